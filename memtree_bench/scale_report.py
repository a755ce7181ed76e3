"""The scale benchmark's report: Markdown with a verdict computed from the numbers,
JSON to render it again, and a plot.

The verdict is written from the measurements, whatever they are: one size or many,
within the 1.2× target or not. A size that misses the target is named as such.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from memtree.retrieval import OVERLAP_MIN_NODES
from memtree.spare_core import SEARCHES
from memtree_bench.report import (
    load_average,
    machine_lines,
    markdown_table,
    new_figure,
    save_figure,
    write_json,
    write_markdown,
)
from memtree_bench.scale import EXACTNESS_CHECKS, QUERY_RATIO_TARGET, ROWS_ADDED_PER_INSERT, ScaleReport, SizeResult

UPKEEP_FLAT = 2.0
"""Upkeep counts as not growing with N while its largest p50 across the sizes is at
most this many times its smallest (the machine's load alone moves it by tens of %)."""


def write_scale_report(report: ScaleReport, out: Path, info: dict[str, str]) -> list[Path]:
    """Write ``scale.md``, ``scale.json`` and ``scale.png`` to ``out``; return their paths."""
    out.mkdir(parents=True, exist_ok=True)
    info = dict(info)
    info.setdefault("faiss threads", str(report.threads))
    info.setdefault("BM25 helper threads", str(SEARCHES.workers))
    info.setdefault("load after", load_average())
    paths = [out / "scale.md", out / "scale.json", out / "scale.png"]
    write_markdown(paths[0], _markdown(report, info))
    write_json(
        paths[1],
        {
            "machine": info,
            "settings": asdict(report.settings),
            "results": [
                {
                    **asdict(result),
                    "rows_written_per_insert": result.rows_written_per_insert,
                    "query_ratio": result.query_ratio,
                    "dense_ratio": result.dense_ratio,
                }
                for result in report.results
            ],
        },
    )
    _plot(report, paths[2])
    return paths


def verdict(report: ScaleReport) -> list[str]:
    """The report's conclusions, as Markdown bullet points, from the numbers alone."""
    results = sorted(report.results, key=lambda result: result.n)
    if not results:
        return ["- Nothing was measured."]
    return [_upkeep_verdict(results), *_query_verdicts(report, results), _exactness_verdict(results)]


def _upkeep_verdict(results: list[SizeResult]) -> str:
    first, last = results[0], results[-1]
    split = f"vector {_us(last.upkeep_vector['p50'])} µs + BM25 {_us(last.upkeep_lexical['p50'])} µs at N = {last.n:,}"
    rebuild = (
        f"A full rebuild per insert would cost {_ms(last.rebuild['p50'])} ms for FAISS plus "
        f"{last.build_lexical_seconds:,.2f} s for the BM25 index at N = {last.n:,}."
    )
    if len(results) == 1:
        return (
            f"- **Index upkeep per insert** (vector + BM25 together): {_us(first.upkeep['p50'])} µs at "
            f"N = {first.n:,} (p50; {split}; {first.rows_written_per_insert} rows and texts written). "
            f"Only one size was measured, so this run says nothing about growth with N. {rebuild}"
        )
    medians = [result.upkeep["p50"] for result in results]
    growth = max(medians) / min(medians)
    trend = (
        f"it does not grow with N (largest ÷ smallest p50 across the sizes {growth:.1f}×, within {UPKEEP_FLAT:g}×)"
        if growth <= UPKEEP_FLAT
        else f"**it grows with N** (largest ÷ smallest p50 across the sizes {growth:.1f}×, above {UPKEEP_FLAT:g}×)"
    )
    return (
        f"- **Index upkeep per insert** (vector + BM25 together): {_us(first.upkeep['p50'])} µs at "
        f"N = {first.n:,} and {_us(last.upkeep['p50'])} µs at N = {last.n:,} (p50, "
        f"{first.rows_written_per_insert} and {last.rows_written_per_insert} rows and texts written) for "
        f"{last.n / first.n:,.0f}× the nodes: {trend}. Split: {split}. Slowest insert timed: "
        f"{_ms(max(result.upkeep['max'] for result in results))} ms. {rebuild}"
    )


def _query_verdicts(report: ScaleReport, results: list[SizeResult]) -> list[str]:
    k, target = report.settings.k, QUERY_RATIO_TARGET
    lines = []
    for label, ratio_of in (
        ("default (hybrid, `lexical_weight` "
         f"{report.settings.lexical_weight:g}) path", lambda r: r.hybrid_paired_ratio),
        ("dense path (`lexical_weight=0`)", lambda r: r.dense_paired_ratio),
    ):  # fmt: skip
        ratios = ", ".join(f"{ratio_of(result):.2f}× at N = {result.n:,}" for result in results)
        above = [result for result in results if ratio_of(result) > target]
        if not above:
            outcome = f"within the {target}× target at every N measured."
        elif len(above) == len(results):
            outcome = f"**above the {target}× target at every N measured.**"
        else:
            missed = ", ".join(f"{result.n:,}" for result in above)
            outcome = f"**above the {target}× target at N = {missed}**; within it elsewhere."
        lines.append(
            f"- **Collapsed top-{k} query, {label}, vs FAISS brute force on the same matrix** (median of "
            f"per-query ratios): {ratios}: {outcome}"
        )
    worst = max(results, key=lambda result: result.hybrid_paired_ratio)
    extra = worst.query_hybrid["p50"] - worst.query_dense["p50"]
    where = (
        f"- **Where the hybrid query's time goes** at N = {worst.n:,} (its highest ratio): the floor scans "
        f"the matrix in {_ms(worst.query_faiss['p50'])} ms (p50); the hybrid path takes {_ms(extra)} ms more "
        f"than the dense one. Its BM25 top-k search alone takes {_ms(worst.query_lexical['p50'])} ms (the "
        f"query's words occur in {worst.postings_per_query:.2f} × N documents, median); after the scan come "
        "the BM25 scores of the vector hits, the cosine of the union and the ranking."
    )
    one_thread = [result for result in results if result.query_hybrid_one_thread]
    if one_thread:
        where += (
            " Running the BM25 search on a spare core during the scan (from "
            f"{OVERLAP_MIN_NODES:,} nodes) instead of after it on the same thread: "
            + ", ".join(
                f"{result.hybrid_one_thread_paired_ratio:.2f}× → {result.hybrid_paired_ratio:.2f}× at N = {result.n:,}"
                for result in one_thread
            )
            + "."
        )
    if len(results) > 1:
        first, last = results[0], results[-1]
        first_extra = first.query_hybrid["p50"] - first.query_faiss["p50"]
        last_extra = last.query_hybrid["p50"] - last.query_faiss["p50"]
        where += (
            f" Over the floor the hybrid path adds {_ms(first_extra)} ms at N = {first.n:,} and "
            f"{_ms(last_extra)} ms at N = {last.n:,}, while the floor itself goes from "
            f"{_ms(first.query_faiss['p50'])} to {_ms(last.query_faiss['p50'])} ms."
        )
    lines.append(where)
    return lines


def _exactness_verdict(results: list[SizeResult]) -> str:
    checked = sum(result.hybrid_checked for result in results)
    exact = sum(round(result.hybrid_exact * result.hybrid_checked) for result in results)
    return (
        f"- **Exact, not approximate**: the dense path returned exactly the floor's top-10 on "
        f"{min(result.dense_same_results for result in results):.0%} of the queries (the lowest share across N); "
        f"the hybrid top-10 equalled the exhaustive computation (every BM25 score of every node sharing a word "
        f"with the query) on {exact} of {checked} checked queries (the first {EXACTNESS_CHECKS} per N)."
    )


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:,.0f}"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.2f}" if seconds < 0.1 else f"{seconds * 1e3:,.0f}"


