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
    assert [r.node.metadata["memtree_score"] for r in results] == pytest.approx([hit.score for hit in hits])
    assert [r.score for r in results] == pytest.approx([hit.similarity for hit in hits])
    for result, hit in zip(results, hits, strict=True):
        metadata = result.node.metadata
        assert (metadata["depth"], metadata["is_leaf"], metadata["leaf_ids"]) == (
            hit.depth,
            hit.is_leaf,
            list(hit.leaf_ids),
        )
        assert metadata["timestamp"] is None and metadata["found_by"] == hit.found_by
        assert result.node.get_content() == hit.context
    # By default a summary that ranks brings its best leaves: every result is a leaf.
    leaves, summaries = by_kind(results)
    assert leaves and not summaries
    as_text = index.as_retriever(similarity_top_k=6, summary_hits="text").retrieve(QUESTION)
    assert [r.node.metadata["memtree_id"] for r in as_text] == [
        hit.id for hit in index.memory.retrieve(QUESTION, k=6, summary_hits="text")
    ]
    assert all(by_kind(as_text))  # leaves and summaries


def test_leaves_come_back_as_their_docstore_nodes(index: MemTreeIndex) -> None:
    leaves, _ = by_kind(index.as_retriever(similarity_top_k=8).retrieve(QUESTION))
    for result in leaves:
        stored = index.docstore.get_node(result.node.node_id)
        assert result.node.ref_doc_id == stored.ref_doc_id  # SOURCE relationship kept
        assert result.node.metadata["topic"] == stored.metadata["topic"]
        assert index.memory.get(result.node.metadata["memtree_id"]).source_id == stored.node_id
        assert "memtree_id" not in stored.metadata  # the stored node is untouched


def test_summaries_are_text_nodes_related_to_the_nodes_they_summarize(index: MemTreeIndex) -> None:
    _, summaries = by_kind(index.as_retriever(similarity_top_k=8, summary_hits="text").retrieve(QUESTION))
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


PEOPLE = [
    ("ana", "Ana hiked the Rota Vicentina trail.", 31, "Lisbon", "2024-03-01"),
    ("ben", "Ben ran the Porto marathon in the rain.", 25, "Porto", "2024-04-10"),
    ("caro", "Caro opened a bakery selling custard tarts.", 40, "Lisbon", "2024-05-20"),
    ("dan", "Dan learned to surf on the Braga coast.", 25.0, "Braga", "2024-06-30"),
    ("eve", "Eve restored an old fishing boat.", 52, "Porto", "2024-08-15T12:00:00"),
]


@pytest.fixture(scope="module")
def people() -> MemTreeIndex:
    nodes = [
        TextNode(id_=node_id, text=text, metadata={"age": age, "city": city, "date": date})
        for node_id, text, age, city, date in PEOPLE
    ]
    nodes.append(TextNode(id_="note", text="A note without any metadata."))
    return MemTreeIndex(nodes, memory=make_memory(), timestamp_key="date")


def found(index: MemTreeIndex, filters: MetadataFilters, **options: object) -> set[str]:
    results = index.as_retriever(filters=filters, similarity_top_k=50, min_score=-1.0, **options).retrieve("who")
    return {r.node.node_id for r in results}


def when(key: str, value: object, operator: str = "==") -> MetadataFilter:
    return MetadataFilter(key=key, value=value, operator=FilterOperator(operator))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("conditions", "condition", "expected"),
    [
        ([when("city", "Lisbon")], "and", {"ana", "caro"}),
        ([when("age", 25)], "and", {"ben", "dan"}),  # 25 and 25.0 are one number
        ([when("city", "Lisbon", "!=")], "and", {"ben", "dan", "eve", "note"}),  # no key: != holds
        ([when("age", 31, ">")], "and", {"caro", "eve"}),
        ([when("age", 31, ">=")], "and", {"ana", "caro", "eve"}),
        ([when("age", 31, "<")], "and", {"ben", "dan"}),
        ([when("age", 31, "<=")], "and", {"ana", "ben", "dan"}),
        ([when("city", ["Porto", "Braga"], "in")], "and", {"ben", "dan", "eve"}),
        ([when("city", ["Porto", "Braga"], "nin")], "and", {"ana", "caro", "note"}),
        ([when("age", 25, ">"), when("age", 50, "<")], "and", {"ana", "caro"}),
        ([when("city", "Braga"), when("age", 50, ">=")], "or", {"dan", "eve"}),
        ([when("city", "Porto"), when("age", 40)], "not", {"ana", "dan", "note"}),
        ([when("city", "Porto")], "not", {"ana", "caro", "dan", "note"}),
    ],
)
def test_every_llamaindex_operator_keeps_exactly_its_nodes(
    people: MemTreeIndex, conditions: list[MetadataFilter], condition: str, expected: set[str]
) -> None:
    filters = MetadataFilters(filters=conditions, condition=FilterCondition(condition))  # type: ignore[arg-type]
    assert found(people, filters) == expected
    assert found(people, filters, mode="traversal", leaves_only=True) <= expected


