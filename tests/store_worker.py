"""A child process for the crash-safety and concurrency tests.

    python store_worker.py insert LOCATION NAMESPACE PREFIX COUNT [MODE]
        adds COUNT notes and prints "<i> <leaf id>" after each add returns
        (the insert is then acknowledged: committed and durable). MODE is
        "eager" (the default: each add writes its summaries), "deferred" (every add
        inside one ``memory.deferred()`` block, whose flush a kill never reaches) or
        "slow" (a summary writer that takes a few milliseconds, as a model does, and
        fails every fifth call, leaving summaries stale).
    python store_worker.py watch LOCATION NAMESPACE EXPECT
        prints "ready", then re-reads the tree until it holds EXPECT leaves,
        checking the invariants of every version it sees; prints one JSON summary.
    python store_worker.py forkserver LOCATION NAMESPACE
        imports memtree once, prints "ready", then serves commands on stdin:
        "insert PREFIX COUNT PORT MODE" forks a writer that connects to 127.0.0.1:PORT
        and does what "insert" does, acknowledging on that connection (replies
        "pid N"); "reap N" waits for that writer and replies "status S" (S as
        Popen.returncode: -9 after SIGKILL). A writer then starts in milliseconds
        instead of the ~1 s an interpreter and its imports take, so the crash test
        can afford many kills. Nothing has run a model or a FAISS search in the
        server before it forks, and each writer opens its own store after the fork.

Models are HashingEmbedder and the extractive aggregator (slowed down and failing
now and then in "slow" mode), so the store is what is under test.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import socket
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from typing import TextIO

from memtree import Aggregator, ExtractiveAggregator, HashingEmbedder, MemTree, MemTreeConfig
from memtree.node import Vector
from memtree.store.location import is_postgres_dsn

VOCABULARY = [
    "garden",
    "tomato",
    "river",
    "bicycle",
    "violin",
    "passport",
    "coffee",
    "mountain",
    "museum",
    "recipe",
    "doctor",
    "winter",
    "birthday",
    "kitten",
    "laptop",
    "train",
    "ocean",
    "piano",
    "novel",
    "soccer",
    "market",
    "lantern",
    "harbor",
    "pepper",
    "meadow",
    "castle",
    "rocket",
    "pillow",
    "thunder",
    "candle",
]
CONFIG = MemTreeConfig(theta0=0.3)


def note(prefix: str, number: int) -> str:
    """A deterministic, unique text with a few topic words, so the tree gets depth."""
    rng = random.Random(f"{prefix}-{number}")
    words = " ".join(rng.choice(VOCABULARY) for _ in range(6))
    return f"{prefix} note {number} mentions {words}."


MODES = ("eager", "deferred", "slow")


class SlowFlakyAggregator(Aggregator):
    """Extractive summaries that take a few milliseconds, as a model's round trip
    does (so a kill often lands while summaries are being written), and fail on
    every fifth call, as a model that times out does (so summaries go stale)."""

    def __init__(self, embedder: HashingEmbedder) -> None:
        self.extractive = ExtractiveAggregator(embedder)
        self.calls = 0
        self.lock = threading.Lock()

    def aggregate(self, summary: str, new_texts: Sequence[str], count: int, *, centroid: Vector | None = None) -> str:
        with self.lock:
            self.calls += 1
            number = self.calls
        time.sleep(0.004)  # a slow model, not a timing assumption: nothing waits for it
        if number % 5 == 0:
            raise ConnectionError("the model did not answer (every fifth call fails)")
        return self.extractive.aggregate(summary, new_texts, count, centroid=centroid)


def open_memory(location: str, namespace: str, mode: str = "eager") -> MemTree:
    embedder = HashingEmbedder(64)
    aggregator = SlowFlakyAggregator(embedder) if mode == "slow" else None
    return MemTree.open(location, namespace=namespace, embedder=embedder, aggregator=aggregator, config=CONFIG)


def insert(
    location: str, namespace: str, prefix: str, count: int, out: TextIO = sys.stdout, mode: str = "eager"
) -> None:
    if mode not in MODES:
        raise SystemExit(f"unknown insert mode {mode!r}; one of {MODES}")
    with open_memory(location, namespace, mode) as memory:
        block = memory.deferred() if mode == "deferred" else contextlib.nullcontext()
        with block:
            for number in range(count):
                leaf_id = memory.add(note(prefix, number), metadata={"writer": prefix, "n": number})
                # One write per acknowledgement: with PYTHONUNBUFFERED set, print() would
                # write its pieces separately and a kill could land between them.
                out.write(f"{number} {leaf_id}\n")
                out.flush()


def forkserver(location: str, namespace: str) -> None:
    if is_postgres_dsn(location):  # imported lazily by PostgresBackend; here once for every writer
        import psycopg  # noqa: F401
        import psycopg_pool  # noqa: F401
    print("ready", flush=True)
    for line in sys.stdin:
        command, *args = line.split()
        if command == "insert":
            prefix, count, port, *mode = args
            pid = os.fork()
            if pid == 0:
                _forked_insert(location, namespace, prefix, int(count), int(port), *mode)
            print(f"pid {pid}", flush=True)
        elif command == "reap":
            _, status = os.waitpid(int(args[0]), 0)
            print(f"status {_returncode(status)}", flush=True)
        else:
            raise SystemExit(f"unknown forkserver command {command!r}")


def _forked_insert(location: str, namespace: str, prefix: str, count: int, port: int, mode: str = "eager") -> None:
    """The forked writer: never returns into the server's loop."""
    code = 1
    try:
        with socket.create_connection(("127.0.0.1", port)) as connection, connection.makefile("w") as out:
            insert(location, namespace, prefix, count, out, mode)
        code = 0
    except BaseException:  # noqa: BLE001 - report anything, then leave by os._exit below
        traceback.print_exc()
        sys.stderr.flush()
    finally:
        os._exit(code)


def _returncode(status: int) -> int:
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def watch(location: str, namespace: str, expect: int) -> None:
    counts: list[int] = []
    problems: list[str] = []
    with open_memory(location, namespace) as memory:
        print("ready", flush=True)
        while True:
            memory.refresh()
            found = memory.check_integrity()
            if found:
                problems.extend(found[:5])
            counts.append(len(memory))
            if counts[-1] >= expect or len(problems) > 20:
                break
    print(json.dumps({"counts": counts, "problems": problems}), flush=True)


if __name__ == "__main__":
    command, location, namespace, *rest = sys.argv[1:]
    if command == "insert":
        insert(location, namespace, rest[0], int(rest[1]), mode=rest[2] if len(rest) > 2 else "eager")
    elif command == "watch":
        watch(location, namespace, int(rest[0]))
    elif command == "forkserver":
        forkserver(location, namespace)
    else:
        raise SystemExit(f"unknown command {command!r}")
