"""Deferred aggregation: the same leaves as eager for fewer calls, each summary written
once with all its new texts, streaming blocks, async, crash recovery, failures, deletes."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest
from conftest import path_to_root
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai_server import FakeOpenAIServer

from memtree import ROOT_ID, Aggregator, HashingEmbedder, MemoryBackend, MemTree, MemTreeConfig
from memtree.models import OpenAIChatModel, OpenAIEmbedder
from memtree.node import Vector
from memtree.retry import RetryPolicy
from memtree.store.base import WriteTransaction

SEP = " | "
TOPICS = ["garden", "cello", "bread", "sailing"]
TEXTS = [f"{TOPICS[i % 4]} note {i}: {TOPICS[i % 4]} practice and {TOPICS[(i * 3) % 4]} plans" for i in range(32)]


class JoiningAggregator(Aggregator):
    """Joins texts with " | " and records each call, so a summary shows exactly the
    leaves it was told about."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[str, ...], int]] = []
        self.lock = threading.Lock()
        self.fail = False

    def aggregate(self, summary: str, new_texts: Sequence[str], count: int, *, centroid: Vector | None = None) -> str:
        if self.fail:
            raise ConnectionError("model unavailable")
        with self.lock:
            self.calls.append((summary, tuple(new_texts), count))
        return SEP.join([summary, *new_texts]) if summary else SEP.join(new_texts)

    @property
    def calls_model(self) -> bool:  # counts as LLM calls and is chunked like one
        return True


def joined_memory(store: MemoryBackend | None = None, **config: object) -> MemTree:
    options = {"theta0": 0.15, **config}
    return MemTree(
        embedder=HashingEmbedder(64),
        aggregator=JoiningAggregator(),
        store=store,
        config=MemTreeConfig(**options),  # type: ignore[arg-type]
    )


def leaf_records(memory: MemTree) -> list[tuple[str, dict, float | None, str | None]]:
    return sorted((n.text, n.metadata, n.timestamp, n.source_id) for n in memory.leaves())  # type: ignore[return-value]


def assert_summaries_cover_exactly_their_leaves(memory: MemTree) -> None:
    for node in memory.walk():
        if node.id == ROOT_ID or node.is_leaf:
            continue
        below = {memory.get(leaf).text for leaf in memory.leaf_ids_under(node.id)}
        pieces = {piece for line in node.text.split("\n") for piece in line.split(SEP)}  # "\n": a fallback text
        assert pieces == below, node.id


def test_eager_and_deferred_store_the_same_leaves_and_deferred_makes_fewer_calls() -> None:
    options = {
        "metadata": [{"i": i} for i in range(len(TEXTS))],
        "timestamps": [1_700_000_000 + i for i in range(len(TEXTS))],
        "source_ids": [f"m{i}" for i in range(len(TEXTS))],
    }
    eager, deferred = joined_memory(), joined_memory()
    eager_ids = eager.add_many(TEXTS, aggregation="eager", **options)  # type: ignore[arg-type]
    deferred_ids = deferred.add_many(TEXTS, aggregation="deferred", **options)  # type: ignore[arg-type]
    assert leaf_records(eager) == leaf_records(deferred)
    assert [deferred.get(i).text for i in deferred_ids] == [eager.get(i).text for i in eager_ids] == TEXTS
    calls = {name: memory.stats().llm_calls for name, memory in (("eager", eager), ("deferred", deferred))}
    assert calls["deferred"] < calls["eager"] / 2
    assert len(deferred.aggregator.calls) == calls["deferred"]  # type: ignore[attr-defined]
    for memory in (eager, deferred):
        assert memory.stats().stale == 0 and memory.stats().pending == 0
        assert memory.check_integrity() == []
        assert_summaries_cover_exactly_their_leaves(memory)


def test_each_touched_summary_is_written_once_with_all_its_new_texts_in_order() -> None:
    memory = joined_memory()
    memory.add_many(TEXTS[:12])
    before = {node.id: (node.text, node.leaf_count) for node in memory.walk() if not node.is_leaf}
    aggregator: JoiningAggregator = memory.aggregator  # type: ignore[assignment]
    aggregator.calls.clear()
    memory.add_many(TEXTS[12:], aggregation="deferred")
    assert memory.stats().stale == 0
    touched = [node for node in memory.walk() if node.id != ROOT_ID and not node.is_leaf]
    calls_by_summary = {call[0]: call for call in aggregator.calls if call[0]}
    assert len(aggregator.calls) == len(set(aggregator.calls))
    for node in touched:
        new_leaves = [memory.get(leaf).text for leaf in memory.leaf_ids_under(node.id)]
        if node.id in before and before[node.id][1] == node.leaf_count:
            continue  # nothing new arrived below it
        if node.id in before:  # an old summary: one merge of its old text with the new leaves
            old_text, old_count = before[node.id]
            _, new_texts, count = calls_by_summary[old_text]
            assert count == old_count
            assert list(new_texts) == [t for t in TEXTS[12:] if t in new_leaves]
    # one call per summary that changed
    changed = [n for n in touched if n.id not in before or before[n.id][1] != n.leaf_count]
    assert len(aggregator.calls) == len(changed)


