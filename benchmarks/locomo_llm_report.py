"""One report for the model-written LoCoMo slice (issue 15, item 2).

``memtree bench locomo`` is run three times on the same slice: with a local model
writing the summaries eagerly (every insert), with it deferred (once per session),
and with the offline extractive summaries. Each run carries its own flat baselines,
so flat hybrid is measured beside each tree in the same process. This script puts
the three JSON reports side by side in ``locomo_llm.md`` (and their rows in
``locomo_llm.json``):

    MEMTREE_LLAMA_CPP_THREADS=1 memtree bench locomo --data locomo10.json --conversations 8 --sessions 10 \\
        --no-raptor --no-paper --no-qa --llm llama-cpp:MODEL.gguf --aggregation eager --out OUT --name llm_eager
    ... --aggregation deferred --name llm_deferred;  ... (no --llm) --name extractive
    python benchmarks/locomo_llm_report.py --runs OUT --model-note "Qwen2.5-Coder-1.5B-Instruct Q4_K_M, sha256 ..."

LoCoMo is CC BY-NC 4.0: the report holds numbers only, no text of it.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from memtree_bench.report import markdown_table

RUNS = {
    "llm_eager": "model-written, eager",
    "llm_deferred": "model-written, deferred",
    "extractive": "extractive (offline default)",
}
BUDGETS = ("250", "500", "1000", "2000")


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:.{digits}f}"


def _points(value: float) -> str:
    return f"{value * 100:+.1f}"


def load_runs(folder: Path) -> dict[str, dict[str, Any]]:
    """Each run's JSON report, by the run's stem."""
    runs = {}
    for stem in RUNS:
        path = folder / f"{stem}.json"
        if not path.exists():
            raise SystemExit(f"missing {path}: run memtree bench locomo with --name {stem} first")
        runs[stem] = json.loads(path.read_text(encoding="utf-8"))
    return runs


def rows_of(runs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The rows the report compares: flat dense, BM25 and flat hybrid once (from the
    extractive run; every run measured them, and they do not depend on summaries),
    then memtree and memtree traversal per tree."""
    base = runs["extractive"]["results"]
    rows = {name: base[name] for name in ("flat dense", "BM25", "flat hybrid")}
    for stem, label in RUNS.items():
        results = runs[stem]["results"]
        rows[f"memtree, {label}"] = results["memtree"]
        rows[f"memtree traversal, {label}"] = results["memtree traversal"]
        rows[f"memtree leaves only, {label}"] = results["memtree, leaves only"]
    return rows


def recall_lines(rows: dict[str, dict[str, Any]], key: str, category: str | None) -> list[str]:
    table = []
    for name, row in rows.items():
        values = row[key] if category is None else row[f"{key}_by_category"][category]
        table.append([name, *(_fmt(values[b]) for b in BUDGETS)])
    return [*markdown_table(["method", *(f"{b} words" for b in BUDGETS)], table), ""]


def cost_lines(runs: dict[str, dict[str, Any]]) -> list[str]:
    table = []
    for stem, label in RUNS.items():
        row = runs[stem]["results"]["memtree"]
        quality = row.get("summary_quality", {})
        shape = row["shape"]
        table.append(
            [
                label,
                _fmt(shape["nodes"], 0),
                _fmt(shape["max_depth"], 0),
                _fmt(shape["mean_depth"], 2),
                _fmt(row["aggregation_calls_per_insert"], 2),
                _fmt(row["insert_ms"]["mean"] / 1000, 2),
                _fmt(row["insert_ms"]["p95"] / 1000, 2),
                _fmt(quality.get("summaries_checked", 0), 0),
                _fmt(quality.get("summary_fallbacks", 0), 0),
            ]
        )
    flat = runs["extractive"]["results"]["flat hybrid"]
    table.append(
        [
            "flat hybrid (no tree)",
            _fmt(flat["shape"]["nodes"], 0),
            "1",
            "1.00",
            "0.00",
            _fmt(flat["insert_ms"]["mean"] / 1000, 2),
            _fmt(flat["insert_ms"]["p95"] / 1000, 2),
            "0",
            "0",
        ]
    )
    header = [
        "tree",
        "nodes",
        "max depth",
        "mean leaf depth",
        "aggregation calls / insert",
        "s / insert (mean)",
        "s / insert (p95)",
        "model replies checked",
        "failed a guard (extractive kept)",
    ]
    return [*markdown_table(header, table), ""]


