"""Pictures of a memory's tree: a text outline, Mermaid, Graphviz DOT (and PNG/SVG
through the ``dot`` program) and a standalone, browsable HTML page.

Each module draws from the in-process :class:`~memtree.state.TreeState`; all the
drawing logic lives here. Users call the one-line :class:`~memtree.tree.MemTree`
conveniences (``format_tree``, ``to_dict``, ``to_mermaid``, ``to_dot``, ``to_png``,
``to_svg``, ``to_html``), which hand these functions the tree under the read lock.
"""

from memtree.viz.dot import to_dot
from memtree.viz.graphviz import GraphvizNotFoundError, render_dot, render_dot_to
from memtree.viz.html import HtmlQuery, answer_queries, to_html
from memtree.viz.mermaid import to_mermaid
from memtree.viz.outline import format_tree, to_dict

__all__ = [
    "GraphvizNotFoundError",
    "HtmlQuery",
    "answer_queries",
    "format_tree",
    "render_dot",
    "render_dot_to",
    "to_dict",
    "to_dot",
    "to_html",
    "to_mermaid",
]
