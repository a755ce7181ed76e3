"""Hybrid retrieval: the incremental BM25 index and how it joins cosine scores."""

from __future__ import annotations

from collections.abc import Sequence
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lexical_reference import ReferenceLexicalIndex

from memtree import MemTree, MemTreeConfig
from memtree import lexical as lexical_module
from memtree.embed import Embedder, Matrix
from memtree.lexical import LexicalBase, LexicalIndex, lexical_tokens, top


class BlurryEmbedder(Embedder):
    """Every text points almost the same way, as names do for a small sentence model:
    cosine similarity cannot tell these texts apart, only word overlap can."""

    def embed(self, texts: Sequence[str]) -> Matrix:
        rows = []
        for text in texts:
            seed = sum(map(ord, text)) % 1000
            vector = np.ones(16) + 0.01 * np.random.default_rng(seed).standard_normal(16)
            rows.append(vector / np.linalg.norm(vector))
        return np.asarray(rows, dtype=np.float32)


FACTS = [
    "Caroline went to an LGBTQ support group on Monday.",
    "Melanie painted a sunrise over the lake.",
    "Caroline is researching adoption agencies.",
    "Melanie signed up for a pottery class.",
    "Jon opened a dance studio downtown.",
]


def test_tokens_drop_function_words_and_fold_case() -> None:
    assert lexical_tokens("When did Caroline go to the LGBTQ support group?") == [
        "caroline",
        "go",
        "lgbtq",
        "support",
        "group",
    ]


def test_index_replaces_and_forgets_documents() -> None:
    index = LexicalIndex()
    index.upsert("a", "pottery class on Monday")
    index.upsert("b", "dance studio")
    assert set(index.scores("pottery dance")) == {"a", "b"}
    index.upsert("a", "painting class")  # rewritten: pottery is gone
    assert set(index.scores("pottery")) == set()
    assert set(index.scores("painting")) == {"a"}
    index.remove("a")
    index.remove("a")  # idempotent
    assert len(index) == 1 and "a" not in index
    assert index.scores("painting class") == {}
    assert index.search("dance class", 5) == list(index.scores("dance class").items())


def test_rewriting_a_document_leaves_no_garbage_behind() -> None:
    """An update appends entries and kills the old ones; compaction keeps what a term
    stores within twice what is alive, however often a document is rewritten."""
    index = LexicalIndex()
    index.upsert_many([f"d{i}" for i in range(50)], [f"common word{i}" for i in range(50)])
    for round_ in range(500):
        index.upsert("summary", f"common summary round{round_}")
    common = index._term_of[b"common"]
    assert index._size[common] - index._dead[common] == 51
    assert index._size[common] <= 2 * 51
    # Rare words keep fewer than 8 dead entries each before they are compacted too.
    assert int(index._size.sum()) <= 2 * (51 + 50 + 2) + 7 * index._terms
    assert index.search("round499", 3) == [("summary", pytest.approx(index.scores("round499")["summary"]))]
    assert index.scores("round10") == {}


def test_bulk_tokenizing_matches_one_text_at_a_time() -> None:
    texts = [
        "Caroline's LGBTQ support-group, on 8 May 2023!",
        "Straße ÜBER naïve ΑΣ café",  # not ASCII: folded by str.casefold, one by one
        "tabs\tand\nnew lines __init__ x_1",
        "",
        "the of and",  # only function words: a document of length 0
        "nul\x00inside the text",
    ]
    for chunk in (texts, texts[:3], [texts[-1]], texts[2:]):
        index, reference = LexicalIndex(), ReferenceLexicalIndex()
        index.upsert_many([str(i) for i in range(len(chunk))], chunk)
        for i, text in enumerate(chunk):
            reference.upsert(str(i), text)
        assert len(index) == len(reference)
        for text in chunk:
            assert index.scores(text) == reference.scores(text)


