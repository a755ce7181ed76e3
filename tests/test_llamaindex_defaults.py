"""MemTreeIndex with LlamaIndex's own defaults and meanings, checked beside
``VectorStoreIndex``: ``similarity_top_k``, a default query engine that answers in
one call (``MockLLM`` included), cosine scores that a ``similarity_cutoff`` tuned
on a vector index keeps its meaning on, and every ``FilterOperator`` keeping the
nodes LlamaIndex's own ``SimpleVectorStore`` keeps."""

from __future__ import annotations

from typing import Any

import pytest
from llama_index.core import Document, VectorStoreIndex
from llama_index.core.constants import DEFAULT_SIMILARITY_TOP_K
from llama_index.core.llms import MockLLM
from llama_index.core.node_parser import SentenceSplitter
from llama_index.core.postprocessor import SimilarityPostprocessor
from llama_index.core.schema import QueryBundle, TextNode
from llama_index.core.vector_stores.types import FilterCondition, FilterOperator, MetadataFilter, MetadataFilters
from llamaindex_corpus import WordsEmbedding, documents, make_memory, sentence_splitter

import llamaindex_memtree.filters as filters_module
from llamaindex_memtree import MemTreeIndex, MemTreeMemoryBlock, MemTreeRetriever, UnsupportedFilterError
from memtree import HashingEmbedder, MemTree, MemTreeConfig

QUESTION = "Is Pepper the greyhound scared of bicycles?"


@pytest.fixture(scope="module")
def index() -> MemTreeIndex:
    return MemTreeIndex.from_documents(documents(), memory=make_memory(), transformations=[sentence_splitter()])


# -- similarity_top_k --------------------------------------------------------------------------


def test_similarity_top_k_defaults_to_llamaindex_default(index: MemTreeIndex) -> None:
    assert DEFAULT_SIMILARITY_TOP_K == 2  # what VectorStoreIndex retrievers return by default
    assert len(index.as_retriever().retrieve(QUESTION)) == DEFAULT_SIMILARITY_TOP_K
    assert len(MemTreeRetriever(index.memory).retrieve(QUESTION)) == DEFAULT_SIMILARITY_TOP_K
    response = index.as_query_engine(llm=MockLLM()).query(QUESTION)
    assert len(response.source_nodes) == DEFAULT_SIMILARITY_TOP_K
    assert len(index.as_retriever(similarity_top_k=5).retrieve(QUESTION)) == 5
    assert MemTreeMemoryBlock(memory=make_memory()).similarity_top_k == DEFAULT_SIMILARITY_TOP_K


def test_as_many_results_as_a_vector_index_gives_by_default(twins: tuple[VectorStoreIndex, MemTreeIndex]) -> None:
    vector, tree = twins
    assert len(tree.as_retriever().retrieve(QUESTION)) == len(vector.as_retriever().retrieve(QUESTION))


# -- the default query engine fits the LLM's window ------------------------------------------------


class CountingLLM(MockLLM):
    """A MockLLM that counts its completions (a refine step is a second one)."""

    calls: int = 0

    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> Any:
        self.calls += 1
        return super().complete(prompt, formatted=formatted, **kwargs)


@pytest.fixture(scope="module")
def long_index() -> MemTreeIndex:
    """Twelve documents of some 400 words: ten of them overflow MockLLM's 3,900-token window."""
    words = [f"word{i}" for i in range(40)]
    texts = [" ".join(f"Topic {n} fact {j} says {words[(n + j) % 40]}." for j in range(80)) for n in range(12)]
    memory = MemTree(embedder=HashingEmbedder(64), config=MemTreeConfig(deduplicate=False))
    return MemTreeIndex.from_documents(
        [Document(text=text, doc_id=f"doc-{n}") for n, text in enumerate(texts)],
        memory=memory,
        transformations=[SentenceSplitter(chunk_size=1024, chunk_overlap=0)],
    )


