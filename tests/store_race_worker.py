"""A child process for the namespace-delete race test (tests/test_store_namespace_race.py).

    python store_race_worker.py LOCATION NAME ROUNDS [INDEX [HOW]]
        opens a ``MemTreeStore`` on LOCATION (a SQLite file or a PostgreSQL DSN) and,
        ROUNDS times, puts an item of its own under a new key in the shared namespace,
        reads it back and deletes it, with no pause anywhere. Prints one JSON line:
        operations done, puts acknowledged, and the keys whose acknowledged put the
        read right after it did not find (lost). INDEX ("index") indexes the items'
        text, so every put and delete also changes the tree. HOW ("sweep") removes
        each item by expiry instead: put with the shortest TTL, then ``sweep_ttl()``
        over and over until the sweep has deleted it.

Two of these in one namespace make the namespace empty over and over, each right
after the other one's put may have landed: the delete of the last item must never
take an acknowledged put with it.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from langchain_memtree import MemTreeStore
from memtree import HashingEmbedder, MemTree, MemTreeConfig

NAMESPACE = ("race",)
SHORTEST_TTL_MINUTES = 0.0005
"""30 ms: a swept item expires soon after its put (and its put is read back before)."""


def loop(store: MemTreeStore, name: str, rounds: int, how: str = "delete") -> dict[str, Any]:
    """Put, read back, delete (or let expire and sweep), ``rounds`` times; what was
    acknowledged and lost."""
    lost: list[str] = []
    operations = sweeps = 0
    for number in range(rounds):
        key = f"{name}-{number}"
        ttl = SHORTEST_TTL_MINUTES if how == "sweep" else None
        started = time.time()
        store.put(NAMESPACE, key, {"text": f"{name} wrote note number {number}."}, ttl=ttl)
        missing = store.get(NAMESPACE, key, refresh_ttl=False) is None
        if missing and (ttl is None or time.time() < started + ttl * 60):  # gone, not expired: nobody deletes it
            lost.append(key)
        operations += 2
        if how == "sweep":
            while store._records.get_records((*store.prefix, *NAMESPACE), "store_items", [key]):
                sweeps += store.sweep_ttl()  # an empty sweep is no operation on an item
            operations += 1
        else:
            store.delete(NAMESPACE, key)
            operations += 1
    return {
        "name": name,
        "how": how,
        "operations": operations,
        "acknowledged_puts": rounds,
        "swept": sweeps,
        "lost": lost,
    }


def open_store(memory: MemTree, indexed: bool) -> MemTreeStore:
    return MemTreeStore(memory, index={"fields": ["text"]} if indexed else None)


def main() -> None:
    location, name, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
    indexed = len(sys.argv) > 4 and sys.argv[4] == "index"
    how = sys.argv[5] if len(sys.argv) > 5 else "delete"
    config = MemTreeConfig(theta0=0.2)
    with MemTree.open(location, embedder=HashingEmbedder(64), config=config) as memory:
        store = open_store(memory, indexed)
        try:
            result = loop(store, name, rounds, how)
        finally:
            store.close()
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
