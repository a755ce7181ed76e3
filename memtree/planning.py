"""What an insert or a delete changes in the tree, before any model is called.

A plan holds copies of every node the change touches with their structure already
updated (parents, depths, leaf counts, centroids, timestamps) and the aggregation
jobs that will give the touched summaries their new texts. The engine runs the
jobs, fills in texts and embeddings, and commits everything in one transaction;
the tree held in memory is never modified by a plan.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from memtree.node import ROOT_ID, JSONDict, Node, Vector
from memtree.routing import Route
from memtree.state import TreeState


def new_node_id() -> str:
    return uuid.uuid4().hex


def root_node(now: float) -> Node:
    """The root every namespace starts with: no text, no embedding."""
    return Node(
        id=ROOT_ID,
        text="",
        embedding=None,
        parent=None,
        depth=0,
        is_leaf=False,
        leaf_count=0,
        created_at=now,
        updated_at=now,
    )


def latest(a: float | None, b: float | None) -> float | None:
    """The later of two optional timestamps."""
    if a is None:
        return b
    if b is None:
        return a
    return max(a, b)


def centroid_of(node: Node) -> Vector | None:
    """Mean leaf embedding below a summary."""
    if node.leaf_sum is None or node.leaf_count <= 0:
        return None
    return (node.leaf_sum / node.leaf_count).astype(np.float32)


def normalized(vector: Vector) -> Vector:
    norm = float(np.linalg.norm(vector))
    return (vector / norm).astype(np.float32) if norm > 0 else vector.astype(np.float32)


@dataclass
class AggregationJob:
    """One summary to (re)write: ``Aggregate(summary, new_texts, count)``."""

    node_id: str
    summary: str
    new_texts: list[str]
    count: int
    centroid: Vector | None


def rebuild_job(node: Node, child_texts: list[str]) -> AggregationJob:
    """A job that writes a summary afresh from its children's texts."""
    return AggregationJob(node.id, "", child_texts, 0, centroid_of(node))


@dataclass
class InsertPlan:
    """A new leaf and everything its insertion changes."""

    leaf: Node
    route: Route
    summaries: dict[str, Node]
    """Copies of the summaries that get new texts (path nodes and a new parent)."""
    moved: list[Node] = field(default_factory=list)
    """Nodes whose place changed (the leaf that was split under a new parent)."""
    jobs: list[AggregationJob] = field(default_factory=list)
    new_parent: str | None = None
    """Id of the summary created by splitting a leaf, if any."""

    def fallback_texts(self) -> dict[str, str]:
        """What a new summary says if its aggregation fails: both texts, verbatim."""
        if self.new_parent is None:
            return {}
        return {self.new_parent: f"{self.summaries[self.new_parent].text}\n{self.leaf.text}"}

    def nodes(self) -> list[Node]:
        """Everything to write, once texts and embeddings are filled in."""
        # Summaries first, so a new parent exists before the old leaf moves under it;
        # the old leaf before the new one, so children stay in chronological order.
        return [*self.summaries.values(), *self.moved, self.leaf]


