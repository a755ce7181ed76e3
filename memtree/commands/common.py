"""What every ``memtree`` command shares: the database and namespace options,
opening the memory, ``KEY=VALUE`` arguments, and the error boundary.

The boundary turns the errors a user can cause (a missing file, a malformed
line, a database of another program, a bad option value) into one clear line on
stderr and exit status 1, never a traceback. Anything else is a bug: it is
reported the same way with a hint, and ``memtree --verbose`` shows its traceback.
A reader that goes away (``memtree export | head``) ends the command quietly,
as it ends ``cat``.

SQLite's own errors carry no file name, so :func:`open_memory`, which knows the
file, turns them into messages naming it: read-only, damaged, full disk.
"""

from __future__ import annotations

import functools
import json
import os
import re
import sqlite3
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, ParamSpec, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from memtree.commands.files import (
    empty_file_problem,
    is_corrupt,
    needs_write_access,
    read_problem,
    sqlite_problem,
    write_problem,
)
from memtree.embed import Embedder, HashingEmbedder
from memtree.model_choice import EmbedderMismatchError
from memtree.models.openai import MissingAPIKeyError
from memtree.models.resolve import resolve_embedder
from memtree.retry import ModelResponseError
from memtree.store.base import NamespaceKey, Store, namespace_key
from memtree.store.migrations import IncompatibleStoreError
from memtree.store.postgres import PostgresBackend
from memtree.store.sqlite import ReadOnlySQLiteBackend
from memtree.tree import MemTree
from memtree.viz.graphviz import GraphvizNotFoundError

P = ParamSpec("P")
R = TypeVar("R")

DEFAULT_DB = "memtree.db"

