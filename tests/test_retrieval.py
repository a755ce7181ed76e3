"""Retrieval: collapsed equals a brute-force ranking; budgets, filters, traversal."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from functools import partial
from typing import TypeVar

import numpy as np
import pytest
from conftest import TableEmbedder

from memtree import ROOT_ID, HashingEmbedder, MemTree, MemTreeConfig, retrieval
from memtree.lexical import lexical_tokens
from memtree.packing import DeliveredSentences
from memtree.retrieval import SUMMARY_WEIGHT, Filters, LexicalShare
from memtree.spare_core import Overlap
from memtree.text import count_tokens

TEXTS = [
    "Alice adopted a grey cat named Miso in March.",
    "Bob started training for the Berlin marathon.",
    "Alice's cat Miso likes to sleep on the piano.",
    "Bob injured his knee during a long run.",
    "Carol moved to Lisbon for a job in a bakery.",
    "Carol's bakery sells custard tarts every morning.",
    "Alice plays jazz piano on Friday nights.",
    "Bob's marathon time was three hours and forty minutes.",
]


def build(**options: object) -> MemTree:
    """The memory these tests rank: summaries deliver their own text, so a test sees
    the ranking itself (what a summary delivers instead is test_summary_hits.py's),
    and the first match's context does not move the query (test_feedback.py's)."""
    options = {"summary_hits": "text", "context_feedback": 0.0, **options}
    config = MemTreeConfig(theta0=0.15, drop_repeated_sentences=False, **options)  # type: ignore[arg-type]
    memory = MemTree(embedder=HashingEmbedder(64), config=config)
    for day, text in enumerate(TEXTS, start=1):
        memory.add(text, timestamp=f"2024-03-{day:02d}", metadata={"person": text.split()[0].strip("'s")})
    return memory


def textbook_bm25(documents: list[str], query: str) -> np.ndarray:
    """Okapi BM25 (k1 1.5, b 0.75, idf log(1 + (N - df + .5) / (df + .5))), written out."""
    docs = [lexical_tokens(text) for text in documents]
    average = sum(map(len, docs)) / len(docs)
    scores = np.zeros(len(docs))
    for term in lexical_tokens(query):
        df = sum(term in doc for doc in docs)
        if not df:
            continue
        idf = math.log(1 + (len(docs) - df + 0.5) / (df + 0.5))
        for i, doc in enumerate(docs):
            tf = doc.count(term)
            scores[i] += idf * tf * 2.5 / (tf + 1.5 * (0.25 + 0.75 * len(doc) / average))
    return scores


def brute_force(memory: MemTree, query: str) -> list[tuple[str, float]]:
    """Every node scored from scratch: (cosine + w x BM25 / best BM25) / (1 + w),
    summaries' scores then times SUMMARY_WEIGHT (hybrid only)."""
    q = memory.embedder.embed([query])[0]
    nodes = [node for node in memory.walk() if node.id != ROOT_ID]
    scores = np.array([float(node.embedding @ q) for node in nodes])
    lexical = textbook_bm25([node.text for node in nodes], query)
    if memory.config.lexical_weight and lexical.max() > 0:
        weight = memory.config.lexical_weight
        scores = (scores + weight * lexical / lexical.max()) / (1 + weight)
    if memory.config.lexical_weight:
        scores = np.where([node.is_leaf for node in nodes], scores, scores * SUMMARY_WEIGHT)
    order = np.argsort(-scores, kind="stable")
    return [(nodes[i].id, float(scores[i])) for i in order]


@pytest.mark.parametrize("lexical_weight", [0.0, 0.2, 1.0])
@pytest.mark.parametrize("query", ["Miso the cat", "marathon knee", "bakery in Lisbon", "piano jazz"])
def test_collapsed_retrieval_equals_brute_force_ranking(query: str, lexical_weight: float) -> None:
    memory = build(lexical_weight=lexical_weight)
    assert memory.stats().summaries > 0  # the ranking mixes leaves and summaries
    ranking = brute_force(memory, query)
    got = memory.retrieve(query, k=5, min_score=-1.0)
    np.testing.assert_allclose([r.score for r in got], [s for _, s in ranking[:5]], atol=1e-5)
    # Ids must match exactly, up to the order of exactly tied scores.
    by_score: dict[float, set[str]] = {}
    for node_id, score in ranking:
        by_score.setdefault(round(score, 5), set()).add(node_id)
    for result in got:
        assert result.id in by_score[round(result.score, 5)]
    assert len({r.id for r in got}) == 5


