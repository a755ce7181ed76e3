"""Does a change leave LoCoMo's evidence recall exactly as it was? Two checkouts, one run each.

Runs ``memtree bench locomo --no-paper --no-raptor --no-qa`` (extractive summaries,
the local embedder) on the same conversations with the code of ``--before`` and of
``--after`` (each a checkout; the one whose ``memtree`` is imported is its own), one
after the other, and compares every recall the two reports hold: per method, budget
and category. Identical means equal to the last bit, not close.

    python benchmarks/locomo_identical.py --data /work/shared/data/locomo10.json \\
        --before /tmp/before --after . --conversations 0,4,8 --out benchmarks/results

Writes ``locomo_identical.json`` and ``.md`` (only recalls and counts, nothing of the
data set: LoCoMo is CC BY-NC); the LoCoMo reports themselves go to ``--work``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def run(root: Path, data: Path, conversations: str, out: Path) -> dict[str, Any]:
    """One LoCoMo run with the code at ``root``; its JSON report."""
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(root.resolve()), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    command = [
        sys.executable, "-m", "memtree", "bench", "locomo", "--data", str(data), "--conversations", conversations,
        "--no-paper", "--no-raptor", "--no-qa", "--out", str(out), "--name", "locomo",
    ]  # fmt: skip
    started = time.perf_counter()
    done = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the LoCoMo run with {root} failed:\n{done.stderr[-3000:]}")
    report: dict[str, Any] = json.loads((out / "locomo.json").read_text(encoding="utf-8"))
    report["seconds"] = time.perf_counter() - started
    return report


def flatten(report: dict[str, Any]) -> dict[str, float]:
    """Every recall of a report, keyed ``method / budget`` and ``method / category / budget``."""
    values: dict[str, float] = {}
    for method, row in report["results"].items():
        for budget, recall in row.get("recall", {}).items():
            values[f"{method} / {budget}"] = recall
        for category, by_budget in row.get("recall_by_category", {}).items():
            for budget, recall in by_budget.items():
                values[f"{method} / category {category} / {budget}"] = recall
    return values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--before", type=Path, required=True)
    parser.add_argument("--after", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--conversations", default="0,4,8")
    parser.add_argument("--work", type=Path, default=Path("/tmp/locomo-identical"))
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = parser.parse_args()
    before = run(args.before, args.data, args.conversations, args.work / "before")
    after = run(args.after, args.data, args.conversations, args.work / "after")
    old, new = flatten(before), flatten(after)
    differing = sorted(key for key in old.keys() | new.keys() if old.get(key) != new.get(key))
    methods = sorted(after["results"])
    summary = (
        f"identical: all {len(new)} recalls of {len(methods)} methods on conversations {args.conversations} "
        f"({after['data']['questions']} questions) equal to the last bit"
        if not differing
        else f"{len(differing)} of {len(new)} recalls differ"
    )
    result = {
        "identical": not differing,
        "summary": summary,
        "conversations": args.conversations,
        "questions": after["data"]["questions"],
        "methods": methods,
        "recalls_compared": len(new),
        "differing": {key: [old.get(key), new.get(key)] for key in differing},
        "overall_500": {method: after["results"][method]["recall"].get("500") for method in methods},
        "before": {"root": str(args.before), "commit": _commit(args.before), "seconds": before["seconds"]},
        "after": {"root": str(args.after), "commit": _commit(args.after), "seconds": after["seconds"]},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "locomo_identical.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    lines = [
        "# LoCoMo evidence recall before and after issue 38",
        "",
        f"`python benchmarks/locomo_identical.py --conversations {args.conversations}`: `memtree bench locomo "
        "--no-paper --no-raptor --no-qa` (extractive summaries, all-MiniLM-L6-v2) with the code before "
        f"({result['before']['commit']}) and after ({result['after']['commit']}), on the same conversations. "
        "A LoCoMo conversation's tree holds under a thousand nodes, far below `ann_min_nodes` (20,000), so "
        "every search stays exact and the recalls must not move at all.",
        "",
        f"**{summary}.**",
        "",
        "| method | recall at 500 words |",
        "|---|---:|",
        *(f"| {method} | {value:.4f} |" for method, value in result["overall_500"].items()),
    ]
    if differing:
        lines += ["", "| recall | before | after |", "|---|---:|---:|"]
        lines += [f"| {key} | {old.get(key)} | {new.get(key)} |" for key in differing]
    (args.out / "locomo_identical.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(summary)


def _commit(root: Path) -> str:
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, check=False
    )
    return done.stdout.strip() or "unknown"


if __name__ == "__main__":
    main()