def quality_lines(runs: dict[str, dict[str, Any]]) -> list[str]:
    table = []
    for stem, label in RUNS.items():
        quality = runs[stem]["results"]["memtree"].get("summary_quality", {})
        table.append(
            [
                label,
                _fmt(quality.get("summaries"), 0),
                _fmt(quality.get("abstraction")),
                _fmt(quality.get("novel_word_share")),
                _fmt(quality.get("invention")),
                _fmt(quality.get("invented_facts"), 2),
            ]
        )
    header = [
        "tree",
        "summaries",
        "abstraction: share using a word no leaf below uses",
        "new words per summary (share of its content words)",
        "invention: share stating a name or number no leaf below has",
        "invented names / numbers per summary",
    ]
    return [*markdown_table(header, table), ""]


def goal_lines(runs: dict[str, dict[str, Any]]) -> list[str]:
    flat = runs["extractive"]["results"]["flat hybrid"]
    lines = []
    for stem, label in RUNS.items():
        ours = runs[stem]["results"]["memtree"]
        answer = ours["answer_recall"]["500"] - flat["answer_recall"]["500"]
        evidence = ours["recall"]["500"] - flat["recall"]["500"]
        verdict = "meets" if answer >= 0.03 else "misses"
        lines.append(
            f"- {label}: answer recall {_points(answer)} points against flat hybrid at 500 words "
            f"({verdict} the +3 goal); evidence recall {_points(evidence)}."
        )
    return [*lines, ""]


def data_line(data: dict[str, Any]) -> str:
    """The slice in words, from a run's ``data`` entry."""
    names = {"1": "multi-hop", "2": "temporal", "3": "open-domain", "4": "single-hop"}
    counts = ", ".join(f"{names.get(c, c)} {n}" for c, n in sorted(data["questions_by_category"].items()))
    return (
        f"{', '.join(data['conversations'])}: {data['turns']} turns, {data['questions']} questions ({counts}); "
        "answer recall counts the multi-hop and single-hop ones."
    )


def render(runs: dict[str, dict[str, Any]], model_note: str, notes: list[str]) -> str:
    first = runs["llm_eager"]
    data = first["data"]
    lines = [
        "# LoCoMo with summaries written by a local model (issue 15, item 2)",
        "",
        f"Model: {model_note}.",
        "",
        f"Data: {data_line(data)}",
        "",
        "Rows: flat dense, BM25 and flat hybrid (memtree's hybrid ranking over the turns alone) are",
        "measured in every run; the tables show them from the extractive run (the three runs agree",
        "on them). `memtree, …` is memtree's defaults (collapsed, hybrid) over that run's tree;",
        "`leaves only` is the same ranking with the summaries left out. Each run's machine, software",
        "and command are at the end.",
        "",
        "## Does the model-written tree beat flat hybrid?",
        "",
        *goal_lines(runs),
        *notes,
        "## Answer recall (gold answer string in the context), multi-hop and single-hop pooled",
        "",
        *recall_lines(rows_of(runs), "answer_recall", None),
        "## Evidence recall, all categories",
        "",
        *recall_lines(rows_of(runs), "recall", None),
    ]
    for category, name in (("1", "multi-hop"), ("2", "temporal"), ("4", "single-hop")):
        lines += [f"## Evidence recall, {name} (category {category})", ""]
        lines += recall_lines(rows_of(runs), "recall", category)
    lines += ["## Tree shape and cost of writing it", "", *cost_lines(runs)]
    lines += ["## Summary quality (no judge model: memtree_bench/summary_quality.py)", "", *quality_lines(runs)]
    lines += ["## The runs", ""]
    for stem, label in RUNS.items():
        lines += [f"**{label}**", "", *runs[stem]["environment"], ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=Path, required=True, help="folder with llm_eager/llm_deferred/extractive.json")
    parser.add_argument("--model-note", required=True, help="which model file, its sha256 and threads")
    parser.add_argument("--note", action="append", default=[], help="a paragraph under the verdict (repeatable)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args()
    runs = load_runs(args.runs)
    notes = [*(paragraph + "\n" for paragraph in args.note)]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "locomo_llm.md").write_text(render(runs, args.model_note, notes) + "\n", encoding="utf-8")
    combined = {stem: runs[stem] for stem in RUNS}
    (args.out / "locomo_llm.json").write_text(json.dumps(combined, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.out / 'locomo_llm.md'} and {args.out / 'locomo_llm.json'}")


if __name__ == "__main__":
    main()
