"""The tree as a Mermaid flowchart (GitHub, GitLab, Notion and most Markdown
viewers render it).

Every label is a quoted string in which the characters Mermaid would read as
syntax or markup are written as Mermaid entity codes (``#quot;``, ``#lt;``…), so
any stored text — quotes, brackets, ``<script>``, ``#``, backticks — parses and
shows as written. Box ids are ``n0``, ``n1``… so no text ever becomes syntax.
"""

from __future__ import annotations

from memtree.state import TreeState
from memtree.viz.picture import Direction, check_options, picture_of

_ENTITIES = {
    "#": "#35;",
    '"': "#quot;",
    "&": "#amp;",
    "<": "#lt;",
    ">": "#gt;",
    "`": "#96;",
    "\\": "#92;",
}

_CLASSES = {
    "root": "fill:#1f2937,stroke:#1f2937,color:#ffffff",
    "summary": "fill:#e8f0fe,stroke:#3b6fd8,color:#10213f",
    "leaf": "fill:#ffffff,stroke:#9aa5b1,color:#1f2937",
    "more": "fill:#f5f5f5,stroke:#b0b0b0,color:#555555,stroke-dasharray:4 3",
    "stale": "fill:#fff1f0,stroke:#d93025,color:#5f1410",
}


def escape_mermaid(text: str) -> str:
    """``text`` safe inside a quoted Mermaid label (newlines become spaces)."""
    flat = " ".join(text.splitlines())
    return "".join(_ENTITIES.get(ch, ch) for ch in flat)


def mermaid_of(
    state: TreeState,
    *,
    max_depth: int | None = None,
    width: int = 80,
    line_width: int = 28,
    direction: Direction = "LR",
) -> str:
    """A ``flowchart`` with one box per node: a title (leaf count, or the leaf's
    date) over the first ``width`` characters of its text.

    Paste it into a Markdown file between ```` ```mermaid ```` fences.
    """
    check_options(max_depth, width, line_width, direction)
    picture = picture_of(state, max_depth=max_depth, width=width, line_width=line_width)
    out = [f"flowchart {direction}"]
    for box in picture.boxes:
        label = "<br/>".join([f"<b>{escape_mermaid(box.title)}</b>", *(escape_mermaid(line) for line in box.lines)])
        if box.kind == "root":
            out.append(f'    {box.key}(["{label}"])')
        else:
            out.append(f'    {box.key}["{label}"]')
    out.extend(f"    {parent} --> {child}" for parent, child in picture.edges)
    out.extend(f"    classDef {name} {style}" for name, style in _CLASSES.items())
    groups: dict[str, list[str]] = {}
    for box in picture.boxes:
        groups.setdefault("stale" if box.stale else box.kind, []).append(box.key)
    out.extend(f"    class {','.join(keys)} {name}" for name, keys in groups.items())
    return "\n".join(out) + "\n"