@pytest.mark.parametrize("lexical_weight", [0.0, 0.3, 1.0])
def test_collapsed_retrieval_equals_brute_force_ranking_on_a_large_tree(lexical_weight: float) -> None:
    """Hundreds of nodes, far more than the candidates the engine ranks first (4k + 16),
    so the dense top-k, the lexical top-k and their union are all really cut."""
    rng = np.random.default_rng(7)
    words = [f"w{i}" for i in range(60)]
    config = MemTreeConfig(
        theta0=0.2,
        drop_repeated_sentences=False,
        lexical_weight=lexical_weight,
        summary_hits="text",
        context_feedback=0.0,
    )
    memory = MemTree(embedder=HashingEmbedder(32), config=config)
    memory.add_many([" ".join(rng.choice(words, size=6)) for _ in range(300)])
    assert len(list(memory.walk())) > 400
    for _ in range(25):
        query = " ".join(rng.choice(words, size=3))
        expected = brute_force(memory, query)[:5]
        got = memory.retrieve(query, k=5, min_score=-1.0)
        np.testing.assert_allclose([r.score for r in got], [score for _, score in expected], atol=1e-5)
        tied = {node_id for node_id, score in brute_force(memory, query) if score >= expected[-1][1] - 1e-5}
        assert {r.id for r in got} <= tied


def test_discounted_summaries_rank_as_the_fused_candidates_say() -> None:
    """Discounting moves summaries down past leaves; retrieval (which asks for
    4k + 16 candidates) still equals scoring everything on this tree."""
    people = ["Alice", "Bob", "Carol", "Dan", "Eve"]
    things = ["cat", "piano", "marathon", "bakery", "garden", "chess", "boat", "violin"]
    config = MemTreeConfig(theta0=0.1, drop_repeated_sentences=False, summary_hits="text", context_feedback=0.0)
    memory = MemTree(embedder=HashingEmbedder(64), config=config)
    for i in range(60):
        memory.add(f"{people[i % 5]} talked about the {things[i % 8]} on day {i}.")
    assert memory.stats().summaries > 10
    index, state = memory._index, memory._state
    assert index is not None
    for query in ("Alice cat", "Bob marathon day", "violin boat", "Eve chess garden"):
        ranking = brute_force(memory, query)
        for k in (1, 2, 5):
            got = memory.retrieve(query, k=k, min_score=-1.0)
            np.testing.assert_allclose([r.score for r in got], [s for _, s in ranking[:k]], atol=1e-5)
        # The ranking function asked for a handful of nodes: fewer candidates, each
        # scored exactly as from scratch, best first.
        vector = memory.embed_query(query)
        exact = dict(ranking)
        for limit in (1, 2, 3, 6):
            ranked = retrieval.rank_collapsed(index, state, vector, limit, Filters(), LexicalShare(query, 0.3))
            assert len(ranked) >= limit
            np.testing.assert_allclose([s for _, s in ranked], [exact[i] for i, _ in ranked], atol=1e-5)
            assert [s for _, s in ranked] == sorted((s for _, s in ranked), reverse=True)


A = TypeVar("A")
B = TypeVar("B")


class ThreadRecordingOverlap(Overlap):
    """An Overlap that records which threads ran the side work."""

    def __init__(self, workers: int) -> None:
        super().__init__(workers)
        self.side_threads: set[int] = set()

    def run(self, main: Callable[[], A], side: Callable[[], B]) -> tuple[A, B]:
        def recorded() -> B:
            self.side_threads.add(threading.get_ident())
            return side()

        return super().run(main, recorded)


def test_hybrid_ranking_is_the_same_with_the_bm25_search_on_a_helper_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """Large memories run the BM25 search beside the vector scan (memtree.spare_core);
    the ranking must not depend on it, filters included."""
    people = ["Alice", "Bob", "Carol", "Dan", "Eve"]
    things = ["cat", "piano", "marathon", "bakery", "garden", "chess", "boat", "violin"]
    config = MemTreeConfig(theta0=0.1, drop_repeated_sentences=False, summary_hits="text")
    memory = MemTree(embedder=HashingEmbedder(64), config=config)
    for i in range(60):
        memory.add(
            f"{people[i % 5]} talked about the {things[i % 8]} on day {i}.",
            metadata={"person": people[i % 5]},
            timestamp=float(i),
        )
    index, state = memory._index, memory._state
    assert index is not None
    helpers = ThreadRecordingOverlap(1)
    cases = [Filters(), Filters(leaves_only=True), Filters(where={"person": "Bob"}), Filters(time_range=(10.0, 30.0))]
    for query in ("Alice cat", "Bob marathon day", "violin boat", "Eve chess garden", "nothing known"):
        vector = memory.embed_query(query)
        for filters in cases:
            for limit in (1, 5, 56):
                rank = partial(retrieval.rank_collapsed, index, state, vector, limit, filters, LexicalShare(query, 0.3))
                inline = rank(overlap=Overlap(0))
                assert rank(overlap=helpers) == inline
                assert rank() == inline  # this small memory: the default runs both in turn
                assert inline  # every case ranks something
    assert helpers.side_threads and threading.get_ident() not in helpers.side_threads  # it did run beside
    # From OVERLAP_MIN_NODES nodes up, the default is the shared helper threads.
    shared = ThreadRecordingOverlap(1)
    monkeypatch.setattr(retrieval, "SEARCHES", shared)
    monkeypatch.setattr(retrieval, "OVERLAP_MIN_NODES", len(index))
    vector = memory.embed_query("Alice cat")
    expected = retrieval.rank_collapsed(index, state, vector, 20, Filters(), LexicalShare("Alice cat", 0.3), Overlap(0))
    assert retrieval.rank_collapsed(index, state, vector, 20, Filters(), LexicalShare("Alice cat", 0.3)) == expected
    assert shared.side_threads


