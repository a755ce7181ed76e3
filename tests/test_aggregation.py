"""Aggregation: once per affected ancestor, concurrent, failures kept stale, both aggregators."""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memtree import (
    ROOT_ID,
    Aggregator,
    ExtractiveAggregator,
    HashingEmbedder,
    LLMAggregator,
    MemTree,
    MemTreeConfig,
)
from memtree.llm import CallableChatModel
from memtree.node import Vector
from memtree.retry import ModelResponseError, RetryPolicy
from memtree.text import count_words, fold

CHAIN = [f"note {i} about the garden and the roses number {i}" for i in range(8)]


class RecordingAggregator(Aggregator):
    """Joins texts; records every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[str, ...], int]] = []
        self.lock = threading.Lock()

    def aggregate(self, summary: str, new_texts: Sequence[str], count: int, *, centroid: Vector | None = None) -> str:
        with self.lock:
            self.calls.append((summary, tuple(new_texts), count))
        return " | ".join([summary, *new_texts]) if summary else " | ".join(new_texts)


class BarrierAggregator(RecordingAggregator):
    """Every call waits until ``parties`` calls are in flight at once: sequential calls time out."""

    def __init__(self, parties: int) -> None:
        super().__init__()
        self.barrier = threading.Barrier(parties, timeout=30)

    def aggregate(self, summary: str, new_texts: Sequence[str], count: int, *, centroid: Vector | None = None) -> str:
        self.barrier.wait()  # raises BrokenBarrierError unless all calls overlap
        return super().aggregate(summary, new_texts, count, centroid=centroid)


def chain_memory(aggregator: Aggregator) -> MemTree:
    # θ0 = -1: every text descends as far as it can, so the tree grows deep.
    config = MemTreeConfig(theta0=-1.0, parent_embedding="mean", near_duplicate=1.0)
    return MemTree(embedder=HashingEmbedder(32), aggregator=aggregator, config=config)


def ancestors(memory: MemTree, node_id: str) -> list[str]:
    out = []
    node = memory.get(node_id)
    while node.parent not in (None, ROOT_ID):
        node = memory.get(node.parent)
        out.append(node.id)
    return out


def test_each_affected_ancestor_is_aggregated_exactly_once_with_raw_text_and_leaf_count() -> None:
    recorder = RecordingAggregator()
    memory = chain_memory(recorder)
    for text in CHAIN:
        before = {node.id: (node.text, node.leaf_count) for node in memory.walk()}
        recorder.calls.clear()
        leaf = memory.add(text)
        path = ancestors(memory, leaf)
        assert len(recorder.calls) == len(path)
        assert all(new_texts == (text,) for _, new_texts, _ in recorder.calls)
        # Each call got the summary's text and leaf count before the insert; a new parent
        # aggregates the leaf it split (its sibling now) with n = 1.
        sibling = [child for child in memory.get(memory.get(leaf).parent).children if child != leaf]
        expected = sorted(before.get(node_id) or (memory.get(sibling[0]).text, 1) for node_id in path)
        assert sorted((summary, count) for summary, _, count in recorder.calls) == expected
    assert memory.stats().max_depth >= 5


def test_aggregations_of_one_insert_overlap_in_time() -> None:
    dry = chain_memory(RecordingAggregator())
    for text in CHAIN[:-1]:
        dry.add(text)
    jobs = len(ancestors(dry, dry.add(CHAIN[-1])))
    assert jobs >= 4

    recorder = RecordingAggregator()
    memory = chain_memory(recorder)
    for text in CHAIN[:-1]:
        memory.add(text)
    barrier = BarrierAggregator(jobs)
    memory.aggregator = barrier
    leaf = memory.add(CHAIN[-1])
    assert len(barrier.calls) == jobs
    assert memory.stats().stale == 0
    assert all(not memory.get(a).stale for a in ancestors(memory, leaf))


async def test_async_aggregations_overlap_on_the_event_loop() -> None:
    class AsyncBarrierAggregator(RecordingAggregator):
        def __init__(self, parties: int) -> None:
            super().__init__()
            self.barrier = asyncio.Barrier(parties)

        async def aaggregate(self, summary, new_texts, count, *, centroid=None):  # type: ignore[no-untyped-def]
            await asyncio.wait_for(self.barrier.wait(), timeout=30)
            return self.aggregate(summary, new_texts, count, centroid=centroid)

    dry = chain_memory(RecordingAggregator())
    for text in CHAIN[:-1]:
        dry.add(text)
    jobs = len(ancestors(dry, dry.add(CHAIN[-1])))

    memory = chain_memory(RecordingAggregator())
    for text in CHAIN[:-1]:
        await memory.aadd(text)
    memory.aggregator = AsyncBarrierAggregator(jobs)
    leaf = await memory.aadd(CHAIN[-1])
    assert memory.stats().stale == 0
    assert len(ancestors(memory, leaf)) == jobs
    hits = await memory.aretrieve(CHAIN[-1], k=1)
    assert hits[0].id == leaf


class FailingAggregator(RecordingAggregator):
    def __init__(self) -> None:
        super().__init__()
        self.fail = False

    def aggregate(self, summary: str, new_texts: Sequence[str], count: int, *, centroid: Vector | None = None) -> str:
        if self.fail:
            raise ConnectionError("model unavailable")
        return super().aggregate(summary, new_texts, count, centroid=centroid)


def test_failed_aggregation_keeps_the_leaf_marks_ancestors_stale_and_repair_fixes_them() -> None:
    aggregator = FailingAggregator()
    memory = chain_memory(aggregator)
    for text in CHAIN[:5]:
        memory.add(text)
    texts_before = {node.id: node.text for node in memory.walk()}
    aggregator.fail = True
    leaf = memory.add(CHAIN[5])
    assert memory.get(leaf).text == CHAIN[5]
    path = ancestors(memory, leaf)
    assert path and all(memory.get(a).stale for a in path)
    for node_id in path:
        if node_id in texts_before:  # old summaries keep their text
            assert memory.get(node_id).text == texts_before[node_id]
        else:  # a new parent keeps both texts verbatim
            assert CHAIN[5] in memory.get(node_id).text
    assert memory.stats().stale == len(path)
    assert memory.check_integrity() == []
    aggregator.fail = False
    assert memory.repair() == len(path)
    assert memory.stats().stale == 0
    for node_id in path:
        assert CHAIN[5] in memory.get(node_id).text
    assert memory.repair() == 0


def test_insert_through_a_stale_summary_rewrites_it_whole() -> None:
    aggregator = FailingAggregator()
    memory = chain_memory(aggregator)
    for text in CHAIN[:4]:
        memory.add(text)
    aggregator.fail = True
    memory.add(CHAIN[4])
    aggregator.fail = False
    leaf = memory.add(CHAIN[5])
    for node_id in ancestors(memory, leaf):
        node = memory.get(node_id)
        if not node.stale:
            assert CHAIN[5] in node.text


def test_llm_aggregator_prompt_and_reply_handling() -> None:
    prompts: list[str] = []

    def model(prompt: str) -> str:
        prompts.append(prompt)
        return "  Merged summary.  "

    aggregator = LLMAggregator(model)
    assert aggregator.aggregate("Old summary.", ["New detail."], 5) == "Merged summary."
    assert "Old summary." in prompts[0] and "- New detail." in prompts[0] and "5 earlier entries" in prompts[0]
    assert "themes" in prompts[0]  # more abstract past two entries
    aggregator.aggregate("", ["a", "b"], 0)
    assert "summarize the new entries on their own" in prompts[1]

    blank_replies: list[str] = []

    def blank(prompt: str) -> str:
        blank_replies.append(prompt)
        return "   "

    no_wait = RetryPolicy(max_attempts=3, initial_delay=0.0)
    with pytest.raises(ModelResponseError, match="empty reply"):
        LLMAggregator(CallableChatModel(blank, retry=no_wait)).aggregate("x", ["y"], 1)
    assert len(blank_replies) == 3  # retried, then given up
    with pytest.raises(ValueError, match="unknown placeholder"):
        LLMAggregator(model, prompt="Summarize {text}")
    with pytest.raises(TypeError, match="callable"):
        LLMAggregator("gpt-4o")  # type: ignore[arg-type]


async def test_llm_aggregator_accepts_async_callables() -> None:
    async def model(prompt: str) -> str:
        await asyncio.sleep(0)
        return "async summary"

    aggregator = LLMAggregator(model)
    assert await aggregator.aaggregate("s", ["t"], 1) == "async summary"
    assert await asyncio.to_thread(aggregator.aggregate, "s", ["t"], 1) == "async summary"


def test_memory_with_llm_callable_stores_model_summaries() -> None:
    memory = MemTree(embedder=HashingEmbedder(32), llm=lambda prompt: "SUMMARY", config=MemTreeConfig(theta0=-1.0))
    memory.add("the garden roses")
    memory.add("the garden tulips")
    summaries = [node for node in memory.walk() if not node.is_leaf and node.id != ROOT_ID]
    assert [node.text for node in summaries] == ["SUMMARY"]
    stats = memory.stats()
    assert stats.llm_calls == stats.aggregation_calls == 1


def test_extractive_summary_uses_only_leaf_sentences_within_the_budget() -> None:
    embedder = HashingEmbedder(64)
    aggregator = ExtractiveAggregator(embedder, max_words=20, min_words=8)
    leaves = [
        "The roses bloomed early this year. We cut them for the table.",
        "The tulips came up in red rows. The roses smelled of honey.",
        "A fox crossed the garden at dawn. It dug under the fence.",
        "The roses need pruning in winter.",
    ]
    vectors = embedder.embed(leaves)
    summary = ""
    for n, leaf in enumerate(leaves):
        centroid = vectors[: n + 1].mean(axis=0)
        summary = aggregator.aggregate(summary, [leaf], n, centroid=centroid)
        assert count_words(summary) <= aggregator.word_budget(n + 1)
    sentences = {s for leaf in leaves for s in leaf.replace(". ", ".\n").splitlines()}
    for line in summary.splitlines():
        assert line in sentences  # every word traceable to a leaf
    # Sentences keep their original order.
    order = [s for leaf in leaves for s in leaf.replace(". ", ".\n").splitlines()]
    positions = [order.index(line) for line in summary.splitlines()]
    assert positions == sorted(positions)


def test_extractive_picks_the_sentence_closest_to_the_centroid_first() -> None:
    embedder = HashingEmbedder(64)
    aggregator = ExtractiveAggregator(embedder, max_words=6, min_words=6, diversity=0.0)
    texts = ["cats purr softly at night.", "dogs bark loudly at noon.", "cats and dogs play together."]
    target = embedder.embed(["cats purr softly at night."])[0]
    assert aggregator.aggregate("", texts, 0, centroid=target) == "cats purr softly at night."
    budget = aggregator.word_budget(50)
    assert budget == 6
    with pytest.raises(ValueError):
        ExtractiveAggregator(max_words=5, min_words=10)


def test_word_budget_shrinks_with_leaf_count() -> None:
    aggregator = ExtractiveAggregator(max_words=80, min_words=20)
    budgets = [aggregator.word_budget(n) for n in (2, 4, 16, 256, 10_000)]
    assert budgets == sorted(budgets, reverse=True)
    assert budgets[0] == 80 and budgets[-1] == 20


def test_summary_embedding_matches_text_after_aggregation() -> None:
    memory = MemTree(embedder=HashingEmbedder(32), config=MemTreeConfig(theta0=-1.0, parent_embedding="text"))
    for text in CHAIN[:4]:
        memory.add(text)
    for node in memory.walk():
        if node.id != ROOT_ID and not node.is_leaf:
            np.testing.assert_allclose(node.embedding, HashingEmbedder(32).embed([node.text])[0], atol=1e-6)


def test_sentence_made_summary_vectors_cost_no_embedding_and_a_model_summary_is_embedded() -> None:
    config = MemTreeConfig(theta0=-1.0, parent_embedding="sentences")
    embedder = HashingEmbedder(32)
    extractive = MemTree(embedder=embedder, config=config)
    texts = ["The roses bloomed early. We cut them for the table.", "The tulips came up red. They smelled of honey."]
    for text in texts:
        extractive.add(text)
    (summary,) = [node for node in extractive.walk() if node.id != ROOT_ID and not node.is_leaf]
    sentences = summary.text.splitlines()
    assert len(sentences) == 4
    weights = np.array([count_words(sentence) for sentence in sentences], dtype=np.float32)
    mean = weights @ embedder.embed(sentences)
    np.testing.assert_allclose(summary.embedding, mean / np.linalg.norm(mean), atol=1e-6)
    assert extractive.stats().embedded_texts == 2 + 4  # two texts and their sentences, no summary

    model = MemTree(embedder=embedder, llm=lambda prompt: "Roses and tulips in the garden.", config=config)
    for text in texts:
        model.add(text)
    (summary,) = [node for node in model.walk() if node.id != ROOT_ID and not node.is_leaf]
    np.testing.assert_allclose(summary.embedding, embedder.embed([summary.text])[0], atol=1e-6)


def fresh_summaries_cover_their_leaves(memory: MemTree) -> None:
    """Every summary not marked stale says every leaf below it (joined with " | ")."""
    for node in memory.walk():
        if node.id == ROOT_ID or node.is_leaf or node.stale:
            continue
        below = {memory.get(leaf).text for leaf in memory.leaf_ids_under(node.id)}
        pieces = {piece for line in node.text.split("\n") for piece in line.split(" | ")}
        assert below <= pieces, f"summary at depth {node.depth} lost {sorted(below - pieces)} but is not stale"


@pytest.mark.parametrize("later", ["insert", "delete"])
def test_a_summary_rebuilt_from_a_stale_child_stays_stale_until_repair(later: str) -> None:
    aggregator = FailingAggregator()
    memory = chain_memory(aggregator)
    for text in CHAIN[:5]:
        memory.add(text)
    aggregator.fail = True
    failed = memory.add(CHAIN[5])  # every summary above it misses its text
    aggregator.fail = False
    if later == "insert":
        memory.add(CHAIN[6])  # passes through those stale summaries
    else:
        memory.delete(memory.leaves()[0].id)  # rewrites summaries above a stale one
    fresh_summaries_cover_their_leaves(memory)
    assert any(memory.get(node_id).stale for node_id in ancestors(memory, failed))
    memory.repair()
    assert memory.stats().stale == 0
    fresh_summaries_cover_their_leaves(memory)


def test_an_aggregator_returning_no_text_keeps_the_leaf_and_marks_the_path_stale() -> None:
    class NoneAggregator(RecordingAggregator):
        def aggregate(self, summary, new_texts, count, *, centroid=None):  # type: ignore[no-untyped-def]
            return None

    memory = chain_memory(RecordingAggregator())
    for text in CHAIN[:3]:
        memory.add(text)
    memory.aggregator = NoneAggregator()
    leaf = memory.add(CHAIN[3])
    assert memory.get(leaf).text == CHAIN[3] and len(memory) == 4
    assert all(memory.get(node_id).stale for node_id in ancestors(memory, leaf))
    assert memory.stats().aggregation_failures == len(ancestors(memory, leaf))


_WHITESPACE = "".join(c for c in map(chr, range(0x3000 + 1)) if c.isspace())


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(f"aZé.\x00{_WHITESPACE}"), max_size=30))
def test_fold_collapses_every_kind_of_whitespace_as_the_regex_did(text: str) -> None:
    """Summaries de-duplicate sentences by ``fold``: it must treat every Unicode space
    (tabs, line breaks, no-break and ideographic spaces) as one space, as the regex did."""
    assert fold(text) == re.sub(r"\s+", " ", text).strip().casefold()
