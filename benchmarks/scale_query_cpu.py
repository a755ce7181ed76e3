"""CPU time per ``retrieve`` on the scale benchmark's kept trees.

``memtree bench scale`` times queries by the wall clock, which on a shared machine
measures the wait for a core as much as the work: at a load average of 13-19 on 2
cores a hybrid query at 100k nodes took 148 ms of wall time for 5 ms of CPU. This
script times the same calls by the process's CPU time (``time.process_time``: every
thread, so the spare-core BM25 search counts), beside the wall time, on the files
``memtree bench scale`` left in ``--trees``:

    python benchmarks/scale_query_cpu.py --sizes 100000 1000000

Prints one JSON line per size (medians in milliseconds); writes nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from memtree_bench.scale import DEFAULT_TREES, open_memory
from memtree_bench.scale_data import Memories

WAYS: dict[str, dict[str, Any]] = {
    "hybrid": {},
    "dense": {"lexical_weight": 0.0},
    "hybrid_exact": {"exact": True},
}


def measure(path: Path, queries: int) -> dict[str, dict[str, float]]:
    """Median CPU and wall milliseconds per way (the exact way on half the queries: it is slow)."""
    questions = Memories().queries(queries + 5, seed=7)
    result: dict[str, dict[str, float]] = {}
    with open_memory(path) as memory:
        for warm in questions[:5]:  # the first reads fault the mapped pages in
            memory.retrieve(warm, k=10)
        for name, options in WAYS.items():
            cpu, wall = [], []
            for question in questions[5 : 5 + (queries // 2 if options.get("exact") else queries)]:
                started_cpu, started = time.process_time(), time.perf_counter()
                memory.retrieve(question, k=10, **options)
                cpu.append(time.process_time() - started_cpu)
                wall.append(time.perf_counter() - started)
            result[name] = {
                "cpu_p50_ms": statistics.median(cpu) * 1e3,
                "wall_p50_ms": statistics.median(wall) * 1e3,
                "queries": float(len(cpu)),
            }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--trees", type=Path, default=DEFAULT_TREES)
    parser.add_argument("--queries", type=int, default=40)
    args = parser.parse_args()
    for size in args.sizes:
        print(json.dumps({"nodes": size, **measure(args.trees / f"scale-{size}.db", args.queries)}), flush=True)


if __name__ == "__main__":
    main()