@pytest.mark.parametrize("top_k", [None, 10])
def test_the_query_engine_answers_in_one_call_whatever_top_k(long_index: MemTreeIndex, top_k: int | None) -> None:
    # Before: ten results overflowed the window into a refine call, whose prompt (MockLLM
    # echoes the first one as its answer) could not fit: "Calculated available context size
    # -44 was not non-negative".
    llm = CountingLLM()
    options = {} if top_k is None else {"similarity_top_k": top_k}
    response = long_index.as_query_engine(llm=llm, **options).query("What does topic 3 say?")
    assert llm.calls == 1
    assert response.source_nodes
    context = sum(len(source.node.get_content().split()) for source in response.source_nodes)
    assert context <= (3900 - 256) // 2  # the cap: half of what MockLLM can read, in tokens >= words


def test_a_chat_engine_gets_the_same_cap(long_index: MemTreeIndex) -> None:
    llm = CountingLLM()
    engine = long_index.as_chat_engine(chat_mode="context", llm=llm, similarity_top_k=10)
    engine.chat("What does topic 3 say?")
    assert llm.calls == 1


def test_an_explicit_token_budget_wins(long_index: MemTreeIndex) -> None:
    response = long_index.as_query_engine(llm=MockLLM(), similarity_top_k=10, token_budget=50).query("topic 3")
    assert sum(len(source.node.get_content().split()) for source in response.source_nodes) <= 50


# -- scores are cosines ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def twins() -> tuple[VectorStoreIndex, MemTreeIndex]:
    """The same nodes, the same embedder, in a VectorStoreIndex and a MemTreeIndex."""
    embed = WordsEmbedding()
    nodes = [
        TextNode(id_=f"{doc.doc_id}-{i}", text=text)
        for doc in documents()
        for i, text in enumerate(doc.text.split(". "))
    ]
    vector = VectorStoreIndex([node.model_copy() for node in nodes], embed_model=embed)
    memory = MemTree(embedder=embed, config=MemTreeConfig(deduplicate=False))
    return vector, MemTreeIndex([node.model_copy() for node in nodes], memory=memory)


@pytest.mark.parametrize(
    "question", [QUESTION, "Leo ate ramen in Kyoto", "Where does the cliffs trail end?", "rich creamy broth"]
)
def test_a_node_scores_its_cosine_as_in_a_vector_index(
    twins: tuple[VectorStoreIndex, MemTreeIndex], question: str
) -> None:
    vector, tree = twins
    cosines = {hit.node.node_id: hit.score for hit in vector.as_retriever(similarity_top_k=100).retrieve(question)}
    results = tree.as_retriever(similarity_top_k=6).retrieve(question)
    leaves = [r for r in results if r.node.metadata["is_leaf"]]
    assert leaves
    for result in leaves:
        assert result.score == pytest.approx(cosines[result.node.node_id], abs=1e-5)
    # The engine's order, on its own scale (a leaf a summary brought in keeps its own score).
    hybrid = [r.node.metadata["memtree_score"] for r in results if r.node.metadata["found_by"] is None]
    assert hybrid == sorted(hybrid, reverse=True)


def test_a_similarity_cutoff_tuned_on_the_vector_index_keeps_the_same_nodes(
    twins: tuple[VectorStoreIndex, MemTreeIndex],
) -> None:
    vector, tree = twins
    for question in (QUESTION, "Leo ate ramen in Kyoto", "Where does the cliffs trail end?"):
        cosines = {hit.node.node_id: hit.score for hit in vector.as_retriever(similarity_top_k=100).retrieve(question)}
        for cutoff in (0.2, 0.4, 0.6):
            cut = SimilarityPostprocessor(similarity_cutoff=cutoff)
            kept = cut.postprocess_nodes(
                tree.as_retriever(similarity_top_k=8, leaves_only=True).retrieve(question), QueryBundle(question)
            )
            assert all(cosines[r.node.node_id] >= cutoff - 1e-6 for r in kept)
            wanted = {node_id for node_id, cosine in cosines.items() if cosine >= cutoff + 1e-6}
            returned = {
                r.node.node_id for r in tree.as_retriever(similarity_top_k=8, leaves_only=True).retrieve(question)
            }
            assert wanted & returned <= {r.node.node_id for r in kept}


