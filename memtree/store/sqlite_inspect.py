"""Whose is this SQLite file, and at which schema version? Answered without writing.

``SQLiteBackend`` asks before it opens a file for writing, because a normal SQLite
connection changes files merely by opening and closing: it rebuilds ``-shm``,
checkpoints the ``-wal`` into the main file and deletes both. A file memtree
refuses must keep every byte of the main file, ``-wal`` and ``-shm``, so the
check reads it in whichever way cannot write:

* a ``-wal`` with content and a ``-shm``: ``mode=ro&readonly_shm=1``. SQLite opens
  ``-shm`` read-only; when no other process has the file open it builds the WAL
  index in private memory from the ``-wal`` (a plain ``mode=ro`` open would
  rebuild ``-shm`` in place). Commits still in the ``-wal`` are seen.
* a ``-wal`` with content and no ``-shm``: a copy of both in a temporary folder
  (any open of the original would create ``-shm`` beside it). Rare: ``-shm``
  only goes missing when files are copied by hand.
* no ``-wal``: ``immutable=1``; the main file holds every commit. Such a read
  takes no lock, so a refusal is confirmed by a second read, chosen afresh.

The file's bytes are only ever read through SQLite: closing any other descriptor
of a database file drops every POSIX lock this process holds on it, including
those of the process's own open stores (SQLite keeps its descriptors open until
its locks are gone). The copy above is the exception, made only when no ``-shm``
shows that no connection has the file open in WAL mode.

A file is memtree's when it is empty, or is a SQLite database whose
``application_id`` is memtree's (or unset), whose ``user_version`` is unset, and
whose schema objects are exactly those memtree's migrations create (SQLite's own
``sqlite_*`` objects aside). Anything else is refused with
:class:`IncompatibleStoreError` naming what was found.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import sqlite3
import tempfile
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import quote

from memtree.store import migrations
from memtree.store.migrations import SCHEMA_TABLE, IncompatibleStoreError, Migration

APPLICATION_ID = 0x4D454D54
"""``PRAGMA application_id`` of memtree files ("MEMT"), so tools like ``file`` can tell them apart."""

_CREATED = re.compile(r"CREATE\s+(?:UNIQUE\s+)?(?:TABLE|INDEX|VIEW|TRIGGER)\s+(?:IF\s+NOT\s+EXISTS\s+)?(\w+)", re.I)
_MAX_SHOWN = 5


def inspect(path: Path, steps: Sequence[Migration]) -> int | None:
    """The schema version of the memtree file at ``path``; ``None`` for a new memory
    (no file, an empty file, a database without objects).

    Raises :class:`IncompatibleStoreError` for anything memtree must not write to
    (``steps`` are the backend's migrations: they say which objects are memtree's
    and which version is the latest), and ``FileNotFoundError`` /
    ``IsADirectoryError`` for paths that cannot be a file.
    """
    if not path.exists():
        if not path.parent.exists():
            raise FileNotFoundError(f"cannot create {path}: the folder {path.parent} does not exist")
        return None
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a folder; give the path of a memory file, e.g. {path / 'memory.db'}")
    if path.stat().st_size == 0:
        return None
    try:
        return _read(path, steps)
    except IncompatibleStoreError:
        # An immutable read takes no lock, so a checkpoint running in another process
        # can tear it, and a -wal seen a moment ago may be gone; a refusal stands
        # only if a second read, chosen afresh, agrees.
        return _read(path, steps)


def schema_version(connection: sqlite3.Connection, path: Path, steps: Sequence[Migration]) -> int | None:
    """The memtree schema version of an open database; ``None`` if it holds no objects.

    Refuses another application's database, a newer memtree schema (version check
    first: a newer memtree may have made objects this one does not know) and a
    memtree file that also holds objects memtree did not make.
    """
    try:
        application_id = int(connection.execute("PRAGMA application_id").fetchone()[0])
        user_version = int(connection.execute("PRAGMA user_version").fetchone()[0])
        objects = [
            (str(kind), str(name))
            for kind, name in connection.execute("SELECT type, name FROM sqlite_master ORDER BY type, name")
            if not str(name).startswith("sqlite_")  # SQLite's own (sqlite_sequence, autoindexes, statistics)
        ]
    except sqlite3.DatabaseError as error:
        raise _unreadable(path, str(error)) from None
    if application_id not in (0, APPLICATION_ID):
        raise _foreign(path, f"application_id {application_id:#010x}; memtree's is {APPLICATION_ID:#010x}")
    if user_version != 0:
        raise _foreign(path, f"user_version {user_version}, which memtree never sets")
    if not objects:
        return None
    if SCHEMA_TABLE not in {name for kind, name in objects if kind == "table"}:
        raise _foreign(path, _listed(objects))
    try:
        version = migrations.current_version(connection)
    except sqlite3.DatabaseError as error:
        raise _foreign(path, f"a {SCHEMA_TABLE} table memtree cannot read: {error}") from None
    migrations.pending(steps, version, str(path))  # refuses a newer schema
    ours = memtree_objects(steps)
    strangers = [(kind, name) for kind, name in objects if name not in ours]
    if strangers:
        raise IncompatibleStoreError(
            f"{path} holds memtree's tables but also objects memtree did not make ({_listed(strangers)}); "
            "memtree left it untouched. memtree keeps a file to itself: move those objects to another "
            "database (or drop them) and open it again."
        )
    return version


def memtree_objects(steps: Sequence[Migration]) -> frozenset[str]:
    """Names of the tables, indexes, views and triggers ``steps`` create."""
    return frozenset(match for step in steps for statement in step.statements for match in _CREATED.findall(statement))


# -- reading without writing --------------------------------------------------------------


class _Contended(Exception):
    """SQLite could not read the file in place without writing its -shm: a writer was
    killed and left a WAL index only a writer may recover, or one holds it busy."""


_CONTENDED_CODES = frozenset({5, 6, 8, 14, 15})
"""SQLITE_BUSY, SQLITE_LOCKED, SQLITE_READONLY (its extended codes too: recovery
needed), SQLITE_CANTOPEN, SQLITE_PROTOCOL: a state of the locks, not of the file."""


def _contended(error: sqlite3.Error) -> bool:
    code = getattr(error, "sqlite_errorcode", None)
    return isinstance(code, int) and code & 0xFF in _CONTENDED_CODES


def _read(path: Path, steps: Sequence[Migration]) -> int | None:
    wal = Path(f"{path}-wal")
    if _size(wal) > 0:
        if Path(f"{path}-shm").exists():
            try:
                return _read_uri(path, path, "mode=ro&readonly_shm=1", steps)
            except _Contended:
                pass  # read a private copy instead: the lock state cannot stop that
        return _read_copy(path, wal, steps)
    return _read_uri(path, path, "mode=ro&immutable=1", steps)


def _read_copy(path: Path, wal: Path, steps: Sequence[Migration]) -> int | None:
    with tempfile.TemporaryDirectory(prefix="memtree-check-") as folder:
        copy = Path(folder) / "copy.db"
        shutil.copyfile(path, copy)
        with contextlib.suppress(FileNotFoundError):  # checkpointed and deleted meanwhile
            shutil.copyfile(wal, f"{copy}-wal")
        return _read_uri(copy, path, "mode=ro", steps)


def _read_uri(target: Path, path: Path, options: str, steps: Sequence[Migration]) -> int | None:
    uri = f"file:{quote(str(target.resolve()))}?{options}"
    try:
        connection = sqlite3.connect(uri, uri=True)
    except sqlite3.Error as error:
        raise IncompatibleStoreError(f"cannot open {path} to read it ({error}); nothing was changed") from None
    try:
        try:
            pages = int(connection.execute("PRAGMA page_count").fetchone()[0])
        except sqlite3.DatabaseError as error:
            if target == path and _contended(error):
                raise _Contended(str(error)) from None
            raise _unreadable(path, str(error)) from None
        if pages == 0:  # SQLite takes a 1-byte file for an empty database, and would overwrite it
            raise _unreadable(path, f"its {_size(path)} byte(s) hold no database page")
        return schema_version(connection, path, steps)
    finally:
        connection.close()


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


# -- messages ---------------------------------------------------------------------------


def _listed(objects: Sequence[tuple[str, str]]) -> str:
    shown = ", ".join(f"{kind} {name}" for kind, name in objects[:_MAX_SHOWN])
    return shown + (f" and {len(objects) - _MAX_SHOWN} more" if len(objects) > _MAX_SHOWN else "")


def _foreign(path: Path, found: str) -> IncompatibleStoreError:
    return IncompatibleStoreError(
        f"{path} is a SQLite database of another application ({found}), not a memtree memory; "
        "memtree left it untouched. Give memtree its own file, e.g. memory.db."
    )


def _unreadable(path: Path, problem: str) -> IncompatibleStoreError:
    return IncompatibleStoreError(
        f"{path} is not a memtree memory file (not a readable SQLite database: {problem}); memtree left it "
        "untouched. Pass the path of a new file or of an existing memtree memory."
    )
