"""Store benchmark: insert throughput and reopen time for the in-memory, SQLite and
PostgreSQL stores at 10k and 100k nodes, reopening from segments (index files) and
from the rows.

Models are taken out of the measurement: ``HashingEmbedder(384)`` (the dimension of
the default all-MiniLM-L6-v2) and the offline extractive aggregator. Texts are
synthetic notes of ten words from a 30-word topic vocabulary; each carries metadata
as an application's would (a conversation, a speaker, a session number). The
config is the default one, so a reopen also builds the BM25 index of hybrid
retrieval; the reopen is timed again with ``lexical_weight=0`` (no BM25 index) to
show what that index costs.

1. Base trees: notes are added to an in-memory memory (``add_many(bulk=True)``, as
   documents are loaded: notes one by one took 9 minutes per 10k nodes on the shared
   machine) until it holds 10k, then 100k nodes; each tree is exported as JSONL
   (cached in ``--cache``) and imported into a fresh store of each kind (import
   time reported too).
2. Reopen: a new ``MemTree`` on the store (median of ``--repeats``, the ways taking
   turns): the default, which maps the namespace's segment where the store keeps
   index files (SQLite; PostgreSQL with ``index_dir``) and reads only the rows
   committed after it; *from rows* (``segment_min_nodes=None, ann_min_nodes=None``),
   which reads every node and builds the tree, vector and BM25 indexes in memory, as
   every reopen did before issue 38, split into reading the rows and building; and
   the same from rows without the BM25 index.
3. Inserts: ``--inserts`` more notes added one by one (each its own transaction, as
   an application adds them), on a tree of that size.
4. Index: rebuilding the vector index from the stored float32 embeddings, loading a
   persisted FAISS index file (``faiss.read_index``), and mapping a segment's
   embeddings (what a reopen does now), at the largest size.

Writes ``storage.md``, ``storage.json`` and ``storage.png`` to ``--out``.

    python benchmarks/storage.py                      # 10k and 100k nodes
    python benchmarks/storage.py --sizes 2000 --inserts 100 --repeats 1   # a quick look
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the throwaway PostgreSQL server

import faiss  # noqa: E402
import numpy as np  # noqa: E402
from pg_server import PostgresServer, PostgresUnavailable  # noqa: E402
from store_worker import VOCABULARY  # noqa: E402

from memtree import HashingEmbedder, MemoryBackend, MemTree, MemTreeConfig, PostgresBackend, SQLiteBackend  # noqa: E402
from memtree.index import VectorIndex  # noqa: E402
from memtree.store import Store  # noqa: E402

DIMENSION = 384
CONFIG = MemTreeConfig()  # theta0="auto", lexical_weight=0.3, segments and IVF from 20k nodes: the default
ROWS = MemTreeConfig(segment_min_nodes=None, ann_min_nodes=None)  # every row read, indexes built: before issue 38
DENSE_ONLY = ROWS.with_options(lexical_weight=0.0)  # the same without the BM25 index
NAMESPACE = ("bench",)
SPEAKERS = ("Caroline", "Melanie", "Jon", "Gina")


def notes(seed: int) -> Iterator[tuple[str, dict[str, Any]]]:
    """Notes with the metadata an application attaches (who, which conversation and session)."""
    rng = random.Random(seed)
    number = 0
    while True:
        text = f"note {seed}-{number}: " + " ".join(rng.choice(VOCABULARY) for _ in range(10)) + "."
        metadata = {
            "conversation": f"c{seed}-{number // 500}",
            "speaker": rng.choice(SPEAKERS),
            "session": number // 20,
        }
        yield text, metadata
        number += 1


def memory_on(store: Store, config: MemTreeConfig = CONFIG) -> MemTree:
    return MemTree(store=store, namespace=NAMESPACE, embedder=HashingEmbedder(DIMENSION), config=config)


# -- base trees ---------------------------------------------------------------------------


def build_base_trees(sizes: list[int], cache: Path) -> dict[int, Path]:
    """JSONL backups of trees with (at least) each size in nodes, grown from one stream."""
    paths = {size: cache / f"tree-{DIMENSION}d-{size}-metadata.jsonl" for size in sizes}
    if all(path.exists() for path in paths.values()):
        return paths
    memory = memory_on(MemoryBackend())
    stream = notes(seed=1)
    started = time.perf_counter()
    for size in sorted(sizes):
        while memory.stats().nodes < size:
            batch = [next(stream) for _ in range(min(5_000, max(1, (size - memory.stats().nodes) // 2)))]
            memory.add_many([text for text, _ in batch], metadata=[metadata for _, metadata in batch], bulk=True)
        memory.export_jsonl(paths[size])
        print(f"built {memory.stats().nodes} nodes in {time.perf_counter() - started:.0f}s", flush=True)
    return paths


# -- measurements ---------------------------------------------------------------------------


def timed(action: Callable[[], Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    result = action()
    return time.perf_counter() - started, result


def measure_store(
    name: str, make_store: Callable[[], Store], backup: Path, inserts: int, repeats: int
) -> dict[str, Any]:
    store = make_store()
    target = memory_on(store)
    import_seconds, _ = timed(lambda: target.import_jsonl(backup))
    nodes = target.stats().nodes
    target.close()
    if not isinstance(store, MemoryBackend):
        store.close()

    settle = make_store()  # the default way's first open writes a segment if the last one lags: not timed
    memory_on(settle).close()
    if settle is not store:
        settle.close()
    reopen, read, cpu, dense_only, rows, rows_read, rows_cpu = [], [], [], [], [], [], []
    for _ in range(repeats):
        for config in (CONFIG, ROWS, DENSE_ONLY):  # alternating, so a change in load hits all alike
            fresh = store if isinstance(store, MemoryBackend) else make_store()
            reading: list[float] = []
            fresh.read_changes = _timing(fresh.read_changes, reading)  # type: ignore[method-assign]
            cpu_start = time.process_time()
            seconds, memory = timed(partial(memory_on, fresh, config))
            cpu_seconds = time.process_time() - cpu_start
            del fresh.read_changes
            assert memory.stats().nodes == nodes
            if config is CONFIG:
                reopen.append(seconds)
                read.append(sum(reading))
                cpu.append(cpu_seconds)
            elif config is ROWS:
                rows.append(seconds)
                rows_read.append(sum(reading))
                rows_cpu.append(cpu_seconds)
            else:
                dense_only.append(seconds)
            memory.close()
            if fresh is not store:
                fresh.close()
    build = [total - part for total, part in zip(rows, rows_read, strict=True)]

    working = store if isinstance(store, MemoryBackend) else make_store()
    memory = memory_on(working)
    stream = notes(seed=7)
    latencies = []
    for _ in range(inserts):
        text, metadata = next(stream)
        seconds, _ = timed(partial(memory.add, text, metadata=metadata))
        latencies.append(seconds)
    assert memory.check_integrity() == []
    memory.close()
    if working is not store:
        working.close()
    result = {
        "store": name,
        "nodes": nodes,
        "import_s": import_seconds,
        "reopen_s": statistics.median(reopen),
        "reopen_cpu_s": statistics.median(cpu),
        "reopen_rows_since_segment_s": statistics.median(read),
        "reopen_from_rows_s": statistics.median(rows),
        "reopen_from_rows_cpu_s": statistics.median(rows_cpu),
        "reopen_dense_only_s": statistics.median(dense_only),
        "reopen_read_rows_s": statistics.median(rows_read),
        "reopen_build_tree_and_index_s": statistics.median(build),
        "inserts_per_s": inserts / sum(latencies),
        "insert_median_ms": 1000 * statistics.median(latencies),
        "insert_p95_ms": 1000 * float(np.percentile(latencies, 95)),
    }
    print(json.dumps(result), flush=True)
    return result


def _timing(read: Callable[..., Any], seconds: list[float]) -> Callable[..., Any]:
    """``read`` that adds how long each call took to ``seconds``."""

    def timed_read(*args: Any) -> Any:
        started = time.perf_counter()
        try:
            return read(*args)
        finally:
            seconds.append(time.perf_counter() - started)

    return timed_read


def index_load_versus_rebuild(backup: Path, folder: Path, repeats: int) -> dict[str, Any]:
    """The vector index of a reopen: rebuilt from the stored embeddings, loaded from a
    FAISS file, or mapped from a segment (what a reopen does since issue 38)?"""
    from memtree.segment import Segment

    path = folder / "index-compare.db"
    store = SQLiteBackend(path)
    memory = memory_on(store, CONFIG.with_options(segment_min_nodes=1))  # a segment at any size
    memory.import_jsonl(backup)
    nodes = [node for node in memory.walk() if node.embedding is not None]
    memory.close()
    store.close()
    ids = [node.id for node in nodes]
    leaves = [node.is_leaf for node in nodes]
    times = [node.timestamp for node in nodes]
    matrix = np.stack([node.embedding for node in nodes])  # type: ignore[misc]
    index_file = folder / "index.faiss"
    flat = faiss.IndexFlatIP(DIMENSION)
    flat.add(matrix)
    faiss.write_index(flat, str(index_file))
    (segment_path,) = [p for p in Path(f"{path}-index").rglob("seg-*") if p.is_dir()][-1:]

    def mapped() -> VectorIndex:
        segment = Segment.open(segment_path)
        vectors = np.asarray(np.load(segment_path / "vectors.npy", mmap_mode="c"))
        return VectorIndex.mapped(
            DIMENSION,
            vectors,
            segment.arrays["is_leaf"],
            segment.arrays["timestamp"],
            segment.id_at,
            segment.row_of,
            None,
        )

    rebuild, load, mapping = [], [], []
    for _ in range(repeats):
        seconds, _ = timed(lambda: VectorIndex(DIMENSION).upsert(ids, matrix, leaves, times))
        rebuild.append(seconds)
        seconds, _ = timed(lambda: faiss.read_index(str(index_file)))
        load.append(seconds)
        seconds, _ = timed(mapped)
        mapping.append(seconds)
    return {
        "vectors": len(ids),
        "rebuild_from_embeddings_s": statistics.median(rebuild),
        "load_index_file_s": statistics.median(load),
        "map_segment_s": statistics.median(mapping),
        "index_file_mb": index_file.stat().st_size / 1e6,
        "segment_mb": sum(p.stat().st_size for p in segment_path.iterdir()) / 1e6,
    }


# -- the report -------------------------------------------------------------------------------


def uptime() -> str:
    """``uptime`` and the kernel's CPU pressure (share of time runnable tasks waited for a CPU)."""
    load = subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()
    try:
        pressure = Path("/proc/pressure/cpu").read_text().splitlines()[0]
    except OSError:
        return load
    return f"{load}; CPU pressure: {pressure}"


