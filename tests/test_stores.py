"""The Store contract, identical on every backend (in-memory, SQLite, PostgreSQL),
and what a memory built on a durable store promises: persistence, isolation,
catching up with other writers incrementally."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import test_memory_api

from memtree import (
    EmbedderMismatchError,
    HashingEmbedder,
    MemoryBackend,
    MemTree,
    MemTreeConfig,
    Node,
    PostgresBackend,
    SQLiteBackend,
)
from memtree.store import ChangeBatch, Store

CONFIG = MemTreeConfig(theta0=0.2)
FACTS = [
    *test_memory_api.FACTS,
    "Eli's cello teacher lives in Bergen.",
    "The Saturday market opens at eight.",
]


@dataclass
class Backend:
    """Opens stores on one backing location (a file, a database, or one shared object)."""

    name: str
    location: str | None = None
    shared: MemoryBackend | None = None
    opened: list[Store] = field(default_factory=list)

    def store(self) -> Store:
        if self.shared is not None:
            return self.shared
        assert self.location is not None
        store: Store = PostgresBackend(self.location) if self.name == "postgres" else SQLiteBackend(self.location)
        self.opened.append(store)
        return store

    def memory(self, namespace: object = "default", dimension: int = 64, config: MemTreeConfig = CONFIG) -> MemTree:
        embedder = HashingEmbedder(dimension)
        return MemTree(store=self.store(), namespace=namespace, embedder=embedder, config=config)  # type: ignore[arg-type]


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if request.param == "memory":
        chosen = Backend("memory", shared=MemoryBackend())
    elif request.param == "sqlite":
        chosen = Backend("sqlite", location=str(tmp_path / "memory.db"))
    else:
        chosen = Backend("postgres", location=request.getfixturevalue("postgres_dsn"))
    yield chosen
    for store in chosen.opened:
        store.close()


def node(node_id: str, parent: str | None = "root", text: str = "a text", depth: int = 1) -> Node:
    vector = np.zeros(8, dtype=np.float32)
    vector[hash(node_id) % 8] = 1.0
    return Node(
        id=node_id,
        text="" if parent is None else text,
        embedding=None if parent is None else vector,
        parent=parent,
        depth=0 if parent is None else depth,
        is_leaf=parent is not None,
        leaf_count=1,
        created_at=1.0,
        updated_at=2.0,
        metadata={"k": "v"} if parent else {},
    )


def commit(store: Store, namespace: tuple[str, ...], upserts: list[Node], deletions: list[str] = ()) -> int:  # type: ignore[assignment]
    with store.write(namespace) as transaction:
        return transaction.commit(upserts, list(deletions))


def ids(batch: ChangeBatch) -> list[str]:
    return sorted(n.id for n in batch.nodes)


# -- the Store contract -------------------------------------------------------------------------


def test_each_commit_gets_the_next_sequence_number_and_readers_get_only_newer_rows(backend: Backend) -> None:
    store, ns = backend.store(), ("t",)
    assert store.head(ns)[0] == 0
    first = commit(store, ns, [node("root", None), node("a"), node("b")])
    second = commit(store, ns, [node("c"), node("a", text="a changed")])
    third = commit(store, ns, [], ["b"])
    assert (first, second, third) == (1, 2, 3)
    assert store.head(ns)[0] == 3

    everything = store.read_changes(ns, 0)
    assert ids(everything) == ["a", "c", "root"] and everything.deleted == [] and everything.seq == 3
    after_first = store.read_changes(ns, first)
    assert ids(after_first) == ["a", "c"] and after_first.deleted == ["b"]  # the tombstone, not a reload
    assert {n.id: n.text for n in after_first.nodes}["a"] == "a changed"
    after_second = store.read_changes(ns, second)
    assert after_second.nodes == [] and after_second.deleted == ["b"]
    assert store.read_changes(ns, third).nodes == [] and store.read_changes(ns, third).deleted == []


def test_nodes_come_back_exactly_as_written(backend: Backend) -> None:
    store, ns = backend.store(), ("t",)
    written = node("x")
    written.timestamp, written.source_id, written.stale = 1234.5, "msg-7", True
    written.leaf_sum = np.arange(8, dtype=np.float32)
    written.metadata = {"quote": 'it\'s "here"', "sql": "'; DROP TABLE memtree_nodes; --", "n": [1, 2.5, None]}
    commit(store, ns, [node("root", None), written])
    read = {n.id: n for n in backend.store().read_changes(ns, 0).nodes}["x"]
    for name in ("id", "text", "parent", "depth", "is_leaf", "leaf_count", "created_at", "updated_at", "timestamp"):
        assert getattr(read, name) == getattr(written, name), name
    assert (read.metadata, read.source_id, read.stale) == (written.metadata, "msg-7", True)
    assert read.embedding is not None and written.embedding is not None
    assert read.embedding.dtype == np.float32 and np.array_equal(read.embedding, written.embedding)
    assert read.leaf_sum is not None and np.array_equal(read.leaf_sum, written.leaf_sum)


def test_a_rolled_back_transaction_leaves_no_trace(backend: Backend) -> None:
    store, ns = backend.store(), ("t",)
    commit(store, ns, [node("root", None), node("a")])
    with pytest.raises(RuntimeError, match="boom"), store.write(ns) as transaction:
        transaction.read_changes(0)
        raise RuntimeError("boom")
    transaction = store.begin(ns)
    transaction.rollback()
    assert store.head(ns)[0] == 1 and ids(store.read_changes(ns, 0)) == ["a", "root"]
    assert commit(store, ns, [node("b")]) == 2  # the lock was released


def test_a_recreated_namespace_gets_a_new_generation(backend: Backend) -> None:
    store, ns = backend.store(), ("t",)
    commit(store, ns, [node("root", None), node("a")])
    _, generation = store.head(ns)
    assert store.delete_namespace(ns) is True
    assert store.delete_namespace(ns) is False
    commit(store, ns, [node("root", None), node("b")])
    new_seq, new_generation = store.head(ns)
    assert new_generation != generation and new_seq == 1
    assert ids(store.read_changes(ns, 0)) == ["b", "root"]


def test_namespaces_are_listed_by_prefix_and_deleted_whole(backend: Backend) -> None:
    store = backend.store()
    for ns in [("users", "bob"), ("users", "alice"), ("agents", "x"), ("users",)]:
        commit(store, ns, [node("root", None), node("a")])
    store.put_records(("sessions", "s1"), "messages", {"1": {"text": "hi"}})
    assert store.list_namespaces() == [
        ("agents", "x"),
        ("sessions", "s1"),
        ("users",),
        ("users", "alice"),
        ("users", "bob"),
    ]
    assert store.list_namespaces(("users",)) == [("users",), ("users", "alice"), ("users", "bob")]
    assert store.list_namespaces(("users", "alice")) == [("users", "alice")]
    assert store.list_namespaces(("use",)) == []
    assert store.delete_namespace(("users", "alice")) is True
    assert store.list_namespaces(("users",)) == [("users",), ("users", "bob")]
    assert ids(store.read_changes(("users", "bob"), 0)) == ["a", "root"]


def test_records_keep_first_written_order_and_go_with_the_namespace(backend: Backend) -> None:
    store, ns = backend.store(), ("chat", "s1")
    store.put_records(ns, "messages", {"0002": {"text": "b"}, "0001": {"text": "a"}})
    store.put_records(ns, "messages", {"0003": {"text": "c"}, "0002": None})
    store.put_records(ns, "messages", {"0001": {"text": "a, edited", "n": [1, {"x": None}]}})
    store.put_records(ns, "profile", {"name": {"value": "Zoë «quoted» 'single' \"double\""}})
    again = backend.store()
    assert list(again.get_records(ns, "messages")) == ["0001", "0003"]  # an update keeps its place
    assert again.get_records(ns, "messages")["0001"] == {"text": "a, edited", "n": [1, {"x": None}]}
    assert again.get_records(ns, "messages", ["0003", "nope", "0001"]) == {
        "0001": {"text": "a, edited", "n": [1, {"x": None}]},
        "0003": {"text": "c"},
    }
    assert again.get_records(ns, "profile")["name"]["value"] == "Zoë «quoted» 'single' \"double\""
    assert again.record_kinds(ns) == ["messages", "profile"]
    assert again.get_records(ns, "other") == {}
    got = again.get_records(ns, "messages")
    got["0003"]["text"] = "changed"  # callers get copies
    assert again.get_records(ns, "messages")["0003"] == {"text": "c"}
    assert again.delete_records(ns, "messages") == 2
    assert again.delete_records(ns, "messages") == 0
    assert again.list_namespaces() == [ns]
    assert again.delete_namespace(ns) is True
    assert again.get_records(ns, "profile") == {} and again.list_namespaces() == []


def test_a_snapshot_holds_the_changes_and_every_record_as_separate_reads_do(backend: Backend) -> None:
    store, ns = backend.store(), ("backup",)
    assert Store.read_snapshot(store, ns).records == {} and store.read_snapshot(ns).changes.nodes == []
    first = commit(store, ns, [node("root", None), node("a"), node("b")])
    commit(store, ns, [node("c")], ["b"])
    store.put_records(ns, "profile", {"name": {"value": "Dana"}})
    store.put_records(ns, "messages", {"0002": {"text": "b"}, "0001": {"text": "a"}})
    for read in (store.read_snapshot, lambda ns, since: Store.read_snapshot(store, ns, since)):  # and the default
        for since in (0, first):
            taken = read(ns, since)
            alone = store.read_changes(ns, since)
            assert (ids(taken.changes), taken.changes.deleted, taken.changes.seq) == (ids(alone), alone.deleted, 2)
            assert taken.changes.generation == store.head(ns)[1]
            assert list(taken.records) == ["messages", "profile"]  # kinds sorted
            assert list(taken.records["messages"].items()) == [("0002", {"text": "b"}), ("0001", {"text": "a"})]
            assert taken.records["profile"] == store.get_records(ns, "profile")


def test_many_records_are_found_by_key_in_written_order(backend: Backend) -> None:
    store, ns = backend.store(), ("log",)
    keys = [f"m{i:05d}" for i in range(1200)]
    store.put_records(ns, "messages", {key: {"i": i} for i, key in enumerate(keys)})
    asked = [*keys[::-1][:700], "missing", keys[5], keys[5]]
    got = store.get_records(ns, "messages", asked)
    assert list(got) == sorted(set(asked) - {"missing"})  # first-written order, each once
    assert got[keys[5]] == {"i": 5}


def test_bad_records_are_refused_before_anything_is_written(backend: Backend) -> None:
    store, ns = backend.store(), ("chat",)
    for kind, records, error in [
        ("messages", {"ok": {"a": 1}, "bad": {"a": object()}}, TypeError),
        ("messages", {"ok": {"a": 1}, "bad\x00key": {"a": 1}}, ValueError),
        ("messages", {"ok": {"a": 1}, "nul": {"a": "x\x00y"}}, ValueError),
        ("messages", {"ok": {"a": 1}, "nan": {"a": float("nan")}}, TypeError),
        ("messages", {"ok": {"a": 1}, "list": [1, 2]}, TypeError),
        ("", {"ok": {"a": 1}}, ValueError),
    ]:
        with pytest.raises(error):
            store.put_records(ns, kind, records)  # type: ignore[arg-type]
    assert store.get_records(ns, "messages") == {} and store.list_namespaces() == []


# -- memories on a store ------------------------------------------------------------------------


def canonical(memory: MemTree, query: str) -> list[tuple[str, float]]:
    """The relevant nodes' scores for a query, ties in id order (FAISS row order may
    differ between two copies of a tree, and so may the order of equal scores)."""
    hits = memory.retrieve(query, k=10, min_score=0.05)
    return sorted(((hit.id, round(hit.score, 5)) for hit in hits), key=lambda item: (-item[1], item[0]))


def snapshot(memory: MemTree) -> dict[str, tuple[object, ...]]:
    return {
        n.id: (
            n.text,
            n.parent,
            n.depth,
            n.is_leaf,
            n.leaf_count,
            n.timestamp,
            n.metadata,
            n.source_id,
            n.stale,
            None if n.embedding is None else n.embedding.tobytes(),
            None if n.leaf_sum is None else n.leaf_sum.tobytes(),
            tuple(sorted(n.children)),
        )
        for n in memory.walk()
    }


def test_a_reopened_memory_is_the_same_tree_with_the_same_answers(backend: Backend) -> None:
    calibrating = MemTreeConfig(theta0="auto", calibration_samples=3)
    memory = backend.memory(config=calibrating)
    ids_ = memory.add_many(FACTS, metadata=[{"i": i} for i in range(len(FACTS))], source_ids=["s"] * len(FACTS))
    memory.delete(ids_[2])
    before, answers = snapshot(memory), canonical(memory, "Where does Dana sell honey?")
    theta0 = memory.stats().theta0
    memory.close()
    for store in backend.opened:
        store.close()
    reopened = backend.memory(config=calibrating)
    assert snapshot(reopened) == before
    assert canonical(reopened, "Where does Dana sell honey?") == answers
    assert reopened.check_integrity() == []
    assert reopened.stats().theta0 == theta0 != calibrating.auto_theta0_start  # calibration survived


def test_namespaces_with_the_same_texts_never_mix(backend: Backend) -> None:
    alice, bob = backend.memory(("users", "alice")), backend.memory(("users", "bob"))
    alice_ids = set(alice.add_many(FACTS))
    bob_ids = set(bob.add_many(FACTS[:4]))
    assert not alice_ids & bob_ids
    alice_nodes = {n.id for n in alice.walk()}
    bob_nodes = {n.id for n in bob.walk()}
    for query in ["Dana honey", "cello", "market Saturday"]:
        assert {hit.id for hit in alice.retrieve(query, k=50)} <= alice_nodes
        assert {hit.id for hit in bob.retrieve(query, k=50)} <= bob_nodes
    assert bob.delete_namespace() is True
    assert len(bob) == 0 and bob.retrieve("cello") == []
    fresh_alice = backend.memory(("users", "alice"))
    assert snapshot(fresh_alice) == snapshot(alice) and fresh_alice.check_integrity() == []
    assert alice.namespaces() == [("users", "alice")]


@pytest.mark.parametrize(
    "namespace",
    [
        "it's",
        ('a"b', "'; DROP TABLE memtree_nodes; --"),
        ("%s", "?", "%(x)s", "\\", "名前", "🐝 bees"),
        ("users", "Robert'); DELETE FROM memtree_namespaces;--"),
    ],
)
def test_hostile_namespaces_and_metadata_are_plain_data(backend: Backend, namespace: object) -> None:
    memory = backend.memory(namespace)
    tricky = {"q": 'it\'s "quoted"', "sql": "1; DROP TABLE memtree_records", "u": "Zoë 🐝 名前", "pct": "%s ?"}
    leaf = memory.add("Zoë's bees 🐝 live on the roof; '; DROP TABLE x; --", metadata=tricky)
    memory.add("An unrelated note about trains.", metadata={"q": "other"})
    reopened = backend.memory(namespace)
    assert reopened.get(leaf).metadata == tricky
    assert reopened.get(leaf).text == "Zoë's bees 🐝 live on the roof; '; DROP TABLE x; --"
    assert [hit.id for hit in reopened.retrieve("bees roof", where={"sql": tricky["sql"]})] == [leaf]
    assert reopened.namespaces() == [reopened.namespace]
    assert reopened.check_integrity() == []


def test_reopening_with_another_embedder_is_refused_clearly(backend: Backend) -> None:
    backend.memory(dimension=64).add_many(FACTS[:3])
    with pytest.raises(
        EmbedderMismatchError, match=r"built with HashingEmbedder\(64\), but embedder= is HashingEmbedder\(32\)"
    ):
        backend.memory(dimension=32)
    assert len(backend.memory(dimension=64)) == 3


def test_a_memory_catches_up_with_another_writer_reading_only_new_rows(backend: Backend) -> None:
    reader, writer = backend.memory(), backend.memory()
    writer.add_many(FACTS[:5])
    reads: list[tuple[int, int]] = []
    original = reader.store.read_changes

    def counting(namespace: tuple[str, ...], since: int) -> ChangeBatch:
        batch = original(namespace, since)
        reads.append((since, len(batch.nodes)))
        return batch

    reader.store.read_changes = counting  # type: ignore[method-assign]
    try:
        assert len(reader) == 5  # the first refresh loads what was there
        before = reader.stats().nodes
        writer.add(FACTS[5])
        assert FACTS[5] in [hit.text for hit in reader.retrieve("cello teacher Bergen", k=20)]
        assert len(reader) == 6 and reader.check_integrity() == []
    finally:
        del reader.store.read_changes
    since, rows = reads[-1]
    assert since > 0  # caught up from its last sequence number, reading only what that insert wrote
    assert 0 < rows <= reader.stats().max_depth + 2 and rows < before


def test_refresh_interval_bounds_how_stale_reads_may_be(backend: Backend) -> None:
    if backend.name == "memory":
        pytest.skip("one shared object: nothing to be stale about")
    reader = MemTree(store=backend.store(), embedder=HashingEmbedder(64), config=CONFIG, refresh_interval=3600)
    backend.memory().add(FACTS[0])
    assert len(reader) == 0  # within its interval a memory does not look
    reader.refresh()
    assert len(reader) == 1


async def test_async_inserts_cross_threads_on_every_store(backend: Backend) -> None:
    memory = backend.memory()
    ids_ = await asyncio.gather(*(memory.aadd(fact) for fact in FACTS))
    assert sorted(n.id for n in memory.leaves()) == sorted(ids_)
    assert memory.check_integrity() == []
    assert len(backend.memory()) == len(FACTS)


async def test_a_cancelled_async_insert_does_not_keep_the_write_lock(backend: Backend) -> None:
    memory = backend.memory()
    memory.add(FACTS[0])
    holder = backend.store().begin(memory.namespace)  # another writer holds the lock
    entered = threading.Event()
    begin = memory.store.begin

    def signalling_begin(namespace: tuple[str, ...]) -> object:
        entered.set()
        return begin(namespace)

    memory.store.begin = signalling_begin  # type: ignore[method-assign]
    waiting = asyncio.ensure_future(memory.aadd(FACTS[1]))
    assert await asyncio.to_thread(entered.wait, 60)  # it is now waiting for the lock in a thread
    del memory.store.begin
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await asyncio.to_thread(holder.rollback)
    done = threading.Event()

    def insert() -> None:
        memory.add(FACTS[2])
        done.set()

    worker = threading.Thread(target=insert)
    worker.start()
    worker.join(timeout=60)
    assert done.is_set()  # the abandoned transaction did not keep the lock
    assert FACTS[1] not in [leaf.text for leaf in memory.leaves()]


def test_records_with_a_literal_backslash_u0000_are_stored_but_nul_and_surrogates_are_refused(tmp_path) -> None:
    from memtree.store import SQLiteBackend

    store = SQLiteBackend(tmp_path / "records.db")
    try:
        key = ("chat", "s")
        store.put_records(key, "log", {"1": {"text": "a literal \\u0000 is just text"}})
        assert store.get_records(key, "log")["1"]["text"] == "a literal \\u0000 is just text"
        with pytest.raises(ValueError, match="record '2' contains a NUL character"):
            store.put_records(key, "log", {"2": {"text": "nul \x00"}})
        with pytest.raises(ValueError, match="record '3' is not valid Unicode"):
            store.put_records(key, "log", {"3": {"nested": ["lone \ud800 surrogate"]}})
        assert list(store.get_records(key, "log")) == ["1"]
    finally:
        store.close()


def test_a_path_as_store_opens_sqlite_owned_by_the_memory(tmp_path) -> None:
    path = tmp_path / "memory.db"
    with MemTree(embedder=HashingEmbedder(16), store=str(path)) as memory:
        memory.add("Rosa lives in Lisbon.")
        store = memory.store
    assert isinstance(store, SQLiteBackend)
    with pytest.raises(Exception, match="closed"):
        store.read_changes(("default",), 0)  # the memory closed the store it opened
    with MemTree(embedder=HashingEmbedder(16), store=path) as again:  # a PathLike too
        assert [leaf.text for leaf in again.leaves()] == ["Rosa lives in Lisbon."]
    with pytest.raises(TypeError, match=r"store must be a Store .*, a SQLite file path or a postgresql:// DSN"):
        MemTree(embedder=HashingEmbedder(16), store=42)  # type: ignore[arg-type]
