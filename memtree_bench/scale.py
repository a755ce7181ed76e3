"""The scale benchmark: memories of 10k to 1M nodes, built, reopened and queried
through the public API (``MemTree.open``, ``add_many``, ``add``, ``retrieve``).

Data: :mod:`memtree_bench.scale_data` (texts with topics and Zipf words, embedded
by :class:`~memtree_bench.scale_data.TopicEmbedder`; no model). For each size:

* **Build** (once; the SQLite file is kept in ``--trees``, outside the repository):
  ``add_many(bulk=True)`` in batches until the tree has the size in nodes, then
  ``close()``, which leaves a segment (:mod:`memtree.segment`) behind.
* **Reopen**, each in a fresh process (:mod:`memtree_bench.scale_reopen`), taking turns:
  the default (map the segment, read the rows committed since) and *from rows*
  (``segment_min_nodes=None, ann_min_nodes=None``: read every row and build the
  indexes in memory, what every reopen did before issue 38). Timed from
  ``MemTree.open`` to the first ``retrieve`` answered; the imports (numpy, FAISS,
  memtree: the same at any size) are timed apart; the process's RSS after that
  first query is read from ``/proc``.
* **Queries**: ``retrieve(q, k=10)`` four ways on each query, in a new random order
  per query: hybrid (the default) and dense (``lexical_weight=0``), each
  approximate (the IVF, the default from ``ann_min_nodes``) and ``exact=True``;
  beside them FAISS brute force over the same matrix (``faiss.knn``: the floor of
  any exact search). Recall@10 = the share of the exact top 10 that the default
  returned. Filtered queries (``leaves_only`` with a ``where``, and a
  ``time_range``) count every result that breaks its filter (there must be none).
* **Other indexes on the same matrix** (up to ``baseline_max`` rows): FAISS's own
  ``IndexIVFFlat`` (same lists and probes) and ``IndexHNSWFlat`` (M = 32), their
  build time, query time and recall: the measurement behind choosing the IVF.
* **Adds**: ``add`` one note at a time on the tree of that size (each its own
  transaction, SQLite ``synchronous=FULL``).

And once, **growth**: a new file grown by single ``add`` calls to ``growth`` nodes;
the median of the adds that take it from 600 to 1,000 nodes against the one of the
adds that take it from ``growth - 400`` to ``growth`` nodes.
"""

from __future__ import annotations

import json
import math
import os
import random
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from memtree import MemTree, MemTreeConfig
from memtree_bench.report import load_average, percentiles
from memtree_bench.scale_data import Memories, TopicEmbedder

DEFAULT_TREES = Path("/work/trees/scale")
"""Where the benchmark's databases live (gigabytes at 1M nodes: never in the repository)."""

RECALL_TARGET = 0.95
BUILD_BATCH = 50_000
"""Notes per ``add_many(bulk=True)`` call while building."""
GROWTH_NODES = 400
"""The growth benchmark times the adds that take the tree from this many nodes below
each of its two sizes to the size (about 300 adds)."""


