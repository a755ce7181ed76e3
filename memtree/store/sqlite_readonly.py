"""``ReadOnlySQLiteBackend``: read a memtree SQLite file you cannot, or must not, write.

A memory file can be read-only for you: another user's file, a read-only folder or
mount, a copy kept as a backup. :class:`~memtree.store.sqlite.SQLiteBackend` cannot
open it there (it switches the file to WAL mode and SQLite must create the
``-wal`` and ``-shm`` files beside it), and where SQLite can create them, the
files left behind belong to the reader and stop the owner from writing.

This store reads such a file without writing anything:

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
from pathlib import Path
from urllib.parse import quote

from memtree.store import migrations
from memtree.store.base import NamespaceKey
from memtree.store.migrations import IncompatibleStoreError
from memtree.store.sqlite import _MMAP_BYTES, SQLITE_MIGRATIONS, SQLiteBackend
from memtree.store.sqlite_check import schema_version


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

    def _open_write(self, namespace: NamespaceKey | None) -> sqlite3.Connection:
        raise ReadOnlyMemoryError(
            f"{self.path} is open read-only; changing the memory needs write access to the file and its folder"
        )
