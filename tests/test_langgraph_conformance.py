"""LangGraph store conformance: one suite, run against ``MemTreeStore`` and LangGraph's
own ``InMemoryStore`` in the same test run.

Written from LangGraph's documented ``BaseStore`` semantics (the docstrings of
``GetOp``, ``SearchOp``, ``PutOp``, ``ListNamespacesOp``, ``TTLConfig``) and the
behaviour its own store tests pin down. A test that both stores pass is behaviour a
user can port from LangGraph unchanged. Where the two differ on purpose, the test
says so through :data:`DIFFERENCES` and the difference is listed, with its reason,
in docs/langchain.md ("Differences from the framework's own classes");
``test_every_listed_difference_is_in_the_docs`` keeps the two lists in step.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import re
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from langchain_core.embeddings import Embeddings
from langgraph.store.base import (
    BaseStore,
    GetOp,
    InvalidNamespaceError,
    Item,
    ListNamespacesOp,
    MatchCondition,
    PutOp,
    SearchItem,
    SearchOp,
)
from langgraph.store.memory import InMemoryStore
from lc_fakes import hashing_memory

from langchain_memtree import MemTreeStore

DOCS = Path(__file__).resolve().parent.parent / "docs" / "langchain.md"
STORES = ("memtree", "langgraph")

DIFFERENCES = {
    "dotted filter keys": "InMemoryStore reads a dotted filter key as one top-level key; MemTreeStore, like "
    "LangGraph's SqliteStore and PostgresStore, also follows it into nested dicts",
    "ttl": "InMemoryStore does not support TTL (supports_ttl is False); MemTreeStore does, as LangGraph's "
    "SqliteStore and PostgresStore",
    "search order across namespaces": "InMemoryStore lists namespaces in the order first written; MemTreeStore "
    "in sorted order (each namespace's items in the order first put, in both)",
    "batch of writes then reads": "InMemoryStore answers every read of a batch before it applies the batch's "
    "writes; MemTreeStore runs a batch's operations in order, as LangGraph's SqliteStore does",
    "distance_type": "InMemoryStore ignores index keys it does not know; MemTreeStore accepts "
    'distance_type="cosine" (its only measure) and refuses other values and unknown keys by name',
    "unknown filter operators": "both raise ValueError; MemTreeStore's message lists the accepted operators "
    "and it accepts $in and $nin besides LangGraph's six",
    "emptied namespaces": "InMemoryStore keeps listing a namespace after its last item is deleted; "
    "MemTreeStore, like LangGraph's SqliteStore and PostgresStore, lists only namespaces that hold items",
    "ranking": "InMemoryStore ranks by cosine similarity; MemTreeStore by its retrieval score (cosine mixed "
    "with BM25, in memtree_score), while score is the cosine in both, so scores need not decrease down a page",
    "relevance floor": "InMemoryStore returns the best items however unrelated; MemTreeStore leaves out items "
    "less similar than the memory's relevance floor (for an embedder with a calibrated one)",
}
"""Differences kept on purpose (each also a row of docs/langchain.md's table)."""


class WordEmbeddings(Embeddings):
    """Bag-of-words vectors (each word hashed to one of 64 dimensions), normalized:
    texts sharing words are similar, in both stores alike, with no model."""

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [self.embed_query(text) for text in texts]

    def embed_query(self, text: str) -> list[float]:
        vector = [0.0] * 64
        for word in re.findall(r"\w+", text.lower()):
            vector[int(hashlib.md5(word.encode()).hexdigest(), 16) % 64] += 1.0
        norm = math.sqrt(sum(value * value for value in vector)) or 1.0
        return [value / norm for value in vector]


def make_store(kind: str, *, indexed: bool = False) -> BaseStore:
    index: Any = {"dims": 64, "embed": WordEmbeddings(), "fields": ["text"]} if indexed else None
    if kind == "langgraph":
        return InMemoryStore(index=index)
    return MemTreeStore(hashing_memory(), index=index, aggregation="eager")


@pytest.fixture(params=STORES)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def store(kind: str) -> Iterator[BaseStore]:
    made = make_store(kind)
    yield made
    if isinstance(made, MemTreeStore):
        made.close()


@pytest.fixture
def vectors(kind: str) -> Iterator[BaseStore]:
    made = make_store(kind, indexed=True)
    yield made
    if isinstance(made, MemTreeStore):
        made.close()


# -- put, get, delete ---------------------------------------------------------------------


def test_put_get_delete(store: BaseStore) -> None:
    assert store.get(("docs",), "missing") is None
    store.put(("docs", "a"), "k", {"text": "first", "n": 1})
    item = store.get(("docs", "a"), "k")
    assert isinstance(item, Item) and not isinstance(item, SearchItem)
    assert (item.namespace, item.key, item.value) == (("docs", "a"), "k", {"text": "first", "n": 1})
    assert isinstance(item.created_at, datetime) and isinstance(item.updated_at, datetime)
    store.put(("docs", "a"), "k", {"text": "second"})
    again = store.get(("docs", "a"), "k")
    assert again is not None and again.value == {"text": "second"}
    assert again.updated_at >= item.updated_at
    store.delete(("docs", "a"), "k")
    assert store.get(("docs", "a"), "k") is None
    store.delete(("docs", "a"), "never-there")  # deleting nothing is no error


def test_keys_and_namespaces_are_separate(store: BaseStore) -> None:
    store.put(("a",), "k", {"v": 1})
    store.put(("a", "b"), "k", {"v": 2})
    store.put(("b",), "k", {"v": 3})
    assert [store.get(ns, "k").value["v"] for ns in [("a",), ("a", "b"), ("b",)]] == [1, 2, 3]  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("namespace", "message"),
    [((), "cannot be empty"), (("langgraph", "x"), "langgraph"), (("a.b",), "periods"), (("a", ""), "empty")],
)
def test_bad_namespaces_are_refused(store: BaseStore, namespace: tuple[str, ...], message: str) -> None:
    with pytest.raises(InvalidNamespaceError, match=message):
        store.put(namespace, "k", {"v": 1})


