"""What a summary that ranks delivers: by default its best leaves (the summary finds,
the leaves answer), with ``summary_hits="text"`` its own text, as in the paper."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memtree import HashingEmbedder, MemTree, MemTreeConfig, RetrievedNode
from memtree.retrieval import SUMMARY_WEIGHT
from memtree.summary_hits import LEAF_ALLOWANCE, SUMMARY_HIT_WEIGHT
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
    "Alice's cat Miso caught a cold in April.",
    "Carol learned to bake bread from her grandmother.",
]
QUERIES = ["Miso the cat", "marathon knee", "bakery in Lisbon", "piano jazz", "grandmother bread", "Alice"]


def build(**options: object) -> MemTree:
    options = {"drop_repeated_sentences": False, **options}
    config = MemTreeConfig(theta0=0.15, **options)  # type: ignore[arg-type]
    memory = MemTree(embedder=HashingEmbedder(64), config=config)
    for day, text in enumerate(TEXTS, start=1):
        memory.add(text, timestamp=f"2024-03-{day:02d}")
    return memory


def pointer_by_hand(memory: MemTree, query: str, k: int) -> list[tuple[str, str | None]]:
    """The default packing written out: rank every node by its own score (hybrid, a
    summary's discounted by SUMMARY_HIT_WEIGHT); a leaf is delivered, a summary brings
    its leaves not yet delivered, best first, until they cost LEAF_ALLOWANCE times its
    own text's tokens."""
    as_text = memory.retrieve(query, k=1000, min_score=-1.0, summary_hits="text")  # summaries x SUMMARY_WEIGHT
    hybrid = memory.config.lexical_weight > 0
    own = {r.id: r.score / (1.0 if r.is_leaf or not hybrid else SUMMARY_WEIGHT) for r in as_text}
    ranked = {r.id: own[r.id] * (1.0 if r.is_leaf or not hybrid else SUMMARY_HIT_WEIGHT) for r in as_text}
    order = sorted(as_text, key=lambda r: -round(ranked[r.id], 9))  # stable: ties keep the engine's order
    delivered: list[tuple[str, str | None]] = []
    given: set[str] = set()
    for result in order:
        if result.is_leaf:
            if result.id not in given:
                delivered.append((result.id, None))
                given.add(result.id)
        else:
            spent = 0
            for leaf in sorted(memory.leaf_ids_under(result.id), key=lambda i: (-own[i], i)):
                if spent >= LEAF_ALLOWANCE * count_tokens(result.text):
                    break
                if leaf not in given:
                    delivered.append((leaf, result.id))
                    given.add(leaf)
                    spent += count_tokens(memory.get(leaf).text)
        if len(delivered) >= k:
            return delivered[:k]
    return delivered


@pytest.mark.parametrize("query", QUERIES)
@pytest.mark.parametrize("lexical_weight", [0.0, 0.3])
def test_a_summary_hit_delivers_its_best_leaves_in_its_place(query: str, lexical_weight: float) -> None:
    memory = build(lexical_weight=lexical_weight)
    assert memory.stats().summaries > 0
    got = memory.retrieve(query, k=6, min_score=-1.0)
    assert [(r.id, r.found_by) for r in got] == pointer_by_hand(memory, query, 6)
    assert all(r.is_leaf for r in got)  # the summaries found; only leaves are delivered
    for result in got:
        if result.found_by is not None:
            assert result.id in memory.leaf_ids_under(result.found_by)
    memory.close()


def test_some_query_is_answered_through_a_summary() -> None:
    # The behaviour above is not vacuous: summaries do rank and bring leaves in.
    memory = build(lexical_weight=0.3)
    found = [r for q in QUERIES for r in memory.retrieve(q, k=6, min_score=-1.0) if r.found_by is not None]
    assert found
    as_text = [r for q in QUERIES for r in memory.retrieve(q, k=6, min_score=-1.0, summary_hits="text")]
    assert any(not r.is_leaf for r in as_text)  # the paper's packing delivers summaries' own text
    memory.close()


def test_leaves_a_summary_brings_pass_the_same_gates_as_the_others(monkeypatch: pytest.MonkeyPatch) -> None:
    memory = build(lexical_weight=0.3)
    floor = 0.2
    for query in QUERIES:  # the floor on the plain cosine (context feedback lets context pass: test_feedback.py)
        for result in memory.retrieve(query, k=10, min_similarity=floor, context_feedback=0):
            assert result.similarity is not None and result.similarity >= floor - 1e-6
    # An expired leaf never comes back, not even through a summary that holds it.
    gone = memory.add("Alice's cat Miso won a ribbon at the cat show.", ttl=60)
    later = time.time() + 120
    monkeypatch.setattr(time, "time", lambda: later)  # the clock moves past its expiry
    for query in [*QUERIES, "Miso ribbon cat show"]:
        assert gone not in {r.id for r in memory.retrieve(query, k=10, min_score=-1.0)}
    # Nor does a leaf outside the time range.
    march_first = memory.retrieve("Alice", k=10, min_score=-1.0, time_range=(None, "2024-03-05"))
    assert march_first
    for result in march_first:
        assert result.time is not None and result.time.day <= 5
    memory.close()


def test_summary_hits_text_is_the_papers_packing_and_a_bad_value_is_named() -> None:
    memory = build(lexical_weight=0.3, summary_hits="text")
    assert any(not r.is_leaf for q in QUERIES for r in memory.retrieve(q, k=6, min_score=-1.0))
    with pytest.raises(ValueError, match="summary_hits must be one of: leaves, text; got 'gist'"):
        memory.retrieve("Miso", summary_hits="gist")
    with pytest.raises(ValueError, match="summary_hits must be 'leaves' or 'text'"):
        MemTreeConfig(summary_hits="gist")  # type: ignore[arg-type]
    memory.close()


@settings(max_examples=30, deadline=None)
@given(
    query=st.sampled_from(QUERIES),
    k=st.integers(1, 12),
    budget=st.one_of(st.none(), st.integers(5, 80)),
    dedup=st.booleans(),
)
def test_results_are_distinct_leaves_within_k_and_budget(query: str, k: int, budget: int | None, dedup: bool) -> None:
    memory = build(lexical_weight=0.3, drop_repeated_sentences=dedup)
    got: list[RetrievedNode] = memory.retrieve(query, k=k, token_budget=budget, min_score=-1.0)
    assert len(got) <= k and len({r.id for r in got}) == len(got)
    assert all(r.is_leaf for r in got)
    if budget is not None:
        assert sum(count_tokens(r.context) for r in got) <= budget
    memory.close()