def test_hybrid_ranking_discounts_summaries_and_dense_ranking_does_not() -> None:
    memory = build(lexical_weight=0.3, parent_embedding="text")  # a summary's vector is its text's
    summary = next(node for node in memory.walk() if node.id != ROOT_ID and not node.is_leaf)
    query = summary.text
    hybrid = {r.id: r.score for r in memory.retrieve(query, k=100, min_score=-1.0)}
    dense = {r.id: r.score for r in memory.retrieve(query, k=100, min_score=-1.0, lexical_weight=0.0)}
    # Its own text: cosine 1, so at most 1 undiscounted; dense ranking gives it exactly 1.
    assert hybrid[summary.id] <= SUMMARY_WEIGHT + 1e-6
    assert dense[summary.id] == pytest.approx(1.0, abs=1e-5)
    leaf = next(node for node in memory.walk() if node.is_leaf)
    leaf_scores = {r.id: r.score for r in memory.retrieve(leaf.text, k=100, min_score=-1.0)}
    assert leaf_scores[leaf.id] == pytest.approx(1.0, abs=1e-5)  # its own text, the best BM25, no discount


def test_results_carry_node_fields_and_leaf_ids() -> None:
    memory = build()
    for result in memory.retrieve("Alice cat", k=20):
        node = memory.get(result.id)
        assert (result.text, result.depth, result.is_leaf) == (node.text, node.depth, node.is_leaf)
        assert result.timestamp == node.timestamp
        assert result.leaf_ids == memory.leaf_ids_under(node.id)
        assert len(result.leaf_ids) == node.leaf_count
        if result.is_leaf:
            assert result.leaf_ids == (result.id,) and result.metadata == node.metadata


def test_token_budget_is_respected_and_last_result_is_cut() -> None:
    memory = build()
    for budget in (5, 17, 40, 90):
        results = memory.retrieve("Bob marathon", k=50, token_budget=budget)
        used = sum(count_tokens(r.context) for r in results)
        assert 0 < used <= budget
    unlimited = memory.retrieve("Bob marathon", k=50)
    total = sum(count_tokens(r.context) for r in unlimited)
    cut = memory.retrieve("Bob marathon", k=50, token_budget=total - 3)
    assert sum(count_tokens(r.context) for r in cut) == total - 3


def test_leaves_only_where_and_time_range_filters() -> None:
    memory = build()
    leaves = memory.retrieve("Alice", k=20, leaves_only=True)
    assert leaves and all(r.is_leaf for r in leaves)
    alice = memory.retrieve("cat", k=20, where={"person": "Alice"})
    assert {r.text for r in alice} == {t for t in TEXTS if t.startswith("Alice")}
    march_4_to_6 = memory.retrieve(
        "anything about people", k=20, leaves_only=True, time_range=("2024-03-04", "2024-03-06"), min_score=-1
    )
    assert {r.text for r in march_4_to_6} == set(TEXTS[3:6])
    open_start = memory.retrieve("anything", k=20, leaves_only=True, time_range=(None, "2024-03-02"), min_score=-1)
    assert {r.text for r in open_start} == set(TEXTS[:2])
    assert memory.retrieve("cat", where={"person": "Nobody"}) == []


def test_filtered_collapsed_ranking_equals_brute_force_over_allowed_nodes() -> None:
    memory = build()
    expected = [(i, s) for i, s in brute_force(memory, "Bob knee marathon") if memory.get(i).is_leaf]
    got = memory.retrieve("Bob knee marathon", k=3, leaves_only=True)
    assert len({round(s, 5) for _, s in expected[:4]}) == 4  # no ties at the top
    assert [r.id for r in got] == [i for i, _ in expected[:3]]


