"""The tree as a Graphviz DOT digraph (``dot -Tpng``, ``-Tsvg``; see ``graphviz.py``).

Labels and tooltips are DOT quoted strings with backslashes and quotes escaped,
so stored text never ends a string early and never turns into one of DOT's
``\\N``-style substitutions; box ids are ``n0``, ``n1``…
"""

from __future__ import annotations

from memtree.state import TreeState
from memtree.viz.picture import Box, Direction, check_options, picture_of, printable

_TOOLTIP_CHARS = 600

_STYLES = {
    "root": 'shape=box, style="rounded,filled", fillcolor="#1f2937", color="#1f2937", fontcolor="#ffffff"',
    "summary": 'fillcolor="#e8f0fe", color="#3b6fd8", fontcolor="#10213f"',
    "leaf": 'fillcolor="#ffffff", color="#9aa5b1", fontcolor="#1f2937"',
    "more": 'style="rounded,dashed,filled", fillcolor="#f5f5f5", color="#b0b0b0", fontcolor="#555555"',
    "stale": 'fillcolor="#fff1f0", color="#d93025", fontcolor="#5f1410", penwidth=1.6',
}


def escape_dot(text: str) -> str:
    """``text`` safe inside a DOT quoted string (newlines become spaces)."""
    flat = " ".join(printable(text).splitlines())
    return flat.replace("\\", "\\\\").replace('"', '\\"')


def _label(box: Box) -> str:
    # "\l" ends a left-justified line; titles and the root's lines stay centred ("\n").
    end = "\\n" if box.kind == "root" else "\\l"
    body = "".join(f"{escape_dot(line)}{end}" for line in box.lines)
    return f"{escape_dot(box.title)}\\n{body}"


def dot_of(
    state: TreeState,
    *,
    max_depth: int | None = None,
    width: int = 80,
    line_width: int = 28,
    direction: Direction = "LR",
) -> str:
    """A ``digraph`` with one box per node: a title (leaf count, or the leaf's
    date) over the first ``width`` characters of its text; the full text (cut at
    600 characters) is the box's tooltip in SVG output."""
    check_options(max_depth, width, line_width, direction)
    picture = picture_of(state, max_depth=max_depth, width=width, line_width=line_width)
    out = [
        "digraph memtree {",
        f'    graph [rankdir={direction}, charset="UTF-8", bgcolor="white", nodesep=0.2, ranksep=0.4, ordering=out];',
        '    node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=10, margin="0.12,0.06"];',
        '    edge [color="#9aa5b1", arrowsize=0.6];',
    ]
    for box in picture.boxes:
        style = _STYLES["stale" if box.stale else box.kind]
        tooltip = escape_dot(box.full_text[:_TOOLTIP_CHARS] or box.title)
        out.append(f'    {box.key} [label="{_label(box)}", tooltip="{tooltip}", {style}];')
    out.extend(f"    {parent} -> {child};" for parent, child in picture.edges)
    out.append("}")
    return "\n".join(out) + "\n"
