"""Deferred aggregation: which summaries wait for a rewrite, and with what.

While aggregation is deferred (``with memory.deferred():`` or
``add_many(..., aggregation="deferred")``) each insert is routed and committed at
once, leaf and structure alike, but the summaries on its path keep their texts and
are committed marked stale. This ledger remembers, for each such summary, the text
it had and the leaf count that text covered when it went stale, and which leaves
arrived since. ``flush()`` then rewrites each summary once, merging all its new
leaves in one call: ``Aggregate(old text, [new texts], old count)``, exactly the
paper's step with several new pieces instead of one.

The ledger lives in memory only, and correctness does not depend on it: the stale
marks are committed with the leaves, so after a crash ``repair()`` rebuilds those
summaries from their children. For the same reason an entry that no longer adds up
(the summary was stale before, a leaf below it was deleted, another writer touched
it) is rebuilt from its children rather than merged, and so is any ancestor of a
flushed summary that was rewritten meanwhile from its stale text.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, field

from memtree.node import Node
from memtree.planning import InsertPlan
from memtree.state import TreeState


@dataclass
class PendingSummary:
    """A summary's text and leaf count when it went stale, and the leaves added since."""

    base_text: str
    base_count: int
    new_leaves: list[str] = field(default_factory=list)
    rebuild: bool = False
    """Rebuild from the children instead of merging (the base no longer tells the story)."""
    stale_base: bool = False
    """The summary was already stale when the entry was made, so its text may miss
    leaves: rebuild it too, unless the entry joins one a flush had taken (see
    :meth:`PendingSummaries.restore`)."""
    shown_text: str | None = None
    """The text the summary holds while it waits (``None``: not known). If it holds
    another when flushed, another writer rewrote it meanwhile (maybe because a leaf
    below was removed, whose text ``base_text`` may still hold): rebuild it, never
    merge into ``base_text``."""


@dataclass
class FlushPlan:
    """What a flush writes: merges (independent of each other) and rebuilds (bottom-up)."""

    merges: dict[str, tuple[str, int, list[str]]]
    """node id -> (old text, old leaf count, texts of the new leaves in arrival order)."""
    rebuilds: list[str]
    """Ids of summaries to rebuild from their children, deepest first."""
    entries: dict[str, PendingSummary] = field(default_factory=dict)
    """The ledger entries the plan was made from (put back if it is not committed)."""


@dataclass(frozen=True)
class FlushBase:
    """What a flush's texts were written from, to re-apply them on a newer tree."""

    texts: dict[str, str]
    """node id -> text when planned: the summaries written and the children rebuilds read."""
    counts: dict[str, int]
    """summary id -> the leaf count its new text covers."""


def flush_base(state: TreeState, nodes: Iterable[str], read: Iterable[Node]) -> FlushBase:
    """The :class:`FlushBase` of a flush planned on ``state`` (under its read lock)."""
    summaries = [state.nodes[node_id] for node_id in nodes]
    texts = {node.id: node.text for node in read}
    texts.update((node.id, node.text) for node in summaries)
    return FlushBase(texts, {node.id: node.leaf_count for node in summaries})


def rebase_flush(
    state: TreeState, written: Iterable[Node], base: FlushBase, arrivals: dict[str, int]
) -> tuple[list[Node], dict[str, tuple[str, int]]] | None:
    """A flush's summaries re-applied on ``state``, if all that changed below them since
    the flush was planned is inserts whose leaves wait in the ledger (``arrivals``:
    summary id -> leaves recorded since); ``None`` otherwise (plan again).

    Each summary keeps the structure it has now (leaf count, leaf sum, place) and
    takes the flush's text and embedding. One that gained leaves meanwhile stays
    stale, and its ledger entry is rebased (the second value: id -> new text and
    the count it covers) so the next flush merges just those leaves into it.
    Without this, with inserts arriving while a flush waits for the model (the
    background worker's case), nearly every flush would conflict and start over.
    """
    for node_id, text in base.texts.items():
        current = state.nodes.get(node_id)
        if current is None or current.text != text:  # deleted, or rewritten by another write
            return None
    rebased: list[Node] = []
    grown_bases: dict[str, tuple[str, int]] = {}
    for node in written:
        current = state.nodes[node.id]
        grown = current.leaf_count - base.counts[node.id]
        if grown != arrivals.get(node.id, 0) or current.depth != node.depth or current.parent != node.parent:
            return None  # something else than recorded inserts changed it (a delete, an eager insert)
        copy = current.copy()
        copy.text, copy.embedding, copy.updated_at = node.text, node.embedding, node.updated_at
        copy.stale = node.stale or grown > 0
        if grown and not node.stale:
            grown_bases[node.id] = (node.text, base.counts[node.id])
        rebased.append(copy)
    return rebased, grown_bases


