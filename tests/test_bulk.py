"""Bulk ingestion (``add_many(bulk=True)``): a batch grouped by clustering, each
summary written and embedded once, in one transaction, with every tree invariant."""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memtree import ROOT_ID, Aggregator, ExtractiveAggregator, HashingEmbedder, MemTree, SQLiteBackend
from memtree.bulk import BRANCHING, Grouping, group
from memtree.embed import Matrix
from memtree.node import Vector

TOPICS = {
    "garden": "tomato basil compost seedling greenhouse watering soil mulch harvest pruning",
    "sailing": "harbour mainsail jib tack anchor mooring tide keel rudder regatta",
    "licence": "copyright licensee warranty distribute permission notice liability software terms conditions",
    "kitchen": "oven dough flour yeast knead bake crust butter whisk recipe",
}


def documents(count: int, seed: int = 0) -> list[str]:
    """Paragraphs of two or three sentences, each drawn from one topic's words."""
    rng = random.Random(seed)
    names = sorted(TOPICS)
    out = []
    for number in range(count):
        words = TOPICS[names[number % len(names)]].split()
        sentences = [" ".join(rng.choice(words) for _ in range(rng.randint(6, 14))) for _ in range(rng.randint(2, 3))]
        out.append(f"Part {number}. " + ". ".join(sentences) + ".")
    return out


class CountingEmbedder(HashingEmbedder):
    """Hashing vectors, counting every text embedded."""

    def __init__(self) -> None:
        super().__init__(128)
        self.texts = 0

    def embed(self, texts: Sequence[str]) -> Matrix:
        self.texts += len(texts)
        return super().embed(texts)


def depth_of(grouping: Grouping) -> int:
    return 1 + max((depth_of(child) for child in grouping if not isinstance(child, int)), default=0)


def indices_of(grouping: Grouping) -> list[int]:
    out: list[int] = []
    for child in grouping:
        out.extend([child] if isinstance(child, int) else indices_of(child))
    return out


def test_a_bulk_batch_builds_a_sound_shallow_tree_in_order() -> None:
    memory = MemTree(embedder=HashingEmbedder(128))
    texts = documents(600)
    ids = memory.add_many(texts, bulk=True)
    assert memory.check_integrity() == []
    assert [memory.get(node_id).text for node_id in ids] == texts
    stats = memory.stats()
    assert stats.leaves == 600 and stats.stale == 0
    assert stats.max_depth <= 1 + math.ceil(math.log2(600 / BRANCHING)) + 1
    for node in memory.walk():
        if not node.is_leaf:
            assert 2 <= len(node.children) <= (len(memory.get(ROOT_ID).children) if node.id == ROOT_ID else BRANCHING)
            leaves = [memory.get(child) for child in node.children if memory.get(child).is_leaf]
            assert [leaf.created_at for leaf in leaves] == sorted(leaf.created_at for leaf in leaves)
            assert [ids.index(leaf.id) for leaf in leaves] == sorted(ids.index(leaf.id) for leaf in leaves)


def test_bulk_embeds_each_text_once_and_each_summary_once() -> None:
    """No sentence embeddings and no re-embedding: the extractive summaries choose
    sentences by their children's vectors."""
    embedder = CountingEmbedder()
    memory = MemTree(embedder=embedder, aggregator=ExtractiveAggregator())
    memory.add_many(documents(300), bulk=True)
    stats = memory.stats()
    assert embedder.texts == stats.leaves + stats.summaries == stats.embedded_texts
    assert stats.extra.get("bulk_builds") == 1
    every_leaf = "\n".join(leaf.text for leaf in memory.leaves())
    for node in memory.walk():  # every sentence of a summary is a leaf's
        if not node.is_leaf and node.id != ROOT_ID:
            for line in node.text.splitlines():
                assert line.rstrip(" …") in every_leaf


def test_routing_one_by_one_embeds_far_more() -> None:
    """What bulk saves: the same batch routed text by text (the paper's insert)."""
    routed, grouped = CountingEmbedder(), CountingEmbedder()
    MemTree(embedder=routed).add_many(documents(120))
    MemTree(embedder=grouped).add_many(documents(120), bulk=True)
    assert grouped.texts < 1.5 * 120 < routed.texts


def test_later_inserts_route_into_the_bulk_tree_and_duplicates_collapse() -> None:
    memory = MemTree(embedder=HashingEmbedder(128))
    texts = documents(80)
    ids = memory.add_many([*texts, texts[3]], bulk=True)
    assert ids[-1] == ids[3]
    assert memory.add_many(texts[:5], bulk=True) == ids[:5]  # already stored
    memory.add(documents(81, seed=1)[-1])
    memory.add_many(documents(40, seed=2), bulk=True)  # a second batch beside the first
    assert memory.check_integrity() == []
    assert memory.stats().leaves == 80 + 1 + 40


def test_async_bulk_gives_the_same_shape() -> None:
    texts = documents(200)
    sync = MemTree(embedder=HashingEmbedder(128))
    sync.add_many(texts, bulk=True)
    later = MemTree(embedder=HashingEmbedder(128))
    asyncio.run(later.aadd_many(texts, bulk=True))
    assert later.check_integrity() == []
    assert sorted(node.text for node in later.walk()) == sorted(node.text for node in sync.walk())


class FailingAggregator(Aggregator):
    def aggregate(self, summary: str, new_texts: Sequence[str], count: int, *, centroid: Vector | None = None) -> str:
        raise RuntimeError("model down")

    @property
    def calls_model(self) -> bool:
        return False


def test_a_failing_summary_loses_no_leaf_and_repair_writes_it(tmp_path: object) -> None:
    store = SQLiteBackend(f"{tmp_path}/bulk.db")
    memory = MemTree(store=store, embedder=HashingEmbedder(128), aggregator=FailingAggregator())
    texts = documents(50)
    memory.add_many(texts, bulk=True)
    assert memory.check_integrity() == []
    stats = memory.stats()
    assert stats.leaves == 50 and stats.stale == stats.summaries > 0
    memory.close()
    fixed = MemTree(store=SQLiteBackend(f"{tmp_path}/bulk.db"), embedder=HashingEmbedder(128))
    assert fixed.repair() == stats.summaries
    assert fixed.check_integrity() == [] and fixed.stats().stale == 0
    fixed.close()


@settings(max_examples=40, deadline=None)
@given(st.integers(min_value=1, max_value=400), st.integers(min_value=0, max_value=3), st.booleans())
def test_grouping_covers_every_text_once_with_logarithmic_depth(count: int, seed: int, alike: bool) -> None:
    rng = np.random.default_rng(seed)
    vectors = rng.standard_normal((count, 16)).astype(np.float32)
    if alike:  # near-identical vectors: k-means cannot split them, the even split must
        vectors = vectors[:1] + 1e-4 * vectors
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    grouping = group(vectors)
    assert sorted(indices_of(grouping)) == list(range(count))
    assert depth_of(grouping) <= 1 + max(0, math.ceil(math.log2(max(1, count / BRANCHING)))) + 1

    def check(children: Grouping, top: bool) -> None:
        assert top or 2 <= len(children) <= BRANCHING
        for child in children:
            if not isinstance(child, int):
                check(child, False)

    check(grouping, True)


@pytest.mark.parametrize("count", [1, 2, BRANCHING, BRANCHING + 1])
def test_small_batches(count: int) -> None:
    memory = MemTree(embedder=HashingEmbedder(128))
    memory.add_many(documents(count), bulk=True)
    assert memory.check_integrity() == [] and memory.stats().leaves == count
