"""The scale benchmark: index upkeep per insert and collapsed query time versus N.

No model is involved: the index holds ``N`` seeded random unit vectors (as many as a
tree of ``N`` nodes), 60% of them flagged as leaves (a MemTree has at least two
children per summary, so leaves are the majority; 3,000 inserts with the test
embedder give 3,000 leaves in 4,979 nodes).

* **Upkeep per insert** reproduces what the engine's insert path does to the index:
  ``MemTree._apply`` calls ``VectorIndex.upsert`` once per insert with every node the
  insert wrote, a list of 1-D embeddings, leaf flags and timestamps. An insert
  re-writes the summaries on the new leaf's path and adds the leaf (plus a summary
  when it splits a leaf), so each timed call overwrites ``ceil(log2 N)`` existing rows
  and appends 2 (more than a real tree writes: its paths are shorter than ``log2 N``).
  It runs with the garbage collector paused, as ``_apply`` does.
* **Full rebuild per insert**, the alternative: a new ``faiss.IndexFlatIP`` filled
  with the ``N × d`` matrix.
* **Collapsed top-10 query** through the engine (``rank_collapsed``: the mask for
  the filters, then ``VectorIndex.search``), without filters and with
  ``leaves_only``, against brute force: ``faiss.knn`` over the engine's own storage
  (the floor: FAISS's exhaustive search reading the very same memory), a separate
  ``faiss.IndexFlatIP`` holding a copy of the matrix, a NumPy matrix-vector product with
  ``argpartition``, and FAISS over a separate matrix of the leaves only (the floor for
  ``leaves_only``). The methods take turns in a random order on each query, so a change
  in the machine's load hits them alike. (Two copies of one matrix need not scan equally
  fast: on the machine of the committed results the first of two large allocations
  scanned 5-8% slower, whichever index it held; reading the same memory removes that.)

Repetitions stop early once a measurement has used its time budget (never below a
minimum count), so the 1M run stays short; the report gives the counts.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import faiss
import numpy as np
from tqdm import tqdm

from memtree.embed import Matrix
from memtree.eval.report import (
    load_average,
    machine_lines,
    markdown_table,
    new_figure,
    percentiles,
    save_figure,
    write_json,
    write_markdown,
)
from memtree.gcpause import paused_gc
from memtree.index import VectorIndex
from memtree.retrieval import Filters, rank_collapsed
from memtree.state import TreeState

QUERY_RATIO_TARGET = 1.2
"""The issue's goal: a collapsed query within 1.2× of FAISS brute force at every N."""

ROWS_ADDED_PER_INSERT = 2
"""The new leaf, and the summary made when it lands on a leaf (the costlier case)."""