DbOption = Annotated[
    str,
    typer.Option(
        "--db",
        envvar="MEMTREE_DB",
        help="The memory: a SQLite file (created by `add` and `import`) or a postgresql:// DSN.",
        show_default=True,
    ),
]
NamespaceOption = Annotated[
    str,
    typer.Option(
        "--namespace",
        "-n",
        envvar="MEMTREE_NAMESPACE",
        help="Which tree in the database (one per user, session, agent…); `users/alice` is a nested namespace.",
    ),
]
EmbedderOption = Annotated[
    str | None,
    typer.Option(
        "--embedder",
        envvar="MEMTREE_EMBEDDER",
        help=(
            "Embedding model: `local` (all-MiniLM-L6-v2, offline), `local:NAME_OR_PATH` (a sentence-transformers "
            "model), `openai[:MODEL]` (needs OPENAI_API_KEY), or `hashing[:DIM]` (instant, NOT semantic: for "
            "trials and tests). Default: the one that built the memory (its stored name), or `local` for a new "
            "one; OPENAI_API_KEY alone never chooses OpenAI."
        ),
        show_default=False,
    ),
]
LlmOption = Annotated[
    str | None,
    typer.Option(
        "--llm",
        envvar="MEMTREE_LLM",
        help=(
            "Summary writer: `openai[:MODEL]` (needs OPENAI_API_KEY) or `llama-cpp:PATH` (a local .gguf model run in "
            "process; experimental, needs the `llamacpp` extra; replies failing a guard fall back to the offline "
            "summary). Default: offline extractive summaries (OPENAI_API_KEY alone never chooses OpenAI)."
        ),
        show_default=False,
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]

_state = {"verbose": False}
err = Console(stderr=True, highlight=False, soft_wrap=True)


class CliError(Exception):
    """An expected failure: shown as one line on stderr, exit status ``code``."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def set_verbose(verbose: bool) -> None:
    _state["verbose"] = verbose


EXPECTED_ERRORS: tuple[type[BaseException], ...] = (
    ValueError,  # bad values, malformed files, incompatible databases (IncompatibleStoreError is one)
    TypeError,
    KeyError,
    OSError,  # files and folders, sockets (PostgreSQL)
    TimeoutError,
    GraphvizNotFoundError,
    MissingAPIKeyError,
    ModelResponseError,  # a model that kept failing after retries
    ImportError,  # an optional dependency (psycopg, openai…) that is not installed
)
SERVICE_MODULES = ("openai", "httpx", "psycopg", "psycopg_pool")
"""Errors raised by these clients (refused connections, bad credentials, server errors)
come from the user's environment, not from a bug in memtree."""


def _expected(error: BaseException) -> bool:
    if isinstance(error, EXPECTED_ERRORS):
        return True
    return type(error).__module__.split(".")[0] in SERVICE_MODULES


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print ``memtree: error: message`` on stderr and return the exit to raise."""
    err.print(f"[bold red]memtree: error:[/] {escape(message)}")
    return typer.Exit(code)


EMBEDDER_MISMATCH = "use the embedder this memory was built with"


def _describe(error: BaseException) -> str:
    if isinstance(error, EmbedderMismatchError):
        hashing = re.fullmatch(r"HashingEmbedder\((\d+)\)", error.stored)
        spec = f"hashing:{hashing[1]}" if hashing else error.spec
        how = f"--embedder {spec}" if spec else "--embedder naming the model that built it"
        return (
            f"this memory was built with {error.stored}, but --embedder is {error.given}: their vectors cannot be "
            f"compared; leave --embedder (and MEMTREE_EMBEDDER) out to use the stored one, or pass {how}"
        )
    message = str(error.args[0]) if isinstance(error, KeyError) and error.args else str(error)
    if EMBEDDER_MISMATCH in message:
        message += " (choose it with --embedder or MEMTREE_EMBEDDER)"
    return message or type(error).__name__


BROKEN_PIPE_STATUS = 141
"""128 + SIGPIPE (13): the status of a Unix tool killed by SIGPIPE when its reader goes away."""


def _stdout_gone() -> typer.Exit:
    """The reader of standard output went away: stop without a word, as ``cat`` does.

    Standard output is pointed at ``/dev/null`` so Python's flush at exit does not
    hit the broken pipe again and print a warning.
    """
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no real file descriptor (an in-process test runner)
        pass
    return typer.Exit(BROKEN_PIPE_STATUS)


def cli_errors(command: Callable[P, R]) -> Callable[P, R]:
    """Run a command inside the error boundary described in the module docstring."""

    @functools.wraps(command)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            result = command(*args, **kwargs)
            sys.stdout.flush()  # a closed pipe shows here, inside the boundary, not at exit
            return result
        except (typer.Exit, typer.Abort, KeyboardInterrupt):
            raise
        except BrokenPipeError:
            raise _stdout_gone() from None
        except CliError as error:
            raise fail(str(error), error.code) from None
        except Exception as error:  # noqa: BLE001 - the boundary: a bug still gets a clear report
            if _expected(error):
                if _state["verbose"]:
                    err.print_exception()
                raise fail(_describe(error)) from None
            if _state["verbose"]:
                err.print_exception()
                raise typer.Exit(1) from None
            raise fail(
                f"unexpected {type(error).__name__}: {_describe(error)} "
                "(this is a bug in memtree; run `memtree --verbose …` to see the traceback and please report it)"
            ) from None

    return run


def parse_namespace(text: str) -> NamespaceKey:
    """``alice`` -> ``("alice",)``; ``users/alice`` -> ``("users", "alice")``;
    ``a\\/b`` -> ``("a/b",)`` (a ``/`` inside a part is written ``\\/``, a
    backslash before ``/`` or ``\\`` as ``\\\\``), the form :func:`namespace_text` prints."""
    parts = [""]
    position = 0
    while position < len(text):
        char = text[position]
        if char == "\\" and text[position + 1 : position + 2] in ("/", "\\"):
            parts[-1] += text[position + 1]
            position += 2
            continue
        if char == "/":
            parts.append("")
        else:
            parts[-1] += char
        position += 1
    return namespace_key(tuple(parts))


def namespace_text(key: NamespaceKey) -> str:
    """A namespace as ``--namespace`` takes it: parts joined by ``/``, so that the
    one-part ``"a/b"`` (shown ``a\\/b``) and ``("a", "b")`` (shown ``a/b``) differ."""
    return "/".join(part.replace("\\", "\\\\").replace("/", "\\/") for part in key)


def parse_embedder(spec: str | None) -> Embedder | None:
    """The embedder an ``--embedder`` value names (``None``: memtree's default).

    ``hashing[:DIM]`` is handled here; every other name (``local[:MODEL]``,
    ``openai[:MODEL]``) goes to the engine's resolver, so the CLI accepts exactly
    the names ``MemTree(embedder=...)`` does.
    """
    if spec is None or not spec.strip():
        return None
    kind, _, argument = spec.strip().partition(":")
    if kind == "hashing":
        if not argument:
            return HashingEmbedder()
        if not argument.isdigit():
            raise CliError(f"--embedder hashing:DIM needs a whole number of dimensions, got {argument!r}")
        return HashingEmbedder(int(argument))
    try:
        return resolve_embedder(spec.strip())
    except TypeError:
        raise CliError(
            f"unknown --embedder {spec!r}; use local, local:MODEL, openai, openai:MODEL, hashing or hashing:DIM"
        ) from None


LLM_SCHEMES = ("openai", "llama-cpp")


def parse_llm(spec: str | None) -> str | None:
    """The ``--llm`` value checked against the names the engine resolves (``None``:
    memtree's default); the model itself is made by ``MemTree(llm=...)``."""
    if spec is None or not spec.strip():
        return None
    kind, _, argument = spec.strip().partition(":")
    if kind not in LLM_SCHEMES:
        raise CliError(f"unknown --llm {spec!r}; use openai, openai:MODEL or llama-cpp:PATH_TO_GGUF")
    if kind == "llama-cpp" and not argument.strip():
        raise CliError("--llm llama-cpp needs the model file: --llm llama-cpp:/path/to/model.gguf")
    return spec.strip()


def parse_pairs(pairs: list[str] | None, option: str) -> dict[str, Any]:
    """``["speaker=Maya", "session=3"]`` -> ``{"speaker": "Maya", "session": 3}``.

    A value that reads as JSON (a number, ``true``, ``null``, a quoted string, a
    list) is taken as that JSON value; anything else is a string.
    """
    out: dict[str, Any] = {}
    for pair in pairs or []:
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip():
            raise CliError(f"{option} takes KEY=VALUE, got {pair!r}")
        try:
            value: Any = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        out[key.strip()] = value
    return out


def is_postgres(db: str) -> bool:
    return db.lower().startswith(("postgresql://", "postgres://"))


@contextmanager
def open_memory(
    db: str,
    namespace: str,
    embedder: str | None = None,
    *,
    create: bool = False,
    writes: bool = False,
    llm: str | None = None,
    read_only: bool = False,
) -> Iterator[MemTree]:
    """The memory at ``db`` (closed afterwards), writing summaries with ``llm`` (an
    ``--llm`` value) when given.

    Without ``create``, a SQLite file that does not exist is an error rather than
    a new empty database, so a mistyped ``--db`` is caught. A command that changes
    the memory says so with ``writes`` (``create`` implies it): it is refused with a
    clear message when the file or its folder is read-only for the user. A command
    that only reads refuses an empty (0-byte) file, which opening would turn into a
    memory, and opens a read-only file read-only (see
    :mod:`memtree.store.sqlite`), so it works and leaves nothing behind.
    SQLite's errors inside the block are reported naming ``db``. ``read_only``
    opens a SQLite file read-only whatever its permissions (a command that must
    never write, such as ``check``).
    """
    key = parse_namespace(namespace)
    if not is_postgres(db):
        path = Path(db)
        if not create and not path.exists():
            raise CliError(
                f"no memory at {db} (the file does not exist); add something first with `memtree add`, "
                "or point --db (or MEMTREE_DB) at your memory"
            )
        if path.is_dir():
            raise CliError(f"{db} is a folder; --db takes the path of a memory file, e.g. {path / DEFAULT_DB}")
        unreadable = read_problem(path) if path.exists() else None
        if unreadable:
            raise CliError(unreadable)
        empty = None if create else empty_file_problem(path, reading=not writes)
        if empty:
            raise CliError(empty)
        unwritable = write_problem(path)
        if unwritable and (create or writes):
            raise CliError(needs_write_access(unwritable) if path.exists() else unwritable)
        read_only = read_only or unwritable is not None
    chosen = parse_embedder(embedder)
    options: dict[str, Any] = {"namespace": key}
    if chosen is not None:
        options["embedder"] = chosen
    chosen_llm = parse_llm(llm)
    if chosen_llm is not None:
        options["llm"] = chosen_llm
    with sqlite_errors_named(db):
        memory, store = _open(db, options, read_only=read_only)
        try:
            yield memory
        finally:
            memory.close()
            if store is not None:
                store.close()


def _open(db: str, options: dict[str, Any], *, read_only: bool) -> tuple[MemTree, Store | None]:
    """The memory, and the store to close after it when the memory does not own it."""
    if not read_only:
        return MemTree.open(db, **options), None
    store: Store = PostgresBackend(db, read_only=True) if is_postgres(db) else ReadOnlySQLiteBackend(db)
    try:
        return MemTree(store=store, **options), store
    except BaseException:
        store.close()
        raise


@contextmanager
def sqlite_errors_named(db: str) -> Iterator[None]:
    """SQLite's errors about the memory ``db`` (read-only, damaged, full disk…) as
    :class:`CliError` naming it; any other SQLite error is left to the boundary (a bug)."""
    try:
        yield
    except sqlite3.Error as error:
        problem = sqlite_problem(db, error)
        if problem is None:
            raise
        raise CliError(problem) from None
    except IncompatibleStoreError as error:
        # The file check calls any file SQLite cannot read "not a memtree memory"; when
        # SQLite found a damaged database, saying so points to the right fix.
        cause = error.__cause__ or error.__context__
        if isinstance(cause, sqlite3.DatabaseError) and is_corrupt(cause):
            raise CliError(sqlite_problem(db, cause) or str(error)) from None
        raise


def print_json(data: Any) -> None:
    """JSON on stdout (UTF-8, not ASCII-escaped), one document."""
    sys.stdout.write(json.dumps(data, ensure_ascii=False, indent=2, default=str) + "\n")
