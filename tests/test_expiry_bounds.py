"""Every time to live is checked once, with the bounds of ``expires_at`` (issue 39 rows 4-6, 9).

One check (:func:`memtree.inputs.ttl_seconds`) serves ``add``, ``add_many``,
``replace_source``, ``set_expiry``, ``MemTreeConfig(default_ttl=)``, the LangGraph
store's ``ttl`` and its ``TTLConfig``: a TTL whose expiry would fall after the year
9999 (which no ``expires_at`` may, and which a backup could not restore) or so
short that the memory would have expired before it is stored (``1e-300``, which
added to the clock does not move it) is refused like zero, naming the parameter and
what is allowed; nothing is stored or changed.
"""

from __future__ import annotations

import io
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from langchain_memtree import MemTreeStore
from memtree import HashingEmbedder, MemTree, MemTreeConfig

TOO_LONG = [1e300, timedelta.max, 10**400, 3e11]  # 3e11 s: about 9,500 years from now
TOO_SHORT = [1e-300, 1e-9, 0.0009]
CASES = [("memory", ttl) for ttl in TOO_LONG + TOO_SHORT] + [
    (backend, ttl)
    for backend in ("sqlite", "postgres")
    for ttl in (1e300, 1e-300)  # same check on every store
]


def memory_on(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> MemTree:
    embedder = HashingEmbedder(64)
    if backend == "memory":
        return MemTree(embedder=embedder)
    location = str(tmp_path / "m.db") if backend == "sqlite" else request.getfixturevalue("postgres_dsn")
    return MemTree.open(location, embedder=embedder)


def every_ttl_entry(memory: MemTree, ttl: Any, leaf: str) -> list[tuple[str, BaseException | None]]:
    """Pass ``ttl`` to each engine entry point; what each raised (``None``: accepted)."""
    calls = {
        "add": lambda: memory.add("Alice keeps bees.", ttl=ttl),
        "add_many": lambda: memory.add_many(["Bob keeps goats.", "Carol keeps hens."], ttl=ttl),
        "replace_source": lambda: memory.replace_source("note", ["Alice keeps wasps."], ttl=ttl),
        "set_expiry": lambda: memory.set_expiry([leaf], ttl=ttl),
        "MemTreeConfig(default_ttl=)": lambda: MemTreeConfig(default_ttl=ttl),
    }
    outcomes: list[tuple[str, BaseException | None]] = []
    for name, call in calls.items():
        try:
            call()
        except (TypeError, ValueError) as error:
            outcomes.append((name, error))
        else:
            outcomes.append((name, None))
    return outcomes


@pytest.mark.parametrize(("backend", "ttl"), CASES, ids=[f"{backend}-{ttl!r:.20}" for backend, ttl in CASES])
def test_a_ttl_out_of_bounds_is_refused_everywhere_and_changes_nothing(
    backend: str, ttl: Any, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    with memory_on(backend, tmp_path, request) as memory:
        leaf = memory.replace_source("note", ["Alice keeps bees in her garden."])[0]
        before = sorted((node.id, node.text, node.expires_at) for node in memory.walk())
        for name, error in every_ttl_entry(memory, ttl, leaf):
            assert isinstance(error, ValueError), f"{name} accepted ttl={ttl!r}"
            assert "ttl" in str(error) and "from 0.001 to" in str(error), (name, str(error))
            assert ("too long" in str(error)) == (ttl in TOO_LONG), (name, str(error))
        assert sorted((node.id, node.text, node.expires_at) for node in memory.walk()) == before
        assert memory.get(leaf).text == "Alice keeps bees in her garden."  # replace_source made it vanish before


def test_the_longest_ttl_accepted_backs_up_and_restores() -> None:
    memory = MemTree(embedder=HashingEmbedder(64), config=MemTreeConfig(default_ttl=timedelta(days=365 * 7000)))
    leaf = memory.add("Alice will remember this for seven thousand years.")
    memory.add("Bob keeps a diary.", ttl=timedelta(days=365 * 7500))
    backup = io.StringIO()
    memory.export_jsonl(backup)
    restored = MemTree(embedder=HashingEmbedder(64), namespace="restored")
    assert restored.import_jsonl(io.StringIO(backup.getvalue())) == len(list(memory.walk()))
    assert restored.get(leaf).expires_at == memory.get(leaf).expires_at


def test_a_ttl_of_10_to_the_400_names_the_parameter() -> None:
    memory = MemTree(embedder=HashingEmbedder(64))
    with pytest.raises(ValueError, match=r"ttl 1000000000000000000\d*… is too long"):
        memory.add("Alice keeps bees.", ttl=10**400)
    with pytest.raises(ValueError, match=r"default_ttl .* is too long"):
        MemTreeConfig(default_ttl=10**400)


@pytest.mark.parametrize("minutes", [1e300, 10**400, 1e-300, 1e-7])
def test_the_store_and_its_ttl_config_use_the_same_bounds(minutes: Any) -> None:
    store = MemTreeStore(MemTree(embedder=HashingEmbedder(64)), index={"fields": ["text"]})
    store.put(("notes",), "bees", {"text": "Alice keeps bees."})
    with pytest.raises(ValueError, match=r"ttl .*(too long|too short).* number of minutes from"):
        store.put(("notes",), "bees", {"text": "Alice keeps wasps."}, ttl=minutes)
    item = store.get(("notes",), "bees")
    assert item is not None and item.value == {"text": "Alice keeps bees."}
    with pytest.raises(ValueError, match=r"TTLConfig default_ttl .*(too long|too short)"):
        MemTreeStore(MemTree(embedder=HashingEmbedder(64)), ttl={"default_ttl": minutes})


@pytest.mark.parametrize("minutes", [1e300, 10**400, 1e-300, 0.001])
def test_a_sweep_interval_out_of_bounds_is_refused_in_the_config(minutes: Any) -> None:
    before = {thread.name for thread in threading.enumerate()}
    with pytest.raises(ValueError, match=r"TTLConfig sweep_interval_minutes .* from 0.0166667 to 525600"):
        MemTreeStore(MemTree(embedder=HashingEmbedder(64)), ttl={"sweep_interval_minutes": minutes})
    store = MemTreeStore(MemTree(embedder=HashingEmbedder(64)))
    with pytest.raises(ValueError, match="sweep_interval_minutes"):
        store.start_ttl_sweeper(minutes)
    assert not store._sweeper.running
    assert {thread.name for thread in threading.enumerate()} - before == set()
    store.close()


def test_a_sweeper_at_the_longest_interval_waits_and_stops() -> None:
    store = MemTreeStore(MemTree(embedder=HashingEmbedder(64)), ttl={"sweep_interval_minutes": 525600})
    assert store._sweeper.running  # before, 1e300 killed the thread with OverflowError at once
    assert store.stop_ttl_sweeper(timeout=10)
    store.close()
