"""MemTreeStore configured as LangGraph's stores are: no index (exact key-value), LangGraph's
``index`` keys, ``from_conn_string``, one tree shared with the middleware, and engine
backends refused where a LangGraph store is expected."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.tools import ToolRuntime
from langchain_core.embeddings import DeterministicFakeEmbedding
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.store.memory import InMemoryStore as LangGraphInMemoryStore
from lc_fakes import PromptRecorder, hashing_memory, scripted
from openai_server import FakeOpenAIServer

from langchain_memtree import MEMORY_HEADER, MemTreeStore
from memtree import Aggregator, HashingEmbedder, MemoryBackend, MemTree, MemTreeConfig
from memtree.embed import Matrix

ITEMS = {
    ("users", "maya"): {
        "dog": {"text": "Maya adopted a rescue greyhound called Pepper.", "year": 2024},
        "job": {"text": "Maya works night shifts as a nurse.", "year": 2023},
    },
    ("users", "leo"): {"food": {"text": "Leo loves ramen with yuzu.", "year": 2024}},
}


class CountingEmbedder(HashingEmbedder):
    def __init__(self) -> None:
        super().__init__(64)
        self.texts: list[str] = []

    def embed(self, texts: Sequence[str]) -> Matrix:
        self.texts += list(texts)
        return super().embed(texts)


class CountingAggregator(Aggregator):
    def __init__(self) -> None:
        self.calls = 0

    def aggregate(self, existing: str, new: str, count: int) -> str:
        self.calls += 1
        return f"{existing} {new}"


def fill(store: MemTreeStore) -> None:
    for namespace, items in ITEMS.items():
        for key, value in items.items():
            store.put(namespace, key, value)


def keys(results: list[Any]) -> list[tuple[tuple[str, ...], str]]:
    return [(item.namespace, item.key) for item in results]


# -- without index: an exact key-value store -------------------------------------------


def test_without_index_nothing_is_embedded_or_summarized_and_a_query_is_ignored() -> None:
    embedder, aggregator = CountingEmbedder(), CountingAggregator()
    memory = MemTree(embedder=embedder, aggregator=aggregator, config=MemTreeConfig(theta0=0.2))
    store, theirs = MemTreeStore(memory), LangGraphInMemoryStore()
    assert store.index is None
    fill(store)
    fill(theirs)
    store.put(("users", "maya"), "dog", {"text": "Maya's greyhound Pepper turned four.", "year": 2025})
    theirs.put(("users", "maya"), "dog", {"text": "Maya's greyhound Pepper turned four.", "year": 2025})
    note = {"text": "fielded", "year": 2024}
    store.put(("users", "maya"), "note", note, index=["text"])  # per-put fields are ignored without an index
    theirs.put(("users", "maya"), "note", note, index=["text"])
    for query in (None, "Where does Leo eat ramen?"):  # a query is ignored too: a filtered listing
        ours = store.search(("users",), query=query, filter={"year": {"$gte": 2024}})
        reference = theirs.search(("users",), query=query, filter={"year": {"$gte": 2024}})
        assert keys(ours) == [(("users", "leo"), "food"), (("users", "maya"), "dog"), (("users", "maya"), "note")]

        def rows(results: list[Any]) -> list[tuple[Any, ...]]:
            return sorted((i.namespace, i.key, i.value, i.score) for i in results)

        assert rows(ours) == rows(reference)  # the same items as LangGraph's own store (it lists in put order)
        assert all(item.score is None for item in ours)
    assert store.get(("users", "maya"), "dog").value["year"] == 2025  # type: ignore[union-attr]
    assert store.list_namespaces() == theirs.list_namespaces() == [("users", "leo"), ("users", "maya")]
    assert embedder.texts == [] and aggregator.calls == 0
    assert all(len(store.tree(ns)) == 0 for ns in ITEMS)
    store.delete(("users", "leo"), "food")
    assert store.list_namespaces() == [("users", "maya")]


def test_without_index_items_persist_in_sqlite(tmp_path: Path) -> None:
    path = tmp_path / "kv.db"
    embedder = CountingEmbedder()
    with MemTreeStore.from_conn_string(path, embedder=embedder) as store:
        fill(store)
        before = store.get(("users", "maya"), "dog")
    with MemTreeStore.from_conn_string(str(path), embedder=embedder) as store:
        assert store.get(("users", "maya"), "dog") == before
        assert keys(store.search(("users",))) == [
            (("users", "leo"), "food"),
            (("users", "maya"), "dog"),
            (("users", "maya"), "job"),
        ]
    assert embedder.texts == []


def test_an_index_added_later_leaves_unindexed_items_listed_and_a_put_indexes_them(tmp_path: Path) -> None:
    path = tmp_path / "later.db"
    with MemTreeStore.from_conn_string(path, embedder=HashingEmbedder(64)) as store:
        fill(store)
    with MemTreeStore.from_conn_string(path, embedder=HashingEmbedder(64), index={"fields": ["text"]}) as store:
        found = store.search(("users",), query="greyhound Pepper")
        assert {item.score for item in found} == {None}  # nothing was indexed: listed, unscored
        store.put(("users", "maya"), "dog", ITEMS[("users", "maya")]["dog"])
        found = store.search(("users",), query="Maya adopted a rescue greyhound called Pepper.")
        assert keys(found)[0] == (("users", "maya"), "dog") and found[0].score == pytest.approx(1.0, abs=1e-5)


# -- LangGraph's index keys -------------------------------------------------------------


def test_index_embed_takes_a_langchain_embeddings_and_dims_is_checked() -> None:
    memory_embedder = CountingEmbedder()
    memory = MemTree(embedder=memory_embedder, config=MemTreeConfig(theta0=0.2))
    store = MemTreeStore(memory, index={"dims": 32, "embed": DeterministicFakeEmbedding(size=32), "fields": ["text"]})
    fill(store)
    found = store.search(("users",), query="Maya adopted a rescue greyhound called Pepper.", limit=1)
    assert keys(found) == [(("users", "maya"), "dog")] and found[0].score == pytest.approx(1.0, abs=1e-5)
    tree = store.tree(("users", "maya"))
    assert tree.dimension == 32 and tree.stored_embedder == "LangChainEmbedder(DeterministicFakeEmbedding)"
    assert memory_embedder.texts == []  # the memory's own embedder is not used by the store

    wrong = MemTreeStore(hashing_memory(), index={"dims": 384, "fields": ["text"]})
    with pytest.raises(ValueError) as mismatch:
        wrong.put(("n",), "k", {"text": "hello"})
    assert str(mismatch.value) == (
        "embedding dimension 64 does not match the store's index dims 384; "
        "set index['dims'] to the model's size or use a model of that size"
    )
    assert wrong.get(("n",), "k") is None  # a put is one transaction: nothing of it is stored


def test_index_embed_takes_sync_and_async_functions() -> None:
    seen: list[str] = []

    def embed(texts: Sequence[str]) -> list[list[float]]:
        seen.extend(texts)
        return HashingEmbedder(16).embed(texts).tolist()

    # eager: no background worker embeds summaries between the query and the check below
    store = MemTreeStore(hashing_memory(), index={"embed": embed, "dims": 16, "fields": ["text"]}, aggregation="eager")
    fill(store)
    assert keys(store.search(("users",), query="Leo loves ramen with yuzu.", limit=1)) == [(("users", "leo"), "food")]
    assert "Leo loves ramen with yuzu." in seen and seen[-1] == "Leo loves ramen with yuzu."

    async def aembed(texts: Sequence[str]) -> list[list[float]]:
        return HashingEmbedder(16).embed(texts).tolist()

    async def run() -> list[Any]:
        store = MemTreeStore(hashing_memory(), index={"embed": aembed, "fields": ["text"]})
        for namespace, items in ITEMS.items():
            for key, value in items.items():
                await store.aput(namespace, key, value)
        return await store.asearch(("users",), query="Leo loves ramen with yuzu.", limit=1)

    assert keys(asyncio.run(run())) == [(("users", "leo"), "food")]


def test_index_embed_strings(monkeypatch: pytest.MonkeyPatch) -> None:
    local = MemTreeStore(hashing_memory(), index={"embed": "local:sentence-transformers/all-MiniLM-L6-v2"})
    assert local.tree(("n",)).embedder.name == "LocalEmbedder(sentence-transformers/all-MiniLM-L6-v2)"  # loads lazily
    with pytest.raises(
        ValueError,
        match=r"(?s)index embed 'nosuch:model' could not be loaded: Provider 'nosuch' is not supported.*'local:<",
    ):
        MemTreeStore(hashing_memory(), index={"embed": "nosuch:model"})
    with FakeOpenAIServer(dimension=24) as server:
        monkeypatch.setenv("OPENAI_API_KEY", server.api_key)
        monkeypatch.setenv("OPENAI_BASE_URL", server.url)
        store = MemTreeStore(
            hashing_memory(), index={"dims": 24, "embed": "openai:text-embedding-3-small", "fields": ["text"]}
        )
        fill(store)
        found = store.search(("users",), query="Maya works night shifts as a nurse.", limit=1)
        assert keys(found) == [(("users", "maya"), "job")]
        embedded = [text for r in server.requests if r.endpoint == "embeddings" for text in r.body["input"]]
        assert {r.body["model"] for r in server.requests} == {"text-embedding-3-small"}
        assert embedded[-1] == "Maya works night shifts as a nurse."  # the query, by the index's model


# -- from_conn_string ------------------------------------------------------------------


def round_trip(location: str | Path) -> None:
    options: dict[str, Any] = {"embedder": HashingEmbedder(64), "config": MemTreeConfig(theta0=0.2)}
    with MemTreeStore.from_conn_string(location, index={"fields": ["text"]}, **options) as store:
        store.setup()  # as LangGraph's durable stores ask; nothing to do here
        fill(store)
        engine = store.memory.store
    with pytest.raises(RuntimeError):  # closed with the block
        engine.list_namespaces()
    with MemTreeStore.from_conn_string(location, index={"fields": ["text"]}, **options) as store:
        found = store.search(("users",), query="Maya works night shifts as a nurse.", limit=2)
        assert keys(found)[0] == (("users", "maya"), "job")
        assert store.get(("users", "leo"), "food").value == ITEMS[("users", "leo")]["food"]  # type: ignore[union-attr]


def test_from_conn_string_on_sqlite(tmp_path: Path) -> None:
    round_trip(tmp_path / "store.db")
    with (
        pytest.raises(ValueError, match="unknown index key"),
        MemTreeStore.from_conn_string(
            tmp_path / "never.db",
            index={"dim": 3},  # type: ignore[typeddict-unknown-key]
        ),
    ):
        pass
    assert not (tmp_path / "never.db").exists()  # a bad index fails before a file is made
    with (
        pytest.raises(TypeError, match="ttl must be a TTLConfig dict"),
        MemTreeStore.from_conn_string(
            tmp_path / "ttl.db",
            ttl=5,  # type: ignore[arg-type]
        ),
    ):
        pass
    assert not (tmp_path / "ttl.db").exists()


def test_from_conn_string_on_postgresql(postgres_dsn: str) -> None:
    round_trip(postgres_dsn)


# -- one tree for the middleware and the store --------------------------------------------


def test_one_tree_backs_the_middleware_and_the_store() -> None:
    memory = hashing_memory()
    store = MemTreeStore(memory, index={"fields": ["text"]})

    @tool
    def remember(fact: str, runtime: ToolRuntime) -> str:
        """Save a fact about the user."""
        runtime.store.put(("memories", "maya"), "dog", {"text": fact})
        return "saved"

    model = scripted(
        AIMessage("", tool_calls=[{"name": "remember", "args": {"fact": "Maya's greyhound is Pepper."}, "id": "c1"}]),
        AIMessage("I will remember Pepper."),
        AIMessage("Your greyhound is Pepper."),
    )
    agent = create_agent(model, tools=[remember], store=store, middleware=[store.middleware(("memories", "maya"))])
    agent.invoke({"messages": [HumanMessage("My greyhound is Pepper, remember that.", id="h1")]})
    recorder = PromptRecorder()
    agent.invoke({"messages": [HumanMessage("What is my dog called?", id="h2")]}, config={"callbacks": [recorder]})

    # one namespace, one tree: the tool's item and the middleware's exchange side by side
    assert memory.namespaces() == [("store", "memories", "maya")]
    tree = store.tree(("memories", "maya"))
    texts = [leaf.text for leaf in tree.leaves()]
    assert texts.count("Maya's greyhound is Pepper.") == 1
    assert texts == [
        "Maya's greyhound is Pepper.",
        "User: My greyhound is Pepper, remember that.\nAssistant: I will remember Pepper.",
        "User: What is my dog called?\nAssistant: Your greyhound is Pepper.",
    ]
    # the model is reminded of the item the tool saved (and of the exchange)
    system = recorder.calls[0][0].text
    assert system.startswith(MEMORY_HEADER) and "Maya's greyhound is Pepper." in system
    # the store still answers with items only
    found = store.search(("memories", "maya"), query="greyhound Pepper", limit=10)
    assert [(item.key, item.value) for item in found] == [("dog", {"text": "Maya's greyhound is Pepper."})]


def test_the_shared_middleware_can_choose_the_namespace_from_the_runtime() -> None:
    store = MemTreeStore(hashing_memory(), index={"fields": ["text"]})
    store.put(("memories", "leo"), "food", {"text": "Leo loves ramen with yuzu."})
    middleware = store.middleware(lambda runtime: ("memories", runtime.context["user"]), k=3)
    agent = create_agent(scripted("Ramen with yuzu."), tools=[], store=store, middleware=[middleware])
    recorder = PromptRecorder()
    agent.invoke(
        {"messages": [HumanMessage("What food do I love?")]}, context={"user": "leo"}, config={"callbacks": [recorder]}
    )
    assert "Leo loves ramen with yuzu." in recorder.calls[0][0].text
    assert [leaf.text for leaf in store.tree(("memories", "leo")).leaves()][-1] == (
        "User: What food do I love?\nAssistant: Ramen with yuzu."
    )


# -- an engine backend where a LangGraph store is expected ------------------------------


BACKEND_ERROR = (
    "MemoryBackend is memtree's storage backend, not a LangGraph store: it cannot {what}. Where LangGraph "
    "expects a store (create_agent(store=...), graph.compile(store=...)), pass "
    "langchain_memtree.MemTreeStore(MemTree(store=backend))"
)


def test_an_engine_backend_given_as_the_agents_store_fails_at_the_first_store_call() -> None:
    @tool
    def recall(query: str, runtime: ToolRuntime) -> str:
        """Look up what we know."""
        return str(runtime.store.search(("memories",), query=query))

    model = scripted(AIMessage("", tool_calls=[{"name": "recall", "args": {"query": "dog"}, "id": "c1"}]), "done")
    agent = create_agent(model, tools=[recall], store=MemoryBackend())  # type: ignore[arg-type]
    with pytest.raises(TypeError) as refused:
        agent.invoke({"messages": [HumanMessage("What is my dog called?")]})
    assert str(refused.value) == BACKEND_ERROR.format(what="search()")
    for method in ("get", "put", "aput", "batch", "abatch"):
        with pytest.raises(TypeError) as refused:
            getattr(MemoryBackend(), method)(("memories",), "k")
        assert str(refused.value) == BACKEND_ERROR.format(what=f"{method}()")


def test_with_memtree_middleware_it_fails_before_the_model_is_called() -> None:
    store = MemTreeStore(hashing_memory())
    model = scripted("never sent")
    agent = create_agent(
        model,
        tools=[],
        store=MemoryBackend(),
        middleware=[store.middleware(("memories", "maya"))],  # type: ignore[arg-type]
    )
    with pytest.raises(TypeError) as refused:
        agent.invoke({"messages": [HumanMessage("hello")]})
    assert str(refused.value) == BACKEND_ERROR.format(what="serve as the agent's store")
    assert model.invoke("next").text == "never sent"  # the script was not consumed


def test_sqlite_and_custom_backends_refuse_too(tmp_path: Path) -> None:
    from memtree import SQLiteBackend

    backend = SQLiteBackend(tmp_path / "m.db")
    try:
        with pytest.raises(TypeError, match=r"^SQLiteBackend is memtree's storage backend, not a LangGraph store"):
            backend.search(("a",))
    finally:
        backend.close()
