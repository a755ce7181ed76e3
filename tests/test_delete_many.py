"""MemTree.delete of several ids: the tree one-at-a-time deletes would leave, each summary rewritten once."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memtree import HashingEmbedder, MemTree, MemTreeConfig
from memtree.text import fold, split_sentences

WORDS = ["cat", "dog", "run", "park", "rain", "code", "tea", "book", "sea", "hill", "jazz", "bike"]


def build(texts: list[str], theta0: float, depth_cap: int) -> MemTree:
    memory = MemTree(embedder=HashingEmbedder(16), config=MemTreeConfig(theta0=theta0, depth_cap=depth_cap))
    memory.add_many(texts)
    return memory


def shape(memory: MemTree) -> tuple[set[frozenset[str]], dict[str, int]]:
    """The tree without ids: each summary as the set of leaf texts below it, and each leaf's depth."""
    nodes = {node.id: node for node in memory.walk()}
    groups = {
        frozenset(nodes[leaf].text for leaf in memory.leaf_ids_under(node.id))
        for node in nodes.values()
        if not node.is_root and not node.is_leaf
    }
    return groups, {node.text: node.depth for node in nodes.values() if node.is_leaf}


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    words=st.lists(st.lists(st.sampled_from(WORDS), min_size=1, max_size=5), min_size=1, max_size=30),
    chosen=st.lists(st.integers(min_value=0, max_value=1000), max_size=30),
    theta0=st.floats(min_value=0.0, max_value=0.6),
    depth_cap=st.integers(min_value=2, max_value=6),
)
def test_delete_many_leaves_the_tree_sequential_deletes_leave(
    words: list[list[str]], chosen: list[int], theta0: float, depth_cap: int
) -> None:
    texts = [f"{' '.join(w)} {i}." for i, w in enumerate(words)]  # unique texts
    batch, sequential = build(texts, theta0, depth_cap), build(texts, theta0, depth_cap)
    assert shape(batch) == shape(sequential)
    victims = sorted({texts[i % len(texts)] for i in chosen})

    count = batch.delete(_ids(batch, victims))
    for leaf_id in _ids(sequential, victims):
        sequential.delete(leaf_id)

    assert count == len(victims)
    assert batch.check_integrity() == []
    assert shape(batch) == shape(sequential)
    assert {leaf.text for leaf in batch.leaves()} == set(texts) - set(victims)
    gone = {fold(s) for text in victims for s in split_sentences(text)}
    assert not any(fold(s) in gone for node in batch.walk() for s in split_sentences(node.text))


def _ids(memory: MemTree, texts: list[str]) -> list[str]:
    by_text = {leaf.text: leaf.id for leaf in memory.leaves()}
    return [by_text[text] for text in texts]


def test_each_affected_summary_is_rewritten_once() -> None:
    texts = [f"dog park walk {i}." for i in range(12)] + [f"tea book rain {i}." for i in range(12)]
    batch, sequential = build(texts, 0.2, 6), build(texts, 0.2, 6)
    victims = [t for t in texts if t.startswith("dog")][::2]
    before = batch.stats().aggregation_calls
    batch.delete(_ids(batch, victims))
    batch_calls = batch.stats().aggregation_calls - before
    before = sequential.stats().aggregation_calls
    for leaf_id in _ids(sequential, victims):
        sequential.delete(leaf_id)
    sequential_calls = sequential.stats().aggregation_calls - before
    assert shape(batch) == shape(sequential)
    summaries_left = sum(1 for node in batch.walk() if not node.is_root and not node.is_leaf)
    assert 0 < batch_calls <= summaries_left
    assert batch_calls < sequential_calls


def test_delete_many_of_a_source_and_async_twin() -> None:
    memory = build(["cat naps.", "dog runs."], 0.2, 6)
    memory.add_many(["cat eats.", "cat purrs."], source_ids=["doc", "doc"])
    assert memory.delete(memory.find(source_id="doc")) == 2
    assert sorted(leaf.text for leaf in memory.leaves()) == ["cat naps.", "dog runs."]
    assert asyncio.run(memory.adelete(_ids(memory, ["cat naps.", "dog runs."]))) == 2
    assert len(memory) == 0 and memory.check_integrity() == []
    assert memory.delete([]) == 0


def test_bad_ids_delete_nothing() -> None:
    memory = build(["cat naps in the sun.", "cat naps on the bed.", "dog runs."], 0.2, 6)
    summary = next(node.id for node in memory.walk() if not node.is_root and not node.is_leaf)
    leaf = memory.leaves()[0].id
    with pytest.raises(KeyError, match="no node with id 'nope'"):
        memory.delete([leaf, "nope"])
    with pytest.raises(ValueError, match="is a summary, not a leaf"):
        memory.delete([leaf, summary])
    with pytest.raises(TypeError, match="node id must be a str"):
        memory.delete([leaf, 7])  # type: ignore[list-item]
    assert len(memory) == 3


def test_delete_takes_one_id_or_several_and_the_old_names_warn() -> None:
    memory = build(["cat naps in the sun.", "cat naps on the bed.", "dog runs."], 0.2, 6)
    one, two, three = (leaf.id for leaf in memory.leaves())
    assert memory.delete(one) == 1  # one id, as a str
    with pytest.warns(DeprecationWarning, match=r"delete_many is deprecated; use delete\(ids\)"):
        assert memory.delete_many([two]) == 1
    with pytest.warns(DeprecationWarning, match="adelete_many is deprecated"):
        assert asyncio.run(memory.adelete_many([three])) == 1
    assert len(memory) == 0 and memory.check_integrity() == []