# -- every FilterOperator means what LlamaIndex's SimpleVectorStore makes it mean -------------------------


PEOPLE: list[tuple[str, dict[str, Any]]] = [
    ("ana", {"age": 31, "city": "Lisbon", "tags": ["art", "food"], "bio": "Painter in Lisbon"}),
    ("ben", {"age": 25, "city": "Porto", "tags": ["sport", "art"], "bio": "Cyclist from Porto"}),
    ("caro", {"age": 40, "city": "Lisbon", "tags": ["food"], "bio": "baker, lisbon-born"}),
    ("dan", {"age": 25.5, "city": "Braga", "tags": [], "bio": "Surfer"}),
    ("eve", {"age": 52, "city": "Porto", "tags": ["sport"]}),
    ("note", {}),
]

VALUES: dict[FilterOperator, Any] = {
    FilterOperator.EQ: ("city", "Lisbon"),
    FilterOperator.NE: ("city", "Lisbon"),
    FilterOperator.GT: ("age", 31),
    FilterOperator.LT: ("age", 31),
    FilterOperator.GTE: ("age", 31),
    FilterOperator.LTE: ("age", 31),
    FilterOperator.IN: ("city", ["Porto", "Braga"]),
    FilterOperator.NIN: ("city", ["Porto", "Braga"]),
    FilterOperator.ANY: ("tags", ["sport", "food"]),
    FilterOperator.ALL: ("tags", ["art", "food"]),
    FilterOperator.TEXT_MATCH: ("bio", "Lisbon"),
    FilterOperator.TEXT_MATCH_INSENSITIVE: ("bio", "LISBON"),
    FilterOperator.CONTAINS: ("tags", "art"),
    FilterOperator.IS_EMPTY: ("tags", None),
}


@pytest.fixture(scope="module")
def people() -> tuple[VectorStoreIndex, MemTreeIndex]:
    nodes = [TextNode(id_=name, text=f"{name} tells a story.", metadata=metadata) for name, metadata in PEOPLE]
    vector = VectorStoreIndex([n.model_copy() for n in nodes], embed_model=WordsEmbedding())
    return vector, MemTreeIndex([n.model_copy() for n in nodes], memory=make_memory())


def kept(index: Any, filters: MetadataFilters) -> set[str]:
    results = index.as_retriever(filters=filters, similarity_top_k=50).retrieve("story")
    return {r.node.node_id for r in results if r.node.metadata.get("is_leaf", True)}


@pytest.mark.parametrize("operator", list(FilterOperator), ids=lambda op: op.name)
def test_every_filter_operator_keeps_what_the_simple_vector_store_keeps(
    people: tuple[VectorStoreIndex, MemTreeIndex], operator: FilterOperator
) -> None:
    assert operator in VALUES, f"a new LlamaIndex FilterOperator {operator!r}: support it or refuse it by name"
    key, value = VALUES[operator]
    vector, tree = people
    for condition in (FilterCondition.AND, FilterCondition.NOT):
        filters = MetadataFilters(
            filters=[MetadataFilter(key=key, value=value, operator=operator)], condition=condition
        )
        expected = kept(vector, filters)
        assert kept(tree, filters) == expected, (operator, condition)
    assert len(kept(vector, MetadataFilters(filters=[MetadataFilter(key=key, value=value, operator=operator)]))) > 0


def test_an_operator_memtree_does_not_apply_is_refused_by_name(
    people: tuple[VectorStoreIndex, MemTreeIndex], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delitem(filters_module.OPERATORS, FilterOperator.TEXT_MATCH)  # as an operator LlamaIndex adds later
    filters = MetadataFilters(filters=[MetadataFilter(key="bio", value="x", operator=FilterOperator.TEXT_MATCH)])
    with pytest.raises(
        UnsupportedFilterError, match=r"support the operators '==', '!=', .*'is_empty'; got 'text_match'"
    ):
        people[1].as_retriever(filters=filters)
