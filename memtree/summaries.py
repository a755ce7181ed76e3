"""Writing summaries: the aggregation and embedding steps every write procedure shares.

A summary is rewritten by merging new texts into it (``Aggregate(text, new, n)``)
or rebuilt from its children's texts. Jobs of one round run concurrently. A failed
job never loses anything: the node keeps its old text (a new parent says its
texts verbatim), is marked stale for ``repair()``, and keeps its embedding or takes
its leaves' centroid. These are sans-IO steps (see :mod:`memtree.model_calls`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator, Iterable, Mapping
from typing import Any

import numpy as np

from memtree.bulk import BulkPlan
from memtree.config import MemTreeConfig
from memtree.deferral import FlushPlan
from memtree.embed import Matrix
from memtree.model_calls import ModelCalls, Request, Steps, aggregations
from memtree.node import Node
from memtree.planning import (
    AggregationJob,
    DeletePlan,
    InsertPlan,
    centroid_of,
    latest,
    normalized,
    path_jobs,
    rebuild_job,
)
from memtree.redaction import interim_summary
from memtree.summary_guard import SummaryTooLongError, cap_summary
from memtree.text import count_words

logger = logging.getLogger(__name__)


def _embeds_its_text(node: Node) -> bool:
    """Whether a summary's embedding is known to be its current text's: it has one
    and is not stale (a stale summary may carry a centroid or an older text's)."""
    return node.embedding is not None and not node.stale and not node.is_leaf


class SummaryWriter:
    """Runs aggregation jobs through ``calls`` and embeds what they wrote with ``embed``."""

    def __init__(self, config: MemTreeConfig, calls: ModelCalls, embed: Callable[[list[str]], Steps[Matrix]]) -> None:
        self.config = config
        self.calls = calls
        self.embed = embed

    def write_path(self, plan: InsertPlan, children: Mapping[str, list[Node]]) -> Generator[Request, Any, None]:
        """Write the summaries on an insert's path in one concurrent round (see
        :func:`~memtree.planning.path_jobs`: a stale one is rebuilt, or merges the
        new text and stays stale when a rebuild would inherit a gap)."""
        jobs, kept_stale = path_jobs(plan, children)
        embedded_as = {node.id: node.text for node in plan.summaries.values() if _embeds_its_text(node)}
        written = yield from self.write_texts(jobs, plan.summaries, fallback=plan.fallback_texts())
        for node in written:
            node.stale = node.id in kept_stale
        # A summary whose text came back unchanged (the new text added no sentence to
        # it) keeps its embedding: re-embedding the same text would give it again.
        changed = [node for node in written if embedded_as.get(node.id) != node.text]
        yield from self.embed_summaries(changed, plan.summaries.values())

    def write(
        self,
        jobs: list[AggregationJob],
        nodes: Mapping[str, Node],
        fallback: Mapping[str, str] | None = None,
    ) -> Generator[Request, Any, None]:
        """Run aggregation jobs and give their nodes new texts and embeddings."""
        written = yield from self.write_texts(jobs, nodes, fallback)
        yield from self.embed_summaries(written, nodes.values())

    def write_texts(
        self,
        jobs: list[AggregationJob],
        nodes: Mapping[str, Node],
        fallback: Mapping[str, str] | None = None,
    ) -> Generator[Request, Any, list[Node]]:
        """Run aggregation jobs concurrently and give their nodes new texts; return
        the nodes written.

        A failed job leaves its node's old text (or ``fallback`` for a new node) and
        marks it stale; the node's embedding is then kept, or for a new node taken
        from its leaves' centroid. Nothing the caller gave is dropped.
        """
        if not jobs:
            return []
        outcomes = yield from self._aggregate(jobs)
        written: list[Node] = []
        for job, outcome in zip(jobs, outcomes, strict=True):
            node = nodes[job.node_id]
            if isinstance(outcome, BaseException):
                self._note_failure(node, outcome)
                if fallback is not None and job.node_id in fallback:
                    node.text = fallback[job.node_id]
                    node.embedding = None  # the old one may say a removed text: its leaves' centroid instead
            else:
                node.text = outcome
                node.stale = False
                written.append(node)
        return written

    def _aggregate(self, jobs: list[AggregationJob]) -> Generator[Request, Any, list[str | BaseException]]:
        """Run jobs concurrently; every summary is held to ``config.summary_max_chars``
        (cut at a sentence end, or rejected), whichever aggregator wrote it."""
        outcomes = yield from aggregations(jobs, self.calls.aggregator)
        return [self._capped(outcome) for outcome in outcomes]

    def _capped(self, outcome: str | BaseException) -> str | BaseException:
        if isinstance(outcome, BaseException):
            return outcome
        limit = self.config.summary_max_chars
        cut = cap_summary(outcome, limit)
        if cut is None:
            self.calls.counters.add("summaries_rejected")
            return SummaryTooLongError(
                f"the summary has {len(outcome)} characters, over summary_max_chars={limit}, and no sentence "
                "end within the cap to cut it at"
            )
        if cut is not outcome:
            self.calls.counters.add("summaries_cut")
            logger.info("a summary of %d characters was cut to %d (summary_max_chars)", len(outcome), len(cut))
        return cut

    def _note_failure(self, node: Node, error: BaseException) -> None:
        logger.warning("aggregation failed for node %s; marked stale: %r", node.id, error)
        self.calls.counters.add("aggregation_failures")
        node.stale = True

    def embed_summaries(
        self, written: list[Node], nodes: Iterable[Node], *, from_sentences: bool = True
    ) -> Generator[Request, Any, None]:
        """Embed rewritten summaries (``parent_embedding="text"``) in batches, or with
        ``"sentences"`` give each the aggregator's vector from its sentences (those not
        held yet embedded first, so the vector depends on the text alone) and embed
        only those it cannot make one for; give the others their leaves' centroid
        where they need one. ``from_sentences=False`` embeds their texts instead (a
        bulk build: its leaves' sentences were never embedded)."""
        if self.config.parent_embedding == "sentences" and from_sentences:
            aggregator = self.calls.aggregator
            missing = list(dict.fromkeys(text for node in written for text in aggregator.missing_sentences(node.text)))
            if missing:  # a summary's vector must not depend on what this process embedded before
                try:
                    aggregator.learn_vectors(missing, (yield from self.embed(missing)))
                except Exception as error:  # noqa: BLE001 - embedded whole below, or marked stale
                    logger.warning("embedding summary sentences failed: %s", error)
            unknown = []
            for node in written:
                known = self.calls.aggregator.known_vector(node.text)
                if known is None:
                    unknown.append(node)
                else:
                    node.embedding = known
            written = unknown
        if self.config.parent_embedding in ("text", "sentences") and written:
            try:
                vectors = yield from self.embed([node.text for node in written])
            except Exception as error:  # noqa: BLE001 - a summary embedding must not lose the leaf
                logger.warning("embedding summaries failed; marked stale: %s", error)
                for node in written:
                    node.stale = True
            else:
                for node, vector in zip(written, vectors, strict=True):
                    node.embedding = vector
        self.centroid_embeddings(nodes)

    def centroid_embeddings(self, nodes: Iterable[Node]) -> None:
        for node in nodes:
            if self.config.parent_embedding == "mean" or node.embedding is None:
                centroid = centroid_of(node)
                if centroid is not None:
                    node.embedding = normalized(centroid)

    def defer(self, nodes: Iterable[Node], fallback: Mapping[str, str]) -> None:
        """Mark an insert's summaries stale for a later flush; texts stay as they
        were (a new parent says both its texts verbatim) and a summary without an
        embedding routes by its leaves' centroid meanwhile."""
        nodes = list(nodes)
        for node in nodes:
            node.stale = True
            if node.id in fallback:
                node.text = fallback[node.id]
        self.centroid_embeddings(nodes)

    def merge_then_rebuild(
        self, plan: FlushPlan, nodes: dict[str, Node], children: Mapping[str, list[Node]]
    ) -> Generator[Request, Any, list[Node]]:
        """Give ``nodes`` their new texts; return those written. A rebuild reads its
        children's texts after the deeper levels were rewritten, and waits for the
        next flush (stays stale) if one of them could not be written."""
        written: list[Node] = []
        levels = sorted({nodes[node_id].depth for node_id in plan.rebuilds}, reverse=True)
        for step in range(1 + len(levels)):
            tasks: dict[str, tuple[str, int, list[str]]] = plan.merges if step == 0 else {}
            for node_id in plan.rebuilds if step > 0 else ():
                node = nodes[node_id]
                if node.depth != levels[step - 1]:
                    continue
                kids = [nodes.get(child.id, child) for child in children[node_id]]
                if any(child.stale for child in kids):
                    node.stale = True
                else:
                    tasks[node_id] = ("", 0, [child.text for child in kids])
            done = yield from self._fold(tasks, nodes)
            for node_id, text in done.items():
                nodes[node_id].text = text
                nodes[node_id].stale = False
                written.append(nodes[node_id])
        return written

    def _fold(
        self, tasks: Mapping[str, tuple[str, int, list[str]]], nodes: Mapping[str, Node]
    ) -> Generator[Request, Any, dict[str, str]]:
        """Merge each task's texts into its summary, in one call per node when they fit
        ``config.aggregation_max_words`` and otherwise chunk after chunk; all nodes
        run concurrently. Returns the new text of every node that succeeded."""
        chunks = {node_id: self._chunks(texts) for node_id, (_, _, texts) in tasks.items()}
        progress = {node_id: (summary, count) for node_id, (summary, count, _) in tasks.items()}
        done: dict[str, str] = {}
        step = 0
        while progress:
            jobs = [
                AggregationJob(node_id, summary, chunks[node_id][step], count, centroid_of(nodes[node_id]))
                for node_id, (summary, count) in progress.items()
            ]
            outcomes = yield from self._aggregate(jobs)
            step += 1
            for job, outcome in zip(jobs, outcomes, strict=True):
                if isinstance(outcome, BaseException):
                    self._note_failure(nodes[job.node_id], outcome)
                    del progress[job.node_id]
                elif step == len(chunks[job.node_id]):
                    done[job.node_id] = outcome
                    del progress[job.node_id]
                else:
                    progress[job.node_id] = (outcome, job.count + len(job.new_texts))
        return done

    def _chunks(self, texts: list[str]) -> list[list[str]]:
        """Texts for successive calls: all at once unless a model call would exceed
        ``config.aggregation_max_words`` (offline aggregators take any amount)."""
        if not self.calls.aggregator.calls_model:
            return [texts]
        limit = self.config.aggregation_max_words
        chunks: list[list[str]] = [[]]
        words = 0
        for text in texts:
            size = count_words(text)
            if chunks[-1] and words + size > limit:
                chunks.append([])
                words = 0
            chunks[-1].append(text)
            words += size
        return chunks

    def write_bulk(self, plan: BulkPlan) -> Generator[Request, Any, None]:
        """Write a bulk plan's summaries once each, a level at a time, deepest first:
        each from its children's texts and embeddings, then the level's texts embedded
        in batches. A summary whose job fails, or with a child that failed, says its
        children's texts and is marked stale for ``repair()`` (its embedding: its
        leaves' centroid)."""
        nodes: dict[str, Node] = {leaf.id: leaf for leaf in plan.leaves}
        nodes.update(plan.summaries)
        for level in plan.levels:
            jobs: list[AggregationJob] = []
            for node_id in level:
                node = nodes[node_id]
                kids = [nodes[child] for child in plan.children[node_id]]
                # What the summary says if its job fails: its children's texts, capped.
                node.text = interim_summary([kid.text for kid in kids], self.config.summary_max_chars)
                if any(kid.stale for kid in kids):
                    node.stale = True
                    continue
                vectors = np.stack([kid.embedding for kid in kids])  # type: ignore[misc]
                texts = [kid.text for kid in kids]
                jobs.append(AggregationJob(node_id, "", texts, 0, centroid_of(node), vectors, node.leaf_count))
            written = yield from self.write_texts(jobs, nodes)
            yield from self.embed_summaries(written, (nodes[node_id] for node_id in level), from_sentences=False)

    def stand_in(self, nodes: Iterable[Node], children: Callable[[Node], list[Node]]) -> None:
        """Give summaries that held a removed text a stand-in, without a model call:
        each one's text becomes its ``children``'s texts (their final ones: call this
        deepest level first), held to ``summary_max_chars``, and its embedding its
        leaves' centroid (the old one was made from the removed text too); marked
        stale, so a model rewrites it later. Committed with the removal, so that
        nothing of the removed text stays readable while the rewrite waits."""
        nodes = list(nodes)
        for node in nodes:
            node.text = interim_summary([kid.text for kid in children(node)], self.config.summary_max_chars)
            node.stale = True
            node.embedding = None
        self.centroid_embeddings(nodes)

    def defer_ancestors(self, plan: DeletePlan) -> None:
        """A delete's ancestors marked stale for the background worker, each in a
        :meth:`stand_in` made of its children after the delete, deepest first."""
        rewritten: dict[str, Node] = {}
        for depth in sorted({node.depth for node in plan.ancestors}, reverse=True):
            level = {node.id: node for node in plan.ancestors if node.depth == depth}
            for node in level.values():
                node.timestamp = None
                for kid in plan.child_nodes(node.id, rewritten):
                    node.timestamp = latest(node.timestamp, kid.timestamp)
            self.stand_in(level.values(), lambda node: plan.child_nodes(node.id, rewritten))
            rewritten.update(level)

    def rewrite_ancestors(self, plan: DeletePlan) -> Generator[Request, Any, None]:
        """Rewrite a delete's ancestors level by level, deepest first: each needs its
        children's new texts, and the summaries of one level run concurrently. Every
        one is rebuilt (none may keep a deleted text); one that reads a stale child
        stays stale, and one whose model call fails gets its :meth:`stand_in` text."""
        rewritten: dict[str, Node] = {}
        for depth in sorted({node.depth for node in plan.ancestors}, reverse=True):
            level = {node.id: node for node in plan.ancestors if node.depth == depth}
            jobs = []
            reads_stale: set[str] = set()
            fallback: dict[str, str] = {}
            for node in level.values():
                kids = plan.child_nodes(node.id, rewritten)
                node.timestamp = None
                for kid in kids:
                    node.timestamp = latest(node.timestamp, kid.timestamp)
                if any(kid.stale for kid in kids):
                    reads_stale.add(node.id)
                jobs.append(rebuild_job(node, [kid.text for kid in kids]))
                fallback[node.id] = interim_summary([kid.text for kid in kids], self.config.summary_max_chars)
            yield from self.write(jobs, level, fallback)
            for node_id in reads_stale:
                level[node_id].stale = True
            rewritten.update(level)