def test_min_score_drops_weak_results() -> None:
    memory = build()
    scores = [r.score for r in memory.retrieve("Carol bakery", k=20, min_score=-1)]
    distinct = sorted(set(scores))
    cutoff = distinct[len(distinct) // 2]
    kept = memory.retrieve("Carol bakery", k=20, min_score=cutoff)
    assert kept and all(r.score >= cutoff for r in kept)
    assert len(kept) < len(scores)


def test_repeated_sentences_are_dropped_from_context() -> None:
    memory = MemTree(embedder=HashingEmbedder(64), config=MemTreeConfig(theta0=0.15))
    for text in TEXTS:
        memory.add(text)
    results = memory.retrieve("Alice cat Miso piano", k=30)
    seen: set[str] = set()
    for result in results:
        lines = [line.strip() for line in result.context.replace("\n", " \n ").split("\n") if line.strip()]
        assert result.context  # a result that adds nothing is skipped
        for line in lines:
            assert line not in seen
            seen.add(line)


def test_delivered_sentences_give_only_what_is_new() -> None:
    delivered = DeliveredSentences()
    assert delivered.new_part("Ana has a cat. It is grey.") == "Ana has a cat. It is grey."
    assert delivered.new_part("it is  GREY. Ben runs.") == "Ben runs."  # folded case and spaces
    assert delivered.new_part("Ana has a cat.") is None
    assert delivered.new_part("Ben runs.\nMiso sleeps.\nAna swims.") == "Miso sleeps.\nAna swims."


def test_traversal_descends_by_beam_then_fills_k_from_the_leaves_below() -> None:
    memory = build(beam=1, lexical_weight=0.0)
    query = "Miso the cat"
    vector = memory.embed_query(query)

    def cosine(node_id: str) -> float:
        return float(memory.get(node_id).embedding @ vector)

    path, node = [], memory.get(ROOT_ID)  # beam 1: the best child at each level
    while node.children:
        best = max(range(len(node.children)), key=lambda i: (cosine(node.children[i]), -i))
        path.append(node.children[best])
        node = memory.get(path[-1])
    assert len(path) >= 2 and memory.get(path[-1]).is_leaf
    below = [leaf for leaf in memory.leaf_ids_under(path[0]) if leaf not in path]
    assert below  # the descent alone would leave k unfilled
    expected = sorted(path, key=lambda i: -cosine(i)) + sorted(below, key=lambda i: (-cosine(i), i))
    assert [r.id for r in memory.retrieve(query, mode="traversal", k=len(expected))] == expected

    # Asked for more than the subtree holds: every other node follows in collapsed order.
    everything = memory.retrieve(query, mode="traversal", k=100)
    nodes = [n.id for n in memory.walk() if n.id != ROOT_ID]
    assert len(everything) == len(nodes)
    assert [r.id for r in everything][: len(expected)] == expected
    others = [r.id for r in memory.retrieve(query, k=100) if r.id not in expected]
    assert [r.id for r in everything][len(expected) :] == others


def test_traversal_fills_the_token_budget() -> None:
    memory = build(beam=1)
    total = sum(count_tokens(node.text) for node in memory.walk() if node.id != ROOT_ID)
    for budget in (40, 120, total // 2):
        results = memory.retrieve("Miso the cat", mode="traversal", k=100, token_budget=budget)
        assert sum(count_tokens(r.context) for r in results) == budget


def test_k_results_come_back_whatever_their_scores_unless_a_min_score_is_set() -> None:
    table = {"north": [1.0, 0.0], "south": [-1.0, 0.1], "east": [0.0, 1.0]}

    def memory(**options: object) -> MemTree:
        config = MemTreeConfig(theta0=0.99, lexical_weight=0.0, **options)  # type: ignore[arg-type]
        built = MemTree(embedder=TableEmbedder(table), config=config)
        for text in table:
            built.add(text)  # θ0 0.99: three leaves under the root, no summary
        return built

    query = np.asarray([1.0, 0.0], np.float32)
    plain = memory()
    for mode in ("collapsed", "traversal"):
        hits = plain.retrieve("q", k=3, mode=mode, query_embedding=query)
        assert [(h.text, round(h.score, 3)) for h in hits] == [("north", 1.0), ("east", 0.0), ("south", -0.995)]
        assert [h.text for h in plain.retrieve("q", k=3, mode=mode, query_embedding=query, min_score=0.0)] == [
            "north",
            "east",
        ]
    assert MemTreeConfig().min_score is None
    strict = memory(min_score=0.5)
    assert [h.text for h in strict.retrieve("q", k=3, query_embedding=query)] == ["north"]
    assert [h.text for h in strict.retrieve("q", k=3, query_embedding=query, min_score=-1.0)] == [
        "north",
        "east",
        "south",
    ]


def test_empty_memory_returns_nothing() -> None:
    memory = MemTree(embedder=HashingEmbedder(32))
    assert memory.retrieve("anything") == []
    assert memory.retrieve("anything", mode="traversal") == []
