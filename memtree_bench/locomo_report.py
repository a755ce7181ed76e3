"""The LoCoMo report: Markdown tables, a JSON dump and a PNG plot of recall vs budget."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from memtree_bench.harness import ANSWER_RECALL_CATEGORIES, MethodResult
from memtree_bench.locomo import CATEGORY_NAMES, RETRIEVAL_CATEGORIES, Conversation
from memtree_bench.report import markdown_table


def _fmt(value: float, digits: int = 3) -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return [*markdown_table(header, rows), ""]


def _best(values: list[float]) -> float:
    return max((v for v in values if not math.isnan(v)), default=float("nan"))


def recall_table(rows: dict[str, Any], budgets: Sequence[int], category: int | None) -> list[str]:
    """Evidence recall per method per budget (from :func:`results_json` rows); the best
    of each column in bold."""

    def value(row: dict[str, Any], budget: int) -> float:
        table = row["recall"] if category is None else row["recall_by_category"][str(category)]
        return float(table[str(budget)])

    best = {b: _best([value(row, b) for row in rows.values()]) for b in budgets}
    table = []
    for name, row in rows.items():
        cells = []
        for b in budgets:
            text = _fmt(value(row, b))
            cells.append(f"**{text}**" if value(row, b) == best[b] else text)
        table.append([name, *cells])
    return _table(["method", *(f"{b} words" for b in budgets)], table)


def answer_table(rows: dict[str, Any], budgets: Sequence[int], category: int | None) -> list[str]:
    """Answer recall per method per budget: one category, or the categories pooled."""
    lines = []
    for name, row in rows.items():
        table = row["answer_recall"] if category is None else row["answer_recall_by_category"][str(category)]
        lines.append([name, *(_fmt(table[str(b)]) for b in budgets)])
    return _table(["method", *(f"{b} words" for b in budgets)], lines)


def cost_table(rows: dict[str, Any]) -> list[str]:
    table = [
        [
            name,
            _fmt(row["shape"]["nodes"], 0),
            _fmt(row["shape"]["max_depth"], 1),
            _fmt(row["shape"]["mean_depth"], 2),
            _fmt(row["shape"]["branching"], 2),
            _fmt(row["embedding_calls_per_insert"], 2),
            _fmt(row["aggregation_calls_per_insert"], 2),
            _fmt(row["insert_ms"]["p50"], 1),
            _fmt(row["insert_ms"]["p95"], 1),
            _fmt(row["insert_ms"].get("mean", float("nan")), 1),
            _fmt(row["insert_ms"].get("cpu_mean", float("nan")), 1),
            _fmt(row["query_ms"]["p50"], 1),
            _fmt(row["query_ms"]["p95"], 1),
        ]
        for name, row in rows.items()
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
        "insert mean ms",
        "insert CPU ms",
        "query p50 ms",
        "query p95 ms",
    ]
    return _table(header, table)


def data_json(conversations: Sequence[Conversation]) -> dict[str, Any]:
    """What the run read: conversations, turns, questions per category, dropped questions."""
    questions = [q for c in conversations for q in c.questions]
    return {
        "conversations": [c.sample_id for c in conversations],
        "turns": sum(len(c.turns) for c in conversations),
        "questions": len(questions),
        "questions_by_category": {str(k): sum(q.category == k for q in questions) for k in RETRIEVAL_CATEGORIES},
        "dropped_questions": sum(c.dropped_questions for c in conversations),
    }


def locomo_markdown(payload: dict[str, Any], *, title: str = "LoCoMo retrieval benchmark") -> str:
    """The report, rendered from the JSON payload :func:`write_locomo_report` writes
    (and nothing else), so the Markdown always says what the JSON says."""
    rows: dict[str, Any] = payload["results"]
    budgets = [int(b) for b in payload["budgets"]]
    data = payload["data"]
    counts = ", ".join(
        f"{CATEGORY_NAMES[c]} (cat {c}) {data['questions_by_category'][str(c)]}" for c in RETRIEVAL_CATEGORIES
    )
    lines = [f"# {title}", "", *payload["environment"], ""]
    lines += [
        f"Data: {len(data['conversations'])} conversation(s), {data['turns']} turns, "
        f"{data['questions']} questions ({counts}); "
        f"{data['dropped_questions']} dropped for lack of valid evidence.",
        "",
        "Metric (design.md §5): each method's retrieved texts are concatenated in rank order and cut at the "
        "budget in whitespace words; a gold turn's recall is the fraction of its sentences found verbatim "
        "(case and whitespace folded); a question's recall is the mean over its gold turns.",
        "",
        *payload.get("notes", []),
        *goal_lines(rows, budgets),
        "## Evidence recall, all categories",
        "",
        *recall_table(rows, budgets, None),
    ]
    for category in RETRIEVAL_CATEGORIES:
        lines += [f"## Evidence recall, {CATEGORY_NAMES[category]} (category {category})", ""]
        lines += recall_table(rows, budgets, category)
    for category in ANSWER_RECALL_CATEGORIES:
        lines += [
            f"## Answer recall (gold answer string in the context), {CATEGORY_NAMES[category]} (category {category})",
            "",
        ]
        lines += answer_table(rows, budgets, category)
    cats = " and ".join(str(c) for c in ANSWER_RECALL_CATEGORIES)
    lines += [f"## Answer recall, categories {cats} pooled", ""]
    lines += answer_table(rows, budgets, None)
    lines += ["## Tree shape, cost and latency (means over conversations; latencies over all inserts / queries)", ""]
    lines += cost_table(rows)
    lines += quality_table(rows)
    lines += saved_tree_lines(rows)
    if payload.get("qa"):
        lines += qa_markdown(payload["qa"])
    return "\n".join(lines)


def quality_table(rows: dict[str, Any]) -> list[str]:
    """Summary quality of the rows that build a tree with summaries (:mod:`memtree_bench.summary_quality`)."""
    table = [
        [
            name,
            _fmt(q["summaries"], 0),
            _fmt(q["abstraction"], 3),
            _fmt(q["novel_word_share"], 3),
            _fmt(q["invention"], 3),
            _fmt(q["invented_facts"], 2),
            _fmt(q["summaries_checked"], 0),
            _fmt(q["summary_fallbacks"], 0),
        ]
        for name, row in rows.items()
        if (q := row.get("summary_quality")) and q.get("summaries")
    ]
    if not table:
        return []
    header = [
        "method",
        "summaries",
        "abstraction (share using words no leaf uses)",
        "new words per summary (share)",
        "invention (share stating a name or number no leaf has)",
        "invented facts / summary",
        "model summaries checked",
        "fell back (failed a guard)",
    ]
    lines = ["## Summary quality (no judge model: memtree_bench/summary_quality.py)", ""]
    return lines + _table(header, table)


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


def goal_lines(rows: dict[str, Any], budgets: Sequence[int]) -> list[str]:
    """Two verdicts on :func:`results_json` rows. The issue's bar: memtree (defaults)
    at least as good as flat dense at every budget, overall and per category, and 5
    points better on multi-hop questions at 500 words. And whether the tree earns its
    place: memtree against the same hybrid ranking without summaries (``flat hybrid``,
    ``memtree, leaves only``)."""
    if "memtree" not in rows:
        return []
    ours = rows["memtree"]
    lines: list[str] = []
    if "flat dense" in rows:
        base = rows["flat dense"]
        lines += ["## memtree's defaults against flat dense retrieval", ""]
        shortfalls = _shortfalls(ours, base, budgets)
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
        lines.append("")
    for other in ("flat hybrid", "memtree, leaves only", "memtree, summaries as text"):
        if other not in rows:
            continue
        base = rows[other]
        lines += [f"## memtree's defaults against {other} (the same ranking without summaries)", ""]
        differences = ", ".join(f"{b}: {(ours['recall'][str(b)] - base['recall'][str(b)]) * 100:+.1f}" for b in budgets)
        lines.append(f"All categories, points at each budget: {differences}.")
        shortfalls = _shortfalls(ours, base, budgets)
        lines.append(("Below it: " + ", ".join(shortfalls) + ".") if shortfalls else "Nowhere below it.")
        lines.append("")
    return lines


def _shortfalls(ours: dict[str, Any], base: dict[str, Any], budgets: Sequence[int]) -> list[str]:
    return [
        f"{'overall' if category is None else f'category {category}'} at {b} words"
        for b in budgets
        for category in (None, *RETRIEVAL_CATEGORIES)
        if (ours["recall"] if category is None else ours["recall_by_category"][str(category)])[str(b)]
        < (base["recall"] if category is None else base["recall_by_category"][str(category)])[str(b)]
    ]


def results_json(results: Sequence[MethodResult], budgets: Sequence[int]) -> dict[str, Any]:
    """Every number of the report, machine-readable, one entry per method in report order."""
    return {
        r.name: {
            "variant": r.variant,
            "recall": {str(b): r.recall(b) for b in budgets},
            "recall_by_category": {str(c): {str(b): r.recall(b, c) for b in budgets} for c in RETRIEVAL_CATEGORIES},
            "answer_recall": {str(b): r.answer_recall(b) for b in budgets},
            "answer_recall_by_category": {
                str(c): {str(b): r.answer_recall(b, (c,)) for b in budgets} for c in ANSWER_RECALL_CATEGORIES
            },
            "shape": {key: r.shape(key) for key in ("nodes", "max_depth", "mean_depth", "branching")},
            "embedding_calls_per_insert": r.per_insert("embedding_calls"),
            "aggregation_calls_per_insert": r.per_insert("aggregation_calls"),
            "insert_ms": {
                "p50": r.insert_latency(0.5) * 1000,
                "p95": r.insert_latency(0.95) * 1000,
                "mean": r.insert_mean() * 1000,
                "cpu_mean": r.insert_cpu_mean() * 1000,
            },
            "summary_quality": r.quality(),
            "query_ms": {"p50": r.query_latency(0.5) * 1000, "p95": r.query_latency(0.95) * 1000},
            "questions": len(r.scores),
            "saved_trees": [cost.saved_tree for cost in r.costs if cost.saved_tree],
        }
        for r in results
    }


def saved_tree_lines(rows: dict[str, Any]) -> list[str]:
    """The saved tree files the run read or wrote, with their sha256 (none: no lines)."""
    seen: dict[str, str] = {}
    for row in rows.values():
        for tree in row.get("saved_trees", []):
            seen.setdefault(tree["file"], tree["sha256"])
    if not seen:
        return []
    lines = ["## Saved trees (kept out of the repository: derived from CC BY-NC data)", ""]
    lines += _table(["file", "sha256"], [[name, digest] for name, digest in sorted(seen.items())])
    return lines


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
            style = ":" if row.get("variant") else "-"  # the report's main rows, then tuning variants
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
    """Write ``<stem>.json`` and, rendered from it, ``<stem>.md`` and ``<stem>.png`` into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    payload: dict[str, Any] = {
        "environment": list(environment),
        "budgets": list(budgets),
        "data": data_json(conversations),
        "notes": list(notes),
        "results": results_json(results, budgets),
        "qa": qa,
    }
    paths = [out / f"{stem}.md", out / f"{stem}.json", out / f"{stem}.png"]
    paths[1].write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")  # rows in report order
    paths[0].write_text(render_markdown_file(payload, stem, title=title), encoding="utf-8")
    plot_recall(payload["results"], budgets, paths[2])
    return paths


def render_markdown_file(payload: dict[str, Any], stem: str, *, title: str = "LoCoMo retrieval benchmark") -> str:
    """The exact text of ``<stem>.md`` for a payload (the JSON file, loaded)."""
    return locomo_markdown(payload, title=title) + f"\n![recall vs budget]({stem}.png)\n"