@dataclass(frozen=True)
class ScaleSettings:
    """What to measure and how long to try."""

    sizes: tuple[int, ...] = (10_000, 100_000, 1_000_000)
    dimension: int = 384
    queries: int = 300
    inserts: int = 300
    rebuilds: int = 20
    seconds_per_measurement: float = 60.0
    """Stop repeating a measurement after this long (but not before the minimum counts)."""
    seed: int = 0
    k: int = 10
    leaf_fraction: float = 0.6
    threads: int = 0
    """FAISS and BLAS threads; 0 keeps their defaults (one per core)."""

    def __post_init__(self) -> None:
        if not self.sizes:
            raise ValueError("sizes is empty: give at least one number of vectors")
        for n in self.sizes:
            if n < 1:
                raise ValueError(f"every size must be at least 1, got {n}")
        for name in ("dimension", "queries", "inserts", "rebuilds", "k"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.threads < 0:
            raise ValueError(f"threads must be 0 (the libraries' default) or more, got {self.threads}")
        if self.seconds_per_measurement <= 0:
            raise ValueError(f"seconds_per_measurement must be positive, got {self.seconds_per_measurement}")
        if not 0.0 < self.leaf_fraction <= 1.0:
            raise ValueError(f"leaf_fraction must be in (0, 1], got {self.leaf_fraction}")


@dataclass
class SizeResult:
    """Everything measured at one N (times in seconds)."""

    n: int
    rows_updated_per_insert: int
    rows_added_per_insert: int
    index_bytes: int
    matrix_bytes: int
    upkeep: dict[str, float]
    rebuild: dict[str, float]
    query_engine: dict[str, float]
    query_engine_leaves: dict[str, float]
    query_faiss: dict[str, float]
    query_faiss_copy: dict[str, float]
    query_faiss_leaves: dict[str, float]
    query_numpy: dict[str, float]
    paired_ratio: float
    """Median over queries of memtree's time ÷ the floor's on that same query."""
    leaves_paired_ratio: float
    """The same for ``leaves_only`` queries (÷ the unfiltered floor)."""
    same_results: float
    """Share of queries where the engine returned exactly FAISS brute force's ids."""

    @property
    def rows_written_per_insert(self) -> int:
        return self.rows_updated_per_insert + self.rows_added_per_insert

    @property
    def query_ratio(self) -> float:
        return self.query_engine["p50"] / self.query_faiss["p50"]

    @property
    def leaves_query_ratio(self) -> float:
        return self.query_engine_leaves["p50"] / self.query_faiss["p50"]


@dataclass
class ScaleReport:
    settings: ScaleSettings
    results: list[SizeResult] = field(default_factory=list)
    threads: int = 1


def load_scale_report(path: Path) -> tuple[ScaleReport, dict[str, str]]:
    """A report and its machine info back from the ``scale.json`` it was written to
    (to render the Markdown and the plot again without measuring again)."""
    import json

    data = json.loads(path.read_text(encoding="utf-8"))
    settings = ScaleSettings(**{**data["settings"], "sizes": tuple(data["settings"]["sizes"])})
    names = {f.name for f in fields(SizeResult)}
    results = [SizeResult(**{key: value for key, value in row.items() if key in names}) for row in data["results"]]
    threads = int(data["machine"].get("faiss threads", 0))
    return ScaleReport(settings=settings, results=results, threads=threads), data["machine"]


def parse_sizes(text: str) -> tuple[int, ...]:
    """``"10000,100k,1M"`` -> ``(10000, 100000, 1000000)``; anything else is a ValueError."""
    sizes: list[int] = []
    for part in text.split(","):
        item = part.strip().replace("_", "")
        multiplier = {"k": 1_000, "m": 1_000_000}.get(item[-1:].lower(), 1)
        digits = item[:-1] if multiplier > 1 else item
        if not digits.isdigit():
            raise ValueError(f"expected whole numbers separated by commas (e.g. 10000,100k,1M), got {part!r}")
        size = int(digits) * multiplier
        if size < 1:
            raise ValueError(f"every size must be at least 1, got {part!r}")
        sizes.append(size)
    return tuple(sizes)


def random_unit_vectors(rng: np.random.Generator, n: int, dimension: int) -> Matrix:
    """``n`` random unit vectors, made in blocks so a million rows need no float64 copy."""
    out = np.empty((n, dimension), dtype=np.float32)
    for start in range(0, n, 65_536):
        block = out[start : start + 65_536]
        rng.standard_normal(block.shape, dtype=np.float32, out=block)
        block /= np.linalg.norm(block, axis=1, keepdims=True)
    return out


def rows_updated_per_insert(n: int) -> int:
    """Summaries an insert re-writes on a tree of ``n`` nodes: ``ceil(log2 n)``, an upper bound."""
    return max(1, math.ceil(math.log2(n))) if n > 1 else 1


def run_scale(settings: ScaleSettings, *, progress: bool = True) -> ScaleReport:
    """Measure every size in ``settings.sizes``, smallest first."""
    with _thread_limit(settings.threads):
        report = ScaleReport(settings=settings, threads=faiss.omp_get_max_threads())
        for n in sorted(settings.sizes):
            report.results.append(measure_size(n, settings, progress=progress))
    return report


@contextmanager
def _thread_limit(threads: int) -> Iterator[None]:
    """Limit FAISS's OpenMP threads and NumPy's BLAS threads for the block.

    Both pools spin for a while after a call; on a small machine a spinning pool
    slows whatever runs next, so a comparison should give both the same count.
    """
    if threads == 0:
        yield
        return
    from threadpoolctl import threadpool_limits

    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(threads)
    try:
        with threadpool_limits(limits=threads):
            yield
    finally:
        faiss.omp_set_num_threads(before)


def measure_size(n: int, settings: ScaleSettings, *, progress: bool = True) -> SizeResult:
    """Build an index of ``n`` vectors and measure queries, upkeep and rebuilds on it."""
    rng = np.random.default_rng([settings.seed, n])
    d = settings.dimension
    matrix = random_unit_vectors(rng, n, d)
    is_leaf = rng.random(n) < settings.leaf_fraction
    timestamps = np.arange(n, dtype=np.float64)
    engine = VectorIndex(d)
    engine.upsert([f"n{i}" for i in range(n)], matrix, is_leaf.tolist(), timestamps.tolist())
    matrix_bytes = len(engine) * d * 4
    index_bytes = _index_bytes(engine)

    queries = _queries(engine, matrix, is_leaf, rng, settings, progress=f"N={n:,}: queries" if progress else None)
    upkeep = _upkeep(engine, rng, settings, progress=f"N={n:,}: inserts" if progress else None)
    rebuild = _rebuilds(matrix, settings, progress=f"N={n:,}: rebuilds" if progress else None)
    return SizeResult(
        n=n,
        rows_updated_per_insert=rows_updated_per_insert(n),
        rows_added_per_insert=ROWS_ADDED_PER_INSERT,
        index_bytes=index_bytes,
        matrix_bytes=matrix_bytes,
        upkeep=percentiles(upkeep),
        rebuild=percentiles(rebuild),
        query_engine=percentiles(queries["engine"]),
        query_engine_leaves=percentiles(queries["engine_leaves"]),
        query_faiss=percentiles(queries["faiss"]),
        query_faiss_copy=percentiles(queries["faiss_copy"]),
        query_faiss_leaves=percentiles(queries["faiss_leaves"]),
        query_numpy=percentiles(queries["numpy"]),
        paired_ratio=_paired_ratio(queries["engine"], queries["faiss"]),
        leaves_paired_ratio=_paired_ratio(queries["engine_leaves"], queries["faiss"]),
        same_results=float(np.mean(queries["same"])),
    )


def _paired_ratio(times: list[float], floor: list[float]) -> float:
    return float(np.median(np.asarray(times) / np.asarray(floor)))


def _queries(
    engine: VectorIndex,
    matrix: Matrix,
    is_leaf: np.ndarray,
    rng: np.random.Generator,
    settings: ScaleSettings,
    *,
    progress: str | None,
) -> dict[str, list[float]]:
    k = settings.k
    storage = engine._rows()  # a view of the engine's matrix (the queries run before any insert)
    copy = faiss.IndexFlatIP(settings.dimension)
    copy.add(matrix)
    leaves_floor = faiss.IndexFlatIP(settings.dimension)
    leaves_floor.add(np.ascontiguousarray(matrix[is_leaf]))
    state = TreeState()  # rank_collapsed reads the tree only for `where` filters
    no_filter, leaves_only = Filters(), Filters(leaves_only=True)

    def numpy_top(query: np.ndarray) -> np.ndarray:
        scores = storage @ query
        top = np.argpartition(-scores, min(k, len(scores)) - 1)[:k]
        return top[np.argsort(-scores[top], kind="stable")]

    methods: dict[str, Callable[[np.ndarray], Any]] = {
        "engine": lambda q: rank_collapsed(engine, state, q, k, no_filter),
        "engine_leaves": lambda q: rank_collapsed(engine, state, q, k, leaves_only),
        "faiss": lambda q: faiss.knn(q.reshape(1, -1), storage, k, faiss.METRIC_INNER_PRODUCT),
        "faiss_copy": lambda q: copy.search(q.reshape(1, -1), k),
        "faiss_leaves": lambda q: leaves_floor.search(q.reshape(1, -1), k),
        "numpy": numpy_top,
    }
    times: dict[str, list[float]] = {name: [] for name in methods}
    times["same"] = []
    names = list(methods)
    for _ in _repeat(settings.queries, 30, settings.seconds_per_measurement, progress):
        query = random_unit_vectors(rng, 1, settings.dimension)[0]
        outputs: dict[str, Any] = {}
        for position in rng.permutation(len(names)):  # a new order per query: none always follows another
            name = names[int(position)]
            start = time.perf_counter()
            outputs[name] = methods[name](query)
            times[name].append(time.perf_counter() - start)
        engine_ids = [node_id for node_id, _ in outputs["engine"]]
        floor_ids = [f"n{slot}" for slot in outputs["faiss"][1][0]]
        times["same"].append(float(engine_ids == floor_ids))
    return times


def _upkeep(
    engine: VectorIndex, rng: np.random.Generator, settings: ScaleSettings, *, progress: str | None
) -> list[float]:
    """Time ``upsert`` calls shaped like the engine's insert path (see the module docstring)."""
    seconds: list[float] = []
    updated = min(rows_updated_per_insert(len(engine)), len(engine))
    for number in _repeat(settings.inserts, 30, settings.seconds_per_measurement, progress):
        slots = rng.choice(len(engine), size=updated, replace=False)
        ids = [engine.ids[int(slot)] for slot in slots] + [f"new{number}-{j}" for j in range(ROWS_ADDED_PER_INSERT)]
        vectors = list(random_unit_vectors(rng, len(ids), settings.dimension))
        leaf_flags = [False] * updated + [True] + [False] * (ROWS_ADDED_PER_INSERT - 1)
        timestamps: list[float | None] = [float(number)] * len(ids)
        with paused_gc():
            start = time.perf_counter()
            engine.upsert(ids, vectors, leaf_flags, timestamps)
            seconds.append(time.perf_counter() - start)
    return seconds


def _rebuilds(matrix: Matrix, settings: ScaleSettings, *, progress: str | None) -> list[float]:
    seconds: list[float] = []
    for _ in _repeat(settings.rebuilds, 3, settings.seconds_per_measurement, progress):
        start = time.perf_counter()
        rebuilt = faiss.IndexFlatIP(settings.dimension)
        rebuilt.add(matrix)
        seconds.append(time.perf_counter() - start)
        del rebuilt
    return seconds


def _repeat(limit: int, minimum: int, budget: float, progress: str | None) -> Iterator[int]:
    """0, 1, … up to ``limit``, stopping after ``budget`` seconds once ``minimum`` ran."""
    minimum = min(minimum, limit)
    started = time.perf_counter()
    with tqdm(total=limit, desc=progress, disable=progress is None, leave=False, unit="rep") as bar:
        for number in range(limit):
            if number >= minimum and time.perf_counter() - started > budget:
                return
            yield number
            bar.update()


def _index_bytes(index: VectorIndex) -> int:
    """The vectors plus the per-row bookkeeping (flags, timestamps, slot table; not the
    id strings, which the tree holds anyway)."""
    import sys

    matrix = len(index) * index.dimension * 4
    columns = len(index) * (1 + 8)
    return matrix + columns + sys.getsizeof(index.ids) + sys.getsizeof(index._slot)


# -- the report -------------------------------------------------------------------------------


def write_scale_report(report: ScaleReport, out: Path, info: dict[str, str]) -> list[Path]:
    """Write ``scale.md``, ``scale.json`` and ``scale.png`` to ``out``; return their paths."""
    out.mkdir(parents=True, exist_ok=True)
    info = dict(info)
    info.setdefault("faiss threads", str(report.threads))
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
                    "leaves_query_ratio": result.leaves_query_ratio,
                }
                for result in report.results
            ],
        },
    )
    _plot(report, paths[2])
    return paths


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:,.0f}"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.2f}" if seconds < 0.1 else f"{seconds * 1e3:,.0f}"


