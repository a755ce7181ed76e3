"""Bulk ingestion: a batch of texts grouped by clustering, each summary written once.

Routing documents one at a time (the paper's insert, made for chat turns) grows
deep, nearly binary chains of 13-18 levels over a few thousand 150-word chunks,
and rewrites and re-embeds every summary on a chunk's path for every chunk. A
batch arrives with all its vectors at once, so ``add_many(bulk=True)`` cuts it
top-down instead: spherical k-means splits a group into at most ``BRANCHING``
parts (a part holding more than half of the group is replaced by an even split
along the group's main direction, so every level at least halves the group and
the depth stays logarithmic); a part of one text is a leaf, a larger part a new
summary. The summaries are then written once each, deepest first, from their
children (:meth:`~memtree.aggregate.Aggregator.summarize`), and embedded once
each. The new subtrees hang under the root, so later inserts route into them.

Everything here is pure: the plan holds new nodes with their structure filled
in (parents, depths, leaf counts and sums, timestamps); texts and embeddings of
the summaries come from the write procedure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from memtree.embed import Matrix
from memtree.inputs import Item
from memtree.node import ROOT_ID, Node
from memtree.planning import latest, new_node_id

BRANCHING = 8
"""Parts a group is split into (at most): a summary has up to 8 children."""

KMEANS_ROUNDS = 12
"""Lloyd iterations of the spherical k-means (it settles in a few on text embeddings)."""

CREATION_STEP = 1e-6
"""Seconds between the creation times of a batch's nodes: children lists stay in the
batch's order (they are sorted by creation time)."""

Grouping = list["int | Grouping"]
"""A group's children: a text's index in the batch, or a nested group (a summary)."""


@dataclass
class BulkPlan:
    """The nodes a batch adds, with the summaries' children and the order to write them."""

    leaves: list[Node]
    summaries: dict[str, Node]
    children: dict[str, list[str]]
    """Each new summary's children, in order."""
    levels: list[list[str]] = field(default_factory=list)
    """The new summaries grouped by depth, deepest first (the order to write them)."""

    def nodes(self) -> list[Node]:
        """Everything to write, parents before their children."""
        top_down = sorted(self.summaries.values(), key=lambda node: node.depth)
        return [*top_down, *self.leaves]


def group(vectors: Matrix, *, branching: int = BRANCHING, max_levels: int = 23, seed: int = 0) -> Grouping:
    """The root's new children for a batch with these (unit) vectors: nested groups
    of batch indices, each in batch order. At most ``max_levels`` nested groups deep
    (a group at the last level takes its texts as direct children)."""
    rng = np.random.default_rng(seed)

    def split(indices: npt.NDArray[np.int64], levels: int) -> Grouping:
        if len(indices) <= branching or levels <= 0:
            return [int(i) for i in indices]
        parts = _parts(vectors[indices], min(branching, math.ceil(len(indices) / branching)), rng)
        children: Grouping = []
        for part in sorted(parts, key=lambda members: int(members[0])):
            members = indices[part]
            children.append(int(members[0]) if len(members) == 1 else split(members, levels - 1))
        return children

    return split(np.arange(len(vectors)), max_levels)


def _parts(matrix: Matrix, k: int, rng: np.random.Generator) -> list[npt.NDArray[np.int64]]:
    """Row numbers of ``matrix`` split into at most ``k`` non-empty parts, none over
    half of the rows (sorted within each part)."""
    labels = _spherical_kmeans(matrix, k, rng)
    parts = [np.flatnonzero(labels == label) for label in range(k)]
    parts = [part for part in parts if len(part)]
    if len(parts) < 2 or max(len(part) for part in parts) > len(matrix) / 2:
        order = np.argsort(matrix @ _main_direction(matrix, rng), kind="stable")
        parts = [np.sort(part) for part in np.array_split(order, k) if len(part)]
    return parts