@dataclass(frozen=True)
class ScaleSettings:
    """What to measure."""

    sizes: tuple[int, ...] = (10_000, 100_000, 1_000_000)
    """Tree sizes, in nodes."""
    trees: Path = DEFAULT_TREES
    queries: int = 200
    adds: int = 200
    reopens: int = 3
    """Fresh-process reopens per way (the rows way only once from 500k nodes: it takes long)."""
    growth: int = 20_000
    """Nodes the growth benchmark grows a tree to (0: skip it)."""
    baseline_max: int = 100_000
    """Largest size at which FAISS's IVF and HNSW are built for comparison (HNSW takes minutes)."""
    k: int = 10
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.sizes or min(self.sizes) < 100:
            raise ValueError(f"sizes must be at least 100 nodes each, got {self.sizes}")
        for name in ("queries", "adds", "reopens", "k"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.growth and self.growth < 2_000:
            raise ValueError(f"growth must be 0 (skip) or at least 2000 nodes, got {self.growth}")


@dataclass
class SizeResult:
    """Everything measured at one size (seconds unless named otherwise)."""

    nodes: int
    leaves: int
    dimension: int
    build: dict[str, float]
    reopen: dict[str, list[dict[str, float]]]
    """Per way (``segments``, ``rows``): one dict per fresh process."""
    queries: dict[str, dict[str, float]]
    """Per method: percentiles of its times."""
    recall: dict[str, float]
    """Mean recall@k of the approximate search against ``exact=True`` (hybrid, dense, filtered)."""
    violations: int
    """Results of filtered queries that broke their filter (must be 0)."""
    filtered_queries: int
    adds: dict[str, float]
    baselines: dict[str, dict[str, float]] = field(default_factory=dict)
    index: dict[str, float] = field(default_factory=dict)
    """What the memory's index held (rows, IVF lists, rows scored by number)."""
    neighbours: dict[str, float] = field(default_factory=dict)
    """Cosine of a query's nearest node and of random pairs (how much structure the data has)."""
    load: dict[str, str] = field(default_factory=dict)


@dataclass
class ScaleReport:
    settings: ScaleSettings
    results: list[SizeResult] = field(default_factory=list)
    growth: dict[str, Any] = field(default_factory=dict)


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


def tree_path(settings: ScaleSettings, nodes: int) -> Path:
    return settings.trees / f"scale-{nodes}.db"


def open_memory(path: Path, config: MemTreeConfig | None = None) -> MemTree:
    return MemTree.open(path, embedder=TopicEmbedder(), config=config or MemTreeConfig())


def run_scale(settings: ScaleSettings, *, progress: Callable[[str], None] = print) -> ScaleReport:
    """Measure every size, smallest first, then the growth benchmark."""
    settings.trees.mkdir(parents=True, exist_ok=True)
    report = ScaleReport(settings)
    for nodes in sorted(settings.sizes):
        report.results.append(measure_size(settings, nodes, progress))
    if settings.growth:
        report.growth = measure_growth(settings, progress)
    return report


# -- one size --------------------------------------------------------------------------------


def measure_size(settings: ScaleSettings, nodes: int, progress: Callable[[str], None]) -> SizeResult:
    path = tree_path(settings, nodes)
    load = {"before": load_average()}
    build = build_tree(path, nodes, progress)
    build["settle"] = settle(path)
    load["after build"] = load_average()
    reopen = measure_reopens(settings, path, nodes, progress)
    load["after reopens"] = load_average()
    with open_memory(path) as memory:
        memory._replica.wait()
        index = memory._replica.index
        assert index is not None
        facts = {key: float(value) for key, value in memory._replica.index_facts().items()}
        stats = memory.stats()
        queries, recall, violations, filtered, neighbours = measure_queries(settings, memory, progress)
        load["after queries"] = load_average()
        compare = nodes <= settings.baseline_max and index.ivf is not None
        baselines = measure_baselines(settings, memory, progress) if compare else {}
        adds = measure_adds(settings, memory, nodes, progress)
        load["after adds"] = load_average()
    return SizeResult(
        nodes=stats.nodes,
        leaves=stats.leaves,
        dimension=index.dimension,
        build=build,
        reopen=reopen,
        queries=queries,
        recall=recall,
        violations=violations,
        filtered_queries=filtered,
        adds=adds,
        baselines=baselines,
        index=facts,
        neighbours=neighbours,
        load=load,
    )


def build_tree(path: Path, nodes: int, progress: Callable[[str], None]) -> dict[str, float]:
    """Grow the tree at ``path`` to ``nodes`` nodes by bulk batches (kept if already there)."""
    memories = Memories()
    started = time.perf_counter()
    with open_memory(path) as memory:
        have = len(memory._state.nodes) - 1
        notes = memory._state.leaf_total
        if have >= nodes:
            return {"seconds": 0.0, "built_now": 0.0, "notes": float(notes)}
        while have < nodes:
            count = min(BUILD_BATCH, max(500, math.ceil((nodes - have) / 1.15)))
            texts, metadata, times = memories.batch(notes, count)
            memory.add_many(texts, metadata=metadata, timestamps=times, bulk=True)
            notes += count
            have = len(memory._state.nodes) - 1
            progress(f"  built {have:,} nodes ({notes:,} notes) in {time.perf_counter() - started:,.0f} s")
        memory._replica.wait()
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "built_now": 1.0, "notes": float(notes)}


def settle(path: Path) -> float:
    """Open the memory and let it finish its background work (a reopen that found its
    segment more than ``reopen_share`` behind the rows writes a newer one), as a
    process that runs a while after a restart does; return the seconds it took."""
    started = time.perf_counter()
    with open_memory(path) as memory:
        memory._replica.wait()
        memory.refresh(force=True)  # adopt what the background wrote
        memory._replica.wait()
    return time.perf_counter() - started


