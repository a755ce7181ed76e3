"""An acknowledged put survives a concurrent delete of the namespace's last item (issue 39 row 1).

Before, ``MemTreeStore.delete`` (and the TTL sweep, which deletes through it) checked
that the namespace held no item and then deleted the namespace, with nothing holding
the two together: another writer's put acknowledged in between was wiped. Now a
namespace is never deleted implicitly (an empty one is simply not listed), so there
is no window. Two writers loop put / get / delete in one namespace with no pause
anywhere, about 2,000 operations per backend; the code before this change lost
acknowledged puts in every such run (see the module docstring of
``tests/store_race_worker.py``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from store_race_worker import NAMESPACE, loop, open_store
from test_crash_safety import ENV

from memtree import HashingEmbedder, MemoryBackend, MemTree, MemTreeConfig

WORKER = str(Path(__file__).with_name("store_race_worker.py"))
ROUNDS = 350
"""Put / get / delete rounds per writer: two writers make about 2,100 operations."""


def race_in_processes(location: str, indexed: bool) -> list[dict[str, Any]]:
    extra = ["index"] if indexed else []
    writers = [
        subprocess.Popen(
            [sys.executable, WORKER, location, f"w{i}", str(ROUNDS), *extra],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=ENV,
        )
        for i in range(2)
    ]
    results = []
    for writer in writers:
        out, errors = writer.communicate(timeout=900)
        assert writer.returncode == 0, errors
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def race_in_threads(backend: MemoryBackend, indexed: bool) -> list[dict[str, Any]]:
    """Two stores on one in-memory backend, in two threads (each store has its own
    in-process lock, as two processes would)."""
    results: list[dict[str, Any]] = []
    failures: list[BaseException] = []

    def run(name: str) -> None:
        memory = MemTree(store=backend, embedder=HashingEmbedder(64), config=MemTreeConfig(theta0=0.2))
        store = open_store(memory, indexed)
        try:
            results.append(loop(store, name, ROUNDS))
        except BaseException as error:  # noqa: BLE001 - reported by the test
            failures.append(error)
        finally:
            store.close()

    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # threads take turns often, as two processes would run at once
    try:
        threads = [threading.Thread(target=run, args=(f"w{i}",)) for i in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(previous)
    assert not failures, failures
    return results


def check(results: list[dict[str, Any]], location: str | MemoryBackend) -> None:
    assert sum(result["operations"] for result in results) >= 2000
    assert [key for result in results for key in result["lost"]] == []
    embedder = HashingEmbedder(64)
    if isinstance(location, str):
        memory = MemTree.open(location, embedder=embedder)
    else:
        memory = MemTree(store=location, embedder=embedder)
    with memory:
        store = open_store(memory, True)
        assert store.search(NAMESPACE, limit=10) == []  # every item was deleted by its writer
        assert store.list_namespaces() == []  # and an empty namespace is not listed
        store.close()


@pytest.mark.slow
@pytest.mark.parametrize("indexed", [False, True], ids=["key-value", "indexed"])
def test_two_sqlite_writers_lose_no_acknowledged_put(tmp_path: Path, indexed: bool) -> None:
    location = str(tmp_path / "race.db")
    check(race_in_processes(location, indexed), location)


@pytest.mark.slow
def test_two_postgres_writers_lose_no_acknowledged_put(postgres_dsn: str) -> None:
    check(race_in_processes(postgres_dsn, indexed=False), postgres_dsn)


def test_two_writers_on_the_memory_store_lose_no_acknowledged_put() -> None:
    backend = MemoryBackend()
    check(race_in_threads(backend, indexed=False), backend)
