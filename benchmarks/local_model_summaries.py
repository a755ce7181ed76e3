"""How good are a local GGUF model's summaries? Guard pass rates and seconds per call.

Builds an offline (extractive) tree over the first turns of a LoCoMo conversation,
recording every aggregation the tree asks for (current summary, new turns, count),
then sends a spread of those same requests to each local model through
:class:`~memtree.aggregate.LLMAggregator` and checks every reply with the summary
guards. Writes a Markdown table, and with ``--replies FILE`` the replies themselves
as JSON (to read, not to trust the table alone; they quote LoCoMo, so keep them out
of the repository).

    python benchmarks/local_model_summaries.py --data locomo10.json \\
        --model smollm2=/models/SmolLM2-135M-Instruct.Q4_1.gguf --calls 10 --threads 1

LoCoMo is CC BY-NC 4.0: download it yourself.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from memtree import AGGREGATE_PROMPT, SMALL_MODEL_PROMPT, LLMAggregator, MemTree
from memtree.aggregate import Aggregator, ExtractiveAggregator
from memtree.embed import LocalEmbedder
from memtree.llm import Completion
from memtree.models.llamacpp import LlamaCppChatModel
from memtree.node import Vector
from memtree_bench.locomo import load_locomo


class Recorder(Aggregator):
    """The extractive aggregator, remembering every request it serves."""

    def __init__(self, inner: ExtractiveAggregator) -> None:
        self.inner = inner
        self.jobs: list[tuple[str, tuple[str, ...], int]] = []

    @property
    def calls_model(self) -> bool:
        return False

    def aggregate(self, summary: str, new_texts: Sequence[str], count: int, *, centroid: Vector | None = None) -> str:
        self.jobs.append((summary, tuple(new_texts), count))
        return self.inner.aggregate(summary, new_texts, count, centroid=centroid)


def record_jobs(data: Path, conversation: int, turns: int) -> list[tuple[str, tuple[str, ...], int]]:
    embedder = LocalEmbedder()
    recorder = Recorder(ExtractiveAggregator(embedder))
    chosen = load_locomo(data)[conversation]
    with MemTree(embedder=embedder, aggregator=recorder) as memory:
        for turn in chosen.turns[:turns]:
            memory.add(turn.text)
    return recorder.jobs


def spread(jobs: list[tuple[str, tuple[str, ...], int]], calls: int) -> list[tuple[str, tuple[str, ...], int]]:
    """``calls`` requests evenly spread over the recorded ones (early small merges and
    later large ones alike)."""
    if len(jobs) <= calls:
        return jobs
    step = len(jobs) / calls
    return [jobs[int(i * step)] for i in range(calls)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="locomo10.json")
    parser.add_argument("--model", action="append", required=True, help="LABEL=PATH of a .gguf file (repeatable)")
    parser.add_argument("--conversation", type=int, default=0)
    parser.add_argument("--turns", type=int, default=40, help="Turns ingested to record aggregation requests.")
    parser.add_argument("--calls", type=int, default=10, help="Requests sent to each model.")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--prompts", default="small", help="Comma separated: small (SMALL_MODEL_PROMPT), default (AGGREGATE_PROMPT)."
    )
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/local_model_summaries.md"))
    parser.add_argument("--replies", type=Path, default=None, help="Also write every request and reply here (JSON).")
    args = parser.parse_args()

    load_before = os.getloadavg()[0]
    jobs = spread(record_jobs(args.data, args.conversation, args.turns), args.calls)
    rows: list[str] = []
    samples: dict[str, list[dict[str, object]]] = {}
    prompts = [name.strip() for name in args.prompts.split(",") if name.strip()]
    unknown = set(prompts) - set(PROMPTS)
    if unknown or not prompts:
        parser.error(f"--prompts takes {', '.join(PROMPTS)}; got {args.prompts!r}")
    for spec in args.model:
        model_label, _, path = spec.partition("=")
        model = LlamaCppChatModel(path, n_threads=args.threads)
        for prompt in prompts:
            label = f"{model_label} | {prompt}"
            rows.append(run_model(model, LLMAggregator(model, prompt=PROMPTS[prompt]), jobs, label, samples))
            print(rows[-1], flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    header = (
        f"Command: `python {' '.join(sys.argv)}`\n\n"
        f"Requests: {len(jobs)} aggregations recorded from an extractive tree over the first {args.turns} turns of "
        f"LoCoMo conversation {args.conversation}, sent to each model through `LLMAggregator` "
        f"({args.threads} thread{'s' if args.threads != 1 else ''}, temperature 0, max_tokens "
        f"{(LlamaCppChatModel.__init__.__kwdefaults__ or {}).get('max_tokens')}) on {os.cpu_count()} CPU cores, "
        f"load average {load_before:.1f} at the start and {os.getloadavg()[0]:.1f} at the end. "
        "Prompts: `small` is `SMALL_MODEL_PROMPT` (what a guarded model gets by default), "
        "`default` is `AGGREGATE_PROMPT` (hosted models).\n\n"
        "| model | prompt | calls | passed the guards | failed (guard: calls) | s/call mean | median | max |\n"
        "|---|---|---:|---:|---|---:|---:|---:|\n"
    )
    args.out.write_text(
        "# Local-model summaries: guard pass rates and speed\n\n" + header + "\n".join(rows) + "\n", encoding="utf-8"
    )
    print(f"wrote {args.out}")
    if args.replies is not None:
        args.replies.write_text(json.dumps(samples, indent=1, ensure_ascii=False), encoding="utf-8")
        print(f"wrote {args.replies}")


PROMPTS = {"small": SMALL_MODEL_PROMPT, "default": AGGREGATE_PROMPT}


def run_model(
    model: LlamaCppChatModel,
    aggregator: LLMAggregator,
    jobs: list[tuple[str, tuple[str, ...], int]],
    label: str,
    samples: dict[str, list[dict[str, object]]],
) -> str:
    """Send every job to the model; the table row, and each reply into ``samples``."""
    verdicts: Counter[str] = Counter()
    seconds: list[float] = []
    samples[label] = []
    for summary, new_texts, count in jobs:
        started = time.perf_counter()
        try:
            completion = model.complete(aggregator.build_prompt(summary, new_texts, count))
        except Exception as error:  # noqa: BLE001 - an empty reply or a timeout is a result here
            completion, failure = Completion(""), repr(error)
        else:
            failure = ""
        seconds.append(time.perf_counter() - started)
        verdict = aggregator.check(completion, summary, new_texts, count)[0]
        verdicts[verdict.guard if verdict else "passed"] += 1
        samples[label].append(
            {
                "summary": summary,
                "new_texts": list(new_texts),
                "count": count,
                "reply": completion.text,
                "verdict": verdict.reason if verdict else "passed",
                "error": failure,
                "seconds": round(seconds[-1], 2),
                "completion_tokens": completion.completion_tokens,
            }
        )
    ordered = sorted(seconds)
    failed = ", ".join(f"{guard} {n}" for guard, n in verdicts.most_common() if guard != "passed") or "none"
    return (
        f"| {label} | {len(jobs)} | {verdicts['passed']} | {failed} | "
        f"{sum(seconds) / len(seconds):.1f} | {ordered[len(ordered) // 2]:.1f} | {ordered[-1]:.1f} |"
    )


if __name__ == "__main__":
    main()
