"""``SQLiteBackend``: the default durable store, one file holding many namespaces.

* WAL journal: readers never wait for the writer and see the last committed tree.
* Writers take SQLite's write lock with ``BEGIN IMMEDIATE`` (waiting up to
  ``busy_timeout`` seconds), so writers in all processes sharing the file are
  serialized and each insert commits atomically.
* ``synchronous=FULL`` by default: a commit is on disk before ``add`` returns,
  so an acknowledged insert survives a power cut, not only a crash.
* The file is checked before anything can write to it (:mod:`memtree.store.sqlite_inspect`):
  a file that is not SQLite, another application's database or a newer memtree
  schema is refused with the file, its ``-wal`` and ``-shm`` byte for byte as they were.

Connections: one writer connection (guarded by a lock; a transaction may begin in
one thread and commit in another, as the async engine does) and a small pool of
reader connections handed to one thread at a time.

``ReadOnlySQLiteBackend`` (at the end) reads a memtree file you cannot, or must not,
write: another user's file, a read-only folder or mount, a copy kept as a backup.
``SQLiteBackend`` cannot open it there (it switches the file to WAL mode and SQLite
must create the ``-wal`` and ``-shm`` files beside it), and where SQLite can create
them, the files left behind belong to the reader and stop the owner from writing.
It reads such a file without writing anything:

* no ``-wal`` file beside it (no connection has the file open, so the main file
  holds every commit): opened ``immutable``, which reads the file as it is and
  creates nothing. A writer that starts while it reads is not seen, so use it for
  a short read (a command), not as a long-lived store next to writers;
* a ``-wal`` file (a writer has the file open, or crashed): opened
  ``mode=ro&readonly_shm=1``, which reads the log without writing the ``-shm`` file.

Any write raises :class:`ReadOnlyMemoryError`; a file whose schema needs an
upgrade is refused (upgrading is a write).
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
from memtree.store.base import IndexFolder, NamespaceKey, index_folder_name
from memtree.store.migrations import (
    SCHEMA_V1_DESCRIPTION,
    SCHEMA_V2_DESCRIPTION,
    SCHEMA_V3_DESCRIPTION,
    ColumnTypes,
    IncompatibleStoreError,
    Migration,
    schema_v1,
    schema_v2,
    schema_v3,
)
from memtree.store.sql import SQLBackend
from memtree.store.sqlite_inspect import APPLICATION_ID, inspect, schema_version

INDEX_SUFFIX = "-index"
"""The folder of index files beside a database file: ``memory.db-index`` (see :mod:`memtree.checkpoint`)."""

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
    Migration(2, SCHEMA_V2_DESCRIPTION, schema_v2(SQLITE_TYPES)),
    Migration(3, SCHEMA_V3_DESCRIPTION, schema_v3(SQLITE_TYPES)),
)


class SQLiteBackend(SQLBackend):
    """Memory in one SQLite file (created if missing), shared by threads and processes.

    ``busy_timeout`` is how long a writer waits for another writer before giving up
    with ``TimeoutError``. ``synchronous="NORMAL"`` trades durability across power
    loss (not across crashes) for faster commits.

    Example::

        store = SQLiteBackend("memory.db")
        memory = MemTree(store=store, namespace=("users", "alice"))

    (``MemTree.open("memory.db")`` does the same and closes the store for you.)

    Large namespaces also keep index files in a folder beside the file
    (``memory.db-index``; :mod:`memtree.checkpoint`), which a reopen maps instead of
    rebuilding its indexes; deleting that folder loses nothing (it is made again).
    """

    _writes_files = True

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
                f"SQLiteBackend needs a file path, got {text!r}; "
                "use MemoryBackend for a memory that lives in the process"
            )
        self.path = Path(text)
        self.busy_timeout = busy_timeout
        self.synchronous = synchronous
        # Every refusal happens here, before a connection that could write is opened.
        inspect(self.path, SQLITE_MIGRATIONS)
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
        return f"SQLiteBackend({str(self.path)!r})"

    def index_folder(self, namespace: NamespaceKey) -> IndexFolder | None:
        """``<file>-index/<namespace hash>``, beside the database file. Its identity is
        the file's device and inode: a copy restored in its place is another file, so
        segments written for the old one are not used with it."""
        try:
            status = os.stat(self.path)
        except OSError:
            return None
        identity = f"sqlite:{status.st_dev}:{status.st_ino}"
        return IndexFolder(
            Path(f"{self.path}{INDEX_SUFFIX}") / index_folder_name(namespace), self._writes_files, identity
        )

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

        :func:`~memtree.store.sqlite_inspect.inspect` read the file without locks; this
        checks again inside a transaction (another process may have changed the file
        since) and migrates under the write lock.
        """
        mode = self._writer.execute("PRAGMA journal_mode").fetchone()[0]
        if mode.lower() != "wal":
            mode = self._writer.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if mode.lower() != "wal":
            raise IncompatibleStoreError(f"{self.path}: SQLite refused WAL mode (got {mode!r}); use a local file")
        latest = migrations.latest_version(SQLITE_MIGRATIONS)
        self._writer.execute("BEGIN")
        try:
            current = schema_version(self._writer, self.path, SQLITE_MIGRATIONS)  # refuses a newer one
        finally:
            self._writer.execute("COMMIT")
        if current is not None and current >= latest:
            return
        with self._writer_lock:
            self._writer.execute("BEGIN IMMEDIATE")
            try:
                current = schema_version(self._writer, self.path, SQLITE_MIGRATIONS) or 0
                steps = migrations.pending(SQLITE_MIGRATIONS, current, str(self.path))
                migrations.apply(self._writer, steps, "?")
            except BaseException:
                self._writer.execute("ROLLBACK")
                raise
            self._writer.execute("COMMIT")

    # -- the SQLBackend hooks ----------------------------------------------------------

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

    # -- compaction ----------------------------------------------------------------------

    def _reclaim_space(self) -> None:
        """``VACUUM`` rewrites the file without the free pages, then a checkpoint moves
        it out of the write-ahead log and truncates the log. In WAL mode readers keep
        reading their snapshot meanwhile; other writers wait as for any write
        (``busy_timeout``)."""
        if not self._writer_lock.acquire(timeout=self.busy_timeout):
            raise TimeoutError(f"{self!r}: another thread held the write lock for more than {self.busy_timeout}s")
        try:
            self._check_usable()
            self._writer.execute("VACUUM")
            self._writer.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        finally:
            self._writer_lock.release()

    def _size_bytes(self) -> int | None:
        """The file and its write-ahead log."""
        return sum(part.stat().st_size for part in (self.path, wal_path(self.path)) if part.exists())

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