def _markdown(report: ScaleReport, info: dict[str, str]) -> list[str]:
    s = report.settings
    results = report.results
    first, last = results[0], results[-1]
    worst_ratio = max(r.query_ratio for r in results)
    worst_leaves = max(r.leaves_query_ratio for r in results)
    worst_paired = max(r.paired_ratio for r in results)
    worst_leaves_paired = max(r.leaves_paired_ratio for r in results)
    upkeep_lines = markdown_table(
        [
            "N",
            "index (MB)",
            "rows written / insert",
            "upkeep p50 (µs)",
            "upkeep p95 (µs)",
            "µs / row (p50)",
            "inserts timed",
            "rebuild p50 (ms)",
            "rebuild p95 (ms)",
            "rebuilds timed",
            "rebuild ÷ upkeep",
        ],
        [
            [
                f"{r.n:,}",
                f"{r.index_bytes / 1e6:,.1f}",
                f"{r.rows_updated_per_insert} + {r.rows_added_per_insert}",
                _us(r.upkeep["p50"]),
                _us(r.upkeep["p95"]),
                f"{r.upkeep['p50'] * 1e6 / r.rows_written_per_insert:.1f}",
                r.upkeep["count"],
                _ms(r.rebuild["p50"]),
                _ms(r.rebuild["p95"]),
                r.rebuild["count"],
                f"{r.rebuild['p50'] / r.upkeep['p50']:,.0f}×",
            ]
            for r in results
        ],
    )
    query_lines = markdown_table(
        [
            "N",
            "memtree p50 (ms)",
            "memtree p95 (ms)",
            "FAISS floor p50 (ms)",
            "FAISS floor p95 (ms)",
            "FAISS own copy p50 (ms)",
            "memtree ÷ floor (p50)",
            "memtree ÷ floor (paired)",
            "NumPy p50 (ms)",
            "memtree leaves_only p50 (ms)",
            "leaves-only FAISS p50 (ms)",
            "leaves_only ÷ floor (paired)",
            "same top-10 as floor",
            "queries",
        ],
        [
            [
                f"{r.n:,}",
                _ms(r.query_engine["p50"]),
                _ms(r.query_engine["p95"]),
                _ms(r.query_faiss["p50"]),
                _ms(r.query_faiss["p95"]),
                _ms(r.query_faiss_copy["p50"]),
                f"{r.query_ratio:.2f}",
                f"{r.paired_ratio:.2f}",
                _ms(r.query_numpy["p50"]),
                _ms(r.query_engine_leaves["p50"]),
                _ms(r.query_faiss_leaves["p50"]),
                f"{r.leaves_paired_ratio:.2f}",
                f"{r.same_results:.0%}",
                r.query_engine["count"],
            ]
            for r in results
        ],
    )
    return [
        "# Scale: index upkeep and collapsed queries versus N",
        "",
        f"Synthetic seeded random unit vectors (d = {s.dimension}, seed {s.seed}, {s.leaf_fraction:.0%} flagged "
        f"as leaves), no model. Each N gets its own `memtree.index.VectorIndex` holding N vectors. "
        "Times are wall-clock (`time.perf_counter`) on a machine shared with other jobs.",
        "",
        "## Verdict",
        "",
        f"- **Index upkeep per insert**: {_us(first.upkeep['p50'])} µs at N = {first.n:,} and "
        f"{_us(last.upkeep['p50'])} µs at N = {last.n:,} (p50, {first.rows_written_per_insert} and "
        f"{last.rows_written_per_insert} rows written): "
        f"{last.upkeep['p50'] / first.upkeep['p50']:.1f}× for {last.n / first.n:,.0f}× the vectors. "
        f"A full rebuild per insert would cost {_ms(first.rebuild['p50'])} ms and {_ms(last.rebuild['p50'])} ms "
        f"({last.rebuild['p50'] / first.rebuild['p50']:,.0f}×). Slowest insert timed: "
        f"{_ms(max(r.upkeep['max'] for r in results))} ms.",
        f"- **Collapsed top-{s.k} query vs FAISS brute force on the same matrix** (target ≤ {QUERY_RATIO_TARGET}×): "
        f"at most {worst_paired:.2f}× the floor across N as the median of per-query ratios, {worst_ratio:.2f}× as "
        f"a ratio of medians; with `leaves_only`, {worst_leaves_paired:.2f}× and {worst_leaves:.2f}× the "
        "unfiltered floor. memtree returned exactly the floor's top-10 on "
        f"{min(r.same_results for r in results):.0%} of the queries (the lowest share across N).",
        "",
        "## Index upkeep per insert",
        "",
        "One `VectorIndex.upsert` call per insert, shaped like `MemTree._apply`'s (a list of 1-D embeddings, "
        "leaf flags, timestamps; garbage collector paused): it overwrites `ceil(log2 N)` existing rows "
        f"(the summaries on the new leaf's path; a real tree's paths are shorter) and appends "
        f"{ROWS_ADDED_PER_INSERT} (the new leaf and the summary made when it splits a leaf). "
        "Rebuild = a new `faiss.IndexFlatIP` filled with the N × d matrix, what an index without in-place "
        "updates would pay per insert. Index size = the float32 matrix plus flags, timestamps and the slot table.",
        "",
        *upkeep_lines,
        "",
        f"## Collapsed top-{s.k} query",
        "",
        "memtree = `memtree.retrieval.rank_collapsed` (filters to a mask, then `VectorIndex.search`), the path "
        "`MemTree.retrieve` takes for collapsed retrieval. FAISS floor = `faiss.knn` (FAISS's exhaustive "
        "inner-product search, what `IndexFlatIP.search` runs) over the engine's own matrix, so both read the "
        "same memory. FAISS own copy = `faiss.IndexFlatIP.search` on a separate index holding a copy of the "
        "matrix (on this machine the first of two large allocations scanned 5-8% slower, whichever index it "
        "held, so two copies are not a fair floor for each other). NumPy = `matrix @ q` with `argpartition`. "
        "leaves-only FAISS = brute force over a separate matrix of just the leaves. One query at a time, "
        "the methods in a new random order on each query. Paired = the median over queries of memtree's time "
        "divided by the floor's on the same query, which cancels most of the load of the shared machine.",
        "",
        *query_lines,
        "",
        "![upkeep and query time versus N](scale.png)",
        "",
        "## Machine",
        "",
        *machine_lines(info),
    ]


