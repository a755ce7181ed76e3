"""``memtree export`` and ``memtree import``: a namespace as portable JSONL."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from memtree.commands.common import (
    DEFAULT_DB,
    CliError,
    DbOption,
    EmbedderOption,
    JsonOption,
    NamespaceOption,
    cli_errors,
    err,
    namespace_text,
    open_memory,
    print_json,
)


@cli_errors
def export(
    target: Annotated[str, typer.Argument(help="The JSONL file to write (`-`: standard output).")] = "-",
    db: DbOption = DEFAULT_DB,
    namespace: NamespaceOption = "default",
    embedder: EmbedderOption = None,
) -> None:
    """Write the namespace (every node, with its embedding) as JSONL: a human-readable backup."""
    if target != "-" and Path(target).is_dir():
        raise CliError(f"{target} is a folder; give a file name, e.g. {Path(target) / 'memory.jsonl'}")
    with open_memory(db, namespace, embedder) as memory:
        if target == "-":
            lines = memory.export_jsonl(sys.stdout)
            sys.stdout.flush()
        else:
            lines = memory.export_jsonl(target)
        name = namespace_text(memory.namespace)
    where = "standard output" if target == "-" else target
    err.print(f"memtree: exported {lines} lines of {db} [{name}] to {where}", markup=False)


@cli_errors
def import_(
    source: Annotated[str, typer.Argument(help="A JSONL file written by `memtree export` (`-`: standard input).")],
    skip_bad: Annotated[
        bool, typer.Option("--skip-bad", help="Import the good lines and skip (and count) malformed ones.")
    ] = False,
    db: DbOption = DEFAULT_DB,
    namespace: NamespaceOption = "default",
    embedder: EmbedderOption = None,
    as_json: JsonOption = False,
) -> None:
    """Load a JSONL backup (from `memtree export`) into the namespace.

    A malformed line imports nothing (its number is reported) unless --skip-bad is given.
    """
    if source != "-":
        path = Path(source)
        if not path.exists():
            raise CliError(f"{source}: no such file")
        if path.is_dir():
            raise CliError(f"{source} is a folder; give the path of a JSONL file written by `memtree export`")
    with open_memory(db, namespace, embedder, create=True) as memory:
        count = memory.import_jsonl(sys.stdin if source == "-" else source, skip_bad=skip_bad)
        name = namespace_text(memory.namespace)
    if as_json:
        print_json({"imported": count, "db": db, "namespace": name})
        return
    typer.echo(f"Imported {count} records into {db} [{name}].")