# -- search: filters and pagination ---------------------------------------------------------


@pytest.fixture
def priced(store: BaseStore) -> BaseStore:
    store.put(("items",), "one", {"price": 10, "color": "red", "active": True, "tags": ["a"], "meta": {"size": "s"}})
    store.put(("items",), "two", {"price": 20, "color": "blue", "active": False, "tags": ["a", "b"]})
    store.put(("items",), "three", {"price": 30, "color": "red", "active": True, "meta": {"size": "l"}})
    return store


@pytest.mark.parametrize(
    ("filter", "expected"),
    [
        ({"color": "red"}, {"one", "three"}),
        ({"color": {"$eq": "blue"}}, {"two"}),
        ({"color": {"$ne": "red"}}, {"two"}),
        ({"price": {"$gt": 15}}, {"two", "three"}),
        ({"price": {"$gte": 20, "$lte": 20}}, {"two"}),
        ({"price": {"$lt": 20}}, {"one"}),
        ({"price": {"$lt": float("inf")}}, {"one", "two", "three"}),
        ({"price": {"$gt": float("-inf")}}, {"one", "two", "three"}),
        ({"price": {"$lt": 10**100}}, {"one", "two", "three"}),
        ({"price": {"$eq": float("nan")}}, set()),
        ({"active": True}, {"one", "three"}),
        ({"active": False}, {"two"}),
        ({"tags": ["a", "b"]}, {"two"}),
        ({"meta": {"size": "l"}}, {"three"}),
        ({"color": "red", "price": {"$gt": 15}}, {"three"}),
        ({"missing": "x"}, set()),
    ],
)
def test_search_filters(priced: BaseStore, filter: dict[str, Any], expected: set[str]) -> None:
    assert {item.key for item in priced.search(("items",), filter=filter)} == expected


def test_dotted_filter_keys_reach_nested_fields(kind: str, store: BaseStore) -> None:
    store.put(("docs",), "hyphen", {"access-level": "public", "user": {"access-level": "nested"}})
    store.put(("docs",), "digit", {"123abc": "ok", "user": {"123abc": "ok2"}})
    assert [item.key for item in store.search(("docs",), filter={"access-level": "public"})] == ["hyphen"]
    assert [item.key for item in store.search(("docs",), filter={"123abc": "ok"})] == ["digit"]
    nested = [item.key for item in store.search(("docs",), filter={"user.access-level": "nested"})]
    # difference: "dotted filter keys" (InMemoryStore reads the whole string as one key)
    assert nested == (["hyphen"] if kind == "memtree" else [])


def test_unknown_filter_operators_are_refused(kind: str, priced: BaseStore) -> None:
    with pytest.raises(ValueError, match=r"\$regex") as refused:
        priced.search(("items",), filter={"color": {"$regex": "r.*"}})
    if kind == "memtree":  # difference: "unknown filter operators" (the accepted ones are listed)
        assert "$eq, $ne, $gt, $gte, $lt, $lte" in str(refused.value)


def test_pagination_pages_are_disjoint_and_complete(store: BaseStore) -> None:
    for i in range(7):
        store.put(("page",), f"k{i}", {"i": i})
    pages = [store.search(("page",), limit=3, offset=offset) for offset in (0, 3, 6, 9)]
    assert [len(page) for page in pages] == [3, 3, 1, 0]
    assert [item.key for page in pages for item in page] == [f"k{i}" for i in range(7)]  # order first put
    assert store.search(("page",), limit=0) == []
    assert all(isinstance(item, SearchItem) and item.score is None for item in pages[0])


