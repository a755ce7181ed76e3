"""Tree invariants under random sequences of adds, updates and deletes (hypothesis)."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memtree import ROOT_ID, HashingEmbedder, MemTree, MemTreeConfig
from memtree.text import count_words, split_sentences

WORDS = ["cat", "dog", "run", "park", "rain", "code", "tea", "book", "sea", "hill", "jazz", "bike"]

sentences = st.lists(st.sampled_from(WORDS), min_size=1, max_size=6).map(" ".join)
texts = st.lists(sentences, min_size=1, max_size=3).map(". ".join)  # one to three sentences
operations = st.lists(
    st.one_of(
        st.tuples(st.just("add"), texts),
        st.tuples(st.just("delete"), st.integers(min_value=0, max_value=10_000)),
        st.tuples(st.just("update"), st.tuples(st.integers(min_value=0, max_value=10_000), texts)),
    ),
    min_size=1,
    max_size=60,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=operations,
    theta0=st.floats(min_value=0.0, max_value=0.7),
    depth_cap=st.integers(min_value=2, max_value=8),
    parent_embedding=st.sampled_from(["text", "mean", "sentences"]),
)
def test_invariants_hold_after_any_adds_updates_and_deletes(
    ops: list[tuple[str, object]], theta0: float, depth_cap: int, parent_embedding: str
) -> None:
    config = MemTreeConfig(theta0=theta0, depth_cap=depth_cap, parent_embedding=parent_embedding)  # type: ignore[arg-type]
    memory = MemTree(embedder=HashingEmbedder(16), config=config)
    added: dict[str, str] = {}
    embeddings: dict[str, np.ndarray] = {}
    versions: dict[str, list[str]] = {}
    for op, value in ops:
        if op == "add":
            assert isinstance(value, str)
            leaf = memory.add(value)
            if leaf in added:
                assert added[leaf] == value  # an exact duplicate returns the stored leaf
            added[leaf] = value
            embeddings.setdefault(leaf, memory.get(leaf).embedding.copy())
        elif op == "update" and added:
            assert isinstance(value, tuple)
            position, text = value
            leaf = sorted(added)[position % len(added)]
            assert memory.update(leaf, text) == leaf  # the id stays, wherever the leaf goes
            if text != added[leaf]:
                versions.setdefault(leaf, []).append(added[leaf])
            added[leaf] = text
            embeddings[leaf] = memory.embedder.embed([text])[0]
            assert [version.text for version in memory.history(leaf)] == versions.get(leaf, [])
        elif op == "delete" and added:
            assert isinstance(value, int)
            victim = sorted(added)[value % len(added)]
            memory.delete(victim)
            del added[victim]
            versions.pop(victim, None)

        assert memory.check_integrity() == []
        for node in memory.walk():  # every summary's vector is its current text's (or its leaves' mean)
            if node.id == ROOT_ID or node.is_leaf:
                continue
            if parent_embedding == "text":
                expected = memory.embedder.embed([node.text])[0]
            elif parent_embedding == "sentences":  # its sentences' word-weighted mean, or its text's if unknown
                expected = memory.embedder.embed([node.text])[0]
                sentences = split_sentences(node.text)
                weights = np.array([max(1, count_words(sentence)) for sentence in sentences], dtype=np.float32)
                mean = weights @ memory.embedder.embed(sentences)
                if not np.allclose(node.embedding, expected, atol=1e-5):
                    expected = mean / np.linalg.norm(mean)
            else:
                below = np.array([memory.get(leaf).embedding for leaf in memory.leaf_ids_under(node.id)])
                expected = below.mean(axis=0) / np.linalg.norm(below.mean(axis=0))
            np.testing.assert_allclose(node.embedding, expected, atol=1e-5)
        leaves = {node.id: node for node in memory.walk() if node.is_leaf}
        assert set(leaves) == set(added)
        for leaf_id, node in leaves.items():
            assert node.text == added[leaf_id]  # a leaf changes only by update
            np.testing.assert_allclose(node.embedding, embeddings[leaf_id], atol=1e-6)
        assert len(memory) == len(added)
        if added:
            root = memory.get(ROOT_ID)
            assert root.text == "" and root.embedding is None
            assert memory.stats().max_depth <= depth_cap