def machine(postgres_version: str | None) -> dict[str, str]:
    import sqlite3

    import psycopg

    cpu = "unknown"
    with open("/proc/cpuinfo", encoding="utf-8") as info:
        for line in info:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "cpu": f"{cpu}, {os.cpu_count()} cores",
        "python": platform.python_version(),
        "numpy": np.__version__,
        "faiss": faiss.__version__,
        "sqlite": sqlite3.sqlite_version,
        "postgresql": postgres_version or "not run",
        "psycopg": psycopg.__version__,
        "platform": platform.platform(),
    }


def write_report(out: Path, results: list[dict[str, Any]], index: dict[str, Any], info: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "storage.json").write_text(json.dumps({"machine": info, "results": results, "index": index}, indent=2))
    lines = [
        "# Store benchmark: insert throughput and reopen time",
        "",
        f"`{info['command']}` on {info['date']}.",
        "",
        f"Machine: {info['cpu']}; Python {info['python']}, NumPy {info['numpy']}, FAISS {info['faiss']}, "
        f"SQLite {info['sqlite']}, PostgreSQL {info['postgresql']} (local server, fsync on), "
        f"psycopg {info['psycopg']}.",
        "",
        "The machine is shared with other engineers' jobs; load (`uptime`) before and after:",
        "",
        f"- before: `{info['load_before']}`",
        f"- after: `{info['load_after']}`",
        "",
        f"Models out of the way: HashingEmbedder({DIMENSION}), extractive aggregator; otherwise the default "
        "config (θ0 auto, hybrid retrieval with `lexical_weight` 0.3, segments and the IVF index from 20,000 "
        "nodes). Every note carries metadata (conversation, speaker, session), as an application's would. "
        "Reopen = constructing a `MemTree` on the store, in the same process (median of the repeats, the three "
        "ways taking turns; CPU = this process's CPU time, which the other jobs on the machine inflate less "
        "than wall time). *Reopen* is the default: where the store keeps index files (SQLite; PostgreSQL "
        "given an `index_dir`) it maps the namespace's segment and reads the rows committed after it (the "
        "store's `read_changes` in that reopen: *rows since the segment*); elsewhere it reads every row. "
        "*From rows* = `segment_min_nodes=None, ann_min_nodes=None`: read every node and build the tree, the "
        "vector index and the BM25 index in memory, as every reopen did before issue 38 (reading rows = the "
        "store's `read_changes(namespace, 0)`, building = the rest). Without BM25 = the same from rows with "
        "`lexical_weight=0`. Rows are measured one after another while the load changed, so compare them with "
        "the load in mind. "
        "Inserts = notes added one by one on a tree of that size, "
        "each its own transaction; SQLite FULL syncs every commit to disk, NORMAL only at checkpoints "
        "(both survive a process crash; NORMAL may lose the last commits on power loss).",
        "",
        "| store | nodes | reopen (s) | reopen CPU (s) | of which rows since the segment (s) "
        "| from rows (s) | from rows CPU (s) | of which reading rows (s) | building tree + indexes (s) "
        "| from rows without BM25 (s) | inserts/s | insert median (ms) | insert p95 (ms) | JSONL import (s) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in results:
        lines.append(
            f"| {row['store']} | {row['nodes']:,} | {row['reopen_s']:.2f} | {row['reopen_cpu_s']:.2f} "
            f"| {row['reopen_rows_since_segment_s']:.2f} | {row['reopen_from_rows_s']:.2f} "
            f"| {row['reopen_from_rows_cpu_s']:.2f} | {row['reopen_read_rows_s']:.2f} "
            f"| {row['reopen_build_tree_and_index_s']:.2f} | {row['reopen_dense_only_s']:.2f} "
            f"| {row['inserts_per_s']:.0f} "
            f"| {row['insert_median_ms']:.1f} | {row['insert_p95_ms']:.1f} | {row['import_s']:.1f} |"
        )
    lines += [
        "",
        f"## The vector index at {index['vectors']:,} vectors: rebuild, load a file, or map a segment?",
        "",
        "| method | seconds |",
        "|---|---:|",
        "| rebuild from the stored float32 embeddings (`VectorIndex.upsert`, every reopen before issue 38) "
        f"| {index['rebuild_from_embeddings_s']:.3f} |",
        f"| load a persisted FAISS index file (`faiss.read_index`, {index['index_file_mb']:.0f} MB) "
        f"| {index['load_index_file_s']:.3f} |",
        f"| map a segment's embeddings (`Segment.open` + `VectorIndex.mapped`; segment {index['segment_mb']:.0f} MB) "
        f"| {index['map_segment_s']:.3f} |",
        "",
        "Before issue 38 a reopen rebuilt the index from the embeddings it read with every row: a persisted "
        "index would only have added a second read of the same bytes. Since then a reopen reads neither: the "
        "segment (memory-mapped index files, `memtree.segment`) holds the embeddings, the IVF lists, the BM25 "
        "arrays and every node field, and nodes are built when first read, so mapping costs what opening the "
        "files costs, whatever the size; the rows committed after the segment are read from the store.",
        "",
        "![insert throughput and reopen time](storage.png)",
        "",
    ]
    (out / "storage.md").write_text("\n".join(lines), encoding="utf-8")
    plot(out / "storage.png", results)


def plot(path: Path, results: list[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stores = list(dict.fromkeys(row["store"] for row in results))
    sizes = sorted({row["nodes"] for row in results})
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / len(sizes)
    for offset, size in enumerate(sizes):
        rows = {row["store"]: row for row in results if row["nodes"] == size}
        positions = [i + offset * width for i in range(len(stores))]
        left.bar(positions, [rows[s]["inserts_per_s"] if s in rows else 0 for s in stores], width, label=f"{size:,}")
        right.bar(positions, [rows[s]["reopen_s"] if s in rows else 0 for s in stores], width, label=f"{size:,}")
        right.scatter(
            positions, [rows[s]["reopen_from_rows_s"] if s in rows else 0 for s in stores], marker="_", color="black"
        )
    for axis, title in (
        (left, "inserts per second (higher is better)"),
        (right, "reopen seconds (bars: default; dashes: from rows)"),
    ):
        axis.set_xticks([i + width * (len(sizes) - 1) / 2 for i in range(len(stores))], stores, fontsize=8)
        axis.set_title(title)
        axis.legend(title="nodes")
    right.axhline(0.3, color="grey", linestyle="--", linewidth=1, label="goal (100k)")
    right.set_ylim(0, 1.15 * max(max(row["reopen_s"], row["reopen_from_rows_s"]) for row in results))
    right.legend(title="nodes")
    figure.tight_layout()
    figure.savefig(path, dpi=120)


@contextmanager
def postgres(enabled: bool) -> Iterator[PostgresServer | None]:
    if not enabled:
        yield None
        return
    try:
        server = PostgresServer(fsync=True).start()
    except PostgresUnavailable as error:
        print(f"PostgreSQL skipped: {error}", flush=True)
        yield None
        return
    try:
        yield server
    finally:
        server.stop()


def _same_store(store: Store) -> Store:
    """The in-memory store is its own backing: every reopen reads the same object."""
    return store


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--inserts", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "memtree-bench")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    args.cache.mkdir(parents=True, exist_ok=True)
    load_before = uptime()
    backups = build_base_trees(args.sizes, args.cache)
    results: list[dict[str, Any]] = []
    work = Path(tempfile.mkdtemp(prefix="memtree-bench-"))
    postgres_version = None
    try:
        with postgres(not args.no_postgres) as server:
            if server is not None:
                import psycopg

                with psycopg.connect(server.dsn(), autocommit=True) as connection:
                    version_row = connection.execute("SHOW server_version").fetchone()
                    postgres_version = version_row[0] if version_row is not None else "unknown"
            for size in args.sizes:
                backup = backups[size]
                shared = MemoryBackend()
                kinds: list[tuple[str, Callable[[], Store]]] = [("memory", partial(_same_store, shared))]
                for mode in ("FULL", "NORMAL"):
                    path = work / f"{size}-{mode}.db"
                    kinds.append((f"sqlite {mode}", partial(SQLiteBackend, path, synchronous=mode)))
                if server is not None:
                    dsn = server.create_database()
                    kinds.append(("postgresql", partial(PostgresBackend, dsn)))
                    dsn = server.create_database()
                    index_dir = work / f"pg-index-{size}"
                    kinds.append(("postgresql + index_dir", partial(PostgresBackend, dsn, index_dir=index_dir)))
                for name, make_store in kinds:
                    results.append(measure_store(name, make_store, backup, args.inserts, args.repeats))
        index = index_load_versus_rebuild(backups[max(args.sizes)], work, args.repeats)
        print(json.dumps(index), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    info = {**machine(postgres_version), "load_before": load_before, "load_after": uptime()}
    write_report(args.out, results, index, info)


if __name__ == "__main__":
    main()
