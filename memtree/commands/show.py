"""``memtree show``: the tree as text, Mermaid, DOT, HTML, PNG or SVG."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, cast

import typer

from memtree import viz
from memtree.commands.common import (
    DEFAULT_DB,
    CliError,
    DbOption,
    EmbedderOption,
    NamespaceOption,
    cli_errors,
    err,
    open_memory,
)
from memtree.commands.files import os_problem, output_problem
from memtree.tree import MemTree
from memtree.viz.picture import DIRECTIONS, Direction

FORMATS = ("text", "mermaid", "dot", "html", "png", "svg")
SUFFIXES = {".txt": "text", ".mmd": "mermaid", ".mermaid": "mermaid", ".dot": "dot", ".gv": "dot"}
SUFFIXES.update({".html": "html", ".htm": "html", ".png": "png", ".svg": "svg"})
BIG_PICTURE = 400
"""Boxes beyond which a Graphviz picture gets a hint to pass --depth."""
MERMAID_MAX_EDGES = 500
MERMAID_MAX_TEXT = 50_000
"""Mermaid's default ``maxEdges`` and ``maxTextSize``: beyond them renderers (GitHub's too) refuse a diagram."""


def choose_format(chosen: str | None, out: str | None) -> str:
    """The format asked for, else the one ``--out``'s suffix names, else text."""
    if chosen is not None:
        if chosen not in FORMATS:
            raise CliError(f"unknown --format {chosen!r}; choose one of {', '.join(FORMATS)}")
        return chosen
    if out is not None and out != "-":
        return SUFFIXES.get(Path(out).suffix.lower(), "text")
    return "text"


def draw(
    memory: MemTree,
    picture: str,
    *,
    depth: int | None,
    width: int | None,
    direction: str,
    queries: list[str],
    k: int | None,
) -> str | bytes:
    """The picture in ``picture`` format (bytes for PNG)."""
    if queries and picture != "html":
        raise CliError("--query highlights retrieved nodes in the HTML view only; add --format html")
    way = cast(Direction, direction)
    if picture == "text":
        return memory.format_tree(max_depth=depth, width=width or 72) + "\n"
    if picture == "html":
        return viz.to_html(memory, queries=queries, k=k, expand_depth=depth or 1)
    box_width = width or 80
    if picture == "mermaid":
        return viz.to_mermaid(memory, max_depth=depth, width=box_width, direction=way)
    if picture == "dot":
        return viz.to_dot(memory, max_depth=depth, width=box_width, direction=way)
    if picture == "png":
        return viz.to_png(memory, max_depth=depth, width=box_width, direction=way)
    return viz.to_svg(memory, max_depth=depth, width=box_width, direction=way)


@cli_errors
def show(
    picture_format: Annotated[
        str | None,
        typer.Option(
            "--format",
            help=(
                "text (an outline), mermaid, dot (Graphviz), html (a page to browse), png or svg (drawn by Graphviz). "
                "Default: from --out's suffix, else text."
            ),
            show_default=False,
        ),
    ] = None,
    depth: Annotated[
        int | None,
        typer.Option(
            "--depth",
            "-d",
            min=1,
            help="Deepest level drawn (text, mermaid, dot, png, svg); for html, how deep the page opens (default 1).",
        ),
    ] = None,
    out: Annotated[
        str | None,
        typer.Option("--out", "-o", help="Write to this file instead of standard output.", show_default=False),
    ] = None,
    width: Annotated[
        int | None, typer.Option("--width", min=8, help="Characters of each node's text shown (72 text, 80 boxes).")
    ] = None,
    direction: Annotated[
        str, typer.Option("--direction", help="Boxes left to right (LR) or top down (TB), for mermaid/dot/png/svg.")
    ] = "LR",
    query: Annotated[
        list[str] | None,
        typer.Option(
            "--query",
            "-q",
            help="html: answer this query with the real retriever now and highlight its results (repeatable).",
        ),
    ] = None,
    k: Annotated[int | None, typer.Option("-k", min=1, help="html: results per --query (default 10).")] = None,
    db: DbOption = DEFAULT_DB,
    namespace: NamespaceOption = "default",
    embedder: EmbedderOption = None,
) -> None:
    """Draw the tree: `memtree show`, `memtree show --out tree.html`, `memtree show --format png -o tree.png`."""
    picture = choose_format(picture_format, out)
    if direction not in DIRECTIONS:
        raise CliError(f"unknown --direction {direction!r}; choose one of {', '.join(DIRECTIONS)}")
    to_file = out is not None and out != "-"
    if picture == "png" and not to_file and sys.stdout.isatty():
        raise CliError("a PNG is binary: pass --out tree.png (or redirect standard output to a file)")
    if out is not None and to_file:
        problem = output_problem(out, f"tree.{picture}")
        if problem:  # checked before drawing, which can take a while
            raise CliError(problem)
    with open_memory(db, namespace, embedder) as memory:
        drawing = draw(memory, picture, depth=depth, width=width, direction=direction, queries=query or [], k=k)
        nodes = memory.stats().nodes
        drawn = nodes if depth is None or picture == "html" else drawn_nodes(memory, depth)
    if picture == "mermaid" and isinstance(drawing, str):
        edges = drawing.count(" --> ")
        if edges > MERMAID_MAX_EDGES or len(drawing) > MERMAID_MAX_TEXT:
            err.print(
                f"memtree: this Mermaid has {edges} edges and {len(drawing)} characters; Mermaid renders at most "
                f"{MERMAID_MAX_EDGES} edges and {MERMAID_MAX_TEXT} characters by default: pass --depth N",
                markup=False,
            )
    elif picture in ("dot", "png", "svg") and depth is None and nodes > BIG_PICTURE:
        err.print(f"memtree: the picture has {nodes} boxes; pass --depth N to draw the top levels only", markup=False)
    data = drawing.encode("utf-8") if isinstance(drawing, str) else drawing
    if out is None or not to_file:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
        return
    try:
        Path(out).write_bytes(data)
    except OSError as error:
        raise CliError(os_problem(out, error)) from None
    what = f"{drawn} nodes" if drawn == nodes else f"{drawn} of {nodes} nodes (down to depth {depth})"
    err.print(f"memtree: wrote the {picture} picture of {what} to {out}", markup=False)


def drawn_nodes(memory: MemTree, depth: int) -> int:
    """The nodes a picture cut at ``depth`` shows (the root not counted, as in ``stats``)."""
    return sum(1 for node in memory.walk() if 1 <= node.depth <= depth)
