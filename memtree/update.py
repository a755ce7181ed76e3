"""``MemTree.update``: correct a leaf, keeping its id and every earlier version.

An update changes a leaf's text (and so its embedding), metadata or event time. The
leaf keeps its id, ``source_id`` and ``created_at``; what it said before is kept as a
:class:`~memtree.node.LeafVersion` in the store, committed in the same transaction
(``MemTree.history`` reads them back, oldest first).

Where the leaf goes: the new embedding is routed from the root (design.md §1) over
the tree without the leaf. If that descent ends where the leaf already hangs, the
leaf is updated in place and the summaries above it are rewritten from their
children. Otherwise its meaning moved: the leaf is removed as a delete would remove
it (a parent left with one child is folded away) and routed in again as an insert
would route it, keeping its id; every summary above its old place and above its new
place is rewritten, deepest first, from its final children, so no summary keeps the
old text. A change of metadata or time alone moves nothing and rewrites no text.

Failures follow inserts: the new embedding is computed before anything is written
(a failure there changes nothing); a summary whose rewrite fails keeps its text and
is marked stale (``repair()``), the leaf is updated all the same. Inside a
``deferred()`` block the summaries are marked stale and rewritten by ``flush()``;
with ``aggregation="background"`` they are marked stale the same way and the
background worker rewrites them: the update waits for the new embedding only.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from memtree.inputs import TimeLike, make_item, to_timestamp
from memtree.node import ROOT_ID, JSONDict, LeafVersion, Node, Vector
from memtree.optimistic import PreparedWrite, footprint_of
from memtree.planning import latest, plan_delete_many, plan_insert, rebuild_job
from memtree.redaction import interim_summary
from memtree.routing import Route, route
from memtree.state import TreeState, TreeView
from memtree.writer import Writer

Router = Callable[[TreeView], Route]
"""Where a text goes in a given view of the tree."""


@dataclass
class UpdatePlan:
    """A leaf's new version and everything it changes, before any model call.

    ``summaries`` are copies of every summary to rewrite (the leaf's old ancestors
    and, if it moves, its new ones and a new parent), with their final place, leaf
    count and leaf sum; ``children`` their final children. ``moved`` holds other
    nodes whose place changed, ``deleted`` the summaries folded away.
    """

    leaf: Node
    version: LeafVersion
    summaries: dict[str, Node]
    children: dict[str, list[str]]
    moved: dict[str, Node]
    deleted: list[str]
    fallback: dict[str, str]
    relocated: bool

    def nodes(self) -> list[Node]:
        """Everything to write, once texts and embeddings are filled in."""
        return [*self.summaries.values(), *self.moved.values(), self.leaf]

    def child_nodes(self, node_id: str, state: TreeView) -> list[Node]:
        """A summary's final children: this plan's copies where it has them (so texts
        rewritten at a deeper level are read), the tree's nodes otherwise."""
        out = []
        for child in self.children[node_id]:
            if child == self.leaf.id:
                out.append(self.leaf)
            else:
                out.append(self.summaries.get(child) or self.moved.get(child) or state.nodes[child])
        return out


def plan_update(
    state: TreeState,
    leaf_id: str,
    *,
    text: str,
    embedding: Vector,
    metadata: JSONDict,
    timestamp: float | None,
    now: float,
    router: Router,
) -> UpdatePlan:
    """Plan the new version of a leaf (see the module docstring)."""
    old = state.nodes[leaf_id]
    assert old.is_leaf and old.embedding is not None and old.parent is not None
    version = LeafVersion(leaf_id, old.text, dict(old.metadata), old.timestamp, now)
    leaf = old.copy()
    leaf.text, leaf.embedding, leaf.metadata, leaf.timestamp, leaf.updated_at = (
        text,
        embedding,
        dict(metadata),
        timestamp,
        now,
    )
    if text != old.text:
        target = router(_without(state, old))
        here = tuple(node.id for node in reversed(state.path_to_root(leaf_id)))
        if target.split is not None or target.path != here or target.parent != old.parent:
            return _relocate(state, old, leaf, version, now, router)
    summaries: dict[str, Node] = {}
    for ancestor in state.path_to_root(leaf_id):
        updated = ancestor.copy()
        assert ancestor.leaf_sum is not None
        updated.leaf_sum = (ancestor.leaf_sum - old.embedding + embedding).astype(embedding.dtype)
        updated.updated_at = now
        summaries[updated.id] = updated
    children = {node_id: list(state.nodes[node_id].children) for node_id in summaries}
    return UpdatePlan(leaf, version, summaries, children, {}, [], {}, relocated=False)


