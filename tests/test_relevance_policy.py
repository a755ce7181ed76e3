"""One relevance policy everywhere: MemTree.retrieve, the CLI, both retrievers and
the LangGraph store apply the relevance floor the agent middleware applies (the one
calibrated for the embedder), and ``min_similarity=None`` / ``MemTreeConfig(
min_similarity=None)`` is the one way to turn it off. Also the framework
conventions around it: store scores are cosines, retrievers refuse unknown options
and honour ``search_kwargs``, the store takes list prefixes and has ``index_config``."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_runner import as_json, memtree, ok
from langchain_core.embeddings import DeterministicFakeEmbedding
from llama_index.core.schema import QueryBundle
from pydantic import ValidationError

from langchain_memtree import MemTreeRetriever, MemTreeStore
from llamaindex_memtree import MemTreeRetriever as LlamaIndexRetriever
from memtree import LocalEmbedder, MemTree, MemTreeConfig
from memtree.retrieval import RELEVANCE_FLOOR

FACTS = [
    "Maya adopted a rescue greyhound called Pepper.",
    "Pepper is scared of bicycles, so their walks avoid the cycle path.",
    "Leo ate chicken ramen with yuzu at a tiny shop in Kyoto.",
    "Maya's sister Rosa lives in Porto.",
]
UNRELATED = "What is 17 times 3?"


@pytest.fixture
def memory(local_embedder: LocalEmbedder) -> MemTree:
    built = MemTree(embedder=local_embedder)
    built.add_many(FACTS)
    return built


def test_retrieve_applies_the_calibrated_floor_by_default(memory: MemTree) -> None:
    assert memory.relevance_floor == RELEVANCE_FLOOR
    assert memory.retrieve(UNRELATED) == []  # was every memory, down to negative similarities
    hits = memory.retrieve("Where does Maya's sister live?")
    assert hits and all(hit.similarity is not None and hit.similarity >= RELEVANCE_FLOOR for hit in hits)
    assert len(memory.retrieve(UNRELATED, k=4, min_similarity=None)) == 4  # the one way to turn it off
    assert memory.retrieve(UNRELATED, k=4, min_similarity=-1.0)


def test_a_config_without_a_floor_turns_it_off_for_the_memory(local_embedder: LocalEmbedder) -> None:
    memory = MemTree(embedder=local_embedder, config=MemTreeConfig(min_similarity=None))
    memory.add_many(FACTS)
    assert len(memory.retrieve(UNRELATED, k=4)) == 4
    assert memory.retrieve(UNRELATED, k=4, min_similarity="auto") != []  # "auto": the memory's policy


def test_the_langchain_retriever_applies_it_and_takes_search_kwargs(memory: MemTree) -> None:
    assert MemTreeRetriever(memory=memory).invoke(UNRELATED) == []
    assert len(MemTreeRetriever(memory=memory, k=4).invoke(UNRELATED, min_similarity=None)) == 4
    one = MemTreeRetriever(memory=memory, search_kwargs={"k": 1})  # as LangChain's vector-store retrievers
    assert [doc.page_content for doc in one.invoke("Where does Maya's sister live?")] == [FACTS[3]]
    one.search_kwargs["k"] = 2  # read at each call, as callers change it
    assert len(one.invoke("Maya", min_similarity=None)) == 2
    floor = MemTreeRetriever(memory=memory, search_kwargs={"score_threshold": 0.99, "filter": None})
    assert floor.invoke("Pepper") == []
    with pytest.raises(ValidationError, match="bogus"):
        MemTreeRetriever(memory=memory, bogus=1)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"unknown search_kwargs\(s\) \['fetch_k'\]"):
        MemTreeRetriever(memory=memory, search_kwargs={"fetch_k": 20})


def test_the_llamaindex_retriever_applies_it(memory: MemTree) -> None:
    assert LlamaIndexRetriever(memory).retrieve(QueryBundle(UNRELATED)) == []
    assert len(LlamaIndexRetriever(memory, similarity_top_k=4, min_similarity=None).retrieve(UNRELATED)) == 4
    with pytest.raises(ValueError, match="min_similarity is NaN"):
        LlamaIndexRetriever(memory, min_similarity=float("nan"))


def test_the_store_scores_by_cosine_applies_the_floor_and_takes_list_prefixes(
    local_embedder: LocalEmbedder,
) -> None:
    store = MemTreeStore(MemTree(embedder=local_embedder), index={"fields": ["text"]}, aggregation="eager")
    pets = {
        "dog": "My dog fears fireworks and loud bangs.",
        "cat": "Our cat hates thunder and hides under the bed.",
        "fish": "The goldfish swims in slow circles.",
    }
    for key, text in pets.items():
        store.put(["pets"], key, {"text": text})  # a list namespace, as SqliteStore takes it
    found = store.search(["pets"], query="Which pet fears storms?")
    tree = store.tree(("pets",))
    cosines = {hit.source_id: hit.similarity for hit in tree.retrieve("Which pet fears storms?", leaves_only=True)}
    assert found and all(item.score == pytest.approx(cosines[item.key], abs=1e-6) for item in found)
    assert all(item.memtree_score is not None for item in found)  # the hybrid score, kept beside it
    assert store.search(("pets",), query=UNRELATED) == []  # under the floor: nothing
    assert len(store.search(("pets",))) == 3  # a listing has no query, so no floor
    assert store.index_config == {"fields": ["text"]}
    assert MemTreeStore(MemTree(embedder=local_embedder)).index_config is None
    fake = DeterministicFakeEmbedding(size=8)
    assert MemTreeStore(index={"dims": 8, "embed": fake}).index_config == {"dims": 8, "embed": fake}


@pytest.mark.slow
def test_the_cli_query_applies_it_and_says_how_to_turn_it_off(tmp_path: Path) -> None:
    db = str(tmp_path / "memory.db")
    ok(memtree("add", *FACTS, db=db, embedder="local"))
    done = ok(memtree("query", UNRELATED, db=db, embedder=None))
    assert "No results: nothing stored is similar enough" in done.stdout and "--min-similarity none" in done.stdout
    everything = as_json(ok(memtree("query", UNRELATED, "--min-similarity", "none", "--json", db=db, embedder=None)))
    assert len(everything) == len(FACTS) and all(-1.0 <= hit["similarity"] <= 1.0 for hit in everything)
