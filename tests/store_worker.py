"""A child process for the crash-safety and concurrency tests.

    python store_worker.py insert LOCATION NAMESPACE PREFIX COUNT
        adds COUNT notes and prints "<i> <leaf id>" after each add returns
        (the insert is then acknowledged: committed and durable).
    python store_worker.py watch LOCATION NAMESPACE EXPECT
        prints "ready", then re-reads the tree until it holds EXPECT leaves,
        checking the invariants of every version it sees; prints one JSON summary.

Models are HashingEmbedder and the extractive aggregator, so the store is what is
under test.
"""

from __future__ import annotations

import json
import random
import sys

from memtree import HashingEmbedder, MemTree, MemTreeConfig

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


def insert(location: str, namespace: str, prefix: str, count: int) -> None:
    with open_memory(location, namespace) as memory:
        for number in range(count):
            leaf_id = memory.add(note(prefix, number), metadata={"writer": prefix, "n": number})
            # One write per acknowledgement: with PYTHONUNBUFFERED set, print() would
            # write its pieces separately and a kill could land between them.
            sys.stdout.write(f"{number} {leaf_id}\n")
            sys.stdout.flush()


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
    else:
        raise SystemExit(f"unknown command {command!r}")
