"""MemTreeStore: LangGraph's BaseStore semantics, with MemTree behind semantic search."""

from __future__ import annotations

import asyncio
import itertools
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langchain.agents import create_agent
from langchain.tools import ToolRuntime
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.config import get_store
from langgraph.store.base import GetOp, InvalidNamespaceError, ListNamespacesOp, MatchCondition, PutOp, SearchOp
from langgraph.store.memory import InMemoryStore as LangGraphInMemoryStore
from lc_fakes import hashing_memory, scripted

from langchain_memtree import MemTreeRetriever, MemTreeStore

NOTES = {
    ("users", "maya"): {
        "dog": {"text": "Maya adopted a rescue greyhound called Pepper.", "year": 2024, "tags": ["pet"]},
        "job": {"text": "Maya works night shifts as a nurse in Oslo.", "year": 2023, "tags": ["work"]},
        "food": {"text": "Maya loves cardamom buns from the corner bakery.", "year": 2022, "tags": ["food"]},
    },
    ("users", "leo"): {
        "food": {"text": "Leo ate chicken ramen with yuzu in Kyoto.", "year": 2024, "tags": ["food"]},
        "music": {"text": "Leo plays the cello in a string quartet.", "year": 2021, "tags": ["music"]},
    },
    ("teams", "ops"): {"oncall": {"text": "The ops team rotates on-call every Monday.", "year": 2024, "tags": []}},
}


def filled(**kwargs: Any) -> MemTreeStore:
    store = MemTreeStore(hashing_memory(), index={"fields": ["text"]}, **kwargs)
    for namespace, items in NOTES.items():
        for key, value in items.items():
            store.put(namespace, key, value)
    return store


def keys(results: list[Any]) -> list[tuple[tuple[str, ...], str]]:
    return [(item.namespace, item.key) for item in results]


def test_put_get_keeps_values_and_times_exactly() -> None:
    store = filled()
    item = store.get(("users", "maya"), "dog")
    assert item is not None
    assert (item.namespace, item.key, item.value) == (("users", "maya"), "dog", NOTES[("users", "maya")]["dog"])
    assert isinstance(item.created_at, datetime) and item.created_at.tzinfo is not None
    store.put(("users", "maya"), "dog", {"text": "Maya's greyhound Pepper turned four.", "year": 2025})
    updated = store.get(("users", "maya"), "dog")
    assert updated is not None and updated.value == {"text": "Maya's greyhound Pepper turned four.", "year": 2025}
    assert updated.created_at == item.created_at and updated.updated_at > item.updated_at
    assert store.get(("users", "maya"), "cat") is None and store.get(("nobody",), "dog") is None


def test_query_search_is_memtree_retrieval_mapped_back_to_items() -> None:
    store = filled()
    results = store.search(("users",), query="Maya adopted a rescue greyhound called Pepper.", limit=3)
    assert keys(results)[0] == (("users", "maya"), "dog")
    assert results[0].score == pytest.approx(1.0, abs=1e-5)
    assert all(a.memtree_score >= b.memtree_score for a, b in itertools.pairwise(results))  # ranked by it
    tree = store.tree(("users", "maya"))
    leaf = tree.get(tree.find(source_id="dog")[0])
    assert (leaf.text, leaf.metadata) == (NOTES[("users", "maya")]["dog"]["text"], {"path": "text"})
    # the same tree answers a LangChain retriever
    docs = MemTreeRetriever(memory=tree, leaves_only=True, k=1).invoke("greyhound Pepper")
    assert docs[0].metadata["source_id"] == "dog"


