"""Ingestion cost with a slow model: path-parallel vs sequential inserts, eager vs deferred.

The model is the OpenAI-compatible test server (tests/openai_server.py) reached through
memtree's OpenAI adapters and the real ``openai`` client; every chat call is answered
after a fixed delay (500 ms by default), embeddings at once. Texts are LoCoMo turns,
``"<date> <speaker>: <text>"``, in conversation order.

1. Latency: the first ``--latency-inserts`` turns inserted one by one, with the paper's
   sequential procedure (``max_concurrency=1``: the summaries on a path are written one
   after another) and path-parallel (``max_concurrency=8``). Both build the same tree.
2. Calls: ``--inserts`` turns, eagerly (item by item, path-parallel) and deferred
   (``with memory.deferred()`` per LoCoMo session, ``add_many`` in blocks of 100, and
   one ``add_many`` of everything): LLM and embedding calls per item, tokens, time.

Writes ``ingestion.md``, ``ingestion.json`` and ``ingestion.png`` to ``--out``.

    python benchmarks/ingestion.py --locomo ../shared/data/locomo10.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the test server

from openai_server import FakeOpenAIServer  # noqa: E402

from memtree import MemTree, MemTreeConfig  # noqa: E402
from memtree.models import OpenAIChatModel, OpenAIEmbedder  # noqa: E402
from memtree.retry import RetryPolicy  # noqa: E402

Turn = tuple[str, int]
"""A formatted turn and the index of its session (sessions are numbered across conversations)."""


def locomo_turns(path: Path, limit: int) -> list[Turn]:
    conversations = json.loads(path.read_text(encoding="utf-8"))
    turns: list[Turn] = []
    session_number = 0
    for sample in conversations:
        conversation = sample["conversation"]
        numbers = sorted(
            int(key.split("_")[1])
            for key in conversation
            if key.startswith("session_") and not key.endswith("date_time") and isinstance(conversation[key], list)
        )
        for number in numbers:
            date = conversation.get(f"session_{number}_date_time", "")
            for turn in conversation[f"session_{number}"]:
                turns.append((f"{date} {turn['speaker']}: {turn['text']}", session_number))
                if len(turns) >= limit:
                    return turns
            session_number += 1
    return turns


THETA0 = 0.3
"""With the server's hashing embeddings this grows the paper's shape: about three
aggregation calls per insert (the paper reports 3.27 ± 2.38) and depth ~9 after 300 turns."""


def make_memory(server: FakeOpenAIServer, concurrency: int) -> MemTree:
    retry = RetryPolicy(timeout=60.0)
    return MemTree(
        embedder=OpenAIEmbedder(**server.client_options(), retry=retry),
        llm=OpenAIChatModel(**server.client_options(), retry=retry),
        config=MemTreeConfig(theta0=THETA0, max_concurrency=concurrency),
    )


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def latency_run(server: FakeOpenAIServer, texts: list[str], concurrency: int) -> dict[str, Any]:
    memory = make_memory(server, concurrency)
    latencies, calls = [], []
    for text in texts:
        before = memory.stats().llm_calls
        start = time.perf_counter()
        memory.add(text)
        latencies.append(time.perf_counter() - start)
        calls.append(memory.stats().llm_calls - before)
    stats = memory.stats()
    return {
        "max_concurrency": concurrency,
        "inserts": len(texts),
        "latency_median_s": statistics.median(latencies),
        "latency_p95_s": percentile(latencies, 0.95),
        "latency_mean_s": statistics.fmean(latencies),
        "llm_calls_per_insert": statistics.fmean(calls),
        "max_calls_in_one_insert": max(calls),
        "latencies_s": latencies,
        "calls": calls,
        "max_in_flight": server.max_in_flight,
        "nodes": stats.nodes,
        "max_depth": stats.max_depth,
    }


def calls_run(server: FakeOpenAIServer, name: str, turns: list[Turn], ingest: Callable[[MemTree], None]) -> dict:
    memory = make_memory(server, 8)
    start = time.perf_counter()
    ingest(memory)
    seconds = time.perf_counter() - start
    stats = memory.stats()
    count = len(turns)
    assert stats.leaves == len({text for text, _ in turns}) and stats.stale == 0, stats
    return {
        "mode": name,
        "items": count,
        "llm_calls": stats.llm_calls,
        "llm_calls_per_item": stats.llm_calls / count,
        "embedding_calls_per_item": stats.embedding_calls / count,
        "prompt_tokens_per_item": stats.prompt_tokens / count,
        "completion_tokens_per_item": stats.completion_tokens / count,
        "seconds": seconds,
        "seconds_per_item": seconds / count,
        "nodes": stats.nodes,
        "max_depth": stats.max_depth,
        "mean_leaf_depth": stats.mean_leaf_depth,
    }


def eager(turns: list[Turn]) -> Callable[[MemTree], None]:
    def run(memory: MemTree) -> None:
        for text, _ in turns:
            memory.add(text)

    return run


def deferred_per_session(turns: list[Turn]) -> Callable[[MemTree], None]:
    def run(memory: MemTree) -> None:
        for _, session in itertools.groupby(turns, key=lambda turn: turn[1]):
            with memory.deferred():
                for text, _ in session:
                    memory.add(text)

    return run


def deferred_blocks(turns: list[Turn], size: int) -> Callable[[MemTree], None]:
    def run(memory: MemTree) -> None:
        texts = [text for text, _ in turns]
        for start in range(0, len(texts), size):
            memory.add_many(texts[start : start + size], aggregation="deferred")

    return run


def environment(command: str) -> dict[str, str]:
    import numpy
    import openai

    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "openai": openai.__version__,
        "numpy": numpy.__version__,
        "memtree commit": commit,
        "command": command,
    }


def write_report(out: Path, env: dict[str, str], delay: float, latency: list[dict], calls: list[dict]) -> None:
    lines = [
        "# Ingestion with a slow model",
        "",
        f"Chat calls answered after a fixed {delay * 1000:.0f} ms by the OpenAI-compatible test server",
        "(`tests/openai_server.py`), reached through `OpenAIChatModel` / `OpenAIEmbedder` and the real",
        "`openai` client; embeddings answered at once (deterministic hashing vectors). Texts: LoCoMo turns",
        f'`"<date> <speaker>: <text>"` in conversation order; `MemTreeConfig(theta0={THETA0})`, which gives',
        "the hashing embeddings about the paper's tree shape (some three aggregation calls per insert).",
        "",
        "| | |",
        "|---|---|",
        *[f"| {key} | `{value}` |" if key == "command" else f"| {key} | {value} |" for key, value in env.items()],
        "",
        f"## Per-insert latency: sequential vs path-parallel ({latency[0]['inserts']} inserts)",
        "",
        "| procedure | median | p95 | mean | LLM calls / insert | max calls in one insert | max calls in flight |",
        "|---|---|---|---|---|---|---|",
    ]
    for run in latency:
        label = "sequential (paper)" if run["max_concurrency"] == 1 else f"path-parallel ({run['max_concurrency']})"
        lines.append(
            f"| {label} | {run['latency_median_s']:.2f} s | {run['latency_p95_s']:.2f} s | "
            f"{run['latency_mean_s']:.2f} s | {run['llm_calls_per_insert']:.2f} | "
            f"{run['max_calls_in_one_insert']} | {run['max_in_flight']} |"
        )
    speedup = latency[0]["latency_mean_s"] / latency[1]["latency_mean_s"]
    lines += [
        "",
        f"Path-parallel inserts are {speedup:.1f}× faster on average: an insert costs about one model",
        "round-trip however deep its path, instead of one per summary on the path.",
        "",
        f"## LLM calls per item: eager vs deferred ({calls[0]['items']} inserts)",
        "",
        "| mode | LLM calls / item | embedding calls / item | prompt tokens / item | "
        "completion tokens / item | wall time | nodes | max depth |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run in calls:
        lines.append(
            f"| {run['mode']} | {run['llm_calls_per_item']:.2f} | {run['embedding_calls_per_item']:.2f} | "
            f"{run['prompt_tokens_per_item']:.0f} | {run['completion_tokens_per_item']:.0f} | "
            f"{run['seconds']:.0f} s | {run['nodes']} | {run['max_depth']} |"
        )
    lines += [
        "",
        "Deferred ingestion stores every leaf at once and rewrites each touched summary once per block",
        "with all its new texts in one call, so the calls no longer grow with the items that pass",
        "through a summary. Tokens are the server's counts (words), so compare them between rows only.",
        "Retrieval quality of eager vs deferred trees is measured by the evaluation harness (LoCoMo).",
        "",
        "![latency and calls](ingestion.png)",
        "",
    ]
    (out / "ingestion.md").write_text("\n".join(lines), encoding="utf-8")


def plot(out: Path, delay: float, latency: list[dict], calls: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for run in latency:
        label = "sequential (paper)" if run["max_concurrency"] == 1 else "path-parallel"
        left.scatter(run["calls"], run["latencies_s"], s=12, alpha=0.6, label=label)
    left.set_xlabel("LLM calls in the insert (summaries on its path)")
    left.set_ylabel("insert latency (s)")
    left.set_title(f"Per-insert latency, {delay * 1000:.0f} ms per chat call")
    left.legend()
    names = [run["mode"] for run in calls]
    values = [run["llm_calls_per_item"] for run in calls]
    bars = right.bar(range(len(names)), values, color=["#888"] + ["#3a7"] * (len(names) - 1))
    right.set_xticks(range(len(names)), names, rotation=15, ha="right", fontsize=8)
    right.bar_label(bars, fmt="%.2f")
    right.set_ylabel("LLM calls per item")
    right.set_title(f"Aggregation calls over {calls[0]['items']} inserts")
    figure.tight_layout()
    figure.savefig(out / "ingestion.png", dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--locomo", type=Path, default=Path("../shared/data/locomo10.json"), help="locomo10.json")
    parser.add_argument("--delay", type=float, default=0.5, help="seconds before each chat reply")
    parser.add_argument("--latency-inserts", type=int, default=120)
    parser.add_argument("--inserts", type=int, default=1000)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    if not args.locomo.is_file():
        parser.error(f"LoCoMo data not found at {args.locomo}; pass --locomo PATH/TO/locomo10.json")
    logging.basicConfig(level=logging.WARNING)
    args.out.mkdir(parents=True, exist_ok=True)
    command = "python benchmarks/ingestion.py " + " ".join(sys.argv[1:])
    turns = locomo_turns(args.locomo, max(args.inserts, args.latency_inserts))
    latency_texts = [text for text, _ in turns[: args.latency_inserts]]
    turns = turns[: args.inserts]

    latency = []
    for concurrency in (1, 8):
        with FakeOpenAIServer(chat_delay=args.delay, dimension=256) as server:
            latency.append(latency_run(server, latency_texts, concurrency))
            print(f"latency, max_concurrency={concurrency}: mean {latency[-1]['latency_mean_s']:.2f} s", flush=True)
    calls = []
    for name, ingest in (
        ("eager", eager(turns)),
        ("deferred, per session", deferred_per_session(turns)),
        ("deferred, blocks of 100", deferred_blocks(turns, 100)),
        (f"deferred, one block of {len(turns)}", deferred_blocks(turns, len(turns))),
    ):
        with FakeOpenAIServer(chat_delay=args.delay, dimension=256) as server:
            calls.append(calls_run(server, name, turns, ingest))
            print(f"{name}: {calls[-1]['llm_calls_per_item']:.2f} LLM calls per item", flush=True)

    env = environment(command)
    (args.out / "ingestion.json").write_text(
        json.dumps({"environment": env, "delay_s": args.delay, "latency": latency, "calls": calls}, indent=1),
        encoding="utf-8",
    )
    write_report(args.out, env, args.delay, latency, calls)
    plot(args.out, args.delay, latency, calls)
    print(f"wrote {args.out / 'ingestion.md'}")


if __name__ == "__main__":
    main()