def test_a_deferred_block_keeps_leaves_visible_and_flushes_once_at_the_outermost_exit() -> None:
    memory = joined_memory()
    memory.add_many(TEXTS[:8])
    aggregator: JoiningAggregator = memory.aggregator  # type: ignore[assignment]
    aggregator.calls.clear()
    with memory.deferred() as same:
        assert same is memory
        for text in TEXTS[8:14]:
            memory.add(text)
        with memory.deferred():
            memory.add(TEXTS[14])
        assert aggregator.calls == []  # the inner block did not flush
        stats = memory.stats()
        assert stats.stale == stats.pending > 0 and len(memory) == 15
        assert memory.retrieve(TEXTS[14], k=1)[0].text == TEXTS[14]  # new leaves are searchable at once
        assert memory.check_integrity() == []
    assert aggregator.calls and memory.stats().stale == 0 and memory.stats().pending == 0
    assert_summaries_cover_exactly_their_leaves(memory)
    assert memory.flush() == 0


async def test_deferred_works_with_the_async_api() -> None:
    memory = joined_memory()
    await memory.aadd_many(TEXTS[:10], aggregation="deferred")
    assert memory.stats().stale == 0
    async with memory.deferred():
        for text in TEXTS[10:20]:
            await memory.aadd(text)
        assert memory.stats().pending > 0
    assert memory.stats().stale == 0
    assert_summaries_cover_exactly_their_leaves(memory)
    eager = joined_memory()
    await eager.aadd_many(TEXTS[:20])
    assert leaf_records(eager) == leaf_records(memory)


def test_a_crash_inside_a_block_loses_no_leaf_and_repair_recovers() -> None:
    store = MemoryBackend()
    memory = joined_memory(store)
    memory.add_many(TEXTS[:8])
    with pytest.raises(KeyboardInterrupt), memory.deferred():  # no flush on KeyboardInterrupt
        for text in TEXTS[8:16]:
            memory.add(text)
        raise KeyboardInterrupt
    # A new process opens the same store: every leaf is there, the summaries say they are stale.
    reopened = joined_memory(store)
    assert len(reopened) == 16 and reopened.check_integrity() == []
    stale = reopened.stats().stale
    assert stale > 0 and reopened.stats().pending == 0
    assert reopened.repair() == stale
    assert reopened.stats().stale == 0
    assert_summaries_cover_exactly_their_leaves(reopened)
    memory.refresh()
    assert memory.flush() == 0  # the ledger sees the summaries are no longer stale


def test_a_block_that_raises_still_flushes() -> None:
    memory = joined_memory()
    with pytest.raises(RuntimeError, match="caller's bug"), memory.deferred():
        memory.add_many(TEXTS[:6])
        raise RuntimeError("caller's bug")
    assert len(memory) == 6 and memory.stats().stale == 0


def test_summaries_that_fail_to_flush_stay_stale_and_the_next_flush_writes_them() -> None:
    memory = joined_memory()
    memory.add_many(TEXTS[:8])
    aggregator: JoiningAggregator = memory.aggregator  # type: ignore[assignment]
    with memory.deferred():
        aggregator.fail = True
        memory.add_many(TEXTS[8:16])
    assert len(memory) == 16
    stats = memory.stats()
    assert stats.stale > 0 and stats.pending == stats.stale and stats.aggregation_failures == stats.stale
    assert all(node.text.strip() for node in memory.walk() if node.id != ROOT_ID)
    aggregator.fail = False
    assert memory.flush() == stats.stale
    assert memory.stats().stale == 0
    assert_summaries_cover_exactly_their_leaves(memory)


class FlakyStore(MemoryBackend):
    """Fails the next ``fail_commits`` commits, as a full disk or a lost connection would."""

    fail_commits = 0

    def begin(self, namespace: tuple[str, ...]) -> WriteTransaction:
        transaction = super().begin(namespace)
        if self.fail_commits:
            self.fail_commits -= 1

            def commit(*args: object, **kwargs: object) -> int:
                raise OSError("disk full")

            transaction.commit = commit  # type: ignore[method-assign]
        return transaction


def test_a_flush_that_cannot_commit_keeps_everything_pending_for_the_next_one() -> None:
    store = FlakyStore()
    memory = joined_memory(store)
    memory.add_many(TEXTS[:8])
    with pytest.raises(OSError, match="disk full"), memory.deferred():
        memory.add_many(TEXTS[8:16])
        pending = memory.stats().pending
        store.fail_commits = 1
    assert memory.stats().pending == pending and memory.stats().stale == pending
    assert len(memory) == 16
    assert memory.flush() == pending
    assert memory.stats().stale == 0
    assert_summaries_cover_exactly_their_leaves(memory)


