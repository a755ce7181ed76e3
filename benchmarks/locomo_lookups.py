"""LoCoMo lookups with issue 36's retrieval (time in questions, context feedback) against today's ranking.

Issue 36 changed how ``retrieve`` ranks: a time expression in a question ranks its
range higher (``parse_times``) and the best first match's tree context moves the
query (``context_feedback``). Its goal for lookups: the default stays at or above flat
hybrid at every budget (extractive trees, all 10 conversations) and multi-hop
questions gain at least 3 points of evidence recall at 500 words. This script scores
``memtree bench locomo``'s main rows on saved trees (``--trees``, as the locomo
bench saves them; missing ones are built into the folder) plus the rows that turn
each change off, so every comparison is paired over the same questions:

    python benchmarks/locomo_lookups.py --data locomo10.json --trees /tmp/trees --out benchmarks/results

The report is ``memtree bench locomo``'s (``locomo_lookups.md``, ``.json``, ``.png``).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

TODAY = {"parse_times": False, "context_feedback": 0.0}
"""``retrieve``'s options that rank as before issue 36."""


def rows() -> dict[str, dict[str, Any]]:
    from memtree_bench.locomo_bench import FLAT_TREE

    return {
        "flat hybrid, as before (no time parsing, no context feedback)": {"config": FLAT_TREE, "retrieve": TODAY},
        "memtree, as before (no time parsing, no context feedback)": {"retrieve": TODAY},
        "memtree, time parsing only": {"retrieve": {"context_feedback": 0.0}},
        "memtree, context feedback only": {"retrieve": {"parse_times": False}},
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "locomo10.json")
    parser.add_argument("--trees", type=Path, required=True, help="saved extractive trees (built when missing)")
    parser.add_argument("--conversations", default="all")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--name", default="locomo_lookups")
    parser.add_argument("--embedder", default="local", help="local, or hashing for smoke runs")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from memtree.minilm import blas_on_one_thread_for_this_process

    blas_on_one_thread_for_this_process()
    from memtree_bench.locomo import load_locomo, select_conversations
    from memtree_bench.locomo_bench import LocomoSettings, run_locomo_bench
    from memtree_bench.locomo_report import write_locomo_report
    from memtree_bench.report import machine_info, machine_lines

    conversations = select_conversations(load_locomo(args.data), args.conversations)
    settings = LocomoSettings(
        embedder=args.embedder, raptor=False, paper=False, keep_trees=str(args.trees), extra_rows=rows()
    )
    info = machine_info()
    results = run_locomo_bench(conversations, settings)
    paths = write_locomo_report(results, conversations, settings.budgets, machine_lines(info), args.out, stem=args.name)
    for result in results:
        print(f"{result.name:70s} " + "  ".join(f"{result.recall(b):.3f}" for b in settings.budgets))
    print("wrote " + ", ".join(str(path) for path in paths))


if __name__ == "__main__":
    main()