def _plot(report: ScaleReport, path: Path) -> None:
    results = report.results
    sizes = [r.n for r in results]
    figure, (left, right) = new_figure(2)
    left.plot(sizes, [r.upkeep["p50"] * 1e3 for r in results], "o-", label="memtree upkeep per insert (p50)")
    left.plot(sizes, [r.upkeep["p95"] * 1e3 for r in results], "o:", color="C0", alpha=0.6, label="… p95")
    left.plot(sizes, [r.rebuild["p50"] * 1e3 for r in results], "s--", color="C3", label="full rebuild per insert")
    left.set_title("index upkeep per insert")
    right.plot(sizes, [r.query_engine["p50"] * 1e3 for r in results], "o-", label="memtree collapsed (p50)")
    right.plot(sizes, [r.query_engine_leaves["p50"] * 1e3 for r in results], "^-", label="memtree leaves_only (p50)")
    right.plot(sizes, [r.query_faiss["p50"] * 1e3 for r in results], "s--", color="k", label="FAISS brute force")
    right.plot(sizes, [r.query_faiss_copy["p50"] * 1e3 for r in results], "d:", color="C4", label="FAISS, own copy")
    right.plot(
        sizes,
        [r.query_faiss["p50"] * 1e3 * QUERY_RATIO_TARGET for r in results],
        ":",
        color="grey",
        label=f"{QUERY_RATIO_TARGET}× brute force",
    )
    right.plot(sizes, [r.query_numpy["p50"] * 1e3 for r in results], "x--", color="C2", label="NumPy matmul")
    right.set_title(f"top-{report.settings.k} query")
    for axis in (left, right):
        axis.set_xscale("log")
        axis.set_yscale("log")
        axis.set_xlabel("N (vectors in the index)")
        axis.set_ylabel("milliseconds")
        axis.grid(True, which="both", alpha=0.3)
        axis.legend(fontsize=8)
    save_figure(figure, path)