def test_nested_filter_groups_combine_as_written(people: MemTreeIndex) -> None:
    lisbon_or_old = MetadataFilters(
        filters=[when("city", "Lisbon"), when("age", 50, ">")], condition=FilterCondition.OR
    )
    young = MetadataFilters(filters=[when("age", 35, "<")])
    filters = MetadataFilters(filters=[lisbon_or_old, young], condition=FilterCondition.AND)
    assert found(people, filters) == {"ana"}
    either = MetadataFilters(filters=[lisbon_or_old, when("city", "Braga")], condition=FilterCondition.OR)
    assert found(people, either) == {"ana", "caro", "eve", "dan"}


@pytest.mark.parametrize(
    ("conditions", "expected"),
    [
        ([when("date", "2024-05-20")], {"caro"}),  # == is the instant
        ([when("date", "2024-05-20", ">=")], {"caro", "dan", "eve"}),
        ([when("date", "2024-05-20", ">")], {"dan", "eve"}),  # strict: the instant itself is out
        ([when("date", "2024-05-20", "<")], {"ana", "ben"}),
        ([when("date", "2024-05-20", "<=")], {"ana", "ben", "caro"}),
        ([when("date", "2024-04-01", ">"), when("date", "2024-07-01T00:00:00+00:00", "<")], {"ben", "caro", "dan"}),
        ([when("date", "2024-04-01", ">"), when("city", "Porto")], {"ben", "eve"}),
        ([when("date", "2024-06-01", ">"), when("date", "2024-04-01", "<")], set()),  # contradictory
        ([when("date", 1717200000, ">=")], {"dan", "eve"}),  # POSIX seconds: 2024-06-01
    ],
)
def test_filters_on_the_timestamp_key_are_time_ranges(
    people: MemTreeIndex, conditions: list[MetadataFilter], expected: set[str]
) -> None:
    filters = MetadataFilters(filters=conditions)
    assert found(people, filters, leaves_only=True) == expected


def test_time_filters_narrow_an_explicit_time_range(people: MemTreeIndex) -> None:
    filters = MetadataFilters(filters=[when("date", "2024-04-01", ">=")])
    assert found(people, filters, time_range=(None, "2024-06-01"), leaves_only=True) == {"ben", "caro"}
    results = people.as_retriever(filters=filters, similarity_top_k=50, min_score=-1.0).retrieve("who")
    assert results and all(r.node.metadata["timestamp"] >= "2024-04-01" for r in results)  # summaries too


async def test_async_retrieval_filters_alike(people: MemTreeIndex) -> None:
    filters = MetadataFilters(filters=[when("age", 30, ">"), when("date", "2024-06-01", "<")])
    results = await people.as_retriever(filters=filters, similarity_top_k=50, min_score=-1.0).aretrieve("who")
    assert {r.node.node_id for r in results} == {"ana", "caro"}


@pytest.mark.parametrize(
    ("filters", "message"),
    [
        (
            MetadataFilters(filters=[when("city", 3, "text_match")]),
            r"metadata filters: where\['city'\]\['\$text_match'\]: \$text_match takes a string",
        ),
        (MetadataFilters(filters=[when("tags", "a", "any")]), r"\$any takes a list of values, got 'a'"),
        (MetadataFilters(filters=[when("age", [1, 2], ">")]), r"metadata filters: where\['age'\]\['\$gt'\]"),
        (
            MetadataFilters(filters=[when("date", "2024-01-01"), when("city", "x")], condition=FilterCondition.OR),
            "a filter on the event time \\('date'\\) can only be a top-level condition joined by AND",
        ),
        (
            MetadataFilters(filters=[when("date", ["2024-01-01"], "in")]),
            "a filter on the event time \\('date'\\) takes '==', '>', '>=', '<', '<='; got 'in'",
        ),
        (MetadataFilters(filters=[when("date", "soon", ">")]), "the filter on 'date' 'soon' is not an ISO 8601"),
        (MetadataFilters(filters=[MetadataFilters(filters=[])]), "an empty nested MetadataFilters matches nothing"),
    ],
)
def test_filters_the_engine_cannot_apply_are_refused(
    people: MemTreeIndex, filters: MetadataFilters, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        people.as_retriever(filters=filters)


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


def test_an_overview_request_is_answered_by_an_overview_in_every_path(index: MemTreeIndex) -> None:
    from llama_index.core.llms import MockLLM

    request = "What do you know about Pepper?"
    routed = index.as_retriever(token_budget=300).retrieve(request)
    assert routed and {r.node.metadata["answered_by"] for r in routed} == {"overview"}
    looked_up = index.as_retriever(token_budget=300, route_overviews=False).retrieve(request)
    assert {r.node.metadata["answered_by"] for r in looked_up} == {"retrieve"}
    mode = index.as_retriever(token_budget=300, route_overviews="always").retrieve("Pepper the greyhound")
    assert mode and {r.node.metadata["answered_by"] for r in mode} == {"overview"}
    answer = index.as_query_engine(llm=MockLLM(), token_budget=300, route_overviews="always").query("Pepper")
    assert answer.source_nodes and {s.node.metadata["answered_by"] for s in answer.source_nodes} == {"overview"}
    chat = index.as_chat_engine(chat_mode="context", llm=MockLLM(), token_budget=300).chat(request)
    assert chat.source_nodes and {s.node.metadata["answered_by"] for s in chat.source_nodes} == {"overview"}
    with pytest.raises(ValueError, match="route_overviews"):
        MemTreeRetriever(index.memory, route_overviews="sometimes")  # type: ignore[arg-type]