def measure_reopens(
    settings: ScaleSettings, path: Path, nodes: int, progress: Callable[[str], None]
) -> dict[str, list[dict[str, float]]]:
    """Fresh-process reopens, the two ways taking turns."""
    query = Memories().queries(1, seed=99)[0]
    runs: dict[str, list[dict[str, float]]] = {"segments": [], "rows": []}
    rows_runs = 1 if nodes >= 500_000 else settings.reopens
    for attempt in range(settings.reopens):
        ways = ["segments", "rows"] if attempt % 2 == 0 else ["rows", "segments"]
        for way in ways:
            if way == "rows" and len(runs["rows"]) >= rows_runs:
                continue
            runs[way].append(reopen_in_fresh_process(path, way, query))
            last = runs[way][-1]
            progress(
                f"  reopen ({way}): {last['open_to_answer']:.3f} s to the first answer, RSS {last['rss'] / 1e6:,.0f} MB"
            )
    return runs


def reopen_in_fresh_process(path: Path, way: str, query: str) -> dict[str, float]:
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "memtree_bench.scale_reopen", str(path), way, query],
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the reopen process failed: {done.stderr[-2000:]}")
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    result["process"] = time.perf_counter() - started
    return result


def measure_queries(
    settings: ScaleSettings, memory: MemTree, progress: Callable[[str], None]
) -> tuple[dict[str, dict[str, float]], dict[str, float], int, int, dict[str, float]]:
    """Times of the four ways and the floor per query; recall; filter violations."""
    index = memory._replica.index
    assert index is not None
    queries = Memories().queries(settings.queries, seed=settings.seed + 7)
    rng = random.Random(settings.seed)
    ways: dict[str, dict[str, Any]] = {
        "hybrid": {},
        "hybrid_exact": {"exact": True},
        "dense": {"lexical_weight": 0.0},
        "dense_exact": {"lexical_weight": 0.0, "exact": True},
    }
    times: dict[str, list[float]] = {name: [] for name in [*ways, "floor", "embed"]}
    recall: dict[str, list[float]] = {"hybrid": [], "dense": [], "filtered": []}
    nearest: list[float] = []
    for warm in queries[:5]:  # the first reads fault the mapped pages in
        memory.retrieve(warm, k=settings.k)
    for query in queries:
        vector = memory.embed_query(query)
        started = time.perf_counter()
        memory.embed_query(query)
        times["embed"].append(time.perf_counter() - started)
        got: dict[str, list[tuple[str, float]]] = {}
        order = [*ways, "floor"]
        rng.shuffle(order)
        for name in order:
            started = time.perf_counter()
            if name == "floor":
                scores, _ = index._matrix.knn(np.ascontiguousarray(vector, dtype=np.float32), settings.k)
                times[name].append(time.perf_counter() - started)
                nearest.append(float(scores[0]))
                continue
            hits = memory.retrieve(query, k=settings.k, **ways[name])
            times[name].append(time.perf_counter() - started)
            got[name] = [(hit.id, hit.score) for hit in hits]
        for name in ("hybrid", "dense"):
            recall[name].append(tie_aware_recall(got[name], got[f"{name}_exact"]))
    violations = filtered = 0
    notes = max(1, memory._state.leaf_total)
    for number, query in enumerate(queries[: max(10, settings.queries // 4)]):
        speaker = ("Caroline", "Melanie", "Jon", "Gina")[number % 4]
        start = 1.6e9 + 60.0 * rng.randrange(notes)  # the notes' event times (Memories.batch): a tenth of them
        window = (start, start + 60.0 * max(10, notes // 10))
        options: list[dict[str, Any]] = [
            {"leaves_only": True, "where": {"speaker": speaker}},
            {"time_range": window},
        ]
        for option in options:
            approximate = memory.retrieve(query, k=settings.k, **option)
            exact_hits = memory.retrieve(query, k=settings.k, exact=True, **option)
            if exact_hits:
                recall["filtered"].append(
                    tie_aware_recall([(h.id, h.score) for h in approximate], [(h.id, h.score) for h in exact_hits])
                )
            filtered += 1
            for hit in approximate:
                if option.get("leaves_only") and (not hit.is_leaf or hit.metadata.get("speaker") != speaker):
                    violations += 1
                if "time_range" in option and (hit.timestamp is None or not window[0] <= hit.timestamp <= window[1]):
                    violations += 1

    sample = index.sample(2000, seed=settings.seed)
    pairs = float(np.mean(np.sum(sample[:1000] * sample[1000:2000], axis=1))) if len(sample) >= 2000 else math.nan
    progress(
        "  queries: "
        + ", ".join(f"{name} {percentiles(values)['p50'] * 1e3:.2f} ms" for name, values in times.items())
        + f"; recall@{settings.k} "
        + ", ".join(f"{name} {np.mean(values):.3f}" for name, values in recall.items())
        + f"; violations {violations}"
    )
    return (
        {name: percentiles(values) for name, values in times.items()},
        {name: float(np.mean(values)) if values else math.nan for name, values in recall.items()},
        violations,
        filtered,
        {"nearest_p50": float(np.median(nearest)), "random_pair_mean": pairs},
    )


def tie_aware_recall(found: list[tuple[str, float]], exact: list[tuple[str, float]]) -> float:
    """The share of the exact results the approximate ones match: a result counts if
    the exact search returned it, or if it scores as high as the lowest exact result
    (two nodes of equal score are equally right, and which of them makes the cut goes
    by the order of the rows, which the two searches read differently)."""
    if not exact:
        return 1.0
    ids = {node_id for node_id, _ in exact}
    lowest = min(score for _, score in exact) - 1e-6
    matched = sum(1 for node_id, score in found if node_id in ids or score >= lowest)
    return min(matched, len(exact)) / len(exact)


def measure_baselines(
    settings: ScaleSettings, memory: MemTree, progress: Callable[[str], None]
) -> dict[str, dict[str, float]]:
    """FAISS's IVF (its own lists of copies) and HNSW on the memory's matrix, dense only."""
    index = memory._replica.index
    assert index is not None and index.ivf is not None
    matrix = index.all_vectors()
    queries = np.stack([memory.embed_query(query) for query in Memories().queries(settings.queries, seed=11)])
    _, truth = faiss.knn(queries, matrix, settings.k, metric=faiss.METRIC_INNER_PRODUCT)
    ours = index.ivf
    config = memory.config
    probes = max(1, min(ours.lists, max(config.ann_min_probes, math.ceil(config.ann_probe_share * ours.lists))))
    out: dict[str, dict[str, float]] = {}
    started = time.perf_counter()
    quantizer = faiss.IndexFlatIP(index.dimension)
    ivf = faiss.IndexIVFFlat(quantizer, index.dimension, ours.lists, faiss.METRIC_INNER_PRODUCT)
    ivf.train(matrix[np.random.default_rng(0).choice(len(matrix), min(len(matrix), 64 * ours.lists), replace=False)])
    ivf.add(matrix)
    ivf.nprobe = probes
    out["faiss_ivf_flat"] = _time_faiss(ivf, queries, truth, settings.k, time.perf_counter() - started, len(matrix))
    out["faiss_ivf_flat"]["update"] = _update_cost(ivf, matrix)
    started = time.perf_counter()
    hnsw = faiss.IndexHNSWFlat(index.dimension, 32, faiss.METRIC_INNER_PRODUCT)
    hnsw.hnsw.efConstruction = 40
    hnsw.add(matrix)
    build = time.perf_counter() - started
    for ef in (32, 64, 128):
        hnsw.hnsw.efSearch = ef
        out[f"faiss_hnsw_ef{ef}"] = _time_faiss(hnsw, queries, truth, settings.k, build, len(matrix))
    ours_times, ours_recall = [], []
    for query, expected in zip(queries, truth, strict=True):
        started = time.perf_counter()
        found = index.search(query, settings.k)
        ours_times.append(time.perf_counter() - started)
        ids = {node_id for node_id, _ in found}
        ours_recall.append(len(ids & {index.ids[int(row)] for row in expected}) / settings.k)
    out["memtree_ivf"] = {"p50": float(np.median(ours_times)), "recall": float(np.mean(ours_recall))}
    shown = ", ".join(f"{name} {v['p50'] * 1e3:.2f} ms r={v['recall']:.3f}" for name, v in out.items())
    progress(f"  baselines: {shown}")
    return out


def _time_faiss(
    index: Any, queries: np.ndarray, truth: np.ndarray, k: int, build: float, rows: int
) -> dict[str, float]:
    times, recall = [], []
    for query, expected in zip(queries, truth, strict=True):
        started = time.perf_counter()
        _, found = index.search(query[None, :], k)
        times.append(time.perf_counter() - started)
        recall.append(len(set(found[0].tolist()) & set(expected.tolist())) / k)
    return {"p50": float(np.median(times)), "recall": float(np.mean(recall)), "build": build, "rows": float(rows)}


def _update_cost(index: Any, matrix: np.ndarray) -> float:
    """Seconds FAISS's IVF takes to replace one vector (remove, add), median of 50."""
    index.set_direct_map_type(faiss.DirectMap.Hashtable)  # type: ignore[attr-defined]  # removing by id needs it
    times = []
    for row in range(min(50, len(matrix))):
        started = time.perf_counter()
        index.remove_ids(np.asarray([row], dtype=np.int64))
        index.add_with_ids(matrix[row : row + 1], np.asarray([row], dtype=np.int64))
        times.append(time.perf_counter() - started)
    return float(np.median(times))


def measure_adds(
    settings: ScaleSettings, memory: MemTree, nodes: int, progress: Callable[[str], None]
) -> dict[str, float]:
    """``settings.adds`` single adds on the tree: notes numbered past every leaf it
    holds, so a run never repeats the notes an earlier run added to the kept file
    (``deduplicate`` would answer those with the stored leaf's id, writing nothing)."""
    before = memory._state.leaf_total
    texts, metadata, stamps = Memories().batch(10_000_000 + nodes + before, settings.adds)
    times = []
    for text, meta, stamp in zip(texts, metadata, stamps, strict=True):
        started = time.perf_counter()
        memory.add(text, metadata=meta, timestamp=stamp)
        times.append(time.perf_counter() - started)
    if memory._state.leaf_total - before != settings.adds:
        raise RuntimeError(
            f"{settings.adds} adds stored {memory._state.leaf_total - before} new leaves: the timings are not of adds"
        )
    result = percentiles(times)
    progress(f"  adds: p50 {result['p50'] * 1e3:.1f} ms, p95 {result['p95'] * 1e3:.1f} ms")
    return result


def measure_growth(settings: ScaleSettings, progress: Callable[[str], None]) -> dict[str, Any]:
    """Grow a new tree by single adds; the median add around 1k nodes and at the end."""
    path = settings.trees / "growth.db"
    for leftover in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        leftover.unlink(missing_ok=True)
    import shutil

    shutil.rmtree(f"{path}-index", ignore_errors=True)
    memories = Memories(seed=5)
    windows: dict[int, list[float]] = {}
    cpu: dict[int, list[float]] = {}
    marks = (1_000, settings.growth)
    load = {"before": load_average()}
    started = time.perf_counter()
    with open_memory(path) as memory:
        number = 0
        for mark in marks:
            # The window ends at the mark: at 20,000 nodes the tree reaches the default
            # segment_min_nodes, and the first segment written in the background would
            # slow the adds beside it; that one-time cost is the build's, not an add's.
            while len(memory._state.nodes) - 1 < mark - GROWTH_NODES:
                texts, metadata, stamps = memories.batch(number, 1)
                memory.add(texts[0], metadata=metadata[0], timestamp=stamps[0])
                number += 1
            windows[mark], cpu[mark] = [], []
            at = len(memory._state.nodes) - 1
            while len(memory._state.nodes) - 1 < mark:
                texts, metadata, stamps = memories.batch(number, 1)
                wall, process = time.perf_counter(), time.process_time()
                memory.add(texts[0], metadata=metadata[0], timestamp=stamps[0])
                windows[mark].append(time.perf_counter() - wall)
                cpu[mark].append(time.process_time() - process)
                number += 1
            load[f"at {mark}"] = load_average()
            progress(f"  growth: {at:,} to {mark:,} nodes, median add {statistics.median(windows[mark]) * 1e3:.1f} ms")
        stats = memory.stats()
    small, large = marks
    return {
        "marks": list(marks),
        "timed": {str(mark): len(windows[mark]) for mark in marks},
        "adds": number,
        "nodes": stats.nodes,
        "seconds": time.perf_counter() - started,
        "median": {str(mark): statistics.median(windows[mark]) for mark in marks},
        "p95": {str(mark): float(np.percentile(windows[mark], 95)) for mark in marks},
        "cpu_median": {str(mark): statistics.median(cpu[mark]) for mark in marks},
        "ratio": statistics.median(windows[large]) / statistics.median(windows[small]),
        "cpu_ratio": statistics.median(cpu[large]) / statistics.median(cpu[small]),
        "mean_leaf_depth": stats.mean_leaf_depth,
        "load": load,
        "max_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "pid": os.getpid(),
    }