def _mb(count: int) -> str:
    return f"{count / 1e6:,.1f}"


def _markdown(report: ScaleReport, info: dict[str, str]) -> list[str]:
    s = report.settings
    results = sorted(report.results, key=lambda result: result.n)
    upkeep_lines = markdown_table(
        [
            "N",
            "rows written / insert",
            "upkeep p50 (µs)",
            "upkeep p95 (µs)",
            "vector p50 (µs)",
            "BM25 p50 (µs)",
            "inserts timed",
            "FAISS rebuild p50 (ms)",
            "rebuilds timed",
            "BM25 bulk build (s)",
            "vector bulk load (s)",
            "vector index (MB)",
            "BM25 index (MB)",
        ],
        [
            [
                f"{r.n:,}",
                f"{r.rows_updated_per_insert} + {r.rows_added_per_insert}",
                _us(r.upkeep["p50"]),
                _us(r.upkeep["p95"]),
                _us(r.upkeep_vector["p50"]),
                _us(r.upkeep_lexical["p50"]),
                r.upkeep["count"],
                _ms(r.rebuild["p50"]),
                r.rebuild["count"],
                f"{r.build_lexical_seconds:,.2f}",
                f"{r.build_vector_seconds:,.2f}",
                _mb(r.index_bytes),
                _mb(r.lexical_bytes),
            ]
            for r in results
        ],
    )
    query_lines = markdown_table(
        [
            "N",
            "hybrid p50 (ms)",
            "hybrid p95 (ms)",
            "dense p50 (ms)",
            "floor p50 (ms)",
            "floor p95 (ms)",
            "hybrid ÷ floor (paired)",
            "hybrid ÷ floor (p50s)",
            "hybrid, one thread, ÷ floor (paired)",
            "dense ÷ floor (paired)",
            "BM25 alone p50 (ms)",
            "query postings ÷ N",
            "dense = floor top-10",
            "hybrid = exhaustive",
            "queries",
        ],
        [
            [
                f"{r.n:,}",
                _ms(r.query_hybrid["p50"]),
                _ms(r.query_hybrid["p95"]),
                _ms(r.query_dense["p50"]),
                _ms(r.query_faiss["p50"]),
                _ms(r.query_faiss["p95"]),
                _flag(r.hybrid_paired_ratio),
                _flag(r.query_ratio),
                _flag(r.hybrid_one_thread_paired_ratio) if r.query_hybrid_one_thread else "–",
                _flag(r.dense_paired_ratio),
                _ms(r.query_lexical["p50"]),
                f"{r.postings_per_query:.2f}",
                f"{r.dense_same_results:.0%}",
                f"{round(r.hybrid_exact * r.hybrid_checked)}/{r.hybrid_checked}",
                r.query_hybrid["count"],
            ]
            for r in results
        ],
    )
    other_lines = markdown_table(
        [
            "N",
            "FAISS own copy p50 (ms)",
            "NumPy p50 (ms)",
            "dense leaves_only p50 (ms)",
            "leaves-only FAISS p50 (ms)",
            "leaves_only ÷ floor (paired)",
        ],
        [
            [
                f"{r.n:,}",
                _ms(r.query_faiss_copy["p50"]),
                _ms(r.query_numpy["p50"]),
                _ms(r.query_dense_leaves["p50"]),
                _ms(r.query_faiss_leaves["p50"]),
                f"{r.leaves_paired_ratio:.2f}",
            ]
            for r in results
        ],
    )
    return [
        "# Scale: index upkeep and collapsed queries versus N",
        "",
        f"Synthetic seeded data, no model: N random unit vectors (d = {s.dimension}, seed {s.seed}, "
        f"{s.leaf_fraction:.0%} flagged as leaves) and N texts of words drawn from a Zipf law (exponent "
        f"{s.zipf_exponent:g}, {s.vocabulary:,} words; {s.leaf_words[0]}-{s.leaf_words[1]} words per leaf, "
        f"{s.summary_words[0]}-{s.summary_words[1]} per summary; queries of {s.query_words} words from the same "
        "law, so their common words reach more documents than LoCoMo's questions do). Each N gets its own "
        "`memtree.index.VectorIndex` and `memtree.lexical.LexicalIndex`. Times are wall-clock "
        "(`time.perf_counter`) on a machine shared with other jobs.",
        "",
        "## Verdict",
        "",
        *verdict(report),
        "",
        "## Index upkeep per insert",
        "",
        "What the engine's insert path does to both indexes, timed together with the garbage collector paused: "
        "one `VectorIndex.upsert` call (a list of 1-D embeddings, leaf flags, timestamps) and one "
        "`LexicalIndex.upsert_many` call (their texts) that overwrite `ceil(log2 N)` existing rows and texts "
        f"(the summaries on the new leaf's path, given new summary-length texts; a real tree's paths are "
        f"shorter) and append {ROWS_ADDED_PER_INSERT} (the new leaf and the summary made when it splits a "
        "leaf). FAISS rebuild = a new `faiss.IndexFlatIP` filled with the N × d matrix, what an index without "
        "in-place updates would pay per insert. Bulk build/load = filling an empty index with all N nodes "
        "at once (what a reopen does). Vector index = the float32 matrix plus flags, timestamps and the slot "
        "table; BM25 index = its posting, forward-index and per-document arrays.",
        "",
        *upkeep_lines,
        "",
        f"## Collapsed top-{s.k} query",
        "",
        f"hybrid = `memtree.retrieval.rank_collapsed` with `LexicalShare(text, {s.lexical_weight:g})`, the path "
        f"`MemTree.retrieve` takes by default, asked for `first_limit({s.k})` nodes as `MemTree.retrieve` asks: "
        "the vector search, the BM25 top-k search (MaxScore: the query's rarest words first, stopping once the "
        "common words' upper bounds cannot change the top), the BM25 scores of the vector hits, and the "
        f"cosine of the union; from {OVERLAP_MIN_NODES:,} nodes up the BM25 search runs on a spare core "
        "(`memtree.spare_core`, helper threads in the machine table) while the calling thread scans, as FAISS "
        "scans one query on one core. hybrid, one thread = the same with the BM25 search after the scan on the "
        "calling thread. dense = the same without BM25 (`lexical_weight=0`). BM25 alone = "
        "`LexicalIndex.search`. Floor = `faiss.knn` top-10 (FAISS's exhaustive inner-product search, what "
        "`IndexFlatIP.search` runs) over the engine's own matrix, so both read the same memory. Query "
        "postings ÷ N = how many documents the query's words occur in (once per word), over N: the work an "
        "exhaustive BM25 query would do. One query at a time, the methods in a new random order on each "
        "query. Paired = the median over queries of a method's time divided by the floor's on the same "
        "query, which cancels most of the load of the shared machine. Ratios above the target are in bold.",
        "",
        *query_lines,
        "",
        "Other baselines: FAISS own copy = `faiss.IndexFlatIP.search` on a separate index holding a copy of the "
        "matrix (on this machine the first of two large allocations scanned 5-8% slower, whichever index it "
        "held, so two copies are not a fair floor for each other). NumPy = `matrix @ q` with `argpartition`. "
        "leaves-only FAISS = brute force over a separate matrix of just the leaves.",
        "",
        *other_lines,
        "",
        "![upkeep and query time versus N](scale.png)",
        "",
        "## Machine",
        "",
        *machine_lines(info),
    ]


