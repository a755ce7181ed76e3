"""What a node-and-edge picture of the tree shows, before any syntax is written.

Mermaid and DOT draw the same thing: one box per node down to ``max_depth`` (a
"… N more below" box stands for what is cut off), an edge per parent link, and
on every box a short title and the first words of the node's text wrapped into
lines. Building that once here keeps the two formats in agreement; each format
module only escapes and spells it.
"""

from __future__ import annotations

import textwrap
import unicodedata
from dataclasses import dataclass
from typing import Literal

from memtree.digest import readable
from memtree.node import ROOT_ID, Node, to_datetime
from memtree.state import TreeState
from memtree.text import preview

BoxKind = Literal["root", "summary", "leaf", "more"]
Direction = Literal["TB", "LR"]
DIRECTIONS: tuple[str, ...] = ("TB", "LR")


@dataclass(frozen=True)
class Box:
    """One box of the picture. ``key`` is a syntax-safe id (``n0``, ``n1``…)."""

    key: str
    kind: BoxKind
    title: str
    lines: tuple[str, ...]
    node_id: str | None = None
    stale: bool = False
    full_text: str = ""


@dataclass(frozen=True)
class Picture:
    """Boxes in depth-first order (the root first) and ``(parent key, child key)`` edges."""

    boxes: list[Box]
    edges: list[tuple[str, str]]


def check_options(max_depth: int | None, width: int, line_width: int, direction: str) -> None:
    """Reject options no picture can honour, naming the fix."""
    if max_depth is not None and (isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < 1):
        raise ValueError(f"max_depth must be a positive integer or None, got {max_depth!r}")
    if isinstance(width, bool) or not isinstance(width, int) or width < 8:
        raise ValueError(f"width must be an integer >= 8 (characters of text per box), got {width!r}")
    if isinstance(line_width, bool) or not isinstance(line_width, int) or line_width < 8:
        raise ValueError(f"line_width must be an integer >= 8, got {line_width!r}")
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {', '.join(DIRECTIONS)}, got {direction!r}")


def printable(text: str) -> str:
    """``text`` with control characters (other than whitespace) replaced by spaces.

    Renderers choke on or silently drop raw control characters; they carry no
    meaning in a picture.
    """
    return "".join(" " if unicodedata.category(ch) == "Cc" and not ch.isspace() else ch for ch in text)


def wrap_preview(text: str, width: int, line_width: int) -> tuple[str, ...]:
    """The first ``width`` characters of ``text`` on one line each ``line_width`` wide."""
    short = preview(printable(text), width)
    return tuple(textwrap.wrap(short, line_width, break_long_words=True, break_on_hyphens=False)) or ("",)


def day(timestamp: float | None) -> str | None:
    """``2024-05-07`` for a POSIX timestamp (UTC), ``None`` for none."""
    if timestamp is None:
        return None
    when = to_datetime(timestamp)
    return when.strftime("%Y-%m-%d") if when is not None else repr(timestamp)  # raw when no date holds it


def _title(node: Node) -> str:
    if node.is_leaf:
        when = day(node.timestamp)
        return f"leaf · {when}" if when else "leaf"
    return f"{node.leaf_count} leaves{' · stale' if node.stale else ''}"


def picture_of(state: TreeState, *, max_depth: int | None = None, width: int = 80, line_width: int = 28) -> Picture:
    """The boxes and edges of the tree down to ``max_depth`` (every level if ``None``)."""
    boxes: list[Box] = []
    edges: list[tuple[str, str]] = []
    root = state.root
    leaves = state.leaf_total
    boxes.append(Box("n0", "root", "root", (f"{leaves} leaves" if root is not None else "empty memory",), ROOT_ID))
    if root is None:
        return Picture(boxes, edges)
    stack: list[tuple[str, str]] = [("n0", child) for child in reversed(root.children)]
    while stack:
        parent_key, node_id = stack.pop()
        node = state.nodes[node_id]
        key = f"n{len(boxes)}"
        kind: BoxKind = "leaf" if node.is_leaf else "summary"
        shown = node.text if node.is_leaf else readable(node.text)  # a digest's heading as a phrase
        box = Box(key, kind, _title(node), wrap_preview(shown, width, line_width), node.id, node.stale, node.text)
        boxes.append(box)
        edges.append((parent_key, key))
        if not node.children:
            continue
        if max_depth is not None and node.depth >= max_depth:
            more = f"n{len(boxes)}"
            hidden = sum(1 for _ in state.walk(node.id)) - 1
            boxes.append(Box(more, "more", f"… {hidden} more nodes", (f"{len(node.children)} children",)))
            edges.append((key, more))
            continue
        stack.extend((key, child) for child in reversed(node.children))
    return Picture(boxes, edges)