def test_search_pages_filters_and_respects_namespace_prefixes() -> None:
    store = filled()
    query = "food ramen buns bakery cello greyhound nurse"
    everything = store.search((), query=query, limit=10)
    assert len(everything) == 6
    assert keys(store.search((), query=query, limit=2, offset=2)) == keys(everything)[2:4]
    assert {ns for ns, _ in keys(store.search(("users", "leo"), query=query))} == {("users", "leo")}
    assert keys(store.search(("users",), query=query, filter={"tags": ["food"]})) == [
        k for k in keys(everything) if k[1] == "food"
    ]
    recent = store.search(("users",), query=query, filter={"year": {"$gte": 2023}, "text": {"$ne": "x"}})
    assert {k for k in keys(recent)} == {
        (("users", "maya"), "dog"),
        (("users", "maya"), "job"),
        (("users", "leo"), "food"),
    }
    # the engine's $in / $nin (memtree.where), beyond LangGraph's own operators
    assert {k for k in keys(store.search(("users",), query=query, filter={"year": {"$in": [2021, 2022]}}))} == {
        (("users", "maya"), "food"),
        (("users", "leo"), "music"),
    }
    assert {k for k in keys(store.search(("users",), filter={"year": {"$nin": [2024, 2022]}}))} == {
        (("users", "maya"), "job"),
        (("users", "leo"), "music"),
    }
    assert store.search(("users",), query=query, limit=0) == []


def test_listing_without_query_goes_in_namespace_then_insertion_order() -> None:
    store = filled()
    listed = store.search(("users",), limit=10)
    assert keys(listed) == [
        (("users", "leo"), "food"),
        (("users", "leo"), "music"),
        (("users", "maya"), "dog"),
        (("users", "maya"), "job"),
        (("users", "maya"), "food"),
    ]
    assert all(item.score is None for item in listed)
    assert keys(store.search(("users",), filter={"year": 2024})) == [
        (("users", "leo"), "food"),
        (("users", "maya"), "dog"),
    ]
    assert keys(store.search(("users",), limit=2, offset=1)) == keys(listed)[1:3]


def test_index_false_and_per_put_fields() -> None:
    store = filled()
    store.put(("users", "maya"), "secret", {"text": "Maya hides the spare key under a greyhound statue."}, index=False)
    store.put(
        ("users", "maya"),
        "trip",
        {"title": "Lisbon", "days": [{"note": "tram 28"}, {"note": "pastéis"}]},
        index=["days[*].note"],
    )
    tree = store.tree(("users", "maya"))
    assert tree.find(source_id="secret") == []
    trip = [tree.get(i) for i in tree.find(source_id="trip")]
    assert sorted((n.metadata["path"], n.text) for n in trip) == [
        ("days[*].note.0", "tram 28"),
        ("days[*].note.1", "pastéis"),
    ]
    results = store.search(("users", "maya"), query="greyhound statue spare key", limit=10)
    assert keys(results)[-1] == (("users", "maya"), "secret") and results[-1].score is None  # unindexed: last, unscored
    assert (("users", "maya"), "trip") in keys(store.search(("users", "maya"), query="tram 28", limit=1))


def test_whole_value_is_embedded_by_default_and_updates_reindex_only_what_changed() -> None:
    store = MemTreeStore(hashing_memory(), index={"fields": ["$"]})
    store.put(("docs",), "a", {"text": "Pepper chases squirrels."})
    tree = store.tree(("docs",))
    assert [tree.get(i).text for i in tree.find(source_id="a")] == ['{"text": "Pepper chases squirrels."}']
    fielded = MemTreeStore(hashing_memory(), index={"fields": ["text"]})
    fielded.put(("docs",), "a", {"text": "Pepper chases squirrels.", "views": 1})
    leaf = fielded.tree(("docs",)).find(source_id="a")
    fielded.put(("docs",), "a", {"text": "Pepper chases squirrels.", "views": 2})  # text unchanged: same leaf
    assert fielded.tree(("docs",)).find(source_id="a") == leaf
    fielded.put(("docs",), "a", {"text": "Pepper sleeps all day.", "views": 3})
    tree = fielded.tree(("docs",))
    assert tree.find(source_id="a") == leaf and len(tree) == 1  # corrected in place: the same leaf
    assert tree.get(leaf[0]).text == "Pepper sleeps all day."
    assert [version.text for version in tree.history(leaf[0])] == ["Pepper chases squirrels."]