def test_deleting_a_leaf_before_the_flush_keeps_its_text_out_of_every_summary() -> None:
    memory = joined_memory()
    memory.add_many(TEXTS[:8])
    with memory.deferred():
        ids = memory.add_many(TEXTS[8:16])
        memory.delete(ids[3])
        memory.aggregator.fail = True  # type: ignore[attr-defined]
        memory.delete(ids[5])  # its ancestors stay stale (the rewrite failed) ...
        memory.aggregator.fail = False  # type: ignore[attr-defined]
    for node in memory.walk():
        assert TEXTS[11] not in node.text and TEXTS[13] not in node.text
    assert memory.stats().stale == 0 and memory.check_integrity() == []
    assert_summaries_cover_exactly_their_leaves(memory)


def test_an_eager_insert_during_a_block_rewrites_its_path_and_the_flush_brings_the_rest_up_to_date() -> None:
    memory = joined_memory(theta0=-1.0, near_duplicate=1.0)  # one deep chain: every insert shares the path
    memory.add_many(TEXTS[:4])
    with memory.deferred():
        memory.add(TEXTS[4])
        leaf = memory.add_many([TEXTS[5]], aggregation="eager")[0]
        path = path_to_root(memory, leaf)
        # The eager insert rebuilt the deferred summaries on its path from their children,
        # except those reading a summary still waiting for the flush: they stay stale.
        for node_id in path:
            node = memory.get(node_id)
            children_stale = [memory.get(child).stale for child in node.children]
            assert node.stale == any(children_stale)
    assert memory.stats().stale == 0
    assert_summaries_cover_exactly_their_leaves(memory)


def test_big_batches_are_folded_within_the_word_budget() -> None:
    memory = joined_memory(aggregation_max_words=30)
    memory.add_many(TEXTS[:4])
    memory.add_many(TEXTS[4:], aggregation="deferred")
    aggregator: JoiningAggregator = memory.aggregator  # type: ignore[assignment]
    for _, new_texts, _ in aggregator.calls:
        assert len(new_texts) == 1 or sum(len(t.split()) for t in new_texts) <= 30
    assert memory.stats().stale == 0
    assert_summaries_cover_exactly_their_leaves(memory)


def test_bad_aggregation_mode_is_a_value_error() -> None:
    memory = joined_memory()
    with pytest.raises(ValueError, match="aggregation must be one of: eager, deferred, background; got 'lazy'"):
        memory.add_many(["a note"], aggregation="lazy")  # type: ignore[arg-type]
    assert len(memory) == 0


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    picks=st.lists(st.integers(0, len(TEXTS) - 1), min_size=1, max_size=24),
    split=st.integers(0, 24),
    theta0=st.sampled_from([-1.0, 0.15, 0.5]),
)
def test_deferred_matches_eager_leaves_for_any_stream(picks: list[int], split: int, theta0: float) -> None:
    texts = [TEXTS[i] for i in picks]
    eager, deferred = joined_memory(theta0=theta0), joined_memory(theta0=theta0)
    eager.add_many(texts)
    deferred.add_many(texts[:split])
    with deferred.deferred():
        for text in texts[split:]:
            deferred.add(text)
    assert leaf_records(eager) == leaf_records(deferred)
    assert deferred.stats().llm_calls <= eager.stats().llm_calls
    assert deferred.stats().stale == 0 and deferred.check_integrity() == []
    assert_summaries_cover_exactly_their_leaves(deferred)


def test_deferred_with_an_openai_model_counts_fewer_requests_at_the_server(openai_server: FakeOpenAIServer) -> None:
    def memory() -> MemTree:
        retry = RetryPolicy(max_attempts=3, initial_delay=0.0)
        return MemTree(
            embedder=OpenAIEmbedder(**openai_server.client_options(), retry=retry),
            llm=OpenAIChatModel(**openai_server.client_options(), retry=retry),
            config=MemTreeConfig(theta0=0.15),
        )

    eager = memory()
    eager.add_many(TEXTS)
    eager_chat, eager_embed = openai_server.count("chat"), openai_server.count("embeddings")
    openai_server.reset()
    deferred = memory()
    openai_server.fail_next("500", endpoint="chat")
    deferred.add_many(TEXTS, aggregation="deferred")
    stats = deferred.stats()
    assert stats.retries == 1 and stats.stale == 0
    assert openai_server.count("chat") == stats.llm_calls + 1 < eager_chat / 2
    assert openai_server.count("embeddings") < eager_embed / 4  # leaves in one batch, summaries in one batch
    assert leaf_records(eager) == leaf_records(deferred)