class ReadOnlyMemoryError(PermissionError):
    """A write was attempted through a store opened read-only."""


def wal_path(path: Path) -> Path:
    """The write-ahead log SQLite keeps beside ``path`` while it is open."""
    return path.with_name(path.name + "-wal")


class ReadOnlySQLiteBackend(SQLiteBackend):
    """An existing memtree SQLite file, opened for reading only.

    Example::

        store = ReadOnlySQLiteBackend("/srv/shared/memory.db")
        memory = MemTree(store=store, namespace="team")
        hits = memory.retrieve("release date")
        memory.close(); store.close()
    """

    def __init__(self, path: str | os.PathLike[str], *, busy_timeout: float = 30.0) -> None:
        location = Path(os.fspath(path))
        if not location.is_file():
            raise FileNotFoundError(f"no memory file at {location} to read")
        # readonly_shm: read the log through the -shm file without ever writing it
        # (plain mode=ro may rewrite it) or checkpointing.
        self._uri_options = "mode=ro&readonly_shm=1" if wal_path(location).exists() else "mode=ro&immutable=1"
        super().__init__(location, busy_timeout=busy_timeout)

    def __repr__(self) -> str:
        return f"ReadOnlySQLiteBackend({str(self.path)!r})"

    _writes_files = False
    """Reads index files beside the database, never writes them."""

    def _connect(self) -> sqlite3.Connection:
        uri = f"file:{quote(str(self.path.resolve()))}?{self._uri_options}"
        connection = sqlite3.connect(
            uri, uri=True, timeout=self.busy_timeout, isolation_level=None, check_same_thread=False
        )
        connection.execute(f"PRAGMA mmap_size = {_MMAP_BYTES}")
        return connection

    def _prepare(self) -> None:
        """Check the schema is current; nothing is switched or migrated."""
        self._writer.execute("BEGIN")
        try:
            # A first read outside the schema check: SQLite's own error (a read-only
            # folder without the -shm file, a damaged page) reaches the caller as is.
            self._writer.execute("SELECT count(*) FROM sqlite_master").fetchone()
            current = schema_version(self._writer, self.path, SQLITE_MIGRATIONS)
        finally:
            self._writer.execute("COMMIT")
        if current is None:
            raise IncompatibleStoreError(f"{self.path} holds no memtree memory yet (it has no tables)")
        if migrations.pending(SQLITE_MIGRATIONS, current, str(self.path)):
            raise IncompatibleStoreError(
                f"{self.path} has memtree schema version {current}, older than this memtree's; upgrading it is a "
                "write, so open it once with write access (any memtree command run by its owner upgrades it)"
            )

    def _reclaim_space(self) -> None:
        raise ReadOnlyMemoryError(f"{self.path} is open read-only; compacting it needs write access")

    def _open_write(self, namespace: NamespaceKey | None) -> sqlite3.Connection:
        raise ReadOnlyMemoryError(
            f"{self.path} is open read-only; changing the memory needs write access to the file and its folder"
        )