def test_put_on_an_existing_key_updates_its_leaves_in_place_with_history() -> None:
    store = MemTreeStore(hashing_memory(), index={"fields": ["text", "note"]})
    namespace = ("memories", "maya")
    store.put(namespace, "dog", {"text": "Maya's greyhound is called Pepper.", "note": "adopted in April"})
    store.put(namespace, "job", {"text": "Maya works night shifts as a nurse.", "note": "since May"})
    tree = store.tree(namespace)
    leaves = {tree.get(i).metadata["path"]: i for i in tree.find(source_id="dog")}
    store.put(namespace, "dog", {"text": "Maya's greyhound Pepper is scared of bicycles.", "note": "adopted in April"})
    assert {tree.get(i).metadata["path"]: i for i in tree.find(source_id="dog")} == leaves  # same ids
    assert tree.get(leaves["text"]).text == "Maya's greyhound Pepper is scared of bicycles."
    assert [v.text for v in tree.history(leaves["text"])] == ["Maya's greyhound is called Pepper."]
    assert tree.history(leaves["note"]) == []  # unchanged text: untouched
    found = store.search(namespace, query="Maya's greyhound Pepper is scared of bicycles.", limit=1)
    assert [(item.key, item.score) for item in found] == [("dog", pytest.approx(1.0, abs=1e-5))]
    assert store.search(namespace, query="Maya's greyhound is called Pepper.", limit=1)[0].score < 0.99
    store.put(namespace, "dog", {"text": "Maya's greyhound Pepper is scared of bicycles."})  # the note is gone
    assert tree.find(source_id="dog") == [leaves["text"]] and len(tree) == 3
    assert tree.check_integrity() == []


async def test_async_put_on_an_existing_key_updates_in_place() -> None:
    store = MemTreeStore(hashing_memory(), index={"fields": ["text"]})
    await store.aput(("n",), "k", {"text": "first version of the note"})
    (leaf,) = store.tree(("n",)).find(source_id="k")
    await store.aput(("n",), "k", {"text": "second version of the note"})
    tree = store.tree(("n",))
    assert tree.find(source_id="k") == [leaf] and tree.get(leaf).text == "second version of the note"
    assert [v.text for v in tree.history(leaf)] == ["first version of the note"]


def test_equal_texts_in_two_items_are_two_leaves() -> None:
    store = MemTreeStore(hashing_memory(), index={"fields": ["text"]})
    store.put(("docs",), "a", {"text": "same words"})
    store.put(("docs",), "b", {"text": "same words"})
    assert keys(store.search(("docs",), query="same words")) == [(("docs",), "a"), (("docs",), "b")]
    store.delete(("docs",), "a")
    assert keys(store.search(("docs",), query="same words")) == [(("docs",), "b")]


def test_delete_removes_item_and_leaves_and_empty_namespaces_disappear() -> None:
    store = filled()
    store.delete(("teams", "ops"), "oncall")
    store.delete(("teams", "ops"), "never-existed")  # deleting nothing is fine, as in LangGraph
    assert store.get(("teams", "ops"), "oncall") is None
    assert ("teams", "ops") not in store.list_namespaces()
    assert len(store.tree(("teams", "ops"))) == 0
    store.delete(("users", "leo"), "music")
    assert store.tree(("users", "leo")).find(source_id="music") == []
    assert keys(store.search(("users", "leo"), query="cello quartet")) == [(("users", "leo"), "food")]