def test_search_is_scoped_by_namespace_prefix(store: BaseStore) -> None:
    store.put(("users", "alice"), "k", {"v": 1})
    store.put(("users", "alina"), "k", {"v": 2})
    store.put(("teams", "alice"), "k", {"v": 3})
    assert {item.namespace for item in store.search(("users",))} == {("users", "alice"), ("users", "alina")}
    assert [item.namespace for item in store.search(("users", "alice"))] == [("users", "alice")]
    assert store.search(("users", "ali")) == []  # a prefix is whole labels
    assert len(store.search(())) == 3


def test_search_order_across_namespaces(kind: str, store: BaseStore) -> None:
    store.put(("b",), "k", {"v": 1})
    store.put(("a",), "k", {"v": 2})
    order = [item.namespace for item in store.search(())]
    # difference: "search order across namespaces"
    assert order == ([("a",), ("b",)] if kind == "memtree" else [("b",), ("a",)])


# -- semantic search --------------------------------------------------------------------


def test_semantic_search_ranks_by_meaning_and_filters(kind: str, vectors: BaseStore) -> None:
    vectors.put(("mem",), "cat", {"text": "the cat sleeps on the sofa", "kind": "pet"})
    vectors.put(("mem",), "car", {"text": "the car needs new tyres", "kind": "thing"})
    vectors.put(("mem",), "dog", {"text": "the dog chases the cat", "kind": "pet"})
    vectors.put(("mem",), "plain", {"other": "no text field"}, index=False)
    found = vectors.search(("mem",), query="cat sleeps on the sofa", limit=2)
    assert next(item.key for item in found) == "cat" and len(found) == 2
    assert all(isinstance(item.score, float) for item in found)
    ranked = [getattr(item, "memtree_score", item.score) for item in found]  # what each store ranks by
    assert ranked[0] >= ranked[1]  # type: ignore[operator]
    filtered = vectors.search(("mem",), query="tyres", filter={"kind": "pet"})
    assert {item.key for item in filtered} <= {"cat", "dog"} and filtered
    assert {item.key for item in vectors.search(("mem",), query="cat", limit=10)} >= {"cat", "dog"}
    assert vectors.get(("mem",), "plain") is not None  # index=False: stored, found by get


def test_scores_are_on_the_scale_of_cosine(kind: str, vectors: BaseStore) -> None:
    vectors.put(("mem",), "cat", {"text": "the cat sleeps on the sofa"})
    vectors.put(("mem",), "car", {"text": "the car needs new tyres"})
    [best] = vectors.search(("mem",), query="cat sofa", limit=1)
    embed = WordEmbeddings()
    query, found = embed.embed_query("cat sofa"), embed.embed_query(best.value["text"])
    cosine = sum(a * b for a, b in zip(query, found, strict=True))
    assert best.key == "cat" and best.score == pytest.approx(cosine)  # score: the cosine, in both stores
    # difference: "ranking" (MemTreeStore ranks by cosine mixed with BM25, kept beside the score)
    assert (getattr(best, "memtree_score", None) is not None) == (kind == "memtree")


def test_a_put_with_its_own_fields_indexes_those(vectors: BaseStore) -> None:
    vectors.put(("mem",), "a", {"text": "unrelated words", "title": "violin lessons"}, index=["title"])
    vectors.put(("mem",), "b", {"text": "violin lessons on monday"})
    assert {item.key for item in vectors.search(("mem",), query="violin lessons", limit=2)} == {"a", "b"}


# -- list_namespaces --------------------------------------------------------------------


@pytest.fixture
def spaces(store: BaseStore) -> BaseStore:
    for namespace in [("a", "b", "c"), ("a", "b", "d"), ("a", "e"), ("f", "b", "c"), ("a", "x", "public")]:
        store.put(namespace, "k", {"v": 1})
    return store


def test_list_namespaces(kind: str, spaces: BaseStore) -> None:
    everything = [("a", "b", "c"), ("a", "b", "d"), ("a", "e"), ("a", "x", "public"), ("f", "b", "c")]
    assert spaces.list_namespaces() == everything
    assert spaces.list_namespaces(prefix=("a", "b")) == [("a", "b", "c"), ("a", "b", "d")]
    assert spaces.list_namespaces(suffix=("c",)) == [("a", "b", "c"), ("f", "b", "c")]
    assert spaces.list_namespaces(prefix=("*", "b")) == [("a", "b", "c"), ("a", "b", "d"), ("f", "b", "c")]
    assert spaces.list_namespaces(max_depth=2) == [("a", "b"), ("a", "e"), ("a", "x"), ("f", "b")]
    assert spaces.list_namespaces(limit=2, offset=1) == everything[1:3]
    spaces.delete(("a", "e"), "k")
    listed = spaces.list_namespaces()
    # difference: "emptied namespaces" (InMemoryStore keeps listing a namespace whose items are all deleted)
    assert (("a", "e") in listed) == (kind == "langgraph")


