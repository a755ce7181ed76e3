"""``memtree export`` and ``memtree import``: a namespace as portable JSONL.

Both check their files before touching the memory: ``export`` that it can write its
target (a regular file is written beside it and renamed, so an interrupted export leaves
no half backup; a pipe or a device is written through; see :mod:`memtree.output_file`),
``import`` that it can read its source and that the namespace is empty. An
import that fails leaves no new database behind; the engine's messages are said in
the command line's words (``--skip-bad``, not ``skip_bad=True``).
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Annotated, TextIO

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
    is_postgres,
    namespace_text,
    open_memory,
    print_json,
)
from memtree.commands.files import os_problem, output_problem, remove_new_database
from memtree.commands.sources import cannot_read
from memtree.tree import MemTree

NOT_A_BACKUP = "not a memtree-jsonl backup"


@cli_errors
def export(
    target: Annotated[str, typer.Argument(help="The JSONL file to write (`-`: standard output).")] = "-",
    db: DbOption = DEFAULT_DB,
    namespace: NamespaceOption = "default",
    embedder: EmbedderOption = None,
) -> None:
    """Write the namespace (every node, with its embedding) as JSONL: a human-readable backup."""
    if target != "-":
        problem = output_problem(target, "memory.jsonl", via_temporary=True)
        if problem:
            raise CliError(problem)
    with open_memory(db, namespace, embedder) as memory:
        if target == "-":
            lines = memory.export_jsonl(sys.stdout)
            sys.stdout.flush()
        else:
            try:
                lines = memory.export_jsonl(target)
            except OSError as error:  # the disk filled up, the folder went away…
                raise CliError(os_problem(target, error)) from None
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
    """Load a JSONL backup (from `memtree export`) into the namespace, which must be empty.

    A malformed line imports nothing (its number is reported) unless --skip-bad is given.
    """
    name = "standard input" if source == "-" else source
    stream = open_backup(source)
    try:
        count, into = restore(stream, name, db=db, namespace=namespace, embedder=embedder, skip_bad=skip_bad)
    finally:
        if stream is not sys.stdin:
            stream.close()
    if as_json:
        print_json({"imported": count, "db": db, "namespace": into})
        return
    typer.echo(f"Imported {count} records into {db} [{into}].")


def open_backup(source: str) -> TextIO:
    """The backup to read (``-``: standard input), opened here so a file that cannot
    be read is reported before any database is opened or created."""
    if source == "-":
        return sys.stdin
    try:
        return open(source, encoding="utf-8", newline="")
    except OSError as error:
        raise cannot_read(source, error, "a JSONL file written by `memtree export`") from None


def restore(
    stream: TextIO, source: str, *, db: str, namespace: str, embedder: str | None, skip_bad: bool
) -> tuple[int, str]:
    """Import ``stream`` into the namespace; return the nodes imported and the namespace's name.

    A database file this call creates is removed again if the import fails and
    leaves it holding nothing, so a failed import has no side effect.
    """
    created = not is_postgres(db) and not Path(db).exists()
    discard = False
    try:
        with open_memory(db, namespace, embedder, create=True) as memory:
            try:
                refuse_if_not_empty(memory, db)
                count = import_with_clean_warnings(memory, stream, source, skip_bad)
            except BaseException:
                discard = created and holds_nothing(memory)
                raise
            return count, namespace_text(memory.namespace)
    except BaseException:
        if discard:
            remove_new_database(Path(db))
        raise


def refuse_if_not_empty(memory: MemTree, db: str) -> None:
    """An import fills an empty namespace only (it restores ids, it does not merge)."""
    leaves = len(memory)
    kinds = memory.store.record_kinds(memory.namespace)
    if not leaves and not kinds:
        return
    held = f"{leaves} leaves" + (f" and records ({', '.join(kinds)})" if kinds else "")
    raise CliError(
        f"namespace {namespace_text(memory.namespace)!r} of {db} is not empty ({held}); an import fills an empty "
        "namespace: choose another one with --namespace NAME, or another database with --db NEW.db"
    )


def holds_nothing(memory: MemTree) -> bool:
    try:
        return not memory.namespaces()
    except Exception:  # noqa: BLE001 - cannot tell: keep the file
        return False


def import_with_clean_warnings(memory: MemTree, stream: TextIO, source: str, skip_bad: bool) -> int:
    """``memory.import_jsonl`` with its warnings (skipped lines, another embedder) printed
    as plain ``memtree: warning:`` lines and its errors in the command line's words."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UserWarning)
        try:
            return memory.import_jsonl(stream, skip_bad=skip_bad)
        except UnicodeDecodeError as error:
            raise CliError(
                f"{source} is not UTF-8 text (byte 0x{error.object[error.start]:02x}); a backup written by "
                "`memtree export` is UTF-8: was it converted or edited?"
            ) from None
        except ValueError as error:
            raise CliError(explain_import_error(str(error), source)) from None
        finally:
            for warning in caught:
                if issubclass(warning.category, UserWarning):
                    print_warning(str(warning.message), source)
                else:
                    warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)


def print_warning(message: str, source: str) -> None:
    """One engine warning as plain lines on stderr (no Python source path or line)."""
    lines = message.splitlines() or [""]
    if lines[-1].endswith("these lines were skipped"):
        head, lines = f"skipped bad lines of {source} (--skip-bad):", lines
    else:
        head, lines = lines[0], lines[1:]
        if "embeds with" in head:
            head += " (choose the embedder with --embedder or MEMTREE_EMBEDDER)"
    err.print("\n".join([f"memtree: warning: {head}", *(f"  {line}" for line in lines)]), markup=False)


def explain_import_error(message: str, source: str) -> str:
    """The engine's import error as the command line says it."""
    message = message.replace("pass skip_bad=True", "pass --skip-bad to import the good lines and skip these")
    message = message.replace("skip_bad cannot skip", "--skip-bad cannot skip")
    if NOT_A_BACKUP in message:
        message += (
            "; `memtree import` reads backups written by `memtree export`. To remember the texts of a JSONL "
            f'file (one {{"text": ...}} object per line), use `memtree add --file {source}`'
        )
    return f"{source}: {message}"