def _relocate(state: TreeState, old: Node, leaf: Node, version: LeafVersion, now: float, router: Router) -> UpdatePlan:
    """Take the leaf out as a delete would, then route it in as an insert would, in one plan."""
    removal = plan_delete_many(state, [old.id], now)
    changed: dict[str, Node] = dict(removal.moved)
    for node in removal.ancestors:
        node.children = list(removal.children[node.id])
        changed[node.id] = node
    gone = set(removal.deleted)
    root = state.nodes[ROOT_ID]
    arrivals = [node.id for node in removal.moved.values() if node.parent == ROOT_ID and node.id not in root.children]
    if arrivals or gone.intersection(root.children):
        top = root.copy()
        kids = [child for child in root.children if child not in gone] + arrivals
        top.children = sorted(kids, key=lambda child: ((changed.get(child) or state.nodes[child]).created_at, child))
        changed[ROOT_ID] = top
    view = _View(_Overlay(state.nodes, changed, gone), state.depth)
    target = router(view)
    assert leaf.embedding is not None
    insert = plan_insert(
        view,
        target,
        text=leaf.text,
        embedding=leaf.embedding,
        metadata=leaf.metadata,
        timestamp=leaf.timestamp,
        source_id=leaf.source_id,
        now=now,
    )
    leaf.parent, leaf.depth = insert.leaf.parent, insert.leaf.depth
    insert.leaf = leaf  # the fallback text of a new parent reads it
    summaries = {node.id: node for node in removal.ancestors}
    summaries.update(insert.summaries)  # the insert's copies already carry the removal's changes
    moved = {node_id: node for node_id, node in removal.moved.items() if node_id not in summaries}
    moved.update((node.id, node) for node in insert.moved)
    children: dict[str, list[str]] = {}
    for node_id in summaries:
        if node_id == insert.new_parent:
            assert target.split is not None
            children[node_id] = [target.split, leaf.id]
            continue
        kids = list(view.nodes[node_id].children)
        if node_id == target.parent:
            if target.split is not None:
                kids = [insert.new_parent if kid == target.split else kid for kid in kids]  # type: ignore[misc]
            else:
                kids.append(leaf.id)
        children[node_id] = kids
    deleted = [node_id for node_id in removal.deleted if node_id != old.id]
    return UpdatePlan(leaf, version, summaries, children, moved, deleted, insert.fallback_texts(), relocated=True)


def _without(state: TreeState, leaf: Node) -> _View:
    """The tree as routing sees it with ``leaf`` left out of its parent's children."""
    assert leaf.parent is not None
    parent = state.nodes[leaf.parent].copy()
    parent.children = [child for child in parent.children if child != leaf.id]
    return _View(_Overlay(state.nodes, {parent.id: parent}, {leaf.id}), state.depth)


class _Overlay(Mapping[str, Node]):
    """Nodes by id: ``changed`` over ``base``, without ``removed`` (nothing is copied)."""

    def __init__(self, base: Mapping[str, Node], changed: Mapping[str, Node], removed: Iterable[str]) -> None:
        self._base = base
        self._changed = changed
        self._removed = frozenset(removed)

    def __getitem__(self, node_id: str) -> Node:
        if node_id in self._removed:
            raise KeyError(node_id)
        node = self._changed.get(node_id)
        return node if node is not None else self._base[node_id]

    def __iter__(self) -> Iterator[str]:
        yield from (node_id for node_id in self._base if node_id not in self._removed)
        yield from (node_id for node_id in self._changed if node_id not in self._base and node_id not in self._removed)

    def __len__(self) -> int:
        return sum(1 for _ in self)


@dataclass(frozen=True)
class _View:
    nodes: Mapping[str, Node]
    depth: int


# -- the engine's side --------------------------------------------------------------


@dataclass(frozen=True)
class _Change:
    """A checked update request; ``None`` fields keep the leaf's current value."""

    leaf_id: str
    text: str
    metadata: JSONDict | None
    timestamp: float | None


def check_leaf(state: TreeState, leaf_id: object, namespace: tuple[str, ...], action: str = "be updated") -> Node:
    """The leaf ``leaf_id`` names: ``KeyError`` if there is none, ``ValueError`` for a summary."""
    if not isinstance(leaf_id, str):
        raise TypeError(f"leaf id must be a str, got {type(leaf_id).__name__}")
    node = state.nodes.get(leaf_id)
    if node is None:
        raise KeyError(f"no node with id {leaf_id!r} in namespace {namespace!r}")
    if not node.is_leaf:
        raise ValueError(f"node {leaf_id!r} is a summary; only leaves can {action} (use the leaves below it)")
    return node


def prepare(
    writer: Writer, leaf_id: str, text: str, metadata: Mapping[str, Any] | None, timestamp: TimeLike | None
) -> tuple[_Change, bool]:
    """Check an update before any model call; also say whether the text changes
    (then the new text must be embedded)."""
    item = make_item(text, metadata)
    change = _Change(leaf_id, item.text, None if metadata is None else item.metadata, to_timestamp(timestamp))
    writer.replica.maybe_refresh()
    with writer.replica.lock.read():
        current = check_leaf(writer.replica.state, leaf_id, writer.replica.namespace)
        return change, current.text != change.text


