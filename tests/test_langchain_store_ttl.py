"""MemTreeStore expiry with LangGraph's semantics: ``TTLConfig`` (``default_ttl`` in
minutes, ``refresh_on_read``, ``sweep_interval_minutes``) and ``put(..., ttl=...)``.

An expired item is invisible to ``get``, ``search`` (listing and semantic) and
``list_namespaces`` at once, in this process and in another one (SQLite and
PostgreSQL); its leaves vanish from the tree behind the namespace at the same
moment; ``sweep_ttl`` deletes it. Time is a controlled clock, except across
processes, where the test waits until the real clock has passed the expiry.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from langgraph.store.base import GetOp, PutOp, SearchOp
from lc_fakes import hashing_memory

from langchain_memtree import MemTreeStore

ROOT = Path(__file__).resolve().parent.parent


class Clock:
    """``time.time`` under the test's control."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.now = time.time()
        monkeypatch.setattr(time, "time", lambda: self.now)

    def advance(self, minutes: float) -> None:
        self.now += minutes * 60


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    return Clock(monkeypatch)


def indexed(**options: Any) -> MemTreeStore:
    return MemTreeStore(hashing_memory(), index={"fields": ["text"]}, aggregation="eager", **options)


def test_an_expired_item_is_invisible_to_every_read(clock: Clock) -> None:
    store = indexed()
    store.put(("mem", "maya"), "dog", {"text": "Maya's greyhound Pepper fears bicycles."}, ttl=10)
    store.put(("mem", "maya"), "job", {"text": "Maya works night shifts as a nurse."})
    store.put(("mem", "leo"), "food", {"text": "Leo loves ramen with yuzu."}, ttl=10)
    assert store.get(("mem", "maya"), "dog") is not None
    clock.advance(11)
    assert store.get(("mem", "maya"), "dog") is None
    assert [item.key for item in store.search(("mem",))] == ["job"]
    assert [item.key for item in store.search(("mem",), query="Pepper bicycles greyhound")] == ["job"]
    assert store.list_namespaces() == [("mem", "maya")]  # leo's only item expired
    tree = store.tree(("mem", "maya"))
    assert [leaf.text for leaf in tree.leaves()] == ["Maya works night shifts as a nurse."]
    assert all("Pepper" not in hit.text for hit in tree.retrieve("Pepper bicycles", k=5, leaves_only=True))
    assert store.batch([GetOp(("mem", "maya"), "dog"), SearchOp(("mem", "leo"))]) == [None, []]


def test_default_ttl_refresh_on_read_and_explicit_none(clock: Clock) -> None:
    store = indexed(ttl={"default_ttl": 10, "refresh_on_read": True})
    store.put(("n",), "read", {"text": "read often"})
    store.put(("n",), "idle", {"text": "never read"})
    store.put(("n",), "kept", {"text": "kept for ever"}, ttl=None)  # an explicit None: no expiry
    clock.advance(8)
    assert store.get(("n",), "read") is not None  # extends it by its TTL from now
    clock.advance(8)  # 16 minutes after the puts, 8 after the read
    assert store.get(("n",), "idle") is None
    assert store.get(("n",), "read", refresh_ttl=False) is not None
    assert [item.key for item in store.search(("n",))] == ["read", "kept"]  # a search refreshes too
    clock.advance(9)
    assert store.get(("n",), "read") is not None
    clock.advance(11)
    assert store.get(("n",), "read") is None and store.get(("n",), "kept") is not None
    leaf = store.tree(("n",)).find(source_id="kept")[0]
    assert store.tree(("n",)).get(leaf).expires_at is None


def test_refresh_on_read_off_lets_reads_pass_the_expiry_by(clock: Clock) -> None:
    store = indexed(ttl={"default_ttl": 10, "refresh_on_read": False})
    store.put(("n",), "k", {"text": "short lived"})
    clock.advance(8)
    assert store.get(("n",), "k") is not None and store.search(("n",), query="short lived")
    clock.advance(3)
    assert store.get(("n",), "k") is None and store.search(("n",), query="short lived") == []


def test_a_refresh_moves_the_leaves_expiry_with_the_item(clock: Clock) -> None:
    store = indexed(ttl={"default_ttl": 10})
    store.put(("n",), "k", {"text": "Pepper fears bicycles."})
    tree = store.tree(("n",))
    [leaf] = tree.find(source_id="k")
    first = tree.get(leaf).expires_at
    clock.advance(5)
    store.get(("n",), "k")
    assert tree.get(leaf).expires_at == pytest.approx(first + 300)  # type: ignore[operator]
    store.put(("n",), "k", {"text": "Pepper fears bicycles and buses."}, ttl=60)  # a put sets its own TTL
    assert tree.get(leaf).expires_at == pytest.approx(clock.now + 3600)


def test_sweep_deletes_records_and_leaves_and_rewrites_summaries(clock: Clock) -> None:
    store = indexed()
    for i in range(4):
        store.put(("n",), f"short{i}", {"text": f"short lived note number {i} about gardens"}, ttl=1)
    store.put(("n",), "long", {"text": "a note about gardens kept for ever"})
    clock.advance(2)
    assert store.sweep_ttl() == 4
    tree = store.tree(("n",))
    assert tree.stats().leaves == 1 and tree.check_integrity() == []
    assert store.memory.store.get_records((*store.prefix, "n"), "store_items").keys() == {"long"}
    assert store.sweep_ttl() == 0


