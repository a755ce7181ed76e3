"""MemTreeRetriever: LangChain's standard retriever suite, metadata, options per call."""

from __future__ import annotations

import functools
import json
from typing import Any

import pytest
from langchain_core.documents import Document
from langchain_tests.integration_tests import RetrieversIntegrationTests
from lc_fakes import hashing_memory

from langchain_memtree import MemTreeRetriever
from memtree import MemTree

FACTS = [
    ("Maya adopted a rescue greyhound called Pepper.", "2024-04-28", {"topic": "dog"}),
    ("Pepper the greyhound is scared of bicycles.", "2024-06-16", {"topic": "dog"}),
    ("Maya walks Pepper by the river every morning.", "2024-07-02", {"topic": "dog"}),
    ("Leo ate chicken ramen with yuzu in Kyoto.", "2024-04-28", {"topic": "food"}),
    ("Leo learned to make ramen broth at home.", "2024-08-10", {"topic": "food"}),
    ("Maya started night shifts as a nurse in Oslo.", "2024-05-20", {"topic": "work"}),
    ("Leo plays the cello in a quartet.", "2024-09-01", {"topic": "music"}),
]


@functools.cache
def populated() -> MemTree:
    memory = hashing_memory()
    for text, day, metadata in FACTS:
        memory.add(text, timestamp=day, metadata=metadata)
    return memory


class TestMemTreeRetrieverStandard(RetrieversIntegrationTests):
    """LangChain's own contract for retrievers, run against a populated memory."""

    @property
    def retriever_constructor(self) -> type[MemTreeRetriever]:
        return MemTreeRetriever

    @property
    def retriever_constructor_params(self) -> dict[str, Any]:
        return {"memory": populated()}

    @property
    def retriever_query_example(self) -> str:
        return "What is Maya's greyhound afraid of?"


def test_documents_carry_json_metadata_and_the_node_context() -> None:
    memory = populated()
    docs = MemTreeRetriever(memory=memory, k=4).invoke("greyhound Pepper bicycles")
    hits = memory.retrieve("greyhound Pepper bicycles", k=4)
    assert [d.id for d in docs] == [h.id for h in hits]
    for doc, hit in zip(docs, hits, strict=True):
        assert doc.page_content == hit.context
        assert doc.metadata == {
            "id": hit.id,
            "score": hit.score,
            "depth": hit.depth,
            "is_leaf": hit.is_leaf,
            "timestamp": hit.time.isoformat() if hit.time else None,
            "leaf_ids": list(hit.leaf_ids),
            "source_id": hit.source_id,
            "found_by": hit.found_by,
            "answered_by": "retrieve",
            "metadata": hit.metadata,
        }
        json.dumps(doc.metadata)  # plain JSON, ready for any vector or doc store
    assert docs[0].metadata["timestamp"].endswith("+00:00")


def test_options_apply_from_fields_and_per_call() -> None:
    memory = populated()
    leaves = MemTreeRetriever(memory=memory, leaves_only=True, k=3)
    assert all(d.metadata["is_leaf"] for d in leaves.invoke("ramen"))
    assert len(leaves.invoke("ramen", k=1)) == 1
    food = leaves.invoke("Maya greyhound ramen", where={"topic": "food"}, k=5)
    assert {d.page_content for d in food} == {FACTS[3][0], FACTS[4][0]}
    summer = leaves.invoke("Maya", time_range=("2024-06-01", "2024-07-31"), k=5)
    assert {d.page_content for d in summer} == {FACTS[1][0], FACTS[2][0]}
    traversal = MemTreeRetriever(memory=memory, mode="traversal").invoke("greyhound")
    assert [d.id for d in traversal] == [h.id for h in memory.retrieve("greyhound", mode="traversal")]


def test_token_budget_caps_the_joined_documents() -> None:
    memory = populated()
    docs = MemTreeRetriever(memory=memory, token_budget=25, k=10).invoke("Maya greyhound nurse")
    joined = " ".join(d.page_content for d in docs)
    assert docs and memory.config.token_counter(joined) <= 25


async def test_async_matches_sync() -> None:
    retriever = MemTreeRetriever(memory=populated(), k=3)
    sync: list[Document] = retriever.invoke("cello quartet")
    assert [d.id for d in await retriever.ainvoke("cello quartet")] == [d.id for d in sync]
    assert len(await retriever.ainvoke("cello quartet", k=1)) == 1


def test_bad_options_are_refused_clearly() -> None:
    retriever = MemTreeRetriever(memory=populated())
    with pytest.raises(TypeError, match=r"unknown retrieval option\(s\) \['top_k'\]"):
        retriever.invoke("cello", top_k=2)
    with pytest.raises(ValueError, match="k must be a positive integer"):
        retriever.invoke("cello", k=0)
    with pytest.raises(ValueError, match="unknown mode 'beam'"):
        retriever.invoke("cello", mode="beam")
    with pytest.raises(ValueError, match="Input should be an instance of MemTree"):
        MemTreeRetriever(memory="not a memory")  # type: ignore[arg-type]
    memory = populated()
    for field, bad in [("k", 0), ("k", -2), ("k", True), ("k", "3"), ("token_budget", 0), ("token_budget", -5)]:
        with pytest.raises(ValueError, match=f"{field} must be a positive integer, got {bad!r}; pass None"):
            MemTreeRetriever(memory=memory, **{field: bad})
    with pytest.raises(ValueError, match="time_range start 'someday' is not an ISO 8601 date"):
        MemTreeRetriever(memory=memory, time_range=("someday", None))
    with pytest.raises(ValueError, match="time_range starts after it ends"):
        MemTreeRetriever(memory=memory, time_range=("2024-02-01", "2024-01-01"))
    assert len(MemTreeRetriever(memory=memory, k=1, token_budget=None).invoke("cello")) == 1


def test_an_overview_request_is_answered_by_an_overview_and_the_documents_say_so() -> None:
    retriever = MemTreeRetriever(memory=populated(), token_budget=300)
    docs = retriever.invoke("What do you know about Pepper the greyhound?")
    assert docs and {doc.metadata["answered_by"] for doc in docs} == {"overview"}
    assert [doc.metadata["timestamp"] for doc in docs] == sorted(doc.metadata["timestamp"] for doc in docs)
    assert all(doc.page_content.startswith("2024-") for doc in docs)  # each part dated
    assert {doc.metadata["answered_by"] for doc in retriever.invoke("What is Pepper scared of?")} == {"retrieve"}
    lookup = retriever.invoke("What do you know about Pepper the greyhound?", route_overviews=False)
    assert {doc.metadata["answered_by"] for doc in lookup} == {"retrieve"}


def test_the_overview_mode_answers_every_query_with_an_overview_of_it() -> None:
    retriever = MemTreeRetriever(memory=populated(), route_overviews="always", token_budget=300)
    docs = retriever.invoke("Leo's ramen")
    assert docs and {doc.metadata["answered_by"] for doc in docs} == {"overview"}
    assert {doc.page_content for doc in docs} == {
        "2024-04-28: Leo ate chicken ramen with yuzu in Kyoto.",
        "2024-08-10: Leo learned to make ramen broth at home.",
    }
    with pytest.raises(ValueError, match="route_overviews"):  # pydantic's ValidationError, at construction
        MemTreeRetriever(memory=populated(), route_overviews="sometimes")  # type: ignore[arg-type]
