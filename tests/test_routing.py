"""Routing on hand-built embeddings: descend, attach, split, thresholds, guards."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import TableEmbedder, unit

from memtree import ROOT_ID, MemTree, MemTreeConfig
from memtree.routing import threshold

A = unit(1, 0, 0, 0)
B = unit(1, 0.3, 0, 0)
C = unit(0, 0, 1, 0)
D = unit(1, 0.1, 0, 1.3)
TABLE = {"alpha": A, "beta": B, "gamma": C, "delta": D}


def memory(**options: object) -> MemTree:
    config = MemTreeConfig(theta0=0.5, parent_embedding="mean", **options)  # type: ignore[arg-type]
    return MemTree(embedder=TableEmbedder(TABLE), config=config)


def cos(u: list[float], v: list[float]) -> float:
    return float(np.dot(u, v))


def test_first_text_hangs_under_the_root() -> None:
    m = memory()
    leaf = m.add("alpha")
    node = m.get(leaf)
    assert node.parent == ROOT_ID and node.depth == 1 and node.is_leaf
    assert m.get(ROOT_ID).children == [leaf]


def test_similar_text_splits_the_leaf_it_reaches_and_keeps_the_old_leaf_intact() -> None:
    m = memory()
    first = m.add("alpha")
    before = m.get(first)
    assert cos(A, B) >= 0.5  # passes θ(0) = θ0
    second = m.add("beta")
    old, new = m.get(first), m.get(second)
    assert old.parent == new.parent != ROOT_ID
    parent = m.get(old.parent)
    assert parent.depth == 1 and parent.leaf_count == 2 and parent.children == [first, second]
    assert (old.depth, new.depth) == (2, 2)
    assert old.id == before.id and old.text == before.text and old.metadata == before.metadata
    np.testing.assert_array_equal(old.embedding, before.embedding)
    assert m.get(ROOT_ID).children == [parent.id]


def test_dissimilar_text_becomes_a_new_root_child() -> None:
    m = memory()
    m.add("alpha")
    m.add("beta")
    gamma = m.add("gamma")
    assert m.get(gamma).parent == ROOT_ID
    assert len(m.get(ROOT_ID).children) == 2


def test_text_that_passes_at_depth_0_but_not_at_depth_1_attaches_inside_the_summary() -> None:
    m = memory()
    first, second = m.add("alpha"), m.add("beta")
    parent = m.get(first).parent
    summary = np.asarray(m.get(parent).embedding)
    theta_1 = 0.5 * math.exp(0.5 * 1 / 2)  # tree depth D = 2 now
    assert float(summary @ D) >= 0.5 and max(cos(D, A), cos(D, B)) < theta_1
    delta = m.add("delta")
    assert m.get(delta).parent == parent
    assert m.get(parent).children == [first, second, delta]
    assert m.get(parent).leaf_count == 3


def test_threshold_is_normalized_by_depth_and_clamped() -> None:
    config = MemTreeConfig(theta0=0.4, decay=0.5)
    assert threshold(0, 5, 0.4, config) == pytest.approx(0.4)
    assert threshold(3, 6, 0.4, config) == pytest.approx(0.4 * math.exp(0.5 * 3 / 6))
    # Empty or one-level trees normalize by D = 1.
    assert threshold(1, 0, 0.4, config) == pytest.approx(0.4 * math.exp(0.5))
    fixed = MemTreeConfig(theta0=0.4, threshold_depth=10)
    assert threshold(5, 2, 0.4, fixed) == pytest.approx(0.4 * math.exp(0.5 * 5 / 10))
    steep = MemTreeConfig(theta0=0.9, decay=5.0)
    assert threshold(4, 4, 0.9, steep) == pytest.approx(0.99)


def test_near_duplicate_is_attached_as_a_sibling_instead_of_splitting() -> None:
    twin = unit(1, 0.01, 0, 0)
    assert cos(A, twin) >= 0.99
    m = MemTree(
        embedder=TableEmbedder({"alpha": A, "alpha again": twin, "gamma": C}),
        config=MemTreeConfig(theta0=0.5, parent_embedding="mean"),
    )
    first = m.add("alpha")
    second = m.add("alpha again")
    assert m.get(first).parent == ROOT_ID and m.get(second).parent == ROOT_ID
    assert m.stats().summaries == 0


def test_exact_duplicate_returns_the_existing_id_unless_disabled() -> None:
    m = memory()
    first = m.add("alpha")
    assert m.add("alpha") == first
    assert len(m) == 1
    loose = memory(deduplicate=False)
    one, two = loose.add("alpha"), loose.add("alpha")
    assert one != two and len(loose) == 2


def test_depth_cap_stops_chains() -> None:
    # Each text is close to the previous one but never a near-duplicate: a chain.
    vectors = {f"t{i}": unit(1, 0.02 * i, 0.15 * (i % 2), 0.15 * ((i + 1) % 2)) for i in range(30)}
    m = MemTree(
        embedder=TableEmbedder(vectors),
        config=MemTreeConfig(theta0=0.3, parent_embedding="mean", depth_cap=4, near_duplicate=0.9999),
    )
    for text in vectors:
        m.add(text)
    assert m.stats().max_depth == 4  # the chain reached the cap and stopped there
    assert m.check_integrity() == []
    assert len(m) == 30


def test_summary_embedding_is_the_embedding_of_its_text_by_default() -> None:
    m = MemTree(embedder=TableEmbedder(TABLE), config=MemTreeConfig(theta0=0.5))
    first = m.add("alpha")
    m.add("beta")
    parent = m.get(m.get(first).parent)
    expected = TableEmbedder(TABLE).embed([parent.text])[0]
    np.testing.assert_allclose(parent.embedding, expected, atol=1e-6)
    assert "alpha" in parent.text and "beta" in parent.text


def test_mean_parent_embedding_is_the_normalized_centroid() -> None:
    m = memory()
    first = m.add("alpha")
    m.add("beta")
    parent = m.get(m.get(first).parent)
    centroid = (np.asarray(A) + np.asarray(B)) / 2
    np.testing.assert_allclose(parent.embedding, centroid / np.linalg.norm(centroid), atol=1e-6)
    assert m.stats().embedding_calls == 2  # one per insert, none for the summary
