"""The files a command touches, and what to tell the user when it cannot.

Each check returns a message naming the file and the fix, or ``None`` when all is
well; the caller raises it (``CliError``) so nothing here depends on the command
layer. Checks run before the work, so a command that cannot finish changes nothing:
no half-written output, no new empty database.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from memtree.output_file import resolved_target, writes_through

READ_COMMANDS = "`memtree query`, `show`, `stats` and `export`"
"""The commands that read a memory without changing it (they work on a read-only file)."""

FIX_COMMANDS = "`memtree repair` and `compact`"
"""The commands that change a memory that must already exist (they never make one)."""


def folder_of(path: Path) -> Path:
    return path.parent if str(path.parent) else Path(".")


def _writable_folder(folder: Path) -> bool:
    return os.access(folder, os.W_OK | os.X_OK)


def read_problem(path: Path) -> str | None:
    """Why the existing memory file ``path`` cannot be read by this user, if it cannot."""
    if not os.access(path, os.R_OK):
        return f"cannot read {path}: permission denied; check the file's permissions (ls -l {path})"
    return None


def empty_file_problem(path: Path, *, reading: bool = True) -> str | None:
    """Why a command that only reads (or, with ``reading=False``, one that changes an
    existing memory: ``repair``, ``compact``) refuses ``path``: it is an existing,
    empty (0-byte) file.

    SQLite takes such a file for an empty database and memtree would create its
    tables in it, so a mistyped ``--db`` (or a file ``touch`` made) would be written
    to by a command that promises to read. A WAL beside it with content means the
    memory lives there until a checkpoint: that file is not empty.
    """
    try:
        if not path.is_file() or path.stat().st_size:
            return None
        wal = path.with_name(path.name + "-wal")
        if wal.exists() and wal.stat().st_size:
            return None
    except OSError:
        return None
    what = f"{READ_COMMANDS} only read a memory" if reading else f"{FIX_COMMANDS} only work on an existing memory"
    return (
        f"{path}: empty file, not a memtree database (0 bytes); {what}, so they left it as it is. Point --db "
        "(or MEMTREE_DB) at your memory, or make this file one with `memtree add` or `memtree import`"
    )


def write_problem(path: Path) -> str | None:
    """Why this user cannot write the SQLite memory at ``path`` (or create it), if they cannot.

    SQLite writes ``NAME-wal`` and ``NAME-shm`` beside the memory, so its folder must
    be writable too, unless those files already exist and are writable.
    """
    folder = folder_of(path)
    if not path.exists():
        if folder.is_dir() and not _writable_folder(folder):
            return (
                f"cannot create {path}: the folder {folder} is read-only for you; "
                "choose a --db in a folder you can write to"
            )
        return None
    if not os.access(path, os.W_OK):
        return f"cannot write to {path}: the file is read-only for you"
    if _writable_folder(folder):
        return None
    sidecars = [path.with_name(path.name + suffix) for suffix in ("-wal", "-shm")]
    if all(os.access(sidecar, os.W_OK) for sidecar in sidecars):
        return None
    return (
        f"cannot write to {path}: its folder {folder} is read-only for you, and SQLite writes "
        f"{sidecars[0].name} and {sidecars[1].name} beside the memory"
    )


def needs_write_access(problem: str) -> str:
    """``problem`` (from :func:`write_problem`) said to a command that changes the memory."""
    return f"{problem}. This command changes the memory, so it needs write access; {READ_COMMANDS} can read it as is."


def is_corrupt(error: sqlite3.Error) -> bool:
    """Whether SQLite found the database file damaged."""
    return (getattr(error, "sqlite_errorname", "") or "").startswith("SQLITE_CORRUPT")


def sqlite_problem(db: str, error: sqlite3.Error) -> str | None:
    """SQLite's error about the memory ``db`` in words naming the file and the fix;
    ``None`` for an error that is not about the file (a bug)."""
    name = getattr(error, "sqlite_errorname", "") or ""
    if name.startswith("SQLITE_READONLY"):
        return (
            f"cannot write to {db}: SQLite says it is read-only ({error}); check the permissions of the file and "
            f"its folder. Adding, importing and repairing need write access; {READ_COMMANDS} can read it as it is."
        )
    if is_corrupt(error) or name == "SQLITE_NOTADB":
        return (
            f"{db} is damaged ({error}); memtree cannot read it. Restore it from a backup "
            "(`memtree import BACKUP.jsonl --db NEW.db`), or from an undamaged copy of the file "
            "(`memtree export BACKUP.jsonl --db COPY.db`, then import that)."
        )
    if name.startswith("SQLITE_FULL"):
        return f"cannot write to {db}: the disk is full; free some space and run the command again"
    if name.startswith("SQLITE_IOERR"):
        return f"cannot read or write {db}: input/output error ({error}); check the disk and the file"
    if name.startswith("SQLITE_CANTOPEN"):
        return f"cannot open {db} ({error}); check that the file and its folder exist and that you may use them"
    if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
        return f"{db} is locked by another program ({error}); try again when it is done"
    return None


def remove_new_database(path: Path) -> None:
    """Delete a SQLite file this command created (and SQLite's files beside it)."""
    for sidecar in ("", "-wal", "-shm", "-journal"):
        path.with_name(path.name + sidecar).unlink(missing_ok=True)


def output_problem(target: str, example: str, *, via_temporary: bool = False) -> str | None:
    """Why the output file ``target`` cannot be written, checked before any work.

    ``via_temporary``: a regular file is written beside ``target`` (beside the file
    a symbolic link points to) and renamed over it, so that folder must be writable
    even when ``target`` exists; a pipe or a device is written through and needs
    only to be writable itself (see :mod:`memtree.output_file`). ``example`` is a
    file name to suggest when ``target`` is a folder.
    """
    path = Path(target)
    if path.is_dir():
        return f"{target} is a folder; give a file name, e.g. {path / example}"
    if writes_through(path):
        if not os.access(path, os.W_OK):
            return f"cannot write {target}: it is read-only for you"
        return None
    real = resolved_target(path)
    folder = folder_of(real)
    if not folder.is_dir():
        return f"cannot write {target}: the folder {folder} does not exist (create it first)"
    if real.exists() and not os.access(real, os.W_OK):
        return f"cannot write {target}: the file is read-only for you"
    if (via_temporary or not real.exists()) and not _writable_folder(folder):
        return f"cannot write {target}: the folder {folder} is read-only for you"
    return None


def os_problem(target: str, error: OSError) -> str:
    """An OS error met while writing ``target``, naming ``target`` (not a temporary file)."""
    return f"cannot write {target}: {error.strerror or error}"
