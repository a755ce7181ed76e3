"""Memories that expire: ``MemTree.add(ttl=...)``, ``expires_at``, ``config.default_ttl``.

An expired leaf is never returned by a read (retrieve, get, get_many, find, leaves,
walk, len, leaf_ids_under), in this process or another; a sweep deletes it with the
usual re-aggregation; the expiry survives a restart (SQLite, PostgreSQL) and a JSONL
backup. Time is a controlled clock here (``time.time`` patched), except across
processes, where the test waits until the real clock has passed the expiry.
"""

from __future__ import annotations

import io
import json
import math
import os
import sqlite3
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from memtree import HashingEmbedder, MemTree, MemTreeConfig, viz

ROOT = Path(__file__).resolve().parent.parent
CAT, CAT_GREY, CELLO, GARDEN = (
    "Alice has a cat named Miso.",
    "Alice's cat Miso is grey and sleepy.",
    "Bob plays the cello on Sundays.",
    "Carol grows tomatoes in her garden.",
)


class Clock:
    """``time.time`` under the test's control."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.now = time.time()
        monkeypatch.setattr(time, "time", lambda: self.now)

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    return Clock(monkeypatch)


def memory_of(**options: object) -> MemTree:
    return MemTree(embedder=HashingEmbedder(dimension=64), **options)  # type: ignore[arg-type]


def texts(memory: MemTree, query: str = "Alice cat Miso") -> list[str]:
    return [hit.text for hit in memory.retrieve(query, k=10, leaves_only=True)]


def test_an_expired_leaf_is_returned_by_no_read(clock: Clock) -> None:
    memory = memory_of()
    short = memory.add(CAT, ttl=60, source_id="note-1")
    kept = memory.add(CAT_GREY, ttl=timedelta(hours=1))
    memory.add(CELLO)
    assert memory.get(short).expires_at == pytest.approx(clock.now + 60)
    assert CAT in texts(memory) and len(memory) == 3
    clock.advance(61)
    assert CAT not in texts(memory) and CAT_GREY in texts(memory)
    for mode in ("collapsed", "traversal"):
        for hit in memory.retrieve("Alice cat Miso", k=10, mode=mode):
            assert short not in hit.leaf_ids and hit.id != short
    with pytest.raises(KeyError, match="expired"):
        memory.get(short)
    assert short not in memory.get_many([short, kept])
    assert memory.find(source_id="note-1") == []
    assert sorted(leaf.text for leaf in memory.leaves()) == sorted([CAT_GREY, CELLO])
    assert short not in {node.id for node in memory.walk()}
    assert all(short not in node.children for node in memory.walk())
    assert len(memory) == 2
    assert short not in memory.leaf_ids_under("root")
    with pytest.raises(KeyError):
        memory.update(short, "a new text for a memory that is gone")
    with pytest.raises(KeyError):
        memory.history(short)
    assert memory.stats().awaiting_sweep == 1


def test_a_summary_of_nothing_but_expired_leaves_is_not_returned(clock: Clock) -> None:
    memory = memory_of(config=MemTreeConfig(theta0=0.2))  # the cats (0.27 alike) meet, the garden stays apart
    memory.add(GARDEN)
    first = memory.add(CAT, ttl=10)
    second = memory.add(CAT_GREY, ttl=10)
    summaries = [
        node.id
        for node in memory.walk()
        if not node.is_leaf and not node.is_root and set(memory.leaf_ids_under(node.id)) == {first, second}
    ]
    assert summaries, "the two cat notes share a summary of their own"
    clock.advance(11)
    returned = {hit.id for hit in memory.retrieve("Alice cat Miso", k=10)}
    assert not returned & {first, second, *summaries}
    assert {node.id for node in memory.walk()} & {first, second, *summaries} == set()


def test_a_sweep_deletes_expired_leaves_with_the_usual_rewrite_and_counts_them(clock: Clock) -> None:
    memory = memory_of(config=MemTreeConfig(theta0=0.0))
    gone = memory.add(CAT, ttl=30)
    memory.add_many([CAT_GREY, CELLO, GARDEN])
    clock.advance(31)
    assert memory.stats().leaves == 4 and memory.stats().awaiting_sweep == 1
    assert memory.sweep_expired() == 1
    stats = memory.stats()
    assert (stats.leaves, stats.expired, stats.awaiting_sweep) == (3, 1, 0)
    assert memory.check_integrity() == []
    assert all(CAT not in node.text.split("\n") and "named Miso" not in node.text for node in memory.walk())
    with pytest.raises(KeyError):
        memory.get(gone)
    assert memory.sweep_expired() == 0


def test_writes_sweep_on_the_way_and_pictures_show_no_expired_text(clock: Clock) -> None:
    memory = memory_of(config=MemTreeConfig(theta0=0.0))
    memory.add(CAT, ttl=5)
    memory.add(CAT_GREY)
    clock.advance(6)
    assert "named Miso" not in memory.format_tree(width=400)  # swept before drawing
    assert memory.stats().expired == 1
    memory.add(GARDEN, ttl=5)
    clock.advance(6)
    memory.add(CELLO)  # a write sweeps what expired before it
    assert memory.stats().expired == 2 and memory.stats().leaves == 2
    assert "tomatoes" not in json.dumps(viz.to_dict(memory))


def test_expires_at_and_the_namespace_default(clock: Clock) -> None:
    memory = memory_of(config=MemTreeConfig(default_ttl=120))
    by_default = memory.add(CAT)
    at_moment = memory.add(CELLO, expires_at=datetime.fromtimestamp(clock.now + 10, tz=UTC))
    never = memory.add(GARDEN, ttl=None, expires_at=None)
    assert memory.get(by_default).expires_at == pytest.approx(clock.now + 120)
    assert memory.get(at_moment).expires_at == pytest.approx(clock.now + 10)
    assert memory.get(never).expires_at == pytest.approx(clock.now + 120)  # None means "the default"
    many = memory.add_many([CAT_GREY, "Dan fixes bicycles."], ttl=7)
    assert [memory.get(leaf).expires_at for leaf in many] == [pytest.approx(clock.now + 7)] * 2
    other = MemTree(embedder=HashingEmbedder(dimension=64), config=MemTreeConfig(default_ttl=timedelta(minutes=1)))
    assert other.get(other.add(CAT)).expires_at == pytest.approx(clock.now + 60)
    clock.advance(11)
    assert len(memory) == 2 and CELLO not in texts(memory, "cello Sundays")


def test_set_expiry_renews_or_clears(clock: Clock) -> None:
    memory = memory_of()
    leaf = memory.add(CAT, ttl=10)
    memory.set_expiry([leaf], ttl=100)
    assert memory.get(leaf).expires_at == pytest.approx(clock.now + 100)
    memory.set_expiry([leaf])
    assert memory.get(leaf).expires_at is None
    memory.set_expiry([leaf], ttl=1)
    clock.advance(2)
    with pytest.raises(KeyError):
        memory.set_expiry([leaf], ttl=100)


@pytest.mark.parametrize(
    ("ttl", "error", "message"),
    [
        (0, ValueError, "ttl must be a positive number of seconds"),
        (-5, ValueError, "ttl must be a positive number of seconds"),
        (timedelta(seconds=-1), ValueError, "ttl must be a positive number of seconds"),
        (math.nan, ValueError, "ttl is NaN"),
        (math.inf, ValueError, "ttl is infinite; pass None"),
        ("60", TypeError, "ttl must be a number of seconds or a datetime.timedelta, got str"),
        (True, TypeError, "got bool"),
        ([60], TypeError, "got list"),
    ],
)
def test_a_bad_ttl_is_refused_by_name_and_nothing_is_stored(ttl: object, error: type, message: str) -> None:
    memory = memory_of()
    with pytest.raises(error, match=message):
        memory.add(CAT, ttl=ttl)  # type: ignore[arg-type]
    with pytest.raises(error, match=message):
        memory.add_many([CAT, CELLO], ttl=ttl)  # type: ignore[arg-type]
    assert len(memory) == 0 and memory.stats().nodes == 0


def test_other_bad_expiries_are_refused(clock: Clock) -> None:
    memory = memory_of()
    with pytest.raises(ValueError, match="has already passed"):
        memory.add(CAT, expires_at=clock.now - 1)
    with pytest.raises(ValueError, match="not both"):
        memory.add(CAT, ttl=5, expires_at=clock.now + 5)
    with pytest.raises(ValueError, match="default_ttl must be a positive number of seconds"):
        MemTreeConfig(default_ttl=0)
    with pytest.raises(ValueError, match="default_ttl is NaN"):
        MemTreeConfig(default_ttl=math.nan)
    assert len(memory) == 0


def test_expiry_survives_a_restart_and_an_upgrade_of_an_older_file(tmp_path: Path, clock: Clock) -> None:
    path = tmp_path / "memory.db"
    with MemTree.open(path, embedder=HashingEmbedder(dimension=64)) as memory:
        leaf = memory.add(CAT, ttl=50)
        memory.add(CELLO)
    with MemTree.open(path, embedder=HashingEmbedder(dimension=64)) as memory:
        assert memory.get(leaf).expires_at == pytest.approx(clock.now + 50)
        clock.advance(51)
        assert [leaf.text for leaf in memory.leaves()] == [CELLO]
    # a file written before schema version 3 gains the column; its leaves never expire
    older = tmp_path / "older.db"
    with MemTree.open(older, embedder=HashingEmbedder(dimension=64)) as memory:
        kept = memory.add(GARDEN)
    with sqlite3.connect(older) as connection:
        connection.execute("ALTER TABLE memtree_nodes DROP COLUMN expires_at")
        connection.execute("DELETE FROM memtree_schema WHERE version = 3")
    connection.close()
    with MemTree.open(older, embedder=HashingEmbedder(dimension=64)) as memory:
        assert memory.get(kept).expires_at is None
        assert memory.get(memory.add(CAT, ttl=5)).expires_at is not None


def test_expiry_survives_a_restart_on_postgres(postgres_dsn: str, clock: Clock) -> None:
    with MemTree.open(postgres_dsn, embedder=HashingEmbedder(dimension=64)) as memory:
        leaf = memory.add(CAT, ttl=50)
    with MemTree.open(postgres_dsn, embedder=HashingEmbedder(dimension=64)) as memory:
        assert memory.get(leaf).expires_at == pytest.approx(clock.now + 50)
        clock.advance(51)
        assert len(memory) == 0
        assert memory.sweep_expired() == 1


def test_a_backup_keeps_the_expiry_and_leaves_out_what_expired(clock: Clock) -> None:
    memory = memory_of()
    keeps = memory.add(CAT, ttl=100)
    memory.add(CELLO, ttl=10)
    memory.add(GARDEN)
    clock.advance(11)
    backup = io.StringIO()
    memory.export_jsonl(backup)
    assert "cello" not in backup.getvalue()  # swept before the export
    restored = memory_of(namespace="restored")
    restored.import_jsonl(io.StringIO(backup.getvalue()))
    assert restored.get(keeps).expires_at == pytest.approx(clock.now + 89)
    # a backup written before expiry existed (no expires_at field) still imports
    lines = [json.loads(line) for line in backup.getvalue().splitlines()]
    for line in lines:
        line.pop("expires_at", None)
    old = memory_of(namespace="old")
    old.import_jsonl(io.StringIO("\n".join(json.dumps(line) for line in lines)))
    assert old.get(keeps).expires_at is None


WORKER = """
import json, sys
from memtree import HashingEmbedder, MemTree
location, leaf = sys.argv[1], sys.argv[2]
with MemTree.open(location, embedder=HashingEmbedder(dimension=64)) as memory:
    try:
        got = memory.get(leaf).text
    except KeyError:
        got = None
    print(json.dumps({
        "get": got,
        "many": sorted(memory.get_many([leaf])),
        "retrieve": [hit.text for hit in memory.retrieve("Alice cat Miso", k=10)],
        "leaf_ids": sorted({i for hit in memory.retrieve("Alice cat Miso", k=10) for i in hit.leaf_ids}),
        "find": memory.find(source_id="note"),
        "leaves": [leaf.text for leaf in memory.leaves()],
        "walk": [node.id for node in memory.walk()],
        "len": len(memory),
    }))