def test_list_namespaces_prefix_suffix_wildcards_depth_and_paging() -> None:
    store = filled()
    store.put(("users", "maya", "drafts"), "d1", {"text": "draft"})
    assert store.list_namespaces() == [
        ("teams", "ops"),
        ("users", "leo"),
        ("users", "maya"),
        ("users", "maya", "drafts"),
    ]
    assert store.list_namespaces(prefix=("users",), max_depth=2) == [("users", "leo"), ("users", "maya")]
    assert store.list_namespaces(prefix=("*", "maya")) == [("users", "maya"), ("users", "maya", "drafts")]
    assert store.list_namespaces(suffix=("ops",)) == [("teams", "ops")]
    assert store.list_namespaces(max_depth=1) == [("teams",), ("users",)]
    assert store.list_namespaces(limit=2, offset=1) == [("users", "leo"), ("users", "maya")]


def test_ops_in_a_batch_run_in_order() -> None:
    store = MemTreeStore(hashing_memory(), index={"fields": ["text"]})
    results = store.batch(
        [
            PutOp(("n",), "k", {"text": "first"}),
            GetOp(("n",), "k"),
            PutOp(("n",), "k", None),
            GetOp(("n",), "k"),
            ListNamespacesOp(match_conditions=(MatchCondition("prefix", ("n",)),)),
            SearchOp(("n",), query="first"),
        ]
    )
    assert results[0] is None and results[1].value == {"text": "first"}
    assert results[2:] == [None, None, [], []]


async def test_async_batch_matches_sync() -> None:
    sync, other = filled(), MemTreeStore(hashing_memory(), index={"fields": ["text"]})
    for namespace, items in NOTES.items():
        for key, value in items.items():
            await other.aput(namespace, key, value)
    query = "greyhound nurse ramen"
    assert keys(await other.asearch(("users",), query=query)) == keys(sync.search(("users",), query=query))
    assert (await other.aget(("users", "leo"), "food")).value == NOTES[("users", "leo")]["food"]  # type: ignore[union-attr]
    assert await other.alist_namespaces(prefix=("users",)) == sync.list_namespaces(prefix=("users",))
    await asyncio.gather(*(other.adelete(ns, key) for ns, items in NOTES.items() for key in items))
    assert await other.alist_namespaces() == []


def test_bad_input_is_refused_clearly() -> None:
    store = MemTreeStore(hashing_memory())
    with pytest.raises(InvalidNamespaceError, match="cannot be empty"):
        store.put((), "k", {"a": 1})
    with pytest.raises(InvalidNamespaceError, match="langgraph"):
        store.put(("langgraph", "x"), "k", {"a": 1})
    with pytest.raises(InvalidNamespaceError, match="periods"):
        store.batch([GetOp(("a.b",), "k")])
    with pytest.raises(ValueError, match="ttl must be a positive number of minutes"):
        store.put(("n",), "k", {"a": 1}, ttl=0)
    with pytest.raises(TypeError, match="JSON-serializable"):
        store.put(("n",), "k", {"when": datetime.now()})
    with pytest.raises(ValueError, match="NUL character"):
        store.put(("n",), "k", {"text": "a\x00b"})
    with pytest.raises(ValueError, match="not valid Unicode"):
        store.put(("n",), "k", {"text": "lone \udc80"})
    with pytest.raises(TypeError, match="must be dicts"):
        store.batch([PutOp(("n",), "k", ["not", "a", "dict"])])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"unsupported filter operator '\$regex'; use one of: \$eq, \$ne, \$gt"):
        store.search(("n",), filter={"a": {"$regex": "x"}})
    with pytest.raises(ValueError, match=r"filter 'a': \$in takes a list of values, got 'xy'"):
        store.search(("n",), filter={"a": {"$in": "xy"}})
    with pytest.raises(ValueError) as unknown:
        MemTreeStore(hashing_memory(), index={"dims": 64, "feilds": ["text"], "distance": "cosine"})
    assert str(unknown.value) == (
        "unknown index key(s) ['distance', 'feilds']; MemTreeStore accepts ['dims', 'embed', 'fields', "
        "'distance_type'] (as LangGraph's IndexConfig: dims, embed, fields; and distance_type as PostgresStore's)"
    )
    with pytest.raises(ValueError, match="index dims must be a positive int"):
        MemTreeStore(hashing_memory(), index={"dims": 0})
    with pytest.raises(TypeError, match="index embed must be a LangChain Embeddings"):
        MemTreeStore(hashing_memory(), index={"embed": 42})  # type: ignore[typeddict-item]
    with pytest.raises(ValueError, match="must be 'provider:model'"):
        MemTreeStore(hashing_memory(), index={"embed": "minilm"})
    assert store.list_namespaces() == []


