"""``MemTree.update`` and ``history``: a corrected leaf keeps its id, moves when its
meaning moved, leaves no summary with the old text, and keeps every earlier version
in every store."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest
from conftest import TableEmbedder, unit

from memtree import Aggregator, HashingEmbedder, LeafVersion, MemoryBackend, MemTree, MemTreeConfig, SQLiteBackend
from memtree.node import ROOT_ID, Vector

TENNIS, SQUASH = "Alice plays tennis.", "Alice plays squash."
PASTA, RISOTTO = "Bob cooks pasta.", "Bob cooks risotto."
BADMINTON, GNOCCHI = "Alice plays badminton.", "Bob cooks gnocchi."
TABLE = {
    TENNIS: unit(1, 0.1, 0, 0),
    SQUASH: unit(1, 0.3, 0, 0),
    PASTA: unit(0, 0, 1, 0.1),
    RISOTTO: unit(0, 0, 1, 0.3),
    # Close to Alice's summary, but below the depth-1 threshold (0.82) to tennis: stays put.
    BADMINTON: unit(1, 1.5, 0, 0),
    # Bob's topic, closest to risotto: moves under Bob's summary, next to risotto.
    GNOCCHI: unit(0, 0, 1, 0.6),
}
# θ(0) = 0.3 at the root, θ(1) = 0.3·e^(2·1/2) ≈ 0.82 one level down (tree depth 2).
CONFIG = MemTreeConfig(theta0=0.3, decay=2.0, lexical_weight=0)
SEP = " | "


class JoiningAggregator(Aggregator):
    """Joins texts with " | ", so a summary shows exactly the leaves it was written from."""

    def __init__(self) -> None:
        self.fail = False
        self.calls = 0
        self.lock = threading.Lock()

    def aggregate(self, summary: str, new_texts: Sequence[str], count: int, *, centroid: Vector | None = None) -> str:
        with self.lock:
            self.calls += 1
        if self.fail:
            raise ConnectionError("model unavailable")
        return SEP.join([summary, *new_texts]) if summary else SEP.join(new_texts)


def two_topics(store: object = None, aggregator: Aggregator | None = None) -> tuple[MemTree, dict[str, str]]:
    """root → [Alice: tennis, squash], [Bob: pasta, risotto]."""
    memory = MemTree(
        embedder=TableEmbedder(TABLE),
        aggregator=aggregator or JoiningAggregator(),
        config=CONFIG,
        store=store,  # type: ignore[arg-type]
    )
    ids = {text: memory.add(text) for text in (TENNIS, SQUASH, PASTA, RISOTTO)}
    return memory, ids


def summaries(memory: MemTree) -> dict[str, str]:
    return {node.id: node.text for node in memory.walk() if not node.is_leaf and node.id != ROOT_ID}


def test_the_setup_is_two_topics_of_two_leaves() -> None:
    memory, ids = two_topics()
    alice = memory.get(ids[TENNIS]).parent
    bob = memory.get(ids[PASTA]).parent
    assert memory.get(ids[SQUASH]).parent == alice and memory.get(ids[RISOTTO]).parent == bob
    assert summaries(memory) == {alice: f"{TENNIS}{SEP}{SQUASH}", bob: f"{PASTA}{SEP}{RISOTTO}"}


def test_an_update_that_still_belongs_here_stays_in_place_and_rewrites_its_summary() -> None:
    memory, ids = two_topics()
    leaf = ids[SQUASH]
    before = memory.get(leaf)
    assert memory.update(leaf, BADMINTON, metadata={"sport": "badminton"}) == leaf
    after = memory.get(leaf)
    assert (after.parent, after.depth, after.created_at) == (before.parent, before.depth, before.created_at)
    assert (after.text, after.metadata) == (BADMINTON, {"sport": "badminton"})
    assert summaries(memory) == {
        before.parent: f"{TENNIS}{SEP}{BADMINTON}",
        memory.get(ids[PASTA]).parent: f"{PASTA}{SEP}{RISOTTO}",
    }
    assert memory.check_integrity() == []
    [version] = memory.history(leaf)
    assert (version.leaf_id, version.text, version.metadata, version.timestamp) == (leaf, SQUASH, {}, None)
    assert before.updated_at <= version.replaced_at <= after.updated_at
    assert [hit.id for hit in memory.retrieve(BADMINTON, k=1, leaves_only=True)] == [leaf]


def test_an_update_whose_meaning_moved_is_routed_again_with_the_same_id() -> None:
    memory, ids = two_topics()
    leaf = ids[SQUASH]
    alice = memory.get(leaf).parent
    bob = memory.get(ids[PASTA]).parent
    memory.update(leaf, GNOCCHI)
    assert memory.check_integrity() == []
    moved = memory.get(leaf)
    assert moved.text == GNOCCHI
    with pytest.raises(KeyError):  # Alice's summary, left with one child, was folded away
        memory.get(alice)
    assert memory.get(ids[TENNIS]).parent == ROOT_ID and memory.get(ids[TENNIS]).depth == 1
    pair = moved.parent  # a new summary took risotto's place under Bob's
    assert pair is not None and memory.get(pair).parent == bob
    assert set(memory.get(pair).children) == {ids[RISOTTO], leaf}
    assert summaries(memory) == {bob: f"{PASTA}{SEP}{RISOTTO}{SEP}{GNOCCHI}", pair: f"{RISOTTO}{SEP}{GNOCCHI}"}
    assert not any(SQUASH in text for text in summaries(memory).values())
    assert [version.text for version in memory.history(leaf)] == [SQUASH]
    assert len(memory) == 4


def test_versions_accumulate_oldest_first_and_metadata_or_time_alone_rewrites_no_summary() -> None:
    aggregator = JoiningAggregator()
    memory, ids = two_topics(aggregator=aggregator)
    leaf = ids[TENNIS]
    memory.update(leaf, TENNIS, metadata={"court": "clay"})
    calls = aggregator.calls
    memory.update(leaf, TENNIS, timestamp="2024-05-01")
    assert aggregator.calls == calls  # the text is unchanged: no summary is rewritten
    memory.update(leaf, TENNIS, metadata={"court": "clay"}, timestamp="2024-05-01")  # no change: no version
    history = memory.history(leaf)
    assert [(v.text, v.metadata, v.timestamp) for v in history] == [
        (TENNIS, {}, None),
        (TENNIS, {"court": "clay"}, None),
    ]
    assert history[0].replaced_at <= history[1].replaced_at
    node = memory.get(leaf)
    assert node.metadata == {"court": "clay"} and node.time is not None and node.time.isoformat()[:10] == "2024-05-01"
    assert memory.get(node.parent).timestamp == node.timestamp  # summaries follow their leaves' times
    assert memory.check_integrity() == []
    assert memory.history(ids[PASTA]) == []


def test_bad_ids_say_what_is_wrong() -> None:
    memory, ids = two_topics()
    with pytest.raises(KeyError, match="no node with id 'missing'"):
        memory.update("missing", "text")
    summary = memory.get(ids[TENNIS]).parent
    with pytest.raises(ValueError, match=f"node '{summary}' is a summary; only leaves can be updated"):
        memory.update(summary, "text")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="only leaves can be updated"):
        memory.update(ROOT_ID, "text")
    with pytest.raises(ValueError, match="only leaves can have a history"):
        memory.history(summary)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="text"):
        memory.update(ids[TENNIS], "   ")
    assert memory.history(ids[TENNIS]) == []  # nothing was changed by the refused calls


def test_deleting_a_leaf_deletes_its_history() -> None:
    store = MemoryBackend()
    memory, ids = two_topics(store)
    leaf = ids[SQUASH]
    memory.update(leaf, BADMINTON)
    memory.delete(leaf)
    with pytest.raises(KeyError, match=leaf):
        memory.history(leaf)
    assert store.read_history(memory.namespace, leaf) == []


def test_a_failed_summary_leaves_the_leaf_updated_and_the_summary_stale_for_repair() -> None:
    aggregator = JoiningAggregator()
    memory, ids = two_topics(aggregator=aggregator)
    leaf = ids[SQUASH]
    alice = memory.get(leaf).parent
    assert alice is not None
    aggregator.fail = True
    memory.update(leaf, BADMINTON)
    assert memory.get(leaf).text == BADMINTON and [v.text for v in memory.history(leaf)] == [SQUASH]
    # The old summary quoted the replaced text: it holds a stand-in of its children instead (issue 39).
    assert memory.get(alice).stale and memory.get(alice).text == f"{TENNIS}\n{BADMINTON}"
    aggregator.fail = False
    assert memory.repair() == 1
    assert memory.get(alice).text == f"{TENNIS}{SEP}{BADMINTON}" and not memory.get(alice).stale


def test_a_failed_embedding_changes_nothing() -> None:
    memory, ids = two_topics()
    with pytest.raises(KeyError, match="no vector"):
        memory.update(ids[SQUASH], "A text the table does not know.")
    assert memory.get(ids[SQUASH]).text == SQUASH and memory.history(ids[SQUASH]) == []


def test_inside_a_deferred_block_summaries_wait_for_the_flush() -> None:
    memory, ids = two_topics()
    leaf = ids[SQUASH]
    alice = memory.get(leaf).parent
    assert alice is not None
    with memory.deferred():
        memory.update(leaf, BADMINTON)
        assert memory.get(alice).stale and memory.get(leaf).text == BADMINTON
    assert not memory.get(alice).stale and memory.get(alice).text == f"{TENNIS}{SEP}{BADMINTON}"
    assert memory.check_integrity() == []


def test_aupdate_matches_update() -> None:
    memory, ids = two_topics()
    leaf = ids[SQUASH]
    assert asyncio.run(memory.aupdate(leaf, GNOCCHI, metadata={"n": 1})) == leaf
    assert memory.get(leaf).text == GNOCCHI and memory.get(leaf).metadata == {"n": 1}
    assert [v.text for v in memory.history(leaf)] == [SQUASH]
    assert memory.check_integrity() == []


def history_round_trip(open_store: object) -> None:
    first = MemTree(embedder=HashingEmbedder(32), store=open_store(), config=MemTreeConfig(theta0=0.2))  # type: ignore[operator]
    leaf = first.add("Rosa lives in Porto.", metadata={"v": 1}, timestamp="2023-01-01")
    first.update(leaf, "Rosa lives in Lisbon.", metadata={"v": 2})
    first.update(leaf, "Rosa lives in Lisbon with her sister.")
    expected = first.history(leaf)
    first.close()
    first.store.close()
    again = MemTree(embedder=HashingEmbedder(32), store=open_store(), config=MemTreeConfig(theta0=0.2))  # type: ignore[operator]
    history = again.history(leaf)
    assert history == expected
    assert [(v.text, v.metadata, v.timestamp) for v in history] == [
        ("Rosa lives in Porto.", {"v": 1}, 1672531200.0),
        ("Rosa lives in Lisbon.", {"v": 2}, 1672531200.0),
    ]
    assert all(isinstance(v, LeafVersion) for v in history)
    assert again.get(leaf).text == "Rosa lives in Lisbon with her sister." and again.get(leaf).metadata == {"v": 2}
    again.delete_namespace()
    assert again.store.read_history(again.namespace) == []
    again.store.close()


def test_history_survives_a_reopen_in_sqlite(tmp_path: Path) -> None:
    path = tmp_path / "memory.db"
    history_round_trip(lambda: SQLiteBackend(path))


def test_history_survives_a_reopen_in_postgres(postgres_dsn: str) -> None:
    from memtree import PostgresBackend

    history_round_trip(lambda: PostgresBackend(postgres_dsn))


def test_history_in_memory_is_shared_by_handles_on_one_store() -> None:
    store = MemoryBackend()
    memory = MemTree(embedder=HashingEmbedder(32), store=store)
    leaf = memory.add("first")
    memory.update(leaf, "second")
    other = memory.with_namespace(memory.namespace)
    assert [v.text for v in other.history(leaf)] == ["first"]
    returned = other.history(leaf)
    returned[0].metadata["changed"] = True  # a caller's copy; the store keeps its own
    assert other.history(leaf)[0].metadata == {}


def test_an_old_sqlite_file_gains_the_history_table(tmp_path: Path) -> None:
    path = tmp_path / "memory.db"
    with MemTree.open(path, embedder=HashingEmbedder(32)) as memory:
        leaf = memory.add("kept across the upgrade")
    with sqlite3.connect(path) as connection:  # what memtree with schema version 1 left
        connection.execute("DROP TABLE memtree_versions")
        connection.execute("ALTER TABLE memtree_nodes DROP COLUMN expires_at")  # schema version 3
        connection.execute("DELETE FROM memtree_schema WHERE version >= 2")
    connection.close()
    with MemTree.open(path, embedder=HashingEmbedder(32)) as memory:
        assert memory.history(leaf) == []
        memory.update(leaf, "changed after the upgrade")
        assert [v.text for v in memory.history(leaf)] == ["kept across the upgrade"]
    with sqlite3.connect(path) as connection:
        versions = [row[0] for row in connection.execute("SELECT version FROM memtree_schema ORDER BY version")]
        assert versions == [1, 2, 3]
    connection.close()


def test_a_jsonl_backup_carries_the_history(tmp_path: Path) -> None:
    memory, ids = two_topics()
    memory.update(ids[SQUASH], BADMINTON, metadata={"n": 1})
    memory.update(ids[SQUASH], GNOCCHI)
    memory.update(ids[PASTA], PASTA, metadata={"fresh": True})
    backup = tmp_path / "backup.jsonl"
    memory.export_jsonl(backup)
    restored = MemTree(embedder=TableEmbedder(TABLE), aggregator=JoiningAggregator(), config=CONFIG)
    restored.import_jsonl(backup)
    for leaf in (ids[SQUASH], ids[PASTA], ids[TENNIS]):
        assert restored.history(leaf) == memory.history(leaf)
    assert [v.text for v in restored.history(ids[SQUASH])] == [SQUASH, BADMINTON]
    lines = backup.read_text().splitlines()
    assert sum('"type": "version"' in line for line in lines) == 3 and '"versions": 3' in lines[0]

    orphan = tmp_path / "orphan.jsonl"
    orphan.write_text(backup.read_text().replace(ids[PASTA], "not-a-leaf-of-this-file", 1))
    with pytest.raises(ValueError, match="which is not a leaf of this backup"):
        MemTree(embedder=TableEmbedder(TABLE), config=CONFIG).import_jsonl(orphan)
