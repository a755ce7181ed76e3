"""What an insert or a delete changes in the tree, before any model is called.

A plan holds copies of every node the change touches with their structure already
updated (parents, depths, leaf counts, centroids, timestamps) and the aggregation
jobs that will give the touched summaries their new texts. The engine runs the
jobs, fills in texts and embeddings, and commits everything in one transaction;
the tree held in memory is never modified by a plan.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from memtree.embed import Matrix
from memtree.node import ROOT_ID, JSONDict, Node, Vector
from memtree.routing import Route
from memtree.state import TreeState, TreeView


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
    vectors: Matrix | None = None
    """Set for a bulk-built summary: its children's embeddings, one row per text of
    ``new_texts``; the job then runs :meth:`~memtree.aggregate.Aggregator.summarize`."""
    leaves: int = 0
    """The leaves a bulk-built summary stands for."""


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
    state: TreeView,
    route: Route,
    *,
    text: str,
    embedding: Vector,
    metadata: JSONDict,
    timestamp: float | None,
    source_id: str | None,
    now: float,
    expires_at: float | None = None,
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
        expires_at=expires_at,
    )
    return InsertPlan(leaf, route, summaries, moved, jobs, new_parent_id)


def children_after(node_id: str, plan: InsertPlan, children: Mapping[str, list[Node]]) -> list[Node]:
    """A path summary's children once the insert is done (with this insert's copies)."""
    kids = [plan.summaries.get(child.id, child) for child in children[node_id]]
    if node_id == plan.route.parent:
        if plan.new_parent is not None:
            kids = [plan.summaries[plan.new_parent] if kid.id == plan.route.split else kid for kid in kids]
        else:
            kids.append(plan.leaf)
    return kids


def path_jobs(plan: InsertPlan, children: Mapping[str, list[Node]]) -> tuple[list[AggregationJob], set[str]]:
    """The jobs that write an insert's path summaries, all runnable at once, and the
    ids of the summaries that stay stale after them.

    A fresh summary merges the new text into its own. A stale one (its text already
    misses something) is rebuilt from its children's texts, where a child on the
    path gives what it will stand for: a stale one its own rebuild's texts, a fresh
    one its text and the new one. No job waits for another, so a failing model
    costs one round of retries, not one per stale level. A stale summary with a
    stale child off the path cannot be rebuilt whole: it merges the new text and
    stays stale for ``repair()``.
    """
    jobs: list[AggregationJob] = []
    kept_stale: set[str] = set()
    for job in plan.jobs:
        node = plan.summaries[job.node_id]
        if not node.stale:
            jobs.append(job)
            continue
        texts = _rebuild_texts(node.id, plan, children)
        if texts is None:
            kept_stale.add(node.id)
            jobs.append(AggregationJob(node.id, node.text, [plan.leaf.text], node.leaf_count - 1, job.centroid))
        else:
            jobs.append(rebuild_job(node, texts))
    return jobs, kept_stale


def _rebuild_texts(node_id: str, plan: InsertPlan, children: Mapping[str, list[Node]]) -> list[str] | None:
    """What a stale path summary is rebuilt from (see :func:`path_jobs`), or ``None``
    if a stale child off the path makes a whole rebuild impossible."""
    texts: list[str] = []
    for kid in children_after(node_id, plan, children):
        if kid.id == plan.leaf.id or kid.id not in plan.summaries:
            if kid.stale:
                return None
            texts.append(kid.text)
        elif kid.stale:
            below = _rebuild_texts(kid.id, plan, children)
            if below is None:
                return None
            texts.extend(below)
        else:
            texts.extend([kid.text, plan.leaf.text])
    return texts


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
    kept: dict[str, Node] = field(default_factory=dict)
    """The other children of the ancestors, as they were when the plan was made."""

    def child_nodes(self, node_id: str, rewritten: Mapping[str, Node]) -> list[Node]:
        """An ancestor's children after the change, using the nodes rewritten so far."""
        return [rewritten.get(child) or self.moved.get(child) or self.kept[child] for child in self.children[node_id]]

    def nodes(self) -> list[Node]:
        return [*self.moved.values(), *self.ancestors]


def plan_delete_many(state: TreeState, leaf_ids: Sequence[str], now: float) -> DeletePlan:
    """Plan the removal of several leaves in one change.

    The tree left is the one deleting them one at a time would leave: a summary
    left with one child is folded away (the child takes its place, its subtree
    moves up), a summary left with none disappears. But every surviving ancestor
    appears once in the plan, to be rewritten once from its final children,
    instead of once per deleted leaf below it.
    """
    removed = list(dict.fromkeys(leaf_ids))
    gone = set(removed)
    lost: dict[str, list[Node]] = {}  # touched summary -> the deleted leaves below it
    for leaf_id in removed:
        leaf = state.nodes[leaf_id]
        assert leaf.is_leaf and leaf.parent is not None and leaf.embedding is not None
        for ancestor in state.path_to_root(leaf_id):
            lost.setdefault(ancestor.id, []).append(leaf)

    folded: dict[str, str] = {}  # summary left with one child -> that child
    children: dict[str, list[str]] = {}  # surviving touched summary -> its final children

    def final_children(node: Node) -> list[str]:
        return [folded.get(child, child) for child in node.children if child not in gone]

    for node_id in sorted(lost, key=lambda n: -state.nodes[n].depth):  # children decided first
        kids = final_children(state.nodes[node_id])
        if not kids:
            gone.add(node_id)
        elif len(kids) == 1:
            folded[node_id] = kids[0]
        else:
            children[node_id] = kids

    moved: dict[str, Node] = {}
    ancestors: dict[str, Node] = {}

    def place(node_id: str, parent: str, depth: int) -> None:
        """Give a node its final parent and depth (its subtree follows)."""
        node = state.nodes[node_id]
        if node_id in children:
            updated = node.copy()
            updated.parent, updated.depth, updated.updated_at = parent, depth, now
            below = lost[node_id]
            updated.leaf_count = node.leaf_count - len(below)
            lost_vectors = [leaf.embedding for leaf in below if leaf.embedding is not None]
            updated.leaf_sum = _plus(node.leaf_sum, -np.sum(lost_vectors, axis=0))
            ancestors[node_id] = updated
            for child in children[node_id]:
                place(child, node_id, depth + 1)
        elif node.parent != parent or node.depth != depth:
            shift = depth - node.depth
            for member in state.walk(node_id):
                shifted = member.copy()
                shifted.depth += shift
                shifted.updated_at = now
                if member.id == node_id:
                    shifted.parent = parent
                moved[member.id] = shifted

    root = state.nodes[ROOT_ID]
    for child in final_children(root):
        place(child, ROOT_ID, 1)
    deleted = [*removed, *(node_id for node_id in lost if node_id in gone), *folded]
    deepest_first = sorted(ancestors.values(), key=lambda node: -node.depth)
    kept = {child: state.nodes[child] for kids in children.values() for child in kids}
    return DeletePlan(deleted, moved, deepest_first, children, kept)


def _plus(total: Vector | None, vector: Vector) -> Vector:
    base = np.zeros_like(vector) if total is None else total
    return (base + vector).astype(np.float32)
