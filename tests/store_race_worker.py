"""A child process for the namespace-delete race test (tests/test_store_namespace_race.py).

    python store_race_worker.py LOCATION NAME ROUNDS [INDEX]
        opens a ``MemTreeStore`` on LOCATION (a SQLite file or a PostgreSQL DSN) and,
        ROUNDS times, puts an item of its own under a new key in the shared namespace,
        reads it back and deletes it, with no pause anywhere. Prints one JSON line:
        operations done, puts acknowledged, and the keys whose acknowledged put the
        read right after it did not find (lost). INDEX ("index") indexes the items'
        text, so every put and delete also changes the tree.

Two of these in one namespace make the namespace empty over and over, each right
after the other one's put may have landed: the delete of the last item must never
take an acknowledged put with it.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from langchain_memtree import MemTreeStore
from memtree import HashingEmbedder, MemTree, MemTreeConfig

NAMESPACE = ("race",)


def loop(store: MemTreeStore, name: str, rounds: int) -> dict[str, Any]:
    """Put, read back, delete, ``rounds`` times; what was acknowledged and lost."""
    lost: list[str] = []
    for number in range(rounds):
        key = f"{name}-{number}"
        store.put(NAMESPACE, key, {"text": f"{name} wrote note number {number}."})
        if store.get(NAMESPACE, key) is None:  # nobody else deletes this key
            lost.append(key)
        store.delete(NAMESPACE, key)
    return {"name": name, "operations": 3 * rounds, "acknowledged_puts": rounds, "lost": lost}


def open_store(memory: MemTree, indexed: bool) -> MemTreeStore:
    return MemTreeStore(memory, index={"fields": ["text"]} if indexed else None)


def main() -> None:
    location, name, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
    indexed = len(sys.argv) > 4 and sys.argv[4] == "index"
    config = MemTreeConfig(theta0=0.2)
    with MemTree.open(location, embedder=HashingEmbedder(64), config=config) as memory:
        store = open_store(memory, indexed)
        try:
            result = loop(store, name, rounds)
        finally:
            store.close()
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