class PendingSummaries:
    """The ledger of summaries whose aggregation is deferred (thread-safe)."""

    def __init__(self) -> None:
        self._entries: dict[str, PendingSummary] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def ids(self) -> list[str]:
        """The summaries waiting, by id (stale in the store until written)."""
        with self._lock:
            return list(self._entries)

    @staticmethod
    def describe_insert(plan: InsertPlan, state: TreeState) -> list[tuple[str, PendingSummary]]:
        """What a deferred insert adds to the ledger, read from ``state`` as planned
        (it is recorded with :meth:`record` once the insert is committed)."""
        entries = []
        for node_id in plan.route.path:  # a deferred insert leaves their texts as they are
            current = state.nodes[node_id]
            entry = PendingSummary(current.text, current.leaf_count, [plan.leaf.id], stale_base=current.stale)
            entry.shown_text = current.text
            entries.append((node_id, entry))
        if plan.new_parent is not None:
            split_leaf = plan.moved[0]
            shown = plan.fallback_texts().get(plan.new_parent)
            entries.append((plan.new_parent, PendingSummary(split_leaf.text, 1, [plan.leaf.id], shown_text=shown)))
        return entries

    def record(self, entries: Iterable[tuple[str, PendingSummary]]) -> None:
        """Add a committed deferred insert: a summary already waiting keeps the text
        and count it had when it first went stale and gains the new leaf."""
        with self._lock:
            for node_id, entry in entries:
                waiting = self._entries.get(node_id)
                if waiting is None:
                    self._entries[node_id] = entry
                else:
                    waiting.new_leaves.extend(entry.new_leaves)

    def mark_rebuild(self, node_ids: Iterable[str]) -> None:
        """Entries whose old text may hold something deleted: rebuild them instead."""
        with self._lock:
            for node_id in node_ids:
                entry = self._entries.get(node_id)
                if entry is not None:
                    entry.rebuild = True

    def take(self, state: TreeState) -> FlushPlan:
        """Empty the ledger into a plan against the current ``state``.

        Summaries that are gone or no longer stale (rewritten meanwhile by an eager
        insert, a repair or another writer) need nothing.
        """
        with self._lock:
            entries, self._entries = self._entries, {}
        merges: dict[str, tuple[str, int, list[str]]] = {}
        rebuilds: list[str] = []
        for node_id, entry in entries.items():
            node = state.nodes.get(node_id)
            if node is None or not node.stale:
                continue
            alive = [leaf for leaf in entry.new_leaves if leaf in state.nodes]
            rewritten = entry.shown_text is not None and node.text != entry.shown_text
            if (
                entry.rebuild
                or entry.stale_base
                or rewritten
                or not alive
                or node.leaf_count != entry.base_count + len(alive)
            ):
                rebuilds.append(node_id)
            else:
                merges[node_id] = (entry.base_text, entry.base_count, [state.nodes[leaf].text for leaf in alive])
        # An ancestor that is not stale was rewritten since (an eager insert, a delete,
        # a repair) from the stale text below it: it must follow what the flush writes.
        planned = {*merges, *rebuilds}
        for node_id in list(planned):
            for ancestor in state.path_to_root(node_id):
                if ancestor.id not in planned:
                    planned.add(ancestor.id)
                    rebuilds.append(ancestor.id)
        rebuilds.sort(key=lambda node_id: state.nodes[node_id].depth, reverse=True)
        return FlushPlan(merges, rebuilds, entries)

    def arrivals(self) -> dict[str, int]:
        """Summary id -> how many leaves wait in its entry (after a :meth:`take`: the
        inserts committed since)."""
        with self._lock:
            return {node_id: len(entry.new_leaves) for node_id, entry in self._entries.items()}

    def rebase(self, bases: dict[str, tuple[str, int]]) -> None:
        """After a rebased flush: the entries of summaries it wrote now start from the
        text it wrote (and the leaf count that text covers)."""
        with self._lock:
            for node_id, (text, count) in bases.items():
                entry = self._entries.get(node_id)
                if entry is not None:
                    entry.base_text, entry.base_count, entry.stale_base = text, count, False
                    entry.shown_text = text  # the node holds the flush's text now

    def restore(self, plan: FlushPlan) -> None:
        """Put back the entries of a flush that was not committed (entries added
        since stay, after the restored ones).

        An entry added since saw its summary stale because this flush had taken it
        (``stale_base``): the restored entry's base still covers it, so that alone is
        no reason to rebuild. (Should anything else have rewritten the summary
        meanwhile, :meth:`take`'s leaf count check turns the merge into a rebuild.)
        Without this, with inserts arriving while the background worker's flushes
        run, every conflict would turn merges into rebuilds, one model round per
        level, and make the next flush longer and likelier to conflict again."""
        with self._lock:
            for node_id, entry in plan.entries.items():
                newer = self._entries.get(node_id)
                if newer is not None:
                    entry.new_leaves.extend(newer.new_leaves)
                    entry.rebuild = entry.rebuild or newer.rebuild
                self._entries[node_id] = entry

    def put_back(self, node_ids: Iterable[str], state: TreeState) -> None:
        """Summaries a flush could not write: the next flush rebuilds them."""
        with self._lock:
            for node_id in node_ids:
                node = state.nodes.get(node_id)
                if node is not None and node_id not in self._entries:
                    self._entries[node_id] = PendingSummary(node.text, node.leaf_count, rebuild=True)