namespaces = st.tuples(st.sampled_from(["a", "b"]), st.sampled_from(["x", "y", "z"])) | st.tuples(
    st.sampled_from(["a", "c"])
)
values = st.fixed_dictionaries({"n": st.integers(0, 3), "tag": st.sampled_from(["red", "blue"])})
puts = st.lists(st.tuples(namespaces, st.sampled_from(["k1", "k2", "k3"]), values), min_size=1, max_size=12)
filters = st.sampled_from([None, {"tag": "red"}, {"n": {"$gt": 1}}, {"n": {"$lte": 1}, "tag": "blue"}])
prefixes = st.sampled_from([(), ("a",), ("b", "y"), ("c",), ("*", "x")])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(puts=puts, filter=filters, prefix=prefixes, depth=st.sampled_from([None, 1, 2]))
def test_same_answers_as_langgraphs_own_in_memory_store(
    puts: list[tuple[tuple[str, ...], str, dict[str, Any]]],
    filter: dict[str, Any] | None,
    prefix: tuple[str, ...],
    depth: int | None,
) -> None:
    ours, theirs = MemTreeStore(hashing_memory(), index={"fields": ["tag"]}), LangGraphInMemoryStore()
    for namespace, key, value in puts:
        ours.put(namespace, key, value)
        theirs.put(namespace, key, value)
    for namespace, key, _ in puts:
        mine, reference = ours.get(namespace, key), theirs.get(namespace, key)
        assert mine is not None and reference is not None and mine.value == reference.value
    assert ours.list_namespaces(prefix=prefix or None, max_depth=depth) == theirs.list_namespaces(
        prefix=prefix or None, max_depth=depth
    )
    search_prefix = tuple(part for part in prefix if part != "*")
    found = {(i.namespace, i.key): i.value for i in ours.search(search_prefix, filter=filter, limit=100)}
    expected = {(i.namespace, i.key): i.value for i in theirs.search(search_prefix, filter=filter, limit=100)}
    assert found == expected


def test_an_agent_tool_writes_and_reads_the_store() -> None:
    store = MemTreeStore(hashing_memory(), index={"fields": ["text"]})

    @tool
    def save_memory(text: str, runtime: ToolRuntime) -> str:
        """Save a fact about the user."""
        assert runtime.store is store
        runtime.store.put(("memories", "maya"), f"m{len(runtime.store.search(('memories', 'maya')))}", {"text": text})
        return "saved"

    @tool
    def recall(query: str) -> str:
        """Look up facts about the user."""
        return "\n".join(item.value["text"] for item in get_store().search(("memories", "maya"), query=query, limit=1))

    model = scripted(
        AIMessage(
            "", tool_calls=[{"name": "save_memory", "args": {"text": "Maya's greyhound is Pepper."}, "id": "c1"}]
        ),
        AIMessage("", tool_calls=[{"name": "save_memory", "args": {"text": "Maya works as a nurse."}, "id": "c2"}]),
        AIMessage("", tool_calls=[{"name": "recall", "args": {"query": "greyhound Pepper"}, "id": "c3"}]),
        AIMessage("Your greyhound is Pepper."),
    )
    agent = create_agent(model, tools=[save_memory, recall], store=store)
    result = agent.invoke({"messages": [HumanMessage("Remember my dog and job, then tell me my dog's name.")]})
    tool_outputs = [m.content for m in result["messages"] if isinstance(m, ToolMessage)]
    assert tool_outputs == ["saved", "saved", "Maya's greyhound is Pepper."]
    assert [item.value for item in store.search(("memories", "maya"))] == [
        {"text": "Maya's greyhound is Pepper."},
        {"text": "Maya works as a nurse."},
    ]
    assert result["messages"][-1].content == "Your greyhound is Pepper."


