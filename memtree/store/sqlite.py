"""``SQLiteStore``: the default durable store, one file holding many namespaces.

* WAL journal: readers never wait for the writer and see the last committed tree.
* Writers take SQLite's write lock with ``BEGIN IMMEDIATE`` (waiting up to
  ``busy_timeout`` seconds), so writers in all processes sharing the file are
  serialized and each insert commits atomically.
* ``synchronous=FULL`` by default: a commit is on disk before ``add`` returns,
  so an acknowledged insert survives a power cut, not only a crash.
* The file is checked read-only before anything is written: another
  application's database or a newer memtree schema is refused untouched.

Connections: one writer connection (guarded by a lock; a transaction may begin in
one thread and commit in another, as the async engine does) and a small pool of
reader connections handed to one thread at a time.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal
from urllib.parse import quote

from memtree.store import migrations
from memtree.store.base import NamespaceKey
from memtree.store.migrations import (
    SCHEMA_TABLE,
    SCHEMA_V1_DESCRIPTION,
    ColumnTypes,
    IncompatibleStoreError,
    Migration,
    schema_v1,
)
from memtree.store.sql import SQLStore

APPLICATION_ID = 0x4D454D54
"""``PRAGMA application_id`` of memtree files ("MEMT"), so tools like ``file`` can tell them apart."""

_MAX_IDLE_READERS = 4
_MMAP_BYTES = 1 << 30

SQLITE_TYPES = ColumnTypes(
    serial_key="INTEGER PRIMARY KEY AUTOINCREMENT",
    integer="INTEGER",
    boolean="INTEGER",
    false="0",
    real="REAL",
    blob="BLOB",
    namespace_reference="",  # rows are deleted explicitly with their namespace
    node_key="UNIQUE (ns, id)",  # a rowid table: rows hold kilobytes of vectors
)

SQLITE_MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1,
        SCHEMA_V1_DESCRIPTION,
        (*schema_v1(SQLITE_TYPES), f"PRAGMA application_id = {APPLICATION_ID}"),
    ),
)


class SQLiteStore(SQLStore):
    """Memory in one SQLite file (created if missing), shared by threads and processes.

    ``busy_timeout`` is how long a writer waits for another writer before giving up
    with ``TimeoutError``. ``synchronous="NORMAL"`` trades durability across power
    loss (not across crashes) for faster commits.

    Example::

        store = SQLiteStore("memory.db")
        memory = MemTree(store=store, namespace=("users", "alice"))

    (``MemTree.open("memory.db")`` does the same and closes the store for you.)
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        busy_timeout: float = 30.0,
        synchronous: Literal["FULL", "NORMAL"] = "FULL",
    ) -> None:
        super().__init__()
        if busy_timeout < 0:
            raise ValueError(f"busy_timeout must be >= 0 seconds, got {busy_timeout}")
        if synchronous not in ("FULL", "NORMAL"):
            raise ValueError(f"synchronous must be 'FULL' or 'NORMAL', got {synchronous!r}")
        text = os.fspath(path)
        if not text or text == ":memory:" or text.startswith("file:"):
            raise ValueError(
                f"SQLiteStore needs a file path, got {text!r}; use InMemoryStore for a memory that lives in the process"
            )
        self.path = Path(text)
        self.busy_timeout = busy_timeout
        self.synchronous = synchronous
        existing = _inspect(self.path)
        if existing is not None:  # refuse a newer schema before opening the file for writing
            migrations.pending(SQLITE_MIGRATIONS, existing, str(self.path))
        self._writer_lock = threading.Lock()
        self._pool_lock = threading.Lock()
        self._idle: list[sqlite3.Connection] = []
        self._connections: set[sqlite3.Connection] = set()
        self._writer = self._connect()
        try:
            self._prepare()
        except BaseException:
            self._writer.close()
            raise

    def __repr__(self) -> str:
        return f"SQLiteStore({str(self.path)!r})"

    # -- opening ---------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        connection = sqlite3.connect(
            self.path, timeout=self.busy_timeout, isolation_level=None, check_same_thread=False
        )
        connection.execute(f"PRAGMA synchronous = {self.synchronous}")
        # Reads through a memory map skip a copy per page: a reopen reads every node.
        connection.execute(f"PRAGMA mmap_size = {_MMAP_BYTES}")
        return connection

    def _prepare(self) -> None:
        """Switch to WAL and bring the schema to the latest version.

        The check in :func:`_inspect` read the file without locks; this one reads it
        properly (inside a transaction) and migrates under the write lock.
        """
        mode = self._writer.execute("PRAGMA journal_mode").fetchone()[0]
        if mode.lower() != "wal":
            mode = self._writer.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if mode.lower() != "wal":
            raise IncompatibleStoreError(f"{self.path}: SQLite refused WAL mode (got {mode!r}); use a local file")
        latest = migrations.latest_version(SQLITE_MIGRATIONS)
        self._writer.execute("BEGIN")
        try:
            current = _schema_version(self._writer, self.path)
        finally:
            self._writer.execute("COMMIT")
        if current is not None and current >= latest:
            migrations.pending(SQLITE_MIGRATIONS, current, str(self.path))  # refuses a newer one
            return
        with self._writer_lock:
            self._writer.execute("BEGIN IMMEDIATE")
            try:
                current = _schema_version(self._writer, self.path) or 0
                steps = migrations.pending(SQLITE_MIGRATIONS, current, str(self.path))
                migrations.apply(self._writer, steps, "?")
            except BaseException:
                self._writer.execute("ROLLBACK")
                raise
            self._writer.execute("COMMIT")

    # -- the SQLStore hooks ----------------------------------------------------------

    @contextmanager
    def _read_session(self, snapshot: bool = False) -> Iterator[sqlite3.Connection]:
        with self._pool_lock:
            connection = self._idle.pop() if self._idle else None
        if connection is None:
            connection = self._connect()
            with self._pool_lock:
                self._connections.add(connection)
        try:
            if snapshot:
                connection.execute("BEGIN")  # one snapshot for every statement of the block
                try:
                    yield connection
                finally:
                    connection.execute("COMMIT")
            else:
                yield connection
        finally:
            with self._pool_lock:
                keep = not self._closed and len(self._idle) < _MAX_IDLE_READERS
                if keep:
                    self._idle.append(connection)
                else:
                    self._connections.discard(connection)
            if not keep:
                connection.close()

    def _open_write(self, namespace: NamespaceKey | None) -> sqlite3.Connection:
        # SQLite locks the whole file, so one lock serves every namespace.
        if not self._writer_lock.acquire(timeout=self.busy_timeout):
            raise TimeoutError(
                f"{self!r}: another thread of this process held the write lock for more than "
                f"{self.busy_timeout}s; raise busy_timeout or finish the other write"
            )
        try:
            self._check_usable()
            self._writer.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as error:
            self._writer_lock.release()
            if "locked" in str(error) or "busy" in str(error):
                raise TimeoutError(
                    f"{self!r}: another process held the write lock for more than {self.busy_timeout}s "
                    f"(busy_timeout); try again or raise busy_timeout"
                ) from error
            raise
        except BaseException:
            self._writer_lock.release()
            raise
        return self._writer

    def _close_write(self, connection: sqlite3.Connection, commit: bool) -> None:
        try:
            if commit:
                try:
                    connection.execute("COMMIT")
                except BaseException:
                    if connection.in_transaction:
                        connection.execute("ROLLBACK")
                    raise
            elif connection.in_transaction:
                connection.execute("ROLLBACK")
        finally:
            self._writer_lock.release()

    # -- closing -----------------------------------------------------------------------

    def close(self) -> None:
        """Close every connection (waits for a write in progress, up to ``busy_timeout``)."""
        if self._closed:
            return
        acquired = self._writer_lock.acquire(timeout=self.busy_timeout)
        try:
            with self._pool_lock:
                self._closed = True
                idle, self._idle = self._idle, []
                for connection in idle:
                    self._connections.discard(connection)
            for connection in idle:
                connection.close()
            self._writer.close()
        finally:
            if acquired:
                self._writer_lock.release()


