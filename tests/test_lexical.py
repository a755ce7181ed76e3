"""Hybrid retrieval: the incremental BM25 index and how it joins cosine scores."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from memtree import MemTree, MemTreeConfig
from memtree.embed import Embedder, Matrix
from memtree.lexical import LexicalIndex, lexical_tokens


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
    assert index._postings.keys() == {"dance", "studio"}  # no empty posting lists left behind


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
    dense = memory.retrieve("Who opened a dance studio?", k=5, lexical_weight=0.0)
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
