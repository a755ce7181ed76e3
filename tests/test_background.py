"""Background aggregation: leaves stored at once, summaries written by a worker thread.

Nothing here is timed: the model waits behind a gate (tests/gated.py), so an ``add``
that returns while the gate is closed provably did not wait for a model call, and
tests wait for the worker with ``wait_for_summaries`` or ``close``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from gated import GatedAggregator, gated_memory, summaries_cover_exactly_their_leaves

from memtree import HashingEmbedder, MemoryBackend, MemTree, MemTreeConfig

ROOT = Path(__file__).resolve().parents[1]
TOPICS = ["garden", "cello", "bread", "sailing"]
TEXTS = [f"{TOPICS[i % 4]} note {i}: {TOPICS[i % 4]} practice and {TOPICS[(i * 3) % 4]} plans" for i in range(16)]


def leaf_texts(memory: MemTree) -> list[str]:
    return sorted(leaf.text for leaf in memory.leaves())


def test_add_returns_before_any_model_call_and_the_leaf_is_searchable_at_once() -> None:
    aggregator = GatedAggregator()
    memory = gated_memory(aggregator, aggregation="background")
    for text in TEXTS[:6]:
        leaf_id = memory.add(text)
        hits = memory.retrieve(text, k=1, leaves_only=True)
        assert [(hit.id, hit.text) for hit in hits] == [(leaf_id, text)]
    assert aggregator.calls == 0  # the gate is closed: no add waited for the model
    assert memory.stats().stale > 0
    aggregator.gate.set()
    assert memory.wait_for_summaries(timeout=30)
    assert memory.stats().stale == 0 and memory.stats().pending == 0
    assert aggregator.calls > 0
    assert summaries_cover_exactly_their_leaves(memory)
    assert memory.check_integrity() == []
    memory.close()


def test_background_writes_the_same_leaves_as_eager_with_summaries_of_exactly_those_leaves() -> None:
    eager = gated_memory(GatedAggregator(open_gate=True))
    background = gated_memory(GatedAggregator(open_gate=True), aggregation="background")
    for text in TEXTS:
        eager.add(text, metadata={"n": len(text)})
        background.add(text, metadata={"n": len(text)})
    assert background.wait_for_summaries(timeout=30)
    assert leaf_texts(background) == leaf_texts(eager) == sorted(TEXTS)
    assert sorted(leaf.metadata["n"] for leaf in background.leaves()) == sorted(len(t) for t in TEXTS)
    assert background.stats().stale == 0
    assert summaries_cover_exactly_their_leaves(background)
    background.close()


def test_per_call_mode_overrides_the_config_and_add_many_runs_in_the_background() -> None:
    aggregator = GatedAggregator()
    memory = gated_memory(aggregator)  # config: eager
    ids = memory.add_many(TEXTS[:8], aggregation="background")
    assert [memory.get(i).text for i in ids] == TEXTS[:8]
    assert aggregator.calls == 0
    aggregator.gate.set()
    assert memory.wait_for_summaries(timeout=30)
    assert memory.stats().stale == 0
    assert summaries_cover_exactly_their_leaves(memory)
    memory.close()


async def test_async_add_in_background_mode() -> None:
    aggregator = GatedAggregator()
    memory = gated_memory(aggregator, aggregation="background")
    for text in TEXTS[:5]:
        await memory.aadd(text)
    assert aggregator.calls == 0 and len(memory) == 5
    aggregator.gate.set()
    assert memory.wait_for_summaries(timeout=30)
    assert memory.stats().stale == 0
    assert summaries_cover_exactly_their_leaves(memory)
    memory.close()


@pytest.mark.parametrize("mode", ["background", "deferred"])
def test_close_writes_every_pending_summary(mode: str) -> None:
    store = MemoryBackend()
    aggregator = GatedAggregator(open_gate=mode == "deferred")
    memory = gated_memory(aggregator, store=store, aggregation=mode)
    memory.add_many(TEXTS[:10])
    assert memory.stats().stale > 0
    if mode == "deferred":
        assert aggregator.calls == 0  # nothing is written before the session ends
    aggregator.gate.set()
    memory.close()
    reopened = gated_memory(GatedAggregator(open_gate=True), store=store)
    assert reopened.stats().stale == 0
    assert leaf_texts(reopened) == sorted(TEXTS[:10])
    assert summaries_cover_exactly_their_leaves(reopened)


def test_close_writes_the_pending_summaries_of_sibling_namespaces() -> None:
    store = MemoryBackend()
    memory = gated_memory(GatedAggregator(open_gate=True), store=store, aggregation="deferred")
    alice = memory.sibling(("users", "alice"))
    alice.add_many(TEXTS[:6])
    assert alice.stats().stale > 0
    memory.close()
    reopened = gated_memory(GatedAggregator(open_gate=True), store=store).with_namespace(("users", "alice"))
    assert reopened.stats().stale == 0 and len(reopened) == 6
    assert summaries_cover_exactly_their_leaves(reopened)


def test_a_full_queue_loses_nothing() -> None:
    aggregator = GatedAggregator()
    memory = gated_memory(aggregator, aggregation="background", background_queue_size=1)
    ids = [memory.add(text) for text in TEXTS]  # the worker is stuck on its first flush
    assert memory._background.overflows > 0
    assert [memory.get(i).text for i in ids] == TEXTS
    assert aggregator.calls == 0
    aggregator.gate.set()
    assert memory.wait_for_summaries(timeout=30)
    assert memory.stats().stale == 0 and memory.stats().pending == 0
    assert leaf_texts(memory) == sorted(TEXTS)
    assert summaries_cover_exactly_their_leaves(memory)
    memory.close()


def test_a_failing_model_leaves_summaries_stale_and_repair_writes_them() -> None:
    aggregator = GatedAggregator(open_gate=True)
    aggregator.fail = True
    memory = gated_memory(aggregator, aggregation="background")
    for text in TEXTS[:8]:
        memory.add(text)
    assert memory.wait_for_summaries(timeout=30)
    assert memory.stats().stale > 0
    assert leaf_texts(memory) == sorted(TEXTS[:8])  # every leaf is kept
    assert memory.retrieve(TEXTS[3], k=1, leaves_only=True)[0].text == TEXTS[3]
    aggregator.fail = False
    assert memory.repair() > 0
    assert memory.stats().stale == 0
    assert summaries_cover_exactly_their_leaves(memory)
    memory.close()


def test_a_write_while_the_worker_stops_stores_its_leaf_and_close_writes_its_summaries() -> None:
    store = MemoryBackend()
    aggregator = GatedAggregator()
    memory = gated_memory(aggregator, store=store, aggregation="background")
    memory.add_many(TEXTS[:4])
    assert aggregator.entered.wait(30)  # the worker is inside its flush, waiting for the model
    memory._background.request_stop()  # what close() and interpreter exit do first
    late = memory.add(TEXTS[4])  # a write during shutdown
    assert memory.retrieve(TEXTS[4], k=1, leaves_only=True)[0].id == late
    aggregator.gate.set()
    memory.close()
    reopened = gated_memory(GatedAggregator(open_gate=True), store=store)
    assert leaf_texts(reopened) == sorted(TEXTS[:5])
    assert reopened.stats().stale == 0
    assert summaries_cover_exactly_their_leaves(reopened)


def test_a_bad_mode_is_refused_with_the_modes_listed() -> None:
    with pytest.raises(ValueError, match="aggregation must be one of: eager, deferred, background; got 'later'"):
        MemTreeConfig(aggregation="later")  # type: ignore[arg-type]
    memory = MemTree(embedder=HashingEmbedder(16))
    with pytest.raises(ValueError, match="aggregation must be one of: eager, deferred, background; got 'later'"):
        memory.add("a note", aggregation="later")  # type: ignore[arg-type]
    assert len(memory) == 0


EXITING = textwrap.dedent(
    """
    import sys, threading
    sys.path.insert(0, {tests!r})
    from gated import GatedAggregator, gated_memory
    import memtree.background
    from memtree import SQLiteBackend

    mode, ending = sys.argv[1], sys.argv[2]
    aggregator = GatedAggregator(open_gate=ending != "stuck")
    memtree.background.EXIT_FLUSH_SECONDS = 2.0
    memory = gated_memory(aggregator, store=SQLiteBackend({path!r}), aggregation=mode)
    for i in range(8):
        memory.add(f"garden note {{i}}: garden practice and cello plans {{i % 3}}")
    if ending == "crash":
        import os
        os._exit(0)
    # "exit" and "stuck": leave without close(); atexit writes what it can in time
    """
)


@pytest.mark.parametrize(
    ("mode", "ending", "stale_after"),
    [
        ("background", "exit", False),
        ("deferred", "exit", False),
        ("deferred", "crash", True),
        ("background", "stuck", True),  # the model never answers: exit waits 2 s, not until it does
    ],
)
def test_interpreter_exit_writes_pending_summaries_within_a_bounded_wait(
    tmp_path: Path, mode: str, ending: str, stale_after: bool
) -> None:
    path = tmp_path / "memory.db"
    script = tmp_path / "run.py"
    script.write_text(EXITING.format(tests=str(ROOT / "tests"), path=str(path)), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    # Well under GATE_LIMIT (30 s), which a stuck model call would reach if exit waited for it.
    subprocess.run([sys.executable, str(script), mode, ending], check=True, env=env, timeout=25)
    from memtree import SQLiteBackend

    store = SQLiteBackend(path)
    try:
        memory = gated_memory(GatedAggregator(open_gate=True), store=store)
        assert len(memory) == 8  # no leaf is ever lost
        assert (memory.stats().stale > 0) is stale_after
        memory.repair()  # a crash or a stuck model: repair() writes what is left
        assert memory.stats().stale == 0
        assert summaries_cover_exactly_their_leaves(memory)
        memory.close()
    finally:
        store.close()


def test_a_flush_that_inserts_overtook_is_rebased_not_planned_again() -> None:
    aggregator = GatedAggregator()
    memory = gated_memory(aggregator, aggregation="background")
    memory.add_many(TEXTS[:6])
    assert aggregator.entered.wait(30)  # the worker's flush waits for the model...
    late = [memory.add(text) for text in TEXTS[6:9]]  # ...while inserts commit through its summaries
    assert [memory.get(i).text for i in late] == TEXTS[6:9]
    aggregator.gate.set()
    assert memory.wait_for_summaries(timeout=30)
    stats = memory.stats()
    assert stats.extra.get("flush_rebases", 0) >= 1  # committed on the newer tree, not thrown away
    assert stats.stale == 0 and stats.pending == 0
    assert summaries_cover_exactly_their_leaves(memory)
    assert memory.check_integrity() == []
    memory.close()
