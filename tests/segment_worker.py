"""A child process for the segment (index file) tests: small thresholds, so a few
hundred notes already make segments and an IVF index.

    python segment_worker.py insert LOCATION INDEX_DIR PREFIX COUNT
        adds COUNT notes (metadata ``writer`` and ``n``, event time ``n``) and prints
        "<n> <leaf id>" after each add returns (acknowledged: committed, durable).
    python segment_worker.py watch LOCATION INDEX_DIR EXPECT
        prints "ready", then queries with filters until the memory holds EXPECT
        leaves; prints one JSON summary: leaf counts seen, and every result that
        broke its filter (none may).
    python segment_worker.py kill-writing LOCATION INDEX_DIR STEP
        opens the memory, adds notes until a segment is due, and SIGKILLs itself at
        step STEP of writing it (each file written is a step; odd steps die halfway
        through a file; step 0 dies after the new segment is renamed into place,
        before the older ones are removed).

``INDEX_DIR`` is where a PostgreSQL store keeps its index files (ignored for SQLite,
which keeps them beside the database file).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any

from memtree import HashingEmbedder, MemTree, MemTreeConfig, PostgresBackend
from memtree.store.location import is_postgres_dsn

CONFIG = MemTreeConfig(
    theta0=0.3, ann_min_nodes=60, ann_probe_share=0.2, ann_min_probes=2, segment_min_nodes=60, segment_share=0.2
)
NAMESPACE = "shared"
WORDS = ["garden", "tomato", "river", "bicycle", "violin", "passport", "coffee", "mountain", "lantern", "harbor"]


def note(prefix: str, number: int) -> str:
    words = " ".join(WORDS[(number * 7 + i * 3 + len(prefix)) % len(WORDS)] for i in range(5))
    return f"{prefix} note {number} mentions {words}."


def open_memory(location: str, index_dir: str) -> MemTree:
    embedder = HashingEmbedder(32)
    if is_postgres_dsn(location):
        store = PostgresBackend(location, index_dir=index_dir)
        memory = MemTree(store=store, namespace=NAMESPACE, embedder=embedder, config=CONFIG)
        memory._owns_store = True  # closed with the memory
        return memory
    return MemTree.open(location, namespace=NAMESPACE, embedder=embedder, config=CONFIG)


def insert(location: str, index_dir: str, prefix: str, count: int) -> None:
    with open_memory(location, index_dir) as memory:
        for number in range(count):
            leaf_id = memory.add(
                note(prefix, number), metadata={"writer": prefix, "n": number}, timestamp=float(number)
            )
            sys.stdout.write(f"{number} {leaf_id}\n")
            sys.stdout.flush()


def broken(found: Any, *, writer: str | None, window: tuple[float, float] | None, leaves_only: bool) -> bool:
    if (leaves_only or writer is not None) and not found.is_leaf:
        return True
    if writer is not None and found.metadata.get("writer") != writer:
        return True
    return window is not None and (found.timestamp is None or not window[0] <= found.timestamp <= window[1])


def watch(location: str, index_dir: str, expect: int) -> None:
    counts: list[int] = []
    violations: list[str] = []
    queries = 0
    with open_memory(location, index_dir) as memory:
        print("ready", flush=True)
        while True:
            memory.refresh()
            counts.append(len(memory))
            for number, text in enumerate(("garden violin", "coffee near the harbor", "mountain lantern river")):
                writer = ("w0", "w1", None)[number]
                window = (5.0, 40.0) if number == 1 else None
                leaves_only = number == 2
                for found in memory.retrieve(
                    text, k=6, where={"writer": writer} if writer else None, time_range=window, leaves_only=leaves_only
                ):
                    if broken(found, writer=writer, window=window, leaves_only=leaves_only):
                        violations.append(f"{text!r}: {found.id} {found.metadata} {found.timestamp}")
                queries += 1
            if counts[-1] >= expect or len(violations) > 20:
                break
        problems = memory.check_integrity()
        facts = memory._replica.index_facts()
    print(
        json.dumps(
            {
                "counts": counts,
                "violations": violations,
                "queries": queries,
                "problems": problems,
                "approximate": bool(facts.get("ivf_lists")),
            }
        ),
        flush=True,
    )


def kill_writing(location: str, index_dir: str, step: int) -> None:
    """Die (SIGKILL, as a power cut or the OOM killer would) inside a segment write."""
    from memtree import segment_writer as segment

    calls = {"files": 0}
    save, save_rows = segment._Writer.save, segment._Writer.save_rows

    def dying(original: Any) -> Any:
        def write(self: Any, name: str, *args: Any) -> None:
            calls["files"] += 1
            if calls["files"] * 2 == step + 1:  # an odd step: half a file on disk, then the kill
                path = self.folder / f"{name}.npy"
                path.write_bytes(b"\x93NUMPY partial")
                os.kill(os.getpid(), signal.SIGKILL)
            original(self, name, *args)
            if calls["files"] * 2 == step:
                os.kill(os.getpid(), signal.SIGKILL)

        return write

    segment._Writer.save = dying(save)  # type: ignore[method-assign]
    segment._Writer.save_rows = dying(save_rows)  # type: ignore[method-assign]
    if step == 0:  # die after the new segment is in place, before the old ones are removed
        from memtree import checkpoint

        checkpoint.SegmentFolder.clean = lambda self, keep: os.kill(os.getpid(), signal.SIGKILL)  # type: ignore[method-assign]
    memory = open_memory(location, index_dir)
    number = 0
    while True:  # the background writer kills the process once a segment is due
        memory.add(note("k", number), metadata={"writer": "k", "n": number}, timestamp=float(number))
        number += 1
        if number > 2000:
            raise SystemExit("no segment was written")


if __name__ == "__main__":
    command, location, index_dir, *rest = sys.argv[1:]
    if command == "insert":
        insert(location, index_dir, rest[0], int(rest[1]))
    elif command == "watch":
        watch(location, index_dir, int(rest[0]))
    elif command == "kill-writing":
        kill_writing(location, index_dir, int(rest[0]))
    else:
        raise SystemExit(f"unknown command {command!r}")
