"""``memtree add``: remember texts given as arguments or read from a file."""

from __future__ import annotations

from typing import Annotated, cast

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from memtree.commands.common import (
    DEFAULT_DB,
    CliError,
    DbOption,
    EmbedderOption,
    JsonOption,
    LlmOption,
    NamespaceOption,
    cli_errors,
    err,
    namespace_text,
    open_memory,
    parse_pairs,
    print_json,
)
from memtree.commands.sources import FILE_FORMATS, FileFormat, ReadItems, read_items
from memtree.inputs import Item, make_item
from memtree.tree import MemTree

CHUNK = 32
"""Items per ``add_many`` call: big enough to batch embeddings, small enough for a live progress bar."""

MAX_REPORTED = 20


def report_problems(found: ReadItems, source: str, skip_bad: bool) -> None:
    """Stop on bad lines (nothing stored) unless ``skip_bad``; then only warn."""
    if not found.problems:
        return
    shown = found.problems[:MAX_REPORTED]
    lines = [f"  {source}: {problem}" for problem in shown]
    if len(found.problems) > len(shown):
        lines.append(f"  … and {len(found.problems) - len(shown)} more bad lines")
    if skip_bad:
        err.print(
            f"memtree: skipping {len(found.problems)} bad line(s) of {source} (--skip-bad):",
            markup=False,
        )
        err.print("\n".join(lines), markup=False)
        return
    good = len(found.items)
    raise CliError(
        f"{source} has {len(found.problems)} bad line(s); nothing was added:\n"
        + "\n".join(lines)
        + f"\nFix them, or pass --skip-bad to add the {good} good item(s) and skip these."
    )


def remember(memory: MemTree, items: list[Item], *, show_progress: bool) -> list[str]:
    """Add items in chunks, with a progress bar on stderr when asked."""
    ids: list[str] = []
    progress = Progress(
        TextColumn("[bold]remembering"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("items"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=err,
        disable=not show_progress,
        transient=False,
    )
    with progress:
        task = progress.add_task("add", total=len(items))
        for start in range(0, len(items), CHUNK):
            chunk = items[start : start + CHUNK]
            ids.extend(
                memory.add_many(
                    [item.text for item in chunk],
                    metadata=[item.metadata for item in chunk],
                    timestamps=[item.timestamp for item in chunk],
                    source_ids=[item.source_id for item in chunk],
                )
            )
            progress.advance(task, len(chunk))
    return ids


@cli_errors
def add(
    texts: Annotated[
        list[str] | None, typer.Argument(help="Texts to remember, one item each.", show_default=False)
    ] = None,
    file: Annotated[
        str | None,
        typer.Option(
            "--file",
            "-f",
            help="Read items from FILE (`-` for standard input): plain text or JSONL (see --format).",
            show_default=False,
        ),
    ] = None,
    file_format: Annotated[
        str,
        typer.Option(
            "--format",
            help=(
                "How FILE holds items: `lines` (one per non-blank line), `paragraphs` (blocks separated by blank "
                'lines), `jsonl` (one {"text", "timestamp", "metadata", "source_id"} object per line) or `auto` '
                "(jsonl for .jsonl/.ndjson files, else lines)."
            ),
        ),
    ] = "auto",
    paragraphs: Annotated[bool, typer.Option("--paragraphs", "-p", help="Shorthand for --format paragraphs.")] = False,
    timestamp: Annotated[
        str | None,
        typer.Option("--timestamp", "-t", help="When the events happened (ISO 8601), for every item without one."),
    ] = None,
    meta: Annotated[
        list[str] | None,
        typer.Option("--meta", "-m", help="KEY=VALUE metadata for every item (repeatable; JSON values allowed)."),
    ] = None,
    skip_bad: Annotated[
        bool, typer.Option("--skip-bad", help="Add the good items of a file and skip (and list) its bad lines.")
    ] = False,
    db: DbOption = DEFAULT_DB,
    namespace: NamespaceOption = "default",
    embedder: EmbedderOption = None,
    llm: LlmOption = None,
    as_json: JsonOption = False,
    progress: Annotated[
        bool, typer.Option("--progress/--no-progress", help="Show a progress bar while adding a file.")
    ] = True,
) -> None:
    """Remember texts: `memtree add "Maya adopted a greyhound."` or `memtree add --file notes.jsonl`.

    Every item is checked before anything is stored: a file with a bad line adds
    nothing (the bad lines are listed with their numbers) unless --skip-bad is given.
    """
    if paragraphs:
        if file_format not in ("auto", "paragraphs"):
            raise CliError(f"--paragraphs contradicts --format {file_format}")
        file_format = "paragraphs"
    if file_format not in FILE_FORMATS:
        raise CliError(f"unknown --format {file_format!r}; choose one of {', '.join(FILE_FORMATS)}")
    if not texts and file is None:
        raise CliError('nothing to add: give texts (memtree add "some text") or --file FILE')
    metadata = parse_pairs(meta, "--meta")
    items = [make_item(text, metadata, timestamp) for text in texts or []]
    if file is not None:
        found = read_items(file, cast(FileFormat, file_format), metadata=metadata, timestamp=timestamp)
        report_problems(found, "standard input" if file == "-" else file, skip_bad)
        items.extend(found.items)
    if not items:
        raise CliError("nothing to add: every line was bad and skipped")
    with open_memory(db, namespace, embedder, create=True, llm=llm) as memory:
        before = len(memory)
        ids = remember(memory, items, show_progress=progress and file is not None and not as_json)
        added = len(memory) - before
    repeated = len(items) - added
    if as_json:
        print_json({"added": added, "already_remembered": repeated, "ids": ids})
        return
    note = f" ({repeated} already remembered)" if repeated else ""
    where = f"{db} [{namespace_text(memory.namespace)}]"
    typer.echo(f"Remembered {added} new item{'s' if added != 1 else ''}{note} in {where}.")