def test_rarer_terms_weigh_more_and_allowed_filters() -> None:
    index = LexicalIndex()
    for i, text in enumerate(["caroline art", "caroline work", "caroline adoption", "melanie art"]):
        index.upsert(str(i), text)
    scores = index.scores("caroline adoption")
    assert max(scores, key=scores.__getitem__) == "2"
    assert set(index.scores("caroline", allowed=lambda node_id: node_id != "0")) == {"1", "2"}


def test_hybrid_finds_the_named_fact_that_cosine_cannot_separate() -> None:
    for weight, expect_first in ((0.0, False), (0.2, True)):
        memory = MemTree(embedder=BlurryEmbedder(), config=MemTreeConfig(lexical_weight=weight))
        ids = memory.add_many(FACTS)
        best = memory.retrieve("Who opened a dance studio?", k=1, leaves_only=True)[0]
        assert (best.id == ids[4]) is expect_first
        memory.close()


def test_deleted_leaf_is_never_found_by_its_words() -> None:
    memory = MemTree(embedder=BlurryEmbedder())
    ids = memory.add_many(FACTS)
    memory.delete(ids[4])
    assert memory._state.lexical is not None and ids[4] not in memory._state.lexical
    hits = memory.retrieve("dance studio downtown Jon", k=20)
    assert all("dance studio" not in hit.text for hit in hits)


def test_filters_apply_to_lexical_candidates() -> None:
    memory = MemTree(embedder=BlurryEmbedder())
    for fact in FACTS:
        memory.add(fact, metadata={"person": fact.split()[0]})
    hits = memory.retrieve("Jon dance studio", k=10, where={"person": "Melanie"})
    assert hits and all(hit.metadata["person"] == "Melanie" for hit in hits)


def test_reopened_memory_ranks_the_same(tmp_path: object) -> None:
    path = f"{tmp_path}/memory.db"
    with MemTree.open(path, embedder=BlurryEmbedder()) as memory:
        memory.add_many(FACTS)
        before = [(hit.id, round(hit.score, 6)) for hit in memory.retrieve("Caroline adoption", k=5)]
    with MemTree.open(path, embedder=BlurryEmbedder()) as memory:
        after = [(hit.id, round(hit.score, 6)) for hit in memory.retrieve("Caroline adoption", k=5)]
    assert before == after


def test_zero_weight_keeps_no_lexical_index_and_bad_weights_fail() -> None:
    memory = MemTree(embedder=BlurryEmbedder(), config=MemTreeConfig(lexical_weight=0.0))
    memory.add_many(FACTS)
    assert memory._state.lexical is None
    with pytest.raises(ValueError, match=r"lexical_weight must be between 0\.0 and 10\.0, got -0\.5"):
        MemTreeConfig(lexical_weight=-0.5)


def test_per_call_weight_overrides_the_config() -> None:
    memory = MemTree(embedder=BlurryEmbedder())
    ids = memory.add_many(FACTS)
    assert memory.retrieve("Who opened a dance studio?", k=1, leaves_only=True)[0].id == ids[4]
    # Without context feedback the query is not moved: a dense score is the cosine with it.
    dense = memory.retrieve("Who opened a dance studio?", k=5, lexical_weight=0.0, context_feedback=0.0)
    query = memory.embed_query("Who opened a dance studio?")
    assert [round(hit.score, 5) for hit in dense] == sorted(
        (round(float(memory.get(hit.id).embedding @ query), 5) for hit in dense), reverse=True
    )
    with pytest.raises(ValueError, match="lexical_weight must be a number between 0 and 10, got -1"):
        memory.retrieve("dance", lexical_weight=-1)
    plain = MemTree(embedder=BlurryEmbedder(), config=MemTreeConfig(lexical_weight=0.0))
    plain.add_many(FACTS)
    with pytest.raises(ValueError, match="keeps no lexical index"):
        plain.retrieve("dance", lexical_weight=0.3)


