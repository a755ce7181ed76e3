"""Pictures of a memory's tree: a text outline (``MemTree.format_tree``), nested
dicts, Mermaid, Graphviz DOT (and PNG/SVG through the ``dot`` program) and a
standalone, browsable HTML page.

The public functions take the memory (:mod:`memtree.viz.pictures`):
``to_mermaid(memory)``, ``to_dot``, ``to_png``, ``to_svg``, ``to_html``,
``to_dict``. Each module below them draws from the in-process
:class:`~memtree.state.TreeState`, which the memory hands over under its read lock.
"""

from memtree.viz.graphviz import GraphvizNotFoundError, render_dot, render_dot_to
from memtree.viz.html import HtmlQuery
from memtree.viz.pictures import Drawable, to_dict, to_dot, to_html, to_mermaid, to_png, to_svg

__all__ = [
    "Drawable",
    "GraphvizNotFoundError",
    "HtmlQuery",
    "render_dot",
    "render_dot_to",
    "to_dict",
    "to_dot",
    "to_html",
    "to_mermaid",
    "to_png",
    "to_svg",
]
