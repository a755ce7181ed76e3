"""Engine features the adapters rely on: reusable namespace handles, per-handle
config, and retrieving with a query vector computed once."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from memtree import HashingEmbedder, MemTree, MemTreeConfig
from memtree.tree import SIBLING_CACHE_SIZE


def make() -> MemTree:
    return MemTree(embedder=HashingEmbedder(64), config=MemTreeConfig(theta0=0.2))


def test_sibling_handles_are_reused_and_see_each_others_writes() -> None:
    memory = make()
    alice = memory.sibling(("users", "alice"))
    assert memory.sibling(("users", "alice")) is alice and memory.sibling("default") is memory
    alice.add("Alice keeps bees.")
    fresh = memory.with_namespace(("users", "alice"))  # a new handle loads the tree
    assert fresh is not alice and [n.text for n in fresh.leaves()] == ["Alice keeps bees."]
    fresh.add("Alice sells honey.")
    assert len(alice) == 2  # the cached handle catches up with the other writer


def test_sibling_cache_keeps_the_most_recently_used() -> None:
    memory = make()
    first = memory.sibling("n0")
    for i in range(1, SIBLING_CACHE_SIZE + 1):
        memory.sibling(f"n{i}")
    assert memory.sibling("n0") is not first  # evicted, reopened
    assert memory.sibling(f"n{SIBLING_CACHE_SIZE}") is memory.sibling(f"n{SIBLING_CACHE_SIZE}")


def test_concurrent_first_use_yields_one_handle() -> None:
    memory = make()
    seen: list[MemTree] = []
    threads = [threading.Thread(target=lambda: seen.append(memory.sibling("shared"))) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len({id(handle) for handle in seen}) <= 2  # racing loads may build two; one is kept
    assert all(memory.sibling("shared") is memory.sibling("shared") for _ in range(3))


def test_with_namespace_can_change_the_config() -> None:
    memory = make()
    loose = memory.with_namespace("docs", config=memory.config.with_options(deduplicate=False))
    assert loose.config.deduplicate is False and memory.config.deduplicate is True
    assert loose.add("same") != loose.add("same")
    assert loose.embedder is memory.embedder and loose.store is memory.store


async def test_query_embedding_gives_the_same_results_as_the_query() -> None:
    memory = make()
    memory.add_many(["Alice keeps bees.", "Bob plays chess.", "Alice sells honey at the market."])
    vector = memory.embed_query("Alice honey")
    assert vector.shape == (64,) and np.isclose(np.linalg.norm(vector), 1.0)
    assert np.allclose(await memory.aembed_query("Alice honey"), vector)
    expected = memory.retrieve("Alice honey", k=3)
    for found in (
        memory.retrieve("Alice honey", k=3, query_embedding=vector),
        await memory.aretrieve("Alice honey", k=3, query_embedding=list(vector)),
    ):
        assert [h.id for h in found] == [h.id for h in expected]
        assert [h.score for h in found] == pytest.approx([h.score for h in expected], abs=1e-6)
    with pytest.raises(ValueError, match="dimension 3 does not match"):
        memory.retrieve("Alice honey", query_embedding=[1.0, 0.0, 0.0])