def test_list_namespaces_in_a_batch(spaces: BaseStore) -> None:
    results = spaces.batch(
        [
            ListNamespacesOp(match_conditions=None, max_depth=None, limit=10, offset=0),
            ListNamespacesOp(match_conditions=(MatchCondition("suffix", ("public",)),), limit=10),
        ]
    )
    assert len(results[0]) == 5 and results[1] == [("a", "x", "public")]  # type: ignore[arg-type]


# -- batch --------------------------------------------------------------------------------


def batch_of_each() -> list[Any]:
    return [
        GetOp(("test", "foo"), "key1"),
        PutOp(("test", "bar"), "key2", {"data": "value2"}),
        SearchOp(("test",), filter={"data": "value1"}, limit=10, offset=0),
        ListNamespacesOp(match_conditions=None, max_depth=None, limit=10, offset=0),
        GetOp(("test",), "key3"),
    ]


def check_batch_of_each(results: list[Any]) -> None:
    assert len(results) == 5
    assert isinstance(results[0], Item) and results[0].value == {"data": "value1"}
    assert results[1] is None
    assert [item.key for item in results[2]] == ["key1"]
    assert {("test", "foo"), ("test", "bar")} <= set(results[3])
    assert results[4] is None


def test_batch_results_follow_the_operations(store: BaseStore) -> None:
    store.put(("test", "foo"), "key1", {"data": "value1"})
    store.put(("test", "bar"), "key2", {"data": "value2"})
    check_batch_of_each(store.batch(batch_of_each()))
    check_batch_of_each(asyncio.run(store.abatch(batch_of_each())))
    reordered = store.batch(
        [
            SearchOp(("test",), filter=None, limit=5, offset=0),
            GetOp(("test", "bar"), "key2"),
            ListNamespacesOp(limit=5),
            PutOp(("test",), "key3", {"data": "value3"}),
            GetOp(("test", "foo"), "key1"),
        ]
    )
    assert len(reordered[0]) >= 2 and reordered[1].value == {"data": "value2"}  # type: ignore[union-attr, arg-type]
    assert reordered[3] is None and reordered[4].value == {"data": "value1"}  # type: ignore[union-attr]
    assert store.get(("test",), "key3").value == {"data": "value3"}  # type: ignore[union-attr]


def test_a_batch_of_writes_then_reads(kind: str, store: BaseStore) -> None:
    results = store.batch([PutOp(("w",), "k", {"v": 1}), GetOp(("w",), "k"), PutOp(("w",), "k", None)])
    # difference: "batch of writes then reads"
    if kind == "memtree":
        assert results[1] is not None and results[1].value == {"v": 1}  # type: ignore[union-attr]
    else:
        assert results[1] is None
    assert store.get(("w",), "k") is None


# -- index options --------------------------------------------------------------------------


def test_distance_type(kind: str) -> None:
    config: Any = {"dims": 64, "embed": WordEmbeddings(), "fields": ["text"], "distance_type": "cosine"}
    if kind == "langgraph":
        InMemoryStore(index=config)
        InMemoryStore(index={**config, "distance_type": "l2"})  # difference: "distance_type" (ignored there)
        return
    MemTreeStore(hashing_memory(), index=config).close()
    with pytest.raises(ValueError, match=r"distance_type 'l2' is not supported; MemTreeStore accepts: cosine"):
        MemTreeStore(hashing_memory(), index={**config, "distance_type": "l2"})


def test_from_conn_string_memory() -> None:
    with MemTreeStore.from_conn_string(":memory:") as store:
        store.put(("a",), "k", {"v": 1})
        assert store.get(("a",), "k").value == {"v": 1}  # type: ignore[union-attr]


# -- ttl ----------------------------------------------------------------------------------


def test_ttl_support(kind: str, store: BaseStore) -> None:
    # difference: "ttl"
    assert store.supports_ttl == (kind == "memtree")
    if kind == "langgraph":
        with pytest.raises(NotImplementedError, match="TTL is not supported"):
            store.put(("t",), "k", {"v": 1}, ttl=5)
        return
    store.put(("t",), "k", {"v": 1}, ttl=5)
    assert store.get(("t",), "k") is not None


def test_every_listed_difference_is_in_the_docs() -> None:
    table = DOCS.read_text(encoding="utf-8")
    section = table.split("## Differences from the framework's own classes", 1)
    assert len(section) == 2, "docs/langchain.md needs its differences section"
    for name in DIFFERENCES:
        assert f"| {name} |" in section[1], f"difference {name!r} is not a row of the docs table"
