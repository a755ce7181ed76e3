"""Chat ingestion cost against evidence recall: this checkout and a baseline, side by side.

Issue 23's goal 2: a LoCoMo turn inserted with memtree's offline defaults costs at
most 2× flat dense retrieval's insert (one embedding of the turn), with evidence
recall unchanged. ``run`` scores ``memtree bench locomo``'s main rows (flat dense,
BM25, flat hybrid, memtree and the readings of its tree) on some conversations with
one checkout's code and writes what it measured to a JSON file: recall per budget
and category, answer recall, process CPU per insert, and each question's recall at
500 words (for paired differences). ``--extra NAME=JSON`` adds a row built with
config overrides. Run it for the baseline (a ``git worktree`` of the commit before)
and for this checkout at the same time, so both see the same load; then
``report`` pairs them:

    git worktree add /tmp/base <commit>
    python benchmarks/chat_ingestion.py run --checkout /tmp/base --conversations 0-4 --json base_0-4.json &
    python benchmarks/chat_ingestion.py run --conversations 0-4 --json new_0-4.json &
    ... (the same for 5-9)
    python benchmarks/chat_ingestion.py report --half 0-4 base_0-4.json new_0-4.json \\
        --half 5-9 base_5-9.json new_5-9.json --out benchmarks/results

The JSON files hold per-question scores of LoCoMo (CC BY-NC 4.0): keep them out of
the repository; the report holds only aggregates.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
BUDGETS = (250, 500, 1000, 2000)
BASE_ROW = "memtree"
BOOTSTRAP = 2000


def run(args: argparse.Namespace) -> None:
    """Score the main rows with the code of ``--checkout`` (imported first on the path)."""
    sys.path.insert(0, str(args.checkout.resolve()))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from memtree.minilm import blas_on_one_thread_for_this_process

    blas_on_one_thread_for_this_process()  # as the memtree command runs
    from memtree_bench.locomo import load_locomo, select_conversations
    from memtree_bench.locomo_bench import LocomoSettings, run_locomo_bench
    from memtree_bench.report import machine_info

    conversations = select_conversations(load_locomo(args.data), args.conversations)
    extra = {name: {"config": json.loads(overrides)} for name, overrides in (e.split("=", 1) for e in args.extra)}
    settings = LocomoSettings(embedder=args.embedder, raptor=False, paper=False, extra_rows=extra)
    rows: dict[str, Any] = {}
    for result in run_locomo_bench(conversations, settings):
        rows[result.name] = {
            "recall": {budget: result.recall(budget) for budget in BUDGETS},
            "answer_recall": {budget: result.answer_recall(budget) for budget in BUDGETS},
            "by_category": {c: {b: result.recall(b, c) for b in BUDGETS} for c in (1, 2, 3, 4)},
            "insert_cpu_ms": result.insert_cpu_mean() * 1000,
            "questions": len(result.scores),
            "recall_500_per_question": [score.recall[500] for score in result.scores],
        }
    payload = {"machine": machine_info(), "conversations": args.conversations, "rows": rows}
    args.json.write_text(json.dumps(payload, indent=1), encoding="utf-8")


def paired(new: list[float], base: list[float]) -> tuple[float, float, float, int]:
    """Mean paired difference, its 95% bootstrap interval, and how many questions differ."""
    difference = np.asarray(new) - np.asarray(base)
    draws = np.random.default_rng(0).integers(0, len(difference), (BOOTSTRAP, len(difference)))
    means = difference[draws].mean(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    return float(difference.mean()), float(low), float(high), int((difference != 0).sum())


def report(args: argparse.Namespace) -> None:
    from memtree_bench.report import machine_lines, markdown_table, write_json, write_markdown

    halves = []
    for name, base_path, new_path in args.half:
        base, new = (json.loads(Path(p).read_text(encoding="utf-8")) for p in (base_path, new_path))
        halves.append((name, base, new))
    lines = ["# Chat ingestion: CPU per turn against evidence recall", ""]
    lines += [
        f"LoCoMo turns inserted one by one, offline defaults, `memtree bench locomo`'s rows; the baseline "
        f"(commit {halves[0][1]['machine']['memtree commit']}) and this code "
        f"(commit {halves[0][2]['machine']['memtree commit']}) ran at the same time in two processes on one "
        "machine, so both saw the same load. CPU is the process's CPU time per insert. "
        f"Paired differences are over the same questions at 500 words, with {BOOTSTRAP}-draw bootstrap "
        "95% intervals.",
        "",
    ]
    if args.note:
        lines += [args.note, ""]
    summary: dict[str, Any] = {}
    for name, base, new in halves:
        brows, nrows = base["rows"], new["rows"]
        dense = nrows["flat dense"]["insert_cpu_ms"]
        table = []
        compared = [("baseline", r, brows) for r in ("flat dense", "flat hybrid", BASE_ROW)]
        compared += [("this code", r, nrows) for r in ("flat dense", "flat hybrid", *args.also, args.row)]
        for side, name_of_row, rows in compared:
            row = rows[name_of_row]
            d, low, high, changed = paired(row["recall_500_per_question"], brows[BASE_ROW]["recall_500_per_question"])
            table.append(
                [
                    f"{side}: {name_of_row}",
                    f"{row['insert_cpu_ms']:.1f}",
                    f"{row['insert_cpu_ms'] / rows['flat dense']['insert_cpu_ms']:.2f}×",
                    *(f"{row['recall'][str(b)]:.4f}" for b in BUDGETS),
                    f"{row['answer_recall']['500']:.4f}",
                    f"{d:+.4f} [{low:+.4f}, {high:+.4f}], {changed} differ",
                ]
            )
        questions = nrows[args.row]["questions"]
        lines += [f"## Conversations {name} ({questions} questions)", ""]
        lines += markdown_table(
            [
                "row",
                "CPU ms / turn",
                "÷ flat dense",
                *(f"recall@{b}" for b in BUDGETS),
                "answer recall@500",
                "recall@500 minus baseline memtree (paired)",
            ],
            table,
        )
        lines.append("")
        summary[name] = {
            "questions": questions,
            "baseline": {r: _aggregate(brows[r]) for r in ("flat dense", "flat hybrid", BASE_ROW)},
            "this code": {r: _aggregate(nrows[r]) for r in nrows},
            "cpu_ratio": nrows[args.row]["insert_cpu_ms"] / dense,
        }
    lines += ["## Machine and commands", ""]
    lines += machine_lines({**halves[0][2]["machine"], "command": " ".join(sys.argv)})
    write_markdown(args.out / "chat_ingestion.md", lines)
    write_json(args.out / "chat_ingestion.json", summary)


def _aggregate(row: dict[str, Any]) -> dict[str, Any]:
    """A row without its per-question scores (the report holds only aggregates)."""
    return {key: value for key, value in row.items() if key != "recall_500_per_question"}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run_parser = commands.add_parser("run", help="score the rows with one checkout's code")
    run_parser.add_argument("--checkout", type=Path, default=ROOT)
    run_parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "locomo10.json")
    run_parser.add_argument("--conversations", default="all")
    run_parser.add_argument("--extra", action="append", default=[], help='NAME={"config_field": value}')
    run_parser.add_argument("--embedder", default="local", help="local, or hashing for smoke runs")
    run_parser.add_argument("--json", type=Path, required=True)
    report_parser = commands.add_parser("report", help="pair a baseline run with this code's")
    report_parser.add_argument("--half", nargs=3, action="append", required=True, metavar=("NAME", "BASE", "NEW"))
    report_parser.add_argument("--row", default=BASE_ROW, help="this code's row to compare")
    report_parser.add_argument("--note", default="", help="a paragraph on how the runs were made")
    report_parser.add_argument("--also", action="append", default=[], help="more of this code's rows to show")
    report_parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    if args.command == "run":
        run(args)
    else:
        sys.path.insert(0, str(ROOT))
        report(args)


if __name__ == "__main__":
    main()
