"""The LoCoMo report: Markdown tables, a JSON dump and a PNG plot of recall vs budget."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from memtree.eval.harness import ANSWER_RECALL_CATEGORIES, MethodResult
from memtree.eval.locomo import CATEGORY_NAMES, RETRIEVAL_CATEGORIES, Conversation
from memtree.eval.report import markdown_table


def _fmt(value: float, digits: int = 3) -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return [*markdown_table(header, rows), ""]


def _best(values: list[float]) -> float:
    return max((v for v in values if not math.isnan(v)), default=float("nan"))


def recall_table(results: Sequence[MethodResult], budgets: Sequence[int], category: int | None) -> list[str]:
    """Evidence recall per method per budget; the best of each column in bold."""
    columns = {b: [r.recall(b, category) for r in results] for b in budgets}
    rows = []
    for i, result in enumerate(results):
        cells = []
        for b in budgets:
            value = columns[b][i]
            text = _fmt(value)
            cells.append(f"**{text}**" if value == _best(columns[b]) else text)
        rows.append([result.name, *cells])
    return _table(["method", *(f"{b} words" for b in budgets)], rows)


def answer_table(results: Sequence[MethodResult], budgets: Sequence[int]) -> list[str]:
    rows = [[r.name, *(_fmt(r.answer_recall(b)) for b in budgets)] for r in results]
    return _table(["method", *(f"{b} words" for b in budgets)], rows)


def cost_table(results: Sequence[MethodResult]) -> list[str]:
    rows = [
        [
            r.name,
            _fmt(r.shape("nodes"), 0),
            _fmt(r.shape("max_depth"), 1),
            _fmt(r.shape("mean_depth"), 2),
            _fmt(r.shape("branching"), 2),
            _fmt(r.per_insert("embedding_calls"), 2),
            _fmt(r.per_insert("aggregation_calls"), 2),
            _fmt(r.insert_latency(0.5) * 1000, 1),
            _fmt(r.insert_latency(0.95) * 1000, 1),
            _fmt(r.query_latency(0.5) * 1000, 1),
            _fmt(r.query_latency(0.95) * 1000, 1),
        ]
        for r in results
    ]
    header = [
        "method",
        "nodes",
        "max depth",
        "mean leaf depth",
        "branching",
        "embedding calls / insert",
        "aggregation calls / insert",
        "insert p50 ms",
        "insert p95 ms",
        "query p50 ms",
        "query p95 ms",
    ]
    return _table(header, rows)


def locomo_markdown(
    results: Sequence[MethodResult],
    conversations: Sequence[Conversation],
    budgets: Sequence[int],
    environment: Sequence[str],
    *,
    title: str = "LoCoMo retrieval benchmark",
    qa: dict[str, Any] | None = None,
    notes: Sequence[str] = (),
) -> str:
    questions = [q for c in conversations for q in c.questions]
    counts = ", ".join(
        f"{CATEGORY_NAMES[c]} (cat {c}) {sum(q.category == c for q in questions)}" for c in RETRIEVAL_CATEGORIES
    )
    lines = [f"# {title}", "", *environment, ""]
    lines += [
        f"Data: {len(conversations)} conversation(s), {sum(len(c.turns) for c in conversations)} turns, "
        f"{len(questions)} questions ({counts}); "
        f"{sum(c.dropped_questions for c in conversations)} dropped for lack of valid evidence.",
        "",
        "Metric (design.md §5): each method's retrieved texts are concatenated in rank order and cut at the "
        "budget in whitespace words; a gold turn's recall is the fraction of its sentences found verbatim "
        "(case and whitespace folded); a question's recall is the mean over its gold turns.",
        "",
        *notes,
        *goal_lines(results_json(results, budgets), budgets),
        "## Evidence recall, all categories",
        "",
        *recall_table(results, budgets, None),
    ]
    for category in RETRIEVAL_CATEGORIES:
        lines += [f"## Evidence recall, {CATEGORY_NAMES[category]} (category {category})", ""]
        lines += recall_table(results, budgets, category)
    cats = " and ".join(str(c) for c in ANSWER_RECALL_CATEGORIES)
    lines += [f"## Answer recall (gold answer string in the context), categories {cats}", ""]
    lines += answer_table(results, budgets)
    lines += ["## Tree shape, cost and latency (means over conversations; latencies over all inserts / queries)", ""]
    lines += cost_table(results)
    if qa:
        lines += qa_markdown(qa)
    return "\n".join(lines)


def qa_markdown(qa: dict[str, Any]) -> list[str]:
    """The LLM reader + judge table (present only when a model was configured)."""
    lines = [f"## QA accuracy (LLM reader and judge, context at {qa['budget']} words, model {qa['model']})", ""]
    header = ["method", "overall", *(f"cat {c}" for c in RETRIEVAL_CATEGORIES), "judge failures"]
    rows = [
        [
            name,
            _fmt(row["overall"]),
            *(_fmt(row["per_category"].get(str(c), float("nan"))) for c in RETRIEVAL_CATEGORIES),
            str(row["judge_failures"]),
        ]
        for name, row in qa["methods"].items()
    ]
    return lines + _table(header, rows)


def goal_lines(report: dict[str, Any], budgets: Sequence[int]) -> list[str]:
    """The issue's bar, checked on ``results_json`` output: memtree (defaults) at least
    as good as flat dense at every budget, overall and per category, and 5 points
    better on multi-hop questions at 500 words."""
    if "memtree" not in report or "flat dense" not in report:
        return []
    ours, base = report["memtree"], report["flat dense"]
    shortfalls = [
        f"{'overall' if category is None else f'category {category}'} at {b} words"
        for b in budgets
        for category in (None, *RETRIEVAL_CATEGORIES)
        if (ours["recall"] if category is None else ours["recall_by_category"][str(category)])[str(b)]
        < (base["recall"] if category is None else base["recall_by_category"][str(category)])[str(b)]
    ]
    lines = ["## memtree's defaults against flat dense retrieval", ""]
    if shortfalls:
        lines.append("Below flat dense: " + ", ".join(shortfalls) + ".")
    else:
        lines.append("At least as good as flat dense at every budget, overall and in every category.")
    if "500" in ours["recall"]:
        gain = ours["recall_by_category"]["1"]["500"] - base["recall_by_category"]["1"]["500"]
        verdict = "meets" if gain >= 0.05 else "misses"
        lines.append(f"Multi-hop (category 1) at 500 words: {gain * 100:+.1f} points ({verdict} the +5 point bar).")
        overall = ours["recall"]["500"] - base["recall"]["500"]
        lines.append(f"All categories at 500 words: {overall * 100:+.1f} points.")
    return [*lines, ""]


def results_json(results: Sequence[MethodResult], budgets: Sequence[int]) -> dict[str, Any]:
    """Every number of the report, machine-readable."""
    return {
        r.name: {
            "recall": {str(b): r.recall(b) for b in budgets},
            "recall_by_category": {str(c): {str(b): r.recall(b, c) for b in budgets} for c in RETRIEVAL_CATEGORIES},
            "answer_recall": {str(b): r.answer_recall(b) for b in budgets},
            "shape": {key: r.shape(key) for key in ("nodes", "max_depth", "mean_depth", "branching")},
            "embedding_calls_per_insert": r.per_insert("embedding_calls"),
            "aggregation_calls_per_insert": r.per_insert("aggregation_calls"),
            "insert_ms": {"p50": r.insert_latency(0.5) * 1000, "p95": r.insert_latency(0.95) * 1000},
            "query_ms": {"p50": r.query_latency(0.5) * 1000, "p95": r.query_latency(0.95) * 1000},
            "questions": len(r.scores),
        }
        for r in results
    }


def plot_recall(report: dict[str, Any], budgets: Sequence[int], path: str | os.PathLike[str]) -> None:
    """Recall vs budget from :func:`results_json` output: overall and per category,
    one line per method (so a committed JSON can be re-plotted without a re-run)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels: list[int | None] = [None, *RETRIEVAL_CATEGORIES]
    figure, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels), 4.6), sharey=True)
    colours = [plt.get_cmap("tab10")(i) for i in range(10)]
    for axis, category in zip(axes, panels, strict=True):
        for position, (name, row) in enumerate(report.items()):
            values = row["recall"] if category is None else row["recall_by_category"][str(category)]
            style = "-" if position < 6 else ":"  # the report's main rows, then tuning variants
            axis.plot(
                budgets,
                [values[str(b)] for b in budgets],
                style,
                marker="o",
                markersize=3,
                color=colours[position % len(colours)],
                label=name,
            )
        axis.set_xscale("log")
        axis.set_xticks(list(budgets), [str(b) for b in budgets])
        axis.minorticks_off()
        axis.set_title("all categories" if category is None else f"{CATEGORY_NAMES[category]} (cat {category})")
        axis.set_xlabel("budget (words)")
        axis.grid(alpha=0.3)
    axes[0].set_ylabel("evidence recall")
    handles, labels = axes[0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="lower center", ncol=min(6, len(labels)), fontsize=8, frameon=False)
    figure.tight_layout(rect=(0, 0.1 + 0.03 * (len(labels) // 7), 1, 1))
    figure.savefig(path, dpi=110)
    plt.close(figure)


def write_locomo_report(
    results: Sequence[MethodResult],
    conversations: Sequence[Conversation],
    budgets: Sequence[int],
    environment: Sequence[str],
    out_dir: str | os.PathLike[str],
    *,
    stem: str = "locomo",
    title: str = "LoCoMo retrieval benchmark",
    qa: dict[str, Any] | None = None,
    notes: Sequence[str] = (),
) -> list[Path]:
    """Write ``<stem>.md``, ``<stem>.json`` and ``<stem>.png`` into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    markdown = locomo_markdown(results, conversations, budgets, environment, title=title, qa=qa, notes=notes)
    paths = [out / f"{stem}.md", out / f"{stem}.json", out / f"{stem}.png"]
    paths[0].write_text(markdown + f"\n![recall vs budget]({stem}.png)\n", encoding="utf-8")
    rows = results_json(results, budgets)
    payload = {"environment": list(environment), "results": rows, "qa": qa}
    paths[1].write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")  # rows in report order
    plot_recall(rows, budgets, paths[2])
    return paths