@pytest.mark.parametrize(
    ("ttl", "error", "message"),
    [
        (0, ValueError, "ttl must be a positive number of minutes"),
        (-1, ValueError, "ttl must be a positive number of minutes"),
        (math.nan, ValueError, "ttl is NaN"),
        (math.inf, ValueError, "ttl is infinite"),
        ("5", TypeError, "ttl must be a number of minutes"),
    ],
)
def test_a_bad_ttl_is_refused_and_nothing_is_stored(ttl: object, error: type, message: str) -> None:
    store = indexed()
    with pytest.raises(error, match=message):
        store.put(("n",), "k", {"text": "x"}, ttl=ttl)  # type: ignore[arg-type]
    with pytest.raises(error, match=message):  # a batch checks every op before running any
        store.batch([PutOp(("n",), "ok", {"text": "y"}), PutOp(("n",), "k", {"text": "x"}, ttl=ttl)])  # type: ignore[arg-type]
    assert store.get(("n",), "k") is None and store.get(("n",), "ok") is None and store.list_namespaces() == []


def test_a_bad_ttl_config_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="TTLConfig default_ttl must be a positive number"):
        indexed(ttl={"default_ttl": 0})
    with pytest.raises(ValueError, match=r"unknown TTLConfig key\(s\) 'default'; use default_ttl, refresh_on_read"):
        indexed(ttl={"default": 5})  # type: ignore[typeddict-unknown-key]
    with pytest.raises(TypeError, match="refresh_on_read must be True or False"):
        indexed(ttl={"refresh_on_read": "yes"})  # type: ignore[typeddict-item]
    with pytest.raises(ValueError, match="omit_expired"):
        indexed(ttl={"omit_expired": False})
    with (
        pytest.raises(ValueError, match="default_ttl"),
        MemTreeStore.from_conn_string(tmp_path / "never.db", ttl={"default_ttl": -1}),
    ):
        pass
    assert not (tmp_path / "never.db").exists()


def test_the_sweeper_thread_starts_with_an_interval_and_stops_on_close() -> None:
    store = indexed(ttl={"default_ttl": 10, "sweep_interval_minutes": 5})
    assert store._sweeper.running
    store.close()
    assert not store._sweeper.running
    other = indexed()
    other.start_ttl_sweeper(1)
    assert other._sweeper.running and other.stop_ttl_sweeper(timeout=5)


def test_expiry_survives_a_restart(tmp_path: Path, clock: Clock) -> None:
    path = tmp_path / "store.db"
    with MemTreeStore.from_conn_string(path, index={"fields": ["text"]}, ttl={"default_ttl": 10}) as store:
        store.put(("n",), "k", {"text": "short lived"})
        store.put(("n",), "forever", {"text": "kept"}, ttl=None)
    with MemTreeStore.from_conn_string(path, index={"fields": ["text"]}) as store:
        assert store.get(("n",), "k") is not None
        clock.advance(11)
        assert store.get(("n",), "k") is None and [i.key for i in store.search(("n",))] == ["forever"]


WORKER = """
import json, sys
from langchain_memtree import MemTreeStore
from memtree import HashingEmbedder
with MemTreeStore.from_conn_string(sys.argv[1], index={"fields": ["text"]}, embedder=HashingEmbedder(64)) as store:
    item = store.get(("mem",), "dog", refresh_ttl=False)
    print(json.dumps({
        "get": None if item is None else item.value["text"],
        "search": [i.key for i in store.search(("mem",), refresh_ttl=False)],
        "query": [i.key for i in store.search(("mem",), query="Pepper bicycles", refresh_ttl=False)],
        "namespaces": [list(ns) for ns in store.list_namespaces()],
        "leaves": [leaf.text for leaf in store.tree(("mem",)).leaves()],
    }))
"""


def read_in_another_process(location: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", WORKER, location], capture_output=True, text=True, env=env, check=True)
    return json.loads(done.stdout)  # type: ignore[no-any-return]


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_an_expired_item_is_gone_for_a_store_in_another_process(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    from memtree import HashingEmbedder

    location = str(tmp_path / "shared.db") if backend == "sqlite" else request.getfixturevalue("postgres_dsn")
    options: Any = {"index": {"fields": ["text"]}, "embedder": HashingEmbedder(64), "aggregation": "eager"}
    with MemTreeStore.from_conn_string(location, **options) as store:
        store.put(("mem",), "job", {"text": "Maya works night shifts."})
        store.put(("mem",), "dog", {"text": "Pepper fears bicycles."}, ttl=60)
        before = read_in_another_process(location)
        assert before["get"] == "Pepper fears bicycles." and "dog" in before["query"]
        store.put(("mem",), "dog", {"text": "Pepper fears bicycles."}, ttl=0.005)  # 0.3 s from now
        expires_at = store.memory.store.get_records((*store.prefix, "mem"), "store_items")["dog"]["expires_at"]
        while time.time() <= expires_at:  # the real clock must pass it (no upper bound: not a timing test)
            time.sleep(0.05)
        after = read_in_another_process(location)
        assert after == {
            "get": None,
            "search": ["job"],
            "query": ["job"],
            "namespaces": [["mem"]],
            "leaves": ["Maya works night shifts."],
        }
        assert store.get(("mem",), "dog") is None and store.sweep_ttl() == 1


def test_the_async_twins_expire_and_refresh_alike(clock: Clock) -> None:
    import asyncio

    store = indexed(ttl={"default_ttl": 10})

    async def scenario() -> list[Any]:
        await store.aput(("n",), "k", {"text": "async note"})
        clock.advance(8)
        seen = await store.aget(("n",), "k")  # refreshed: 10 more minutes from now
        clock.advance(8)
        still = await store.asearch(("n",), query="async note")
        clock.advance(11)
        return [seen, still, await store.aget(("n",), "k"), await store.asweep_ttl()]

    seen, still, gone, swept = asyncio.run(scenario())
    assert seen is not None and [item.key for item in still] == ["k"] and gone is None and swept == 1