def test_concurrent_puts_to_one_key_leave_exactly_the_last_value_indexed() -> None:
    store = MemTreeStore(hashing_memory(), index={"fields": ["text"]})
    texts = [f"version {i} of the shopping list: {'milk ' * i}eggs" for i in range(8)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda text: store.put(("lists",), "shopping", {"text": text}), texts))
    item = store.get(("lists",), "shopping")
    assert item is not None and item.value["text"] in texts
    tree = store.tree(("lists",))
    assert [tree.get(leaf).text for leaf in tree.find(source_id="shopping")] == [item.value["text"]]
    assert len(tree) == 1 and tree.check_integrity() == []


def test_traversal_search_and_unknown_modes() -> None:
    with pytest.raises(ValueError, match="unknown mode 'beam'"):
        MemTreeStore(hashing_memory(), mode="beam")  # type: ignore[arg-type]
    store = filled(mode="traversal")
    results = store.search(("users",), query="Leo plays the cello in a string quartet.", limit=2)
    assert keys(results)[0] == (("users", "leo"), "music") and results[0].score == pytest.approx(1.0, abs=1e-5)


def test_traversal_search_fills_the_limit_beam_first_and_filters_work() -> None:
    words = ["dog", "cat", "ramen", "cello", "nurse", "oslo", "lisbon", "bike", "tram"]
    words += ["bakery", "tea", "coffee", "rain", "snow", "sun", "moon", "river", "hill"]
    # Eager: the scores compared below must not move while a background worker rewrites summaries.
    store = MemTreeStore(hashing_memory(), index={"fields": ["text"]}, mode="traversal", aggregation="eager")
    for i in range(40):  # every text a different 4-word pick: a tree several levels deep
        text = " ".join(words[(i * j + i // 7) % len(words)] for j in (1, 3, 5, 7))
        store.put(("n",), f"k{i}", {"text": text, "i": i})
    query = "dog cat tea"
    tree = store.tree(("n",))
    options: dict[str, Any] = {"leaves_only": True, "min_score": -1.0, "k": 100}
    options["k"] = 10 * 2 + 8  # what the store asks each tree for a page of 10
    beam = {hit.source_id: hit.score for hit in tree.retrieve(query, mode="traversal", **options)}
    cosines = {hit.source_id: hit.similarity for hit in tree.retrieve(query, mode="traversal", **options)}
    assert len(beam) == options["k"]  # traversal fills k: the beam's nodes, then the leaves below them

    results = store.search(("n",), query=query, limit=10)
    found = [(item.key, item.memtree_score) for item in results]
    assert len(found) == 10 and len({key for key, _ in found}) == 10
    assert all(beam[key] == score for key, score in found)  # what traversal reached, best first
    assert all(item.score == cosines[item.key] for item in results)  # the score shown is the cosine
    assert [score for _, score in found] == sorted(beam.values(), reverse=True)[:10]
    assert keys(store.search(("n",), query=query, limit=4, offset=6)) == keys(results[6:10])

    late = store.search(("n",), query=query, limit=10, filter={"i": {"$gte": 30}})
    assert sorted(item.value["i"] for item in late) == list(range(30, 40))
    scores = [item.memtree_score or 0.0 for item in late]
    assert scores == sorted(scores, reverse=True)  # every tree gave all it has: one ranking
    assert len(store.search(("n",), query=query, limit=50)) == 40
