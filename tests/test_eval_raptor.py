"""The offline RAPTOR-style baseline: tree invariants, clustering, search, errors."""

from __future__ import annotations

import sys
from collections.abc import Sequence

import numpy as np
import pytest

from memtree import HashingEmbedder
from memtree.aggregate import ExtractiveAggregator
from memtree.embed import Embedder, Matrix
from memtree.text import count_words
from memtree_bench.raptor import RaptorTree

pytest.importorskip("sklearn")

PER_TOPIC = 40
FRUIT = [f"Fruit note {i}: Alice ate fruit number {i}." for i in range(PER_TOPIC)]
SPACE = [f"Space note {i}: the rocket number {i} flew." for i in range(PER_TOPIC)]
PHRASES = [
    "we planned a hiking trip to the mountains",
    "my sister adopted a small grey kitten",
    "the bakery on the corner sells sourdough",
    "I started painting landscapes in watercolor",
    "our team won the football match on Sunday",
    "she is studying for the nursing exam",
    "the concert downtown was loud and crowded",
    "he fixed the old bicycle in the garage",
]
MIXED = [f"Session {i // 8}: {PHRASES[i % 8]} and talked about day {i}." for i in range(48)]


class TopicEmbedder(Embedder):
    """Fruit texts point along axis 0, space texts along axis 1, each with a small
    fixed jitter on the other axes; a summary (one sentence per line) gets the mean
    of its sentences' vectors, as if the model averaged its content."""

    def __init__(self, dimension: int = 8, jitter: float = 0.05) -> None:
        rng = np.random.default_rng(100)
        self.table: dict[str, np.ndarray] = {}
        for axis, texts in ((0, FRUIT), (1, SPACE)):
            for text in texts:
                vector = jitter * rng.normal(size=dimension)
                vector[axis] += 1.0
                self.table[text] = vector

    def embed(self, texts: Sequence[str]) -> Matrix:
        rows = [np.mean([self.table[line] for line in text.split("\n")], axis=0) for text in texts]
        matrix = np.asarray(rows, dtype=np.float32)
        return matrix / np.linalg.norm(matrix, axis=1, keepdims=True)


@pytest.fixture(scope="module")
def topic_tree() -> RaptorTree:
    return RaptorTree.build(FRUIT + SPACE, TopicEmbedder(), ExtractiveAggregator())


@pytest.fixture(scope="module")
def mixed_tree() -> RaptorTree:
    return RaptorTree.build(MIXED, HashingEmbedder(64), ExtractiveAggregator(), max_clusters=12)


def test_every_leaf_appears_once_as_a_leaf(mixed_tree: RaptorTree) -> None:
    leaves = [node for node in mixed_tree.nodes if node.is_leaf]
    assert [node.text for node in leaves] == MIXED
    assert [node.leaves for node in leaves] == [(i,) for i in range(len(MIXED))]
    assert all(mixed_tree.nodes[i].is_leaf for i in range(len(MIXED)))


def test_summaries_cover_nodes_of_the_level_below(mixed_tree: RaptorTree) -> None:
    assert mixed_tree.levels >= 2
    for level in range(1, mixed_tree.levels):
        below = set(mixed_tree.level(level - 1))
        covered: set[int] = set()
        for node_id in mixed_tree.level(level):
            node = mixed_tree.nodes[node_id]
            assert node.children and set(node.children) <= below
            expected = sorted({leaf for child in node.children for leaf in mixed_tree.nodes[child].leaves})
            assert list(node.leaves) == expected
            covered |= set(node.children)
        assert covered == below  # soft assignment may add parents, never drop a node


def test_two_separated_topics_make_two_first_level_clusters(topic_tree: RaptorTree) -> None:
    first = [topic_tree.nodes[i] for i in topic_tree.level(1)]
    assert [node.children for node in first] == [
        tuple(range(PER_TOPIC)),
        tuple(range(PER_TOPIC, 2 * PER_TOPIC)),
    ]
    fruit, space = (set(node.text.split("\n")) for node in first)
    assert fruit <= set(FRUIT) and space <= set(SPACE)
    # Two nodes are too few for another mixture (RAPTOR's stop), so the tree ends here.
    assert topic_tree.levels == 2
    assert topic_tree.shape() == {
        "nodes": 82.0,
        "leaves": 80.0,
        "summaries": 2.0,
        "levels": 2.0,
        "max_depth": 2.0,
        "mean_depth": 2.0,
        "branching": 40.0,
        "searchable": 82.0,
    }


def test_search_returns_the_queried_leaf_first(topic_tree: RaptorTree) -> None:
    query = TopicEmbedder().embed([SPACE[7]])[0]
    hits = topic_tree.search(query, 5)
    assert hits[0].text == SPACE[7]
    assert hits[0].score == pytest.approx(1.0, abs=1e-5)
    assert (hits[0].level, hits[0].is_leaf) == (0, True)
    assert [hit.score for hit in hits] == sorted((hit.score for hit in hits), reverse=True)
    assert all(hit.text in SPACE or not hit.is_leaf for hit in hits)


