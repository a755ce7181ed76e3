"""``memtree query``: what the memory retrieves for a question, as a table or JSON."""

from __future__ import annotations

from typing import Annotated, Literal

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from memtree.commands.common import (
    DEFAULT_DB,
    CliError,
    DbOption,
    EmbedderOption,
    JsonOption,
    NamespaceOption,
    cli_errors,
    open_memory,
    parse_pairs,
    print_json,
)
from memtree.config import RETRIEVAL_MODES
from memtree.node import RetrievedNode
from memtree.text import preview
from memtree.viz.html import moment


def hit_record(rank: int, hit: RetrievedNode) -> dict[str, object]:
    """One result as JSON-ready data."""
    return {
        "rank": rank,
        "id": hit.id,
        "score": round(hit.score, 6),
        "similarity": None if hit.similarity is None else round(hit.similarity, 6),
        "depth": hit.depth,
        "is_leaf": hit.is_leaf,
        "leaves": len(hit.leaf_ids),
        "timestamp": hit.timestamp,
        "time": moment(hit.timestamp),
        "text": hit.text,
        "context": hit.context,
        "metadata": hit.metadata,
        "source_id": hit.source_id,
    }


def results_table(hits: list[RetrievedNode], width: int, full: bool) -> Table:
    table = Table(show_lines=full, header_style="bold")
    table.add_column("#", justify="right", style="dim")
    table.add_column("score", justify="right")
    table.add_column("depth", justify="right")
    table.add_column("kind")
    table.add_column("time", no_wrap=True)
    table.add_column("text", overflow="fold")
    for rank, hit in enumerate(hits, start=1):
        kind = "leaf" if hit.is_leaf else f"summary of {len(hit.leaf_ids)}"
        text = hit.text if full else preview(hit.text, width)
        table.add_row(str(rank), f"{hit.score:.3f}", str(hit.depth), kind, moment(hit.timestamp) or "", escape(text))
    return table


def parse_floor(text: str) -> float | Literal["auto"] | None:
    """A ``--min-similarity`` value: ``auto``, ``none`` or a number."""
    word = text.strip().lower()
    if word in ("auto", "none"):
        return "auto" if word == "auto" else None
    try:
        return float(word)
    except ValueError:
        raise CliError(f"--min-similarity takes auto, none or a number, got {text!r}") from None


@cli_errors
def query(
    question: Annotated[str, typer.Argument(help="What to look for (a question or a few words).", show_default=False)],
    k: Annotated[int | None, typer.Option("-k", help="At most this many results (default: the config's 10).")] = None,
    budget: Annotated[
        int | None,
        typer.Option("--budget", help="Stop when the results' context reaches this many tokens (the last is cut)."),
    ] = None,
    mode: Annotated[
        str | None,
        typer.Option("--mode", help="`collapsed` (score every node at once) or `traversal` (descend from the root)."),
    ] = None,
    leaves_only: Annotated[bool, typer.Option("--leaves-only", help="Only leaves, no summaries.")] = False,
    where: Annotated[
        list[str] | None,
        typer.Option("--where", help="KEY=VALUE: only leaves whose metadata has this value (repeatable)."),
    ] = None,
    min_similarity: Annotated[
        str,
        typer.Option(
            "--min-similarity",
            help=(
                "Relevance floor: leave out results whose cosine similarity to the question is below it. `auto`: "
                "the floor calibrated for the memory's embedder (0.3 for the offline model), as MemTree.retrieve "
                "applies it; `none`: no floor; or a number."
            ),
        ),
    ] = "auto",
    full: Annotated[bool, typer.Option("--full", help="Show each result's full text, not a preview.")] = False,
    width: Annotated[int, typer.Option("--width", help="Characters of text per result in the table.")] = 160,
    db: DbOption = DEFAULT_DB,
    namespace: NamespaceOption = "default",
    embedder: EmbedderOption = None,
    as_json: JsonOption = False,
) -> None:
    """Ask the memory: a table of results with score, depth, leaf or summary, time and text."""
    if not question.strip():
        raise CliError('the query is empty; give some words to look for, e.g. memtree query "Where does Maya work?"')
    if mode is not None and mode not in RETRIEVAL_MODES:
        raise CliError(f"unknown --mode {mode!r}; choose one of {', '.join(RETRIEVAL_MODES)}")
    if width < 8:
        raise CliError(f"--width must be at least 8, got {width}")
    filters = parse_pairs(where, "--where")
    floor = parse_floor(min_similarity)
    with open_memory(db, namespace, embedder) as memory:
        size = len(memory)
        hits = memory.retrieve(
            question,
            k=k,
            token_budget=budget,
            mode=mode,
            leaves_only=leaves_only,
            where=filters or None,
            min_similarity=floor,
        )
    if as_json:
        print_json([hit_record(rank, hit) for rank, hit in enumerate(hits, start=1)])
        return
    if not hits:
        if size == 0:
            typer.echo("No results: this memory is empty.")
        else:
            typer.echo(
                "No results: nothing stored is similar enough to the question (--min-similarity none shows all)."
            )
        return
    Console(highlight=False).print(results_table(hits, width, full))
