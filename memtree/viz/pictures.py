"""The pictures of a memory, as functions of it: ``to_mermaid(memory)``,
``to_dot``, ``to_png``, ``to_svg``, ``to_html`` and ``to_dict``.

Each draws the memory's tree as one snapshot (under its read lock, expired leaves
swept first, so no summary text mentions one); the drawing itself is in the
sibling modules. ``MemTree.format_tree`` is the one picture kept on the memory.

Example::

    from memtree.viz import to_html, to_mermaid

    print(to_mermaid(memory, max_depth=2))
    Path("tree.html").write_text(to_html(memory, queries=["Where does Maya live?"]))
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from memtree.config import MemTreeConfig
from memtree.node import RetrievedNode
from memtree.store.base import NamespaceKey
from memtree.viz.dot import dot_of
from memtree.viz.graphviz import render_dot_to
from memtree.viz.html import answer_queries, page_of
from memtree.viz.mermaid import mermaid_of
from memtree.viz.outline import dict_of
from memtree.viz.picture import Direction

R = TypeVar("R")


class Drawable(Protocol):
    """What a picture needs of a memory (a :class:`~memtree.MemTree` is one)."""

    namespace: NamespaceKey
    config: MemTreeConfig

    def read_tree(self, draw: Callable[..., R], /, **options: Any) -> R: ...

    @property
    def retrieve(self) -> Callable[..., list[RetrievedNode]]: ...


def to_dict(memory: Drawable) -> dict[str, Any]:
    """The tree as nested dicts (id, text, depth, leaf_count, timestamp, metadata, children)."""
    return memory.read_tree(dict_of)


def to_mermaid(
    memory: Drawable,
    *,
    max_depth: int | None = None,
    width: int = 80,
    line_width: int = 28,
    direction: Direction = "LR",
) -> str:
    """The tree as a Mermaid ``flowchart``: boxes of a title over ``width`` characters
    wrapped at ``line_width``, "… N more below" past ``max_depth``."""
    return memory.read_tree(mermaid_of, max_depth=max_depth, width=width, line_width=line_width, direction=direction)


def to_dot(
    memory: Drawable,
    *,
    max_depth: int | None = None,
    width: int = 80,
    line_width: int = 28,
    direction: Direction = "LR",
) -> str:
    """The tree as a Graphviz DOT ``digraph`` (same boxes as :func:`to_mermaid`; in SVG
    output each box's tooltip is its full text)."""
    return memory.read_tree(dot_of, max_depth=max_depth, width=width, line_width=line_width, direction=direction)


def to_png(memory: Drawable, path: str | os.PathLike[str] | None = None, **options: Any) -> bytes:
    """The :func:`to_dot` picture (same options) drawn as PNG by Graphviz, written to
    ``path`` if given; :class:`~memtree.viz.GraphvizNotFoundError` without ``dot``."""
    return render_dot_to(to_dot(memory, **options), "png", path)


def to_svg(memory: Drawable, path: str | os.PathLike[str] | None = None, **options: Any) -> str:
    """The :func:`to_dot` picture drawn as SVG by Graphviz (see :func:`to_png`)."""
    return render_dot_to(to_dot(memory, **options), "svg", path).decode("utf-8")


def to_html(
    memory: Drawable,
    *,
    queries: str | Sequence[str] = (),
    k: int | None = None,
    mode: str | None = None,
    expand_depth: int = 1,
    max_depth: int | None = None,
    title: str | None = None,
) -> str:
    """One self-contained HTML page to browse the tree (no server, no network), open
    to ``expand_depth``; a click shows a node's text and metadata. Its search box
    matches words (BM25); each of ``queries`` is answered by the memory's
    ``retrieve`` (``k``, ``mode``), so the page highlights the nodes it retrieves.
    ``max_depth`` leaves deeper nodes out (see :mod:`memtree.viz.html`)."""
    answered = answer_queries(memory.retrieve, queries, k=k, mode=mode, shown_mode=memory.config.mode)
    name = "/".join(memory.namespace)
    return memory.read_tree(
        page_of,
        title=title or f"memtree · {name}",
        namespace=name,
        queries=answered,
        expand_depth=expand_depth,
        max_depth=max_depth,
        k=k or memory.config.k,
    )
