"""Would another prompt get fewer of the local model's summaries rejected by the guards?

``memtree bench locomo --keep-trees DIR`` logs every guarded aggregation of a tree it
builds (the earlier summary, the new texts, the model's reply, the verdict). This
script draws a seeded sample of those requests and asks the model again with each
candidate prompt of :data:`VARIANTS`, then judges every reply with the guards of the
code it runs with (``LLMAggregator.check``, so the echo guard compares with the
variant's own prompt). The ``logged`` row is the reply the tree got, re-judged with
today's guards: the same model at ``temperature=0`` with a fixed seed, so it is what
the current :data:`~memtree.aggregate.SMALL_MODEL_PROMPT` gives (the ``current``
variant asks again, to check that).

Replies are kept in ``--replies`` (JSON Lines keyed by model and exact prompt), so a
rerun asks the model nothing it was asked before; that file and the logs are derived
from LoCoMo (CC BY-NC 4.0) and stay out of the repository. The report gives counts
only, never texts. Choose a prompt on the tuning conversations' logs, then run the
chosen one once on held-out logs:

    python benchmarks/summary_prompt_replay.py /work/trees/llm/conv-30__*.replies.jsonl \\
        --llm llama-cpp:/work/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf --sample 40 \\
        --replies /work/trees/prompt_replies.jsonl --out benchmarks/results --name summary_prompt_tuning
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

from locomo_reader import ReplyCache  # noqa: E402
from summary_guard_audit import read_logs  # noqa: E402

from memtree.aggregate import SMALL_MODEL_PROMPT, SMALL_MODEL_RETRY_PROMPT, LLMAggregator  # noqa: E402
from memtree.llm import ChatModel, Completion  # noqa: E402
from memtree.models.resolve import resolve_chat_model  # noqa: E402
from memtree.summary_guard import GUARDS, GuardVerdict  # noqa: E402
from memtree_bench.report import markdown_table  # noqa: E402

_EXAMPLE = SMALL_MODEL_RETRY_PROMPT[
    SMALL_MODEL_RETRY_PROMPT.index("How it is done") : SMALL_MODEL_RETRY_PROMPT.index("New notes:")
]
NEW_FIRST = SMALL_MODEL_RETRY_PROMPT.replace(_EXAMPLE, "")
"""The retry prompt without its worked example."""

NEW_FIRST_EXAMPLE = SMALL_MODEL_RETRY_PROMPT
"""``NEW_FIRST`` with the worked example: adopted as the retry prompt."""

_SMALL_RULES = SMALL_MODEL_PROMPT[SMALL_MODEL_PROMPT.index("Rules:") :]
DATE_FIRST = SMALL_MODEL_PROMPT.replace(
    _SMALL_RULES,
    "Rules: begin with the date of the new notes, as the example does; say what the new notes add, with "
    "every name and number in them; keep the current summary's main points; do not copy the notes or write "
    "chat lines. At most 60 words. Reply with the summary only.",
)
"""``SMALL_MODEL_PROMPT`` with other rules (and no abstraction guidance)."""

VARIANTS: dict[str, str] = {
    "current": SMALL_MODEL_PROMPT,
    "new_first": NEW_FIRST,
    "new_first_example": NEW_FIRST_EXAMPLE,
    "date_first": DATE_FIRST,
}
"""Candidate prompts by name (placeholders as ``LLMAggregator`` takes them)."""

VARIANT_NOTES: dict[str, str] = {
    "logged": "the reply the tree got: SMALL_MODEL_PROMPT, as built",
    "current": "SMALL_MODEL_PROMPT asked again (checks that `logged` is what it gives)",
    "new_first": "new notes before the summary, rules that ask to start with them and their date, no example, "
    "no abstraction guidance (its entry count leaked into replies as a number)",
    "new_first_example": "`new_first` with the worked example, marked as made-up people (now SMALL_MODEL_RETRY_PROMPT)",
    "date_first": "SMALL_MODEL_PROMPT with rules that ask to begin with the new notes' date and say what they add, "
    "no abstraction guidance",
}


def judge(
    records: list[dict[str, Any]], variant: str, model: ChatModel | None, cache: ReplyCache | None, restore: bool
) -> tuple[list[GuardVerdict | None], int, int]:
    """(each record's verdict, replies the model was asked for, replies stored with
    their date restored) of one variant; ``model=None`` uses cached replies only. A
    verdict is ``None`` where the reply is stored (with its date restored, if
    ``restore`` and that was all it lacked)."""
    prompt = SMALL_MODEL_PROMPT if variant == "logged" else VARIANTS[variant]
    aggregator = LLMAggregator(lambda _: "", prompt=prompt, guarded=True, restore_dates=restore)
    verdicts: list[GuardVerdict | None] = []
    asked = restored = 0
    for number, record in enumerate(records, 1):
        summary, new_texts, count = record["summary"], record["new_texts"], int(record["count"])
        if variant == "logged":
            completion: Completion | None = Completion(record["reply"], truncated=bool(record["truncated"]))
        else:
            text = aggregator.build_prompt(summary, new_texts, count)
            known = cache is not None and model is not None and cache.complete(model, text, ask=False) is not None
            if model is None:
                raise SystemExit(f"variant {variant!r} needs --llm (its replies are cached under the model's name)")
            completion = cache.complete(model, text) if cache is not None else model.complete(text)
            if not known:
                asked += 1
                print(f"{variant}: {number}/{len(records)}", file=sys.stderr, flush=True)
        assert completion is not None
        verdict, kept = aggregator.check(completion, summary, new_texts, count)
        restored += kept is not None and verdict is not None
        verdicts.append(None if kept is not None else verdict)
    return verdicts, asked, restored


def judge_with_retries(
    records: list[dict[str, Any]], spec: str, model: ChatModel | None, cache: ReplyCache | None, restore: bool
) -> tuple[list[GuardVerdict | None], int, int, int]:
    """``first+second``: each record judged with the first prompt, and those it
    rejects asked again with the second (and so on). Returns (final verdicts, replies
    asked for, retries, replies stored with their date restored)."""
    first, *retries = spec.split("+")
    verdicts, asked, restored = judge(records, first, model, cache, restore)
    retried = 0
    for variant in retries:
        failed = [number for number, verdict in enumerate(verdicts) if verdict is not None]
        again, more, mended = judge([records[number] for number in failed], variant, model, cache, restore)
        for number, verdict in zip(failed, again, strict=True):
            verdicts[number] = verdict
        asked, retried, restored = asked + more, retried + len(failed), restored + mended
    return verdicts, asked, retried, restored


def main(argv: list[str] | None = None, model: ChatModel | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("logs", nargs="+", type=Path)
    parser.add_argument(
        "--variants",
        default=",".join(["logged", *VARIANTS]),
        help="comma-separated; 'a+b': a, and b asked again where the guards reject a's reply",
    )
    parser.add_argument("--sample", type=int, default=40, help="requests drawn from the logs (seeded)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--llm", help="the model to ask, e.g. llama-cpp:/models/x.gguf (needed unless only 'logged')")
    parser.add_argument("--replies", type=Path, help="JSON Lines cache of the model's replies")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--name", default="summary_prompt_replay")
    parser.add_argument("--title", default="Summary prompts replayed", help="the report's heading")
    parser.add_argument(
        "--restore-dates",
        default="on",
        choices=("on", "off", "both"),
        help="store a reply that lacks only the new texts' date with the date restored (both: a row each)",
    )
    args = parser.parse_args(argv)
    records = read_logs(args.logs)
    sample = random.Random(args.seed).sample(records, min(args.sample, len(records)))
    model = model or (resolve_chat_model(args.llm) if args.llm else None)
    cache = ReplyCache(args.replies) if args.replies else None
    rows, results = [], {}
    modes = {"on": [True], "off": [False], "both": [False, True]}[args.restore_dates]
    for variant in args.variants.split(","):
        for restore in modes:
            verdicts, asked, retried, restored = judge_with_retries(sample, variant, model, cache, restore)
            counts = Counter(verdict.guard for verdict in verdicts if verdict is not None)
            rejected = sum(counts.values())
            name = f"{variant}, dates restored" if restore and len(modes) > 1 else variant
            results[name] = {
                "rejected": rejected,
                "asked": asked,
                "retried": retried,
                "dates_restored": restored,
                **{g: counts[g] for g in GUARDS},
            }
            share = f"{rejected}/{len(sample)} ({rejected / len(sample):.0%})"
            calls = f"{(len(sample) + retried) / len(sample):.2f}"
            rows.append([name, share, calls, str(restored), *(str(counts[g]) for g in GUARDS)])
    table = "\n".join(
        markdown_table(["prompt", "rejected", "model calls per merge", "stored with the date restored", *GUARDS], rows)
    )
    logs = ", ".join(path.name for path in args.logs)
    named = set(re.split(r"[,+]", args.variants))
    command = "python benchmarks/summary_prompt_replay.py " + " ".join(argv if argv is not None else sys.argv[1:])
    text = (
        f"{len(sample)} requests drawn (seed {args.seed}) from {len(records)} logged in {logs}; "
        f"model: {model.name if model else 'none (logged replies only)'}. "
        "`logged` is the reply the tree got (the current prompt), judged with today's guards.\n\n"
        f"{table}\n\n"
        + "".join(f"- `{name}`: {note}\n" for name, note in VARIANT_NOTES.items() if name in named)
        + "- `first+second`: the first prompt's reply, and where the guards reject it, the second prompt's\n"
        + "- rejected: replies the guards reject, so the node gets the extractive summary; a reply that lacks "
        "only the new texts' date is stored with that date in front (`restore_dates`), not rejected, and "
        "is not asked again\n" + f"\nCommand: `{command}`\n"
    )
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"{args.name}.md").write_text(f"# {args.title}\n\n{text}", encoding="utf-8")
        payload = {
            "sample": len(sample),
            "seed": args.seed,
            "logs": logs,
            "model": model.name if model else None,
            "results": results,
        }
        (args.out / f"{args.name}.json").write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