def _spherical_kmeans(matrix: Matrix, k: int, rng: np.random.Generator) -> npt.NDArray[np.int64]:
    """Labels of k-means on the unit sphere (cosine), seeded by k-means++."""
    count = len(matrix)
    centers = np.empty((k, matrix.shape[1]), dtype=np.float32)
    centers[0] = matrix[rng.integers(count)]
    distance = np.maximum(0.0, 1.0 - matrix @ centers[0])
    for number in range(1, k):
        total = float(distance.sum())
        pick = rng.choice(count, p=distance / total) if total > 0 else rng.integers(count)
        centers[number] = matrix[pick]
        distance = np.minimum(distance, np.maximum(0.0, 1.0 - matrix @ centers[number]))
    labels = np.argmax(matrix @ centers.T, axis=1)
    for _ in range(KMEANS_ROUNDS):
        for number in range(k):
            members = matrix[labels == number]
            if len(members):
                mean = members.sum(axis=0)
                norm = float(np.linalg.norm(mean))
                centers[number] = mean / norm if norm > 0 else mean
        new_labels = np.argmax(matrix @ centers.T, axis=1)
        if np.array_equal(new_labels, labels):
            break
        labels = new_labels
    return labels


def _main_direction(matrix: Matrix, rng: np.random.Generator) -> npt.NDArray[np.float32]:
    """The rows' first principal direction, by a few power iterations."""
    centred = matrix - matrix.mean(axis=0)
    direction: npt.NDArray[np.float32] = np.asarray(rng.standard_normal(matrix.shape[1]), dtype=np.float32)
    for _ in range(20):
        direction = centred.T @ (centred @ direction)
        norm = float(np.linalg.norm(direction))
        if norm == 0:
            break
        direction /= norm
    return direction


def plan_bulk(items: Sequence[Item], vectors: Matrix, grouping: Grouping, *, now: float, depth_cap: int) -> BulkPlan:
    """New leaves and summaries for ``items`` laid out as ``grouping`` under the root."""
    leaves = [
        Node(
            id=new_node_id(),
            text=item.text,
            embedding=vectors[number],
            parent=ROOT_ID,
            depth=1,
            is_leaf=True,
            leaf_count=1,
            created_at=now + number * CREATION_STEP,
            updated_at=now + number * CREATION_STEP,
            timestamp=item.timestamp,
            metadata=dict(item.metadata),
            source_id=item.source_id,
            expires_at=item.expires_at,
        )
        for number, item in enumerate(items)
    ]
    plan = BulkPlan(leaves, {}, {})
    by_depth: dict[int, list[str]] = {}

    def place(children: Grouping, parent: str, depth: int) -> list[int]:
        """Hang ``children`` under ``parent`` at ``depth``; the batch indices below."""
        below: list[int] = []
        for child in children:
            if isinstance(child, int):
                leaf = leaves[child]
                leaf.parent, leaf.depth = parent, depth
                below.append(child)
                plan.children.setdefault(parent, []).append(leaf.id)
                continue
            if depth + 1 > depth_cap:
                raise ValueError(f"a bulk grouping {depth + 1} levels deep passes the depth cap {depth_cap}")
            summary = Node(
                id=new_node_id(),
                text="",
                embedding=None,
                parent=parent,
                depth=depth,
                is_leaf=False,
                leaf_count=0,
                created_at=now,
                updated_at=now,
            )
            plan.summaries[summary.id] = summary
            plan.children.setdefault(parent, []).append(summary.id)
            members = place(child, summary.id, depth + 1)
            summary.leaf_count = len(members)
            summary.leaf_sum = vectors[members].sum(axis=0).astype(np.float32)
            summary.created_at = summary.updated_at = now + members[0] * CREATION_STEP
            for member in members:
                summary.timestamp = latest(summary.timestamp, items[member].timestamp)
            by_depth.setdefault(depth, []).append(summary.id)
            below.extend(members)
        return below

    place(grouping, ROOT_ID, 1)
    plan.children.pop(ROOT_ID, None)
    plan.levels = [by_depth[depth] for depth in sorted(by_depth, reverse=True)]
    return plan
