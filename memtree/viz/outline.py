"""The tree as an indented text outline (for terminals, logs and ``memtree show``)."""

from __future__ import annotations

from typing import Any

from memtree.digest import readable
from memtree.node import ROOT_ID
from memtree.state import TreeState
from memtree.text import preview


def format_tree(state: TreeState, *, max_depth: int | None = None, width: int = 72) -> str:
    """An indented outline: one line per node, a remembered text as its preview and a
    summary marked with how many texts it covers (a digest's heading said as a
    phrase, :func:`memtree.digest.readable`); the indentation is the depth.

    Example lines: ``├─ [summary of 5] Caroline joined a support group…`` and
    ``│  ├─ Caroline went to the LGBTQ support group on 7 May.``
    """
    root = state.root
    if root is None or not root.children:
        return "(empty memory)"
    lines = [f"root · {sum(1 for n in state.nodes.values() if n.is_leaf)} leaves"]

    def visit(node_id: str, prefix: str, last: bool) -> None:
        node = state.nodes[node_id]
        branch = "└─ " if last else "├─ "
        if node.is_leaf:
            lines.append(f"{prefix}{branch}{preview(node.text, width)}")
        else:
            label = f"[summary of {node.leaf_count}{', stale' if node.stale else ''}]"
            lines.append(f"{prefix}{branch}{label} {preview(readable(node.text), width)}")
        if max_depth is not None and node.depth >= max_depth:
            if node.children:
                lines.append(f"{prefix}{'   ' if last else '│  '}└─ … {len(node.children)} children")
            return
        extension = "   " if last else "│  "
        for i, child in enumerate(node.children):
            visit(child, prefix + extension, i == len(node.children) - 1)

    children = state.nodes[ROOT_ID].children
    for i, child in enumerate(children):
        visit(child, "", i == len(children) - 1)
    return "\n".join(lines)


def dict_of(state: TreeState) -> dict[str, Any]:
    """The tree as nested dicts (id, text, depth, leaf_count, timestamp, metadata, children)."""

    def build(node_id: str) -> dict[str, Any]:
        node = state.nodes[node_id]
        return {
            "id": node.id,
            "text": node.text,
            "depth": node.depth,
            "is_leaf": node.is_leaf,
            "leaf_count": state.leaf_total if node.id == ROOT_ID else node.leaf_count,
            "timestamp": node.timestamp,
            "metadata": dict(node.metadata),
            "stale": node.stale,
            "children": [build(child) for child in node.children],
        }

    if state.root is None:
        return {"id": ROOT_ID, "text": "", "depth": 0, "leaf_count": 0, "children": []}
    return build(ROOT_ID)
