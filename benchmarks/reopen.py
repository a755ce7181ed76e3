"""Reopen time of a 100k-node SQLite memory, for comparing two checkouts on one file.

The file is made once (``--db``, kept between runs): the notes of
``benchmarks/storage.py`` (ten words, metadata), ``HashingEmbedder(384)``,
stored with ``add_many(bulk=True)`` until about 100k nodes. Each repeat opens a
new ``SQLiteBackend`` and ``MemTree`` on it (the default config: hybrid
retrieval, so the BM25 index is built too) and reports the seconds until the
constructor returns, until the BM25 index is ready (a hybrid query could run),
and the process CPU time meanwhile (all threads). Each repeat also times the floor
under any reopen that reads rows: SQLite's own ``fetchall`` of the same rows (the
store's query, no decoding, no tree, no index), in the same process, alternating.

    python benchmarks/reopen.py --root . --repeats 3
    python benchmarks/reopen.py --root /path/to/older/checkout --repeats 3   # the same file, older code
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import statistics
import sys
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--db", type=Path, default=Path("/tmp/memtree-reopen-100k.db"))
    parser.add_argument("--leaves", type=int, default=88_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    sys.path[:0] = [str(args.root), str(args.root / "benchmarks")]
    import storage  # the code under test: imported from --root

    from memtree import SQLiteBackend

    if not args.db.exists():
        notes = list(itertools.islice(storage.notes(seed=1), args.leaves))
        store = SQLiteBackend(args.db)
        memory = storage.memory_on(store)
        memory.add_many([text for text, _ in notes], metadata=[metadata for _, metadata in notes], bulk=True)
        memory.close()
        store.close()
    reopen, ready, cpu, floor = [], [], [], []
    nodes = 0
    for _ in range(args.repeats):
        gc.collect()
        floor.append(sqlite_read_seconds(args.db))
        gc.collect()
        store = SQLiteBackend(args.db)
        started, cpu_started = time.perf_counter(), time.process_time()
        memory = storage.memory_on(store)
        reopen.append(time.perf_counter() - started)
        _ = memory._state.lexical  # waits for the BM25 index where it is built on a thread
        ready.append(time.perf_counter() - started)
        cpu.append(time.process_time() - cpu_started)
        nodes = memory.stats().nodes
        memory.close()
        store.close()
    print(
        json.dumps(
            {
                "root": str(args.root),
                "nodes": nodes,
                "reopen_s": statistics.median(reopen),
                "bm25_ready_s": statistics.median(ready),
                "cpu_s": statistics.median(cpu),
                "sqlite_read_cpu_s": statistics.median(floor),
                "runs": {"reopen": reopen, "ready": ready, "cpu": cpu, "sqlite_read_cpu": floor},
            }
        )
    )


def sqlite_read_seconds(path: Path) -> float:
    """CPU seconds SQLite takes to hand Python every live node row of the file's
    namespace, by the query a reopen runs: what a reopen from rows cannot go below."""
    import sqlite3

    from memtree.store.sql import ALL_NODES

    connection = sqlite3.connect(path)
    try:
        (namespace,) = connection.execute("SELECT id FROM memtree_namespaces ORDER BY id LIMIT 1").fetchone()
        started = time.process_time()
        rows = connection.execute(ALL_NODES, (namespace,)).fetchall()
        seconds = time.process_time() - started
        del rows
        return seconds
    finally:
        connection.close()


if __name__ == "__main__":
    main()