def _flag(ratio: float) -> str:
    text = f"{ratio:.2f}"
    return f"**{text}**" if ratio > QUERY_RATIO_TARGET else text


def _plot(report: ScaleReport, path: Path) -> None:
    results = sorted(report.results, key=lambda result: result.n)
    sizes = [r.n for r in results]
    figure, (left, right) = new_figure(2)
    left.plot(sizes, [r.upkeep["p50"] * 1e3 for r in results], "o-", label="upkeep per insert, both (p50)")
    left.plot(sizes, [r.upkeep["p95"] * 1e3 for r in results], "o:", color="C0", alpha=0.6, label="… p95")
    left.plot(sizes, [r.upkeep_vector["p50"] * 1e3 for r in results], "^--", color="C1", label="vector part (p50)")
    left.plot(sizes, [r.upkeep_lexical["p50"] * 1e3 for r in results], "v--", color="C2", label="BM25 part (p50)")
    left.plot(sizes, [r.rebuild["p50"] * 1e3 for r in results], "s--", color="C3", label="FAISS rebuild per insert")
    left.set_title("index upkeep per insert")
    right.plot(sizes, [r.query_hybrid["p50"] * 1e3 for r in results], "o-", label="memtree hybrid (default, p50)")
    right.plot(sizes, [r.query_dense["p50"] * 1e3 for r in results], "^-", label="memtree dense (p50)")
    right.plot(sizes, [r.query_lexical["p50"] * 1e3 for r in results], "v:", color="C2", label="BM25 search alone")
    right.plot(sizes, [r.query_faiss["p50"] * 1e3 for r in results], "s--", color="k", label="FAISS brute force")
    right.plot(
        sizes,
        [r.query_faiss["p50"] * 1e3 * QUERY_RATIO_TARGET for r in results],
        ":",
        color="grey",
        label=f"{QUERY_RATIO_TARGET}× brute force",
    )
    right.plot(sizes, [r.query_numpy["p50"] * 1e3 for r in results], "x--", color="C4", label="NumPy matmul")
    right.set_title(f"top-{report.settings.k} query")
    for axis in (left, right):
        axis.set_xscale("log")
        axis.set_yscale("log")
        axis.set_xlabel("N (nodes in the index)")
        axis.set_ylabel("milliseconds")
        axis.grid(True, which="both", alpha=0.3)
        axis.legend(fontsize=8)
    save_figure(figure, path)
