"""Writes call their models outside the store's writer lock and commit only if what
they planned on still holds: a slow model never blocks other writers, concurrent
writes to one subtree are planned again, and writes to different subtrees are not."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

import pytest
from conftest import TableEmbedder, unit
from test_deferred import SEP, JoiningAggregator, assert_summaries_cover_exactly_their_leaves

from memtree import Aggregator, HashingEmbedder, MemTree, MemTreeConfig, SQLiteBackend
from memtree.node import Vector


class GatedAggregator(JoiningAggregator):
    """Joins texts; a call whose new texts mention ``gate_word`` waits for ``release``
    (after setting ``entered``), the first time only."""

    def __init__(self, gate_word: str) -> None:
        super().__init__()
        self.gate_word = gate_word
        self.entered = threading.Event()
        self.release = threading.Event()

    def aggregate(self, summary: str, new_texts: Sequence[str], count: int, *, centroid: Vector | None = None) -> str:
        if any(self.gate_word in text for text in new_texts) and not self.release.is_set():
            self.entered.set()
            assert self.release.wait(30), "the test never released the gate"
        return super().aggregate(summary, new_texts, count, centroid=centroid)


def two_topic_memory(aggregator: Aggregator, store: SQLiteBackend | None = None) -> MemTree:
    """Two subtrees under the root: "alpha ..." texts and "beta ..." texts."""
    table = {
        **{f"alpha {i}": unit(1, 0, 0.3 * i, 0) for i in range(1, 6)},
        **{f"beta {i}": unit(0, 1, 0, 0.3 * i) for i in range(1, 6)},
    }
    memory = MemTree(
        embedder=TableEmbedder(table),
        aggregator=aggregator,
        store=store,
        config=MemTreeConfig(theta0=0.5, decay=0.0, lexical_weight=0),
    )
    memory.add_many(["alpha 1", "alpha 2", "beta 1", "beta 2"])
    return memory


def in_thread(call: object) -> tuple[threading.Thread, dict[str, object]]:
    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            outcome["value"] = call()  # type: ignore[operator]
        except BaseException as error:  # noqa: BLE001 - handed to the test
            outcome["error"] = error

    thread = threading.Thread(target=run)
    thread.start()
    return thread, outcome


def test_a_slow_model_call_does_not_hold_the_files_writer_lock(tmp_path) -> None:
    store = SQLiteBackend(tmp_path / "memory.db", busy_timeout=1.0)
    aggregator = GatedAggregator("alpha 3")
    alice = two_topic_memory(aggregator, store)
    bob = MemTree(embedder=HashingEmbedder(16), store=store, namespace="bob")
    thread, outcome = in_thread(lambda: alice.add("alpha 3"))
    assert aggregator.entered.wait(30)
    # Alice's summary is being written by a (stuck) model: Bob, in another namespace of
    # the same SQLite file, stores at once instead of waiting for the lock and timing out.
    bob.add("Bob's sister lives in Oslo.")
    alice_too = MemTree(embedder=alice.embedder, aggregator=JoiningAggregator(), store=store)
    alice_too.add("beta 3")  # and so does another writer of Alice's namespace, in the other subtree
    aggregator.release.set()
    thread.join(30)
    assert "error" not in outcome, outcome
    expected = ["alpha 1", "alpha 2", "alpha 3", "beta 1", "beta 2", "beta 3"]
    assert sorted(leaf.text for leaf in alice.leaves()) == expected
    assert alice.check_integrity() == [] and len(bob) == 1
    store.close()


def test_concurrent_writes_to_one_subtree_are_planned_again() -> None:
    aggregator = GatedAggregator("alpha 3")
    memory = two_topic_memory(aggregator)
    other = memory.with_namespace(memory.namespace)  # a second handle: another writer
    other.aggregator = JoiningAggregator()
    thread, outcome = in_thread(lambda: memory.add("alpha 3"))
    assert aggregator.entered.wait(30)
    other.add("alpha 4")  # rewrites the same "alpha" summary while alpha 3's plan waits
    aggregator.release.set()
    thread.join(30)
    assert "error" not in outcome, outcome
    assert memory.stats().extra.get("write_conflicts") == 1
    assert sorted(leaf.text for leaf in memory.leaves())[:4] == ["alpha 1", "alpha 2", "alpha 3", "alpha 4"]
    assert memory.check_integrity() == []
    assert_summaries_cover_exactly_their_leaves(memory)  # no summary lost alpha 4 to a stale plan


def test_concurrent_writes_to_different_subtrees_commit_without_replanning() -> None:
    aggregator = GatedAggregator("alpha 3")
    memory = two_topic_memory(aggregator)
    other = memory.with_namespace(memory.namespace)
    other.aggregator = JoiningAggregator()
    calls_before = len(aggregator.calls)
    thread, outcome = in_thread(lambda: memory.add("alpha 3"))
    assert aggregator.entered.wait(30)
    other.add("beta 3")
    aggregator.release.set()
    thread.join(30)
    assert "error" not in outcome, outcome
    assert "write_conflicts" not in memory.stats().extra
    alpha_calls = [call for call in aggregator.calls[calls_before:] if "alpha 3" in SEP.join(call[1])]
    path = memory.get(memory.get(outcome["value"]).parent)  # type: ignore[arg-type]
    assert len(alpha_calls) == path.depth  # one call per summary on its path, none repeated
    assert memory.check_integrity() == []
    assert_summaries_cover_exactly_their_leaves(memory)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("on_disk", [False, True], ids=["memory", "sqlite"])
def test_many_concurrent_aadds_on_one_memory_all_finish(tmp_path, on_disk: bool) -> None:
    """More coroutines than the event loop's default executor has threads, all routed
    into one subtree: waiting for the writer lock must not starve the model calls."""

    async def main() -> MemTree:
        store = SQLiteBackend(tmp_path / "memory.db") if on_disk else None
        memory = MemTree(embedder=HashingEmbedder(64), store=store, config=MemTreeConfig(theta0=0.2))
        for i in range(5):
            await memory.aadd(f"seed cat dog {i}")
        await asyncio.gather(*(memory.aadd(f"cat dog park number {i}") for i in range(24)))
        return memory

    memory = asyncio.run(main())
    assert len(memory) == 29 and memory.check_integrity() == []