def _inspect(path: Path) -> int | None:
    """The schema version of an existing memtree file, ``None`` for a new or empty one.

    Reads the file as immutable (no locks, no ``-wal``/``-shm`` files created), so a
    file memtree refuses is left exactly as it was, with nothing beside it. Such a
    read can be torn by a concurrent checkpoint, so a refusal is confirmed by a
    normal read-only open first.
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
        return _read_version(path, "mode=ro&immutable=1")
    except IncompatibleStoreError:
        return _read_version(path, "mode=ro")


def _read_version(path: Path, options: str) -> int | None:
    uri = f"file:{quote(str(path.resolve()))}?{options}"
    try:
        connection = sqlite3.connect(uri, uri=True)
    except sqlite3.Error as error:
        raise IncompatibleStoreError(f"cannot open {path} to read it ({error}); nothing was changed") from None
    try:
        return _schema_version(connection, path)
    finally:
        connection.close()


def _schema_version(connection: sqlite3.Connection, path: Path) -> int | None:
    """The file's memtree schema version; ``None`` if it has no tables at all."""
    try:
        tables = _tables(connection)
        if not tables:
            return None
        if SCHEMA_TABLE not in tables:
            raise _foreign(path, tables)
        return migrations.current_version(connection)
    except sqlite3.DatabaseError as error:
        raise IncompatibleStoreError(
            f"{path} is not a memtree memory file (not a SQLite database: {error}); memtree left it untouched. "
            "Pass the path of a new file or of an existing memtree memory."
        ) from None


def _tables(connection: sqlite3.Connection) -> list[str]:
    return [row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]


def _foreign(path: Path, tables: list[str]) -> IncompatibleStoreError:
    shown = ", ".join(sorted(tables)[:5]) + (", …" if len(tables) > 5 else "")
    return IncompatibleStoreError(
        f"{path} is a SQLite database of another application (tables: {shown}), not a memtree memory; "
        "memtree left it untouched. Give memtree its own file, e.g. memory.db."
    )
