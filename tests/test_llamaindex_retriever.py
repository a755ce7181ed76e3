"""MemTreeRetriever: NodeWithScore results, metadata, relationships, filters, budgets, async."""

from __future__ import annotations

import pytest
from llama_index.core.schema import MetadataMode, NodeRelationship, NodeWithScore, TextNode
from llama_index.core.vector_stores.types import FilterCondition, FilterOperator, MetadataFilter, MetadataFilters
from llamaindex_corpus import documents, make_memory, sentence_splitter

from llamaindex_memtree import MemTreeIndex, MemTreeRetriever
from memtree import MemTree
from memtree.text import count_tokens

QUESTION = "Is Pepper the greyhound scared of bicycles?"


@pytest.fixture(scope="module")
def index() -> MemTreeIndex:
    return MemTreeIndex.from_documents(documents(), memory=make_memory(), transformations=[sentence_splitter()])


def by_kind(results: list[NodeWithScore]) -> tuple[list[NodeWithScore], list[NodeWithScore]]:
    leaves = [r for r in results if r.node.metadata["is_leaf"]]
    summaries = [r for r in results if not r.node.metadata["is_leaf"]]
    return leaves, summaries


def test_results_follow_the_engine_ranking_with_tree_metadata(index: MemTreeIndex) -> None:
    results = index.as_retriever(similarity_top_k=6).retrieve(QUESTION)
    hits = index.memory.retrieve(QUESTION, k=6)
    assert [r.node.metadata["memtree_id"] for r in results] == [hit.id for hit in hits]
    assert [r.score for r in results] == pytest.approx([hit.score for hit in hits])
    for result, hit in zip(results, hits, strict=True):
        metadata = result.node.metadata
        assert (metadata["depth"], metadata["is_leaf"], metadata["leaf_ids"]) == (
            hit.depth,
            hit.is_leaf,
            list(hit.leaf_ids),
        )
        assert metadata["timestamp"] is None
        assert result.node.get_content() == hit.context
    leaves, summaries = by_kind(results)
    assert leaves and summaries


def test_leaves_come_back_as_their_docstore_nodes(index: MemTreeIndex) -> None:
    leaves, _ = by_kind(index.as_retriever(similarity_top_k=8).retrieve(QUESTION))
    for result in leaves:
        stored = index.docstore.get_node(result.node.node_id)
        assert result.node.ref_doc_id == stored.ref_doc_id  # SOURCE relationship kept
        assert result.node.metadata["topic"] == stored.metadata["topic"]
        assert index.memory.get(result.node.metadata["memtree_id"]).source_id == stored.node_id
        assert "memtree_id" not in stored.metadata  # the stored node is untouched


def test_summaries_are_text_nodes_related_to_the_nodes_they_summarize(index: MemTreeIndex) -> None:
    _, summaries = by_kind(index.as_retriever(similarity_top_k=8).retrieve(QUESTION))
    assert summaries
    for result in summaries:
        assert isinstance(result.node, TextNode)
        assert result.node.node_id == result.node.metadata["memtree_id"]
        children = result.node.relationships[NodeRelationship.CHILD]
        expected = [index.memory.get(leaf_id).source_id for leaf_id in result.node.metadata["leaf_ids"]]
        assert [child.node_id for child in children] == expected
        assert len(children) >= 2
        assert all(index.docstore.get_node(child.node_id) for child in children)


def test_tree_metadata_is_hidden_from_the_llm_and_the_embedder(index: MemTreeIndex) -> None:
    for result in index.as_retriever(similarity_top_k=8).retrieve(QUESTION):
        for mode in (MetadataMode.LLM, MetadataMode.EMBED):
            content = result.node.get_content(metadata_mode=mode)
            assert "leaf_ids" not in content and "memtree_id" not in content


def test_token_budget_caps_the_joined_results(index: MemTreeIndex) -> None:
    results = index.as_retriever(similarity_top_k=10, token_budget=25).retrieve(QUESTION)
    assert sum(count_tokens(r.node.get_content()) for r in results) <= 25
    assert sum(count_tokens(r.node.get_content()) for r in results) >= 20  # filled, last one cut


def test_traversal_mode_reaches_leaves_by_descent(index: MemTreeIndex) -> None:
    results = index.as_retriever(mode="traversal", similarity_top_k=10).retrieve(QUESTION)
    hits = index.memory.retrieve(QUESTION, k=10, mode="traversal")
    assert [r.node.metadata["memtree_id"] for r in results] == [hit.id for hit in hits]
    assert any(r.node.get_content() == "Pepper the greyhound is scared of bicycles." for r in results)


def test_metadata_filters_keep_matching_leaves(index: MemTreeIndex) -> None:
    filters = MetadataFilters(filters=[MetadataFilter(key="topic", value="ramen")])
    results = index.as_retriever(filters=filters, similarity_top_k=10).retrieve(QUESTION)
    assert len(results) == 4
    assert {r.node.metadata["topic"] for r in results} == {"ramen"}


@pytest.mark.parametrize(
    ("filters", "message"),
    [
        (
            MetadataFilters(filters=[MetadataFilter(key="topic", value="dog", operator=FilterOperator.NE)]),
            "only equality",
        ),
        (
            MetadataFilters(
                filters=[MetadataFilter(key="topic", value="dog"), MetadataFilter(key="topic", value="hike")],
                condition=FilterCondition.OR,
            ),
            "joined by AND",
        ),
        (
            MetadataFilters(filters=[MetadataFilters(filters=[MetadataFilter(key="topic", value="dog")])]),
            "nested",
        ),
        (
            MetadataFilters(filters=[MetadataFilter(key="topic", value="dog"), MetadataFilter(key="topic", value="x")]),
            "two different values",
        ),
    ],
)
def test_filters_the_engine_cannot_apply_are_refused(
    index: MemTreeIndex, filters: MetadataFilters, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        index.as_retriever(filters=filters)


async def test_aretrieve_matches_retrieve(index: MemTreeIndex) -> None:
    retriever = index.as_retriever(similarity_top_k=5)
    sync = retriever.retrieve(QUESTION)
    asynchronous = await retriever.aretrieve(QUESTION)
    assert [(r.node.node_id, r.score) for r in asynchronous] == [(r.node.node_id, r.score) for r in sync]


def test_retriever_over_a_bare_memory_builds_nodes_from_leaves() -> None:
    memory: MemTree = make_memory()
    memory.add("Pepper the greyhound is scared of bicycles.", source_id="msg-1", metadata={"speaker": "Maya"})
    memory.add("Pepper the greyhound loves the river path.")
    retriever = MemTreeRetriever(memory, similarity_top_k=3)
    results = retriever.retrieve(QUESTION)
    ids = {r.node.node_id for r in results}
    assert "msg-1" in ids  # a leaf with a source id is named by it
    first = next(r for r in results if r.node.node_id == "msg-1")
    assert first.node.metadata["speaker"] == "Maya"
    with pytest.raises(TypeError, match=r"memory must be a memtree\.MemTree"):
        MemTreeRetriever("not a memory")  # type: ignore[arg-type]