WORDS = ["the", "of", "Über", "ΑΣ", "x_1", "9"] + [f"w{i}" for i in range(40)]
# Skewed: early words are common (long posting lists, low idf), late ones rare.
word = st.integers(min_value=0, max_value=len(WORDS) - 1).map(lambda i: WORDS[i * i // len(WORDS)])

text = st.lists(word, max_size=14).map(" ".join)
node_id = st.sampled_from([f"n{i}" for i in range(24)])
operation = st.one_of(
    st.tuples(st.just("upsert"), st.lists(st.tuples(node_id, text), min_size=1, max_size=8)),
    st.tuples(st.just("remove"), st.lists(node_id, min_size=1, max_size=4)),
    st.tuples(
        st.just("query"),
        st.tuples(text, st.integers(min_value=1, max_value=12), st.none() | st.frozensets(node_id)),
    ),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    start=st.lists(text, min_size=0, max_size=60),
    operations=st.lists(operation, max_size=40),
    forward_cost=st.sampled_from([None, 0, lexical_module._FORWARD_COST, 10**9]),
    bulk=st.booleans(),
)
def test_numpy_index_scores_exactly_like_the_reference(
    start: list[str], operations: list[tuple[str, object]], forward_cost: float | None, bulk: bool
) -> None:
    """Random bulk loads, upserts (ids repeated within a batch too), removes and
    filtered or unfiltered queries: the NumPy index returns the reference's scores,
    and its top-k equals the reference's top-k (ties by id). ``forward_cost`` None
    scores every matching document in one pass (what small indexes do); otherwise
    MaxScore runs, stopping as early as its bounds allow (0), as it would
    (the default) or never (10**9). ``bulk`` takes the paths of large batches (texts
    tokenized in chunks, new words found among the distinct tokens) for every batch."""
    index, reference = LexicalIndex(), ReferenceLexicalIndex()
    ids = [f"s{i}" for i in range(len(start))]
    with (
        mock.patch.object(lexical_module, "_BULK_TOKENS", 0 if bulk else lexical_module._BULK_TOKENS),
        mock.patch.object(lexical_module, "_KNOWN_WORDS", 10**9 if bulk else lexical_module._KNOWN_WORDS),
        mock.patch.object(lexical_module, "_TEXTS_PER_CHUNK", 3 if bulk else lexical_module._TEXTS_PER_CHUNK),
    ):
        _check_against_reference(index, reference, ids, start, operations, forward_cost)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    start=st.lists(text, min_size=1, max_size=60),
    operations=st.lists(operation, max_size=40),
    forward_cost=st.sampled_from([None, 0, lexical_module._FORWARD_COST]),
)
def test_an_index_mapped_from_stored_arrays_scores_like_the_reference(
    start: list[str], operations: list[tuple[str, object]], forward_cost: float | None
) -> None:
    """An index opened over a segment's arrays (postings read in place until a write
    copies them) gives the reference's scores before and after any upserts and removes."""
    ids = [f"s{i}" for i in range(len(start))]
    index = LexicalIndex.mapped(LexicalBase.of(ids, start))
    _check_against_reference(index, ReferenceLexicalIndex(), ids, start, operations, forward_cost, loaded=True)


def _check_against_reference(
    index: LexicalIndex,
    reference: ReferenceLexicalIndex,
    ids: list[str],
    start: list[str],
    operations: list[tuple[str, object]],
    forward_cost: float | None,
    *,
    loaded: bool = False,
) -> None:
    if not loaded:
        index.upsert_many(ids, start)
    for key, value in zip(ids, start, strict=True):
        reference.upsert(key, value)
    one_pass = 10**9 if forward_cost is None else 0
    with (
        mock.patch.object(lexical_module, "_FORWARD_COST", forward_cost or 0),
        mock.patch.object(lexical_module, "_SCORE_ALL_ENTRIES", one_pass),
    ):
        for kind, payload in operations:
            if kind == "upsert":
                pairs = payload
                assert isinstance(pairs, list)
                index.upsert_many([key for key, _ in pairs], [value for _, value in pairs])
                for key, value in pairs:
                    reference.upsert(key, value)
            elif kind == "remove":
                assert isinstance(payload, list)
                index.remove_many(payload)
                for key in payload:
                    reference.remove(key)
            else:
                query, limit, subset = payload  # type: ignore[misc]
                allowed = None if subset is None else subset.__contains__
                expected = reference.scores(query, allowed)
                assert index.scores(query, allowed) == expected  # the same floats, not just close
                probe = [*ids[:3], "n1", "n2", "missing"]
                unfiltered = reference.scores(query)
                probe_scores = [unfiltered.get(key, 0.0) for key in probe]
                hits, also = index.search_and_score(query, limit, allowed, also=probe)
                assert hits == top(expected, limit)
                assert also.tolist() == probe_scores
                assert index.score_of(query, probe).tolist() == probe_scores
            assert len(index) == len(reference)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    texts=st.lists(text, min_size=1, max_size=60),
    query=text,
    limit=st.integers(min_value=1, max_value=8),
    allowed=st.none() | st.frozensets(st.sampled_from([f"d{i}" for i in range(60)])),
    budget=st.sampled_from([0, 5, 40]),
)
def test_an_approximate_search_returns_exact_scores_of_allowed_documents(
    texts: list[str], query: str, limit: int, allowed: frozenset[str] | None, budget: int
) -> None:
    """Approximate search (what retrieval asks past ``ann_min_nodes``) may miss a
    document whose score comes from common words only, but never a filter, never a
    score: every hit scores what ``score_of`` says, the hits come best first, and as
    many are found as exact search finds (when the rare words leave too few allowed
    documents, it reads on)."""
    index = LexicalIndex()
    ids = [f"d{i}" for i in range(len(texts))]
    index.upsert_many(ids, texts)
    check = None if allowed is None else allowed.__contains__
    with (
        mock.patch.object(lexical_module, "_SCORE_ALL_ENTRIES", 0),
        mock.patch.object(lexical_module, "APPROXIMATE_ENTRIES", budget),
    ):
        hits = index.search_and_score(query, limit, check, approximate=True)[0]
    exact = index.search(query, limit, check)
    assert len(hits) <= limit
    assert all(allowed is None or node_id in allowed for node_id, _ in hits)
    assert [score for _, score in hits] == sorted((score for _, score in hits), reverse=True)
    truth = index.score_of(query, [node_id for node_id, _ in hits]).tolist()
    assert [score for _, score in hits] == pytest.approx(truth, rel=1e-12)
    if exact and exact[0][1] > 0:
        assert len(hits) == min(limit, len(exact))  # a filter that keeps few: the search reads on
    if len(exact) < limit:  # every allowed document sharing a word fits: nothing to miss
        assert {node_id for node_id, _ in hits} <= {node_id for node_id, _ in exact} | {
            node_id for node_id, score in hits if score == 0
        }