def plan_insert(
    state: TreeState,
    route: Route,
    *,
    text: str,
    embedding: Vector,
    metadata: JSONDict,
    timestamp: float | None,
    source_id: str | None,
    now: float,
) -> InsertPlan:
    """Plan the insertion of one leaf along ``route`` (design.md §1, steps 4 and 5)."""
    summaries: dict[str, Node] = {}
    jobs: list[AggregationJob] = []
    for node_id in route.path:
        current = state.nodes[node_id]
        updated = current.copy()
        updated.leaf_count = current.leaf_count + 1
        updated.leaf_sum = _plus(current.leaf_sum, embedding)
        updated.timestamp = latest(current.timestamp, timestamp)
        updated.updated_at = now
        summaries[node_id] = updated
        if current.stale:  # its text already misses something: rewrite it whole
            texts = [state.nodes[child].text for child in current.children]
            jobs.append(rebuild_job(updated, [*texts, text]))
        else:
            jobs.append(AggregationJob(node_id, current.text, [text], current.leaf_count, centroid_of(updated)))

    parent_depth = state.nodes[route.parent].depth if route.parent in state.nodes else 0
    moved: list[Node] = []
    leaf_parent, leaf_depth = route.parent, parent_depth + 1
    new_parent_id: str | None = None
    if route.split is not None:
        old_leaf = state.nodes[route.split]
        assert old_leaf.embedding is not None
        new_parent = Node(
            id=new_node_id(),
            text=old_leaf.text,
            embedding=None,
            parent=route.parent,
            depth=old_leaf.depth,
            is_leaf=False,
            leaf_count=2,
            created_at=now,
            updated_at=now,
            timestamp=latest(old_leaf.timestamp, timestamp),
            leaf_sum=(old_leaf.embedding + embedding).astype(np.float32),
        )
        summaries[new_parent.id] = new_parent
        jobs.append(AggregationJob(new_parent.id, old_leaf.text, [text], 1, centroid_of(new_parent)))
        moved_leaf = old_leaf.copy()
        moved_leaf.parent = new_parent.id
        moved_leaf.depth = old_leaf.depth + 1
        moved.append(moved_leaf)
        leaf_parent, leaf_depth = new_parent.id, moved_leaf.depth
        new_parent_id = new_parent.id

    leaf = Node(
        id=new_node_id(),
        text=text,
        embedding=embedding,
        parent=leaf_parent,
        depth=leaf_depth,
        is_leaf=True,
        leaf_count=1,
        created_at=now,
        updated_at=now,
        timestamp=timestamp,
        metadata=dict(metadata),
        source_id=source_id,
    )
    return InsertPlan(leaf, route, summaries, moved, jobs, new_parent_id)


@dataclass
class DeletePlan:
    """A leaf's removal: what disappears, what moves up, what must be rewritten.

    ``ancestors`` are rewritten from their children, deepest first, one after the
    other: each needs its child's new text, and none may keep the deleted text.
    """

    deleted: list[str]
    moved: dict[str, Node]
    ancestors: list[Node]
    children: dict[str, list[str]]
    """Each ancestor's children after the change, in order."""

    def child_texts(self, node_id: str, state: TreeState, rewritten: Mapping[str, Node]) -> list[str]:
        """Current texts of an ancestor's children, using texts rewritten so far."""
        out = []
        for child_id in self.children[node_id]:
            child = rewritten.get(child_id) or self.moved.get(child_id) or state.nodes[child_id]
            out.append(child.text)
        return out

    def child_timestamps(self, node_id: str, state: TreeState, rewritten: Mapping[str, Node]) -> list[Any]:
        return [(rewritten.get(c) or self.moved.get(c) or state.nodes[c]).timestamp for c in self.children[node_id]]

    def nodes(self) -> list[Node]:
        return [*self.moved.values(), *self.ancestors]


def plan_delete(state: TreeState, leaf_id: str, now: float) -> DeletePlan:
    """Plan the removal of one leaf; a parent left with one child is folded away."""
    leaf = state.nodes[leaf_id]
    assert leaf.parent is not None and leaf.embedding is not None
    parent = state.nodes[leaf.parent]
    deleted = [leaf_id]
    moved: dict[str, Node] = {}
    children: dict[str, list[str]] = {}
    if parent.id == ROOT_ID:
        return DeletePlan(deleted, moved, [], children)

    remaining = [child for child in parent.children if child != leaf_id]
    if len(remaining) == 1:
        # The survivor takes the parent's place; its whole subtree moves up a level.
        deleted.append(parent.id)
        survivor_id = remaining[0]
        for node in state.walk(survivor_id):
            shifted = node.copy()
            shifted.depth -= 1
            if node.id == survivor_id:
                shifted.parent = parent.parent
            shifted.updated_at = now
            moved[node.id] = shifted
        chain = [state.nodes[parent.parent]] if parent.parent != ROOT_ID else []
        replaced = {parent.id: survivor_id}
    else:
        chain = [parent]
        replaced = {leaf_id: ""}
    chain = [*chain, *state.path_to_root(chain[0].id)] if chain else []

    ancestors: list[Node] = []
    for current in chain:
        updated = current.copy()
        updated.leaf_count = current.leaf_count - 1
        updated.leaf_sum = _plus(current.leaf_sum, -leaf.embedding)
        updated.updated_at = now
        kids = []
        for child in current.children:
            child = replaced.get(child, child)
            if child:
                kids.append(child)
        children[current.id] = kids
        ancestors.append(updated)
    return DeletePlan(deleted, moved, ancestors, children)


def _plus(total: Vector | None, vector: Vector) -> Vector:
    base = np.zeros_like(vector) if total is None else total
    return (base + vector).astype(np.float32)
