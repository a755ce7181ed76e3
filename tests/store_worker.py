"""A child process for the crash-safety and concurrency tests.

    python store_worker.py insert LOCATION NAMESPACE PREFIX COUNT
        adds COUNT notes and prints "<i> <leaf id>" after each add returns
        (the insert is then acknowledged: committed and durable).
    python store_worker.py watch LOCATION NAMESPACE EXPECT
        prints "ready", then re-reads the tree until it holds EXPECT leaves,
        checking the invariants of every version it sees; prints one JSON summary.
    python store_worker.py forkserver LOCATION NAMESPACE
        imports memtree once, prints "ready", then serves commands on stdin:
        "insert PREFIX COUNT PORT" forks a writer that connects to 127.0.0.1:PORT
        and does what "insert" does, acknowledging on that connection (replies
        "pid N"); "reap N" waits for that writer and replies "status S" (S as
        Popen.returncode: -9 after SIGKILL). A writer then starts in milliseconds
        instead of the ~1 s an interpreter and its imports take, so the crash test
        can afford many kills. Nothing has run a model or a FAISS search in the
        server before it forks, and each writer opens its own store after the fork.

Models are HashingEmbedder and the extractive aggregator, so the store is what is
under test.
"""

from __future__ import annotations

import json
import os
import random
import socket
import sys
import traceback
from typing import TextIO

from memtree import HashingEmbedder, MemTree, MemTreeConfig
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


def open_memory(location: str, namespace: str) -> MemTree:
    return MemTree.open(location, namespace=namespace, embedder=HashingEmbedder(64), config=CONFIG)


def insert(location: str, namespace: str, prefix: str, count: int, out: TextIO = sys.stdout) -> None:
    with open_memory(location, namespace) as memory:
        for number in range(count):
            leaf_id = memory.add(note(prefix, number), metadata={"writer": prefix, "n": number})
            # One write per acknowledgement: with PYTHONUNBUFFERED set, print() would
            # write its pieces separately and a kill could land between them.
            out.write(f"{number} {leaf_id}\n")
            out.flush()


def forkserver(location: str, namespace: str) -> None:
    if is_postgres_dsn(location):  # imported lazily by PostgresStore; here once for every writer
        import psycopg  # noqa: F401
        import psycopg_pool  # noqa: F401
    print("ready", flush=True)
    for line in sys.stdin:
        command, *args = line.split()
        if command == "insert":
            prefix, count, port = args
            pid = os.fork()
            if pid == 0:
                _forked_insert(location, namespace, prefix, int(count), int(port))
            print(f"pid {pid}", flush=True)
        elif command == "reap":
            _, status = os.waitpid(int(args[0]), 0)
            print(f"status {_returncode(status)}", flush=True)
        else:
            raise SystemExit(f"unknown forkserver command {command!r}")


def _forked_insert(location: str, namespace: str, prefix: str, count: int, port: int) -> None:
    """The forked writer: never returns into the server's loop."""
    code = 1
    try:
        with socket.create_connection(("127.0.0.1", port)) as connection, connection.makefile("w") as out:
            insert(location, namespace, prefix, count, out)
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
        insert(location, namespace, rest[0], int(rest[1]))
    elif command == "watch":
        watch(location, namespace, int(rest[0]))
    elif command == "forkserver":
        forkserver(location, namespace)
    else:
        raise SystemExit(f"unknown command {command!r}")