def test_an_approximate_search_reads_the_rare_words_not_the_common_ones() -> None:
    """A million-document memory cannot read "the"-like lists per query: past the
    entry budget, the common word's postings are not read, its share of a candidate's
    score still counts, and the document that the rare words pick stays first."""
    index = LexicalIndex()
    texts = [f"common filler {i}" for i in range(400)] + ["common zebra violin", "zebra alone", "violin common common"]
    index.upsert_many([f"d{i}" for i in range(len(texts))], texts)
    read: list[int] = []
    original = LexicalIndex._accumulate

    def counting(self: LexicalIndex, accumulator: np.ndarray, query: object, position: int) -> np.ndarray:
        read.append(int(self._size[query.terms[position]]))  # type: ignore[attr-defined]
        return original(self, accumulator, query, position)  # type: ignore[arg-type]

    with (
        mock.patch.object(LexicalIndex, "_accumulate", counting),
        mock.patch.object(lexical_module, "_SCORE_ALL_ENTRIES", 10),
        mock.patch.object(lexical_module, "APPROXIMATE_ENTRIES", 50),
    ):
        hits = index.search_and_score("zebra violin common", 2, approximate=True)[0]
    assert max(read) <= 2  # the rare words' lists only; the common word's 402 entries are not read
    exact = index.search("zebra violin common", 2)
    assert hits == exact
    assert hits[0][0] == "d400"
