"""Structural checks of a tree and its index: what must hold after any sequence of
inserts, deletes, crashes and concurrent writers."""

from __future__ import annotations

import numpy as np

from memtree.index import VectorIndex
from memtree.node import ROOT_ID
from memtree.state import TreeState


def integrity_problems(state: TreeState, index: VectorIndex | None, depth_cap: int) -> list[str]:
    """Every violated invariant, described; an empty list means the tree is sound.
    A tree mapped from a segment also has every file of the segment checked against
    its checksum (reading it all)."""
    problems: list[str] = state.nodes.segment.verify() if state.nodes.segment is not None else []
    nodes = state.nodes
    if not nodes:
        return problems if index is None or len(index) == 0 else ["index holds vectors of an empty tree"]
    root = nodes.get(ROOT_ID)
    if root is None:
        return ["the tree has nodes but no root"]
    if root.text or root.embedding is not None or root.parent is not None or root.depth != 0:
        problems.append("the root must have no text, no embedding, no parent and depth 0")

    children_of: dict[str, list[str]] = {node_id: [] for node_id in nodes}
    for node in nodes.values():
        if node.id == ROOT_ID:
            continue
        if node.parent is None or node.parent not in nodes:
            problems.append(f"{node.id}: parent {node.parent} does not exist")
            continue
        children_of[node.parent].append(node.id)
        parent = nodes[node.parent]
        if node.depth != parent.depth + 1:
            problems.append(f"{node.id}: depth {node.depth} but parent depth {parent.depth}")
        if node.depth > depth_cap:
            problems.append(f"{node.id}: depth {node.depth} beyond the cap {depth_cap}")
        if node.embedding is None:
            problems.append(f"{node.id}: no embedding")
        elif abs(float(np.linalg.norm(node.embedding)) - 1.0) > 1e-3:
            problems.append(f"{node.id}: embedding is not unit length")
        if not node.text:
            problems.append(f"{node.id}: empty text")

    for node in nodes.values():
        if sorted(node.children) != sorted(children_of[node.id]):
            problems.append(f"{node.id}: children list does not match the parent links")
        if node.id == ROOT_ID:
            continue
        if node.is_leaf:
            if node.children or node.leaf_count != 1:
                problems.append(f"{node.id}: a leaf must have no children and leaf_count 1")
            continue
        if len(node.children) < 2:
            problems.append(f"{node.id}: a summary with {len(node.children)} child(ren) should be folded")
        expected = sum(nodes[c].leaf_count for c in node.children if c in nodes)
        if node.leaf_count != expected:
            problems.append(f"{node.id}: leaf_count {node.leaf_count} but its children hold {expected}")

    leaf_sums = _leaf_sums(state)
    for node_id, total in leaf_sums.items():
        stored = nodes[node_id].leaf_sum
        if stored is None or not np.allclose(stored, total, atol=1e-3):
            problems.append(f"{node_id}: leaf_sum differs from the sum of its leaves' embeddings")

    if len(nodes) == 1:  # only the root is left
        if index is not None and len(index) > 0:
            problems.append("index holds vectors of an empty tree")
        return problems
    if index is None:
        problems.append("the tree has nodes but no index")
        return problems
    expected_ids = {node_id for node_id in nodes if node_id != ROOT_ID}
    if set(index.ids) != expected_ids or len(index.ids) != len(expected_ids):
        problems.append(f"index holds {len(index.ids)} vectors for {len(expected_ids)} nodes (or other ids)")
        return problems
    ids = list(index.ids)
    stored = np.stack([nodes[node_id].embedding for node_id in ids])  # type: ignore[misc]
    if not np.allclose(index.all_vectors(), stored, atol=1e-6):
        problems.append("index vectors differ from the nodes' embeddings")
    return problems


def _leaf_sums(state: TreeState) -> dict[str, np.ndarray]:
    """Sum of leaf embeddings below every summary, bottom-up in one pass."""
    sums: dict[str, np.ndarray] = {}
    for node in sorted(state.nodes.values(), key=lambda n: -n.depth):
        if node.id == ROOT_ID or node.is_leaf or not node.children:
            continue
        parts = []
        for child_id in node.children:
            child = state.nodes.get(child_id)
            if child is None:
                continue
            if child.is_leaf and child.embedding is not None:
                parts.append(child.embedding)
            elif child_id in sums:
                parts.append(sums[child_id])
        if parts:
            sums[node.id] = np.sum(parts, axis=0)
    return sums