"""


def read_in_another_process(location: str, leaf: str) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", WORKER, location, leaf], capture_output=True, text=True, env=env, check=True
    )
    return json.loads(done.stdout)  # type: ignore[no-any-return]


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_an_expired_leaf_is_gone_for_a_reader_in_another_process(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    location = str(tmp_path / "shared.db") if backend == "sqlite" else request.getfixturevalue("postgres_dsn")
    with MemTree.open(location, embedder=HashingEmbedder(dimension=64)) as writer:
        writer.add(CELLO)
        leaf = writer.add(CAT, ttl=3600, source_id="note")
        before = read_in_another_process(location, leaf)
        assert before["get"] == CAT and leaf in before["leaf_ids"] and before["len"] == 2  # type: ignore[operator]
        writer.set_expiry([leaf], ttl=0.2)  # (a child process takes longer than that to start)
        expires_at = writer.get(leaf).expires_at
        assert expires_at is not None
        while time.time() <= expires_at:  # the real clock must pass the expiry (no upper bound: not a timing test)
            time.sleep(0.05)
        after = read_in_another_process(location, leaf)
        assert after["get"] is None and after["many"] == [] and after["find"] == []
        assert CAT not in after["retrieve"] and leaf not in after["leaf_ids"]  # type: ignore[operator]
        assert after["leaves"] == [CELLO] and leaf not in after["walk"] and after["len"] == 1  # type: ignore[operator]
        assert len(writer) == 1 and writer.sweep_expired() == 1  # and this process agrees