def test_search_over_all_levels_finds_the_topic_summary(topic_tree: RaptorTree) -> None:
    axis = np.zeros(8, dtype=np.float32)
    axis[0] = 2.0  # not unit length: search normalizes
    hits = topic_tree.search(axis, 200)
    assert len(hits) == 82  # limit beyond the tree returns every node once
    fruit_summary = topic_tree.nodes[topic_tree.level(1)[0]]
    summaries = [hit for hit in hits if not hit.is_leaf]
    assert summaries[0].text == fruit_summary.text and summaries[0].level == 1
    assert all(hit.text in FRUIT for hit in hits[:PER_TOPIC] if hit.is_leaf)


def test_build_counts_its_calls(topic_tree: RaptorTree, mixed_tree: RaptorTree) -> None:
    for tree in (topic_tree, mixed_tree):
        summaries = [node for node in tree.nodes if not node.is_leaf]
        assert tree.embedding_calls == tree.levels  # the leaves in one batch, then one batch per level
        assert tree.stats.embedded_texts == len(tree.nodes)
        assert tree.aggregation_calls == len(summaries)
        assert tree.stats.seconds > 0
    # 40 sentences of 7 words exceed a summary's budget, so the aggregator embedded them.
    assert topic_tree.stats.aggregator_embedding_calls >= 1


def test_clusters_too_long_for_the_summarizer_are_split() -> None:
    tree = RaptorTree.build(
        FRUIT + SPACE, TopicEmbedder(), ExtractiveAggregator(), max_cluster_words=50, max_clusters=12
    )
    first = [tree.nodes[i] for i in tree.level(1)]
    assert len(first) > 2
    for node in first:
        words = sum(count_words(tree.nodes[child].text) for child in node.children)
        assert words <= 50 or len(node.children) == 1
        assert set(node.leaves) <= set(range(PER_TOPIC)) or set(node.leaves) <= set(range(PER_TOPIC, 80))


def test_same_seed_same_tree() -> None:
    first = RaptorTree.build(MIXED, HashingEmbedder(64), ExtractiveAggregator(), max_clusters=12, seed=3)
    second = RaptorTree.build(MIXED, HashingEmbedder(64), ExtractiveAggregator(), max_clusters=12, seed=3)
    assert first.nodes == second.nodes
    assert np.array_equal(first.embeddings, second.embeddings)


def test_one_text_is_a_tree_of_one_leaf() -> None:
    tree = RaptorTree.build(["Only one memory."], HashingEmbedder(16), ExtractiveAggregator())
    assert tree.levels == 1 and tree.aggregation_calls == 0
    [hit] = tree.search(HashingEmbedder(16).embed(["Only one memory."])[0], 10)
    assert (hit.text, hit.is_leaf) == ("Only one memory.", True)


def test_copies_of_a_text_are_searched_once() -> None:
    tree = RaptorTree.build(["same words here", "same words here"], HashingEmbedder(16), ExtractiveAggregator())
    hits = tree.search(HashingEmbedder(16).embed(["same words here"])[0], 10)
    assert [hit.text for hit in hits] == ["same words here"]


@pytest.mark.parametrize(
    ("texts", "error", "message"),
    [
        ([], ValueError, "texts is empty"),
        (["fine text", "   "], ValueError, r"texts\[1\] is empty"),
        (["fine text", 7], TypeError, r"texts\[1\] must be a str"),
        ("a single string", TypeError, "not a single string"),
    ],
)
def test_bad_texts_are_refused(texts: object, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        RaptorTree.build(texts, HashingEmbedder(16), ExtractiveAggregator())  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ({"max_levels": 0}, "max_levels must be a positive int, got 0"),
        ({"threshold": 1.0}, "threshold must be strictly between 0 and 1, got 1.0"),
        ({"seed": -1}, "seed must be a non-negative int, got -1"),
        ({"covariance": "round"}, "covariance must be one of full, diag, spherical, tied; got 'round'"),
    ],
)
def test_bad_settings_are_refused(option: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RaptorTree.build(["a text"], HashingEmbedder(16), ExtractiveAggregator(), **option)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("query", "limit", "message"),
    [
        (np.ones(15), 3, r"shape \(15,\); this tree's embeddings have dimension 16"),
        (np.zeros(16), 3, "all zeros"),
        (np.full(16, np.nan), 3, "NaN or infinite"),
        (np.ones(16), 0, "limit must be a positive int, got 0"),
    ],
)
def test_bad_queries_are_refused(query: np.ndarray, limit: int, message: str) -> None:
    tree = RaptorTree.build(["a text"], HashingEmbedder(16), ExtractiveAggregator())
    with pytest.raises(ValueError, match=message):
        tree.search(query, limit)


def test_missing_scikit_learn_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "sklearn.mixture", None)
    with pytest.raises(ImportError, match=r'pip install "memtree-llm\[bench\]"'):
        RaptorTree.build(["a text"], HashingEmbedder(16), ExtractiveAggregator())
