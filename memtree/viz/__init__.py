"""Pictures of a memory's tree: a text outline, Mermaid, Graphviz DOT (and PNG/SVG
through the ``dot`` program) and a standalone, browsable HTML page.

Each module draws from the in-process :class:`~memtree.state.TreeState`; users call
the :class:`~memtree.tree.MemTree` methods (``format_tree``, ``to_mermaid``,
``to_dot``, ``to_png``, ``to_svg``, ``to_html``), which take the read lock first.
"""

from memtree.viz.dot import to_dot
from memtree.viz.graphviz import GraphvizNotFoundError, render_dot
from memtree.viz.html import HtmlQuery, to_html
from memtree.viz.mermaid import to_mermaid
from memtree.viz.outline import format_tree

__all__ = [
    "GraphvizNotFoundError",
    "HtmlQuery",
    "format_tree",
    "render_dot",
    "to_dot",
    "to_html",
    "to_mermaid",
]