def update_steps(
    writer: Writer, change: _Change, embedding: Vector | None, *, defer: bool
) -> Generator[Any, Any, PreparedWrite[str]]:
    """The write procedure of one update (run by ``Writer.write`` / ``awrite``)."""
    with writer.replica.lock.read():
        current = check_leaf(writer.replica.state, change.leaf_id, writer.replica.namespace)
        needs_vector = current.text != change.text and embedding is None
    if needs_vector:  # the leaf changed since the caller looked: embed the text now
        embedding = (yield from writer.procedures.embed([change.text]))[0]
    with writer.replica.lock.read():
        state = writer.replica.state
        base = (state.seq, state.generation)
        old = check_leaf(state, change.leaf_id, writer.replica.namespace)
        metadata = dict(old.metadata) if change.metadata is None else change.metadata
        timestamp = old.timestamp if change.timestamp is None else change.timestamp
        retext = old.text != change.text
        if not retext and metadata == old.metadata and timestamp == old.timestamp:
            return PreparedWrite(change.leaf_id, base)  # nothing to change, nothing to remember
        vector = embedding if retext else old.embedding
        assert vector is not None
        scorer = writer.procedures.scorer(vector)
        theta0 = writer.procedures.theta0()
        plan = plan_update(
            state,
            change.leaf_id,
            text=change.text,
            embedding=vector,
            metadata=metadata,
            timestamp=timestamp,
            now=time.time(),
            router=lambda view: route(view, scorer, theta0, writer.config),
        )
        kids = {node_id: plan.child_nodes(node_id, state) for node_id in plan.summaries}
        watched = {node_id for node_id in [*plan.summaries, old.parent, plan.leaf.parent, ROOT_ID] if node_id}
        footprint = footprint_of(
            state,
            {node_id for node_id in watched if node_id in state.nodes},
            extra_reads=[change.leaf_id, *plan.moved, *plan.deleted],
        )
    deferring = defer and retext
    summaries = writer.procedures.summaries
    for depth in sorted({node.depth for node in plan.summaries.values()}, reverse=True):
        level = {node.id: node for node in plan.summaries.values() if node.depth == depth}
        jobs = []
        reads_stale: set[str] = set()
        for node in level.values():
            node.timestamp = None
            for kid in kids[node.id]:
                node.timestamp = latest(node.timestamp, kid.timestamp)
            if not retext or deferring:
                continue
            if any(kid.stale for kid in kids[node.id]):
                reads_stale.add(node.id)
            jobs.append(rebuild_job(node, [kid.text for kid in kids[node.id]]))
        if deferring:  # the old text must not wait for the worker in these summaries: stand-ins now
            summaries.stand_in(level.values(), lambda node: kids[node.id])
        elif jobs:  # a rewrite that fails leaves a stand-in too, never the old text
            limit = writer.config.summary_max_chars
            fallback = {node_id: interim_summary([kid.text for kid in kids[node_id]], limit) for node_id in level}
            yield from summaries.write(jobs, level, fallback)
        for node_id in reads_stale:
            level[node_id].stale = True

    def committed() -> None:
        writer.pending.mark_rebuild(plan.summaries)  # what a ledger entry merged is gone
        if deferring:
            with writer.replica.lock.read():
                writer.pending.put_back(plan.summaries, writer.replica.state)
        writer.calls.counters.add("updates")

    return PreparedWrite(
        change.leaf_id,
        base,
        plan.nodes(),
        plan.deleted,
        footprint,
        committed=committed,
        versions=[plan.version],
    )


def update(
    writer: Writer,
    leaf_id: str,
    text: str,
    *,
    metadata: Mapping[str, Any] | None,
    timestamp: TimeLike | None,
) -> str:
    """``MemTree.update`` (see there)."""
    change, retext = prepare(writer, leaf_id, text, metadata, timestamp)
    background = writer.in_background()
    defer = writer.is_deferring() or background
    vector = writer.calls.drive(writer.procedures.embed([change.text]))[0] if retext else None
    result = writer.write(lambda: update_steps(writer, change, vector, defer=defer))
    if background:
        writer.background.notify()
    return result


async def aupdate(
    writer: Writer,
    leaf_id: str,
    text: str,
    *,
    metadata: Mapping[str, Any] | None,
    timestamp: TimeLike | None,
) -> str:
    """``MemTree.aupdate`` (see there)."""
    change, retext = prepare(writer, leaf_id, text, metadata, timestamp)
    background = writer.in_background()
    defer = writer.is_deferring() or background
    vector = (await writer.calls.adrive(writer.procedures.embed([change.text])))[0] if retext else None
    result = await writer.awrite(lambda: update_steps(writer, change, vector, defer=defer))
    if background:
        writer.background.notify()
    return result


def history(writer: Writer, leaf_id: str) -> list[LeafVersion]:
    """``MemTree.history`` (see there)."""
    writer.replica.maybe_refresh()
    with writer.replica.lock.read():
        check_leaf(writer.replica.state, leaf_id, writer.replica.namespace, action="have a history")
    return writer.replica.store.read_history(writer.replica.namespace, leaf_id)
