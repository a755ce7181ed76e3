"""One reopen of a scale-benchmark memory, in the fresh process it must be timed in.

    python -m memtree_bench.scale_reopen PATH WAY QUERY

``WAY`` is ``segments`` (the default config: map the segment beside the file, read
the rows committed after it) or ``rows`` (``segment_min_nodes=None,
ann_min_nodes=None``: read every row, build the indexes in memory). Prints one JSON
line: seconds to import the library (numpy, FAISS, memtree: the same at any size;
with the benchmark's embedder made ready),
to open, to the first ``retrieve`` answered, the process CPU time meanwhile, and the
resident set size (bytes, from ``/proc/self/status``) before opening and after the
answer.
"""

from __future__ import annotations

import time

STARTED = time.perf_counter()

import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

import memtree.tree  # noqa: E402,F401 - timed as part of the imports
from memtree import MemTree, MemTreeConfig  # noqa: E402
from memtree_bench.scale_data import TopicEmbedder  # noqa: E402

WAYS = {"segments": MemTreeConfig(), "rows": MemTreeConfig(segment_min_nodes=None, ann_min_nodes=None)}


def resident_bytes() -> int:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def main() -> None:
    path, way, query = sys.argv[1:4]
    embedder = TopicEmbedder()
    embedder.embed([query])  # the benchmark's embedder makes its topic centres now, not inside the timing
    imported = time.perf_counter() - STARTED
    before = resident_bytes()
    cpu = time.process_time()
    started = time.perf_counter()
    memory = MemTree.open(path, embedder=embedder, config=WAYS[way])
    opened = time.perf_counter() - started
    hits = memory.retrieve(query, k=10)
    answered = time.perf_counter() - started
    result = {
        "imports": imported,
        "open": opened,
        "open_to_answer": answered,
        "cpu": time.process_time() - cpu,
        "rss_before": before,
        "rss": resident_bytes(),
        "results": len(hits),
        "segment_rows": memory._replica.index_facts().get("segment_rows", 0),
        "nodes": len(memory._replica.state.nodes) - 1,
    }
    print(json.dumps(result), flush=True)
    os._exit(0)  # no close: a reader writes nothing, and waiting for threads is not part of a reopen


if __name__ == "__main__":
    main()
