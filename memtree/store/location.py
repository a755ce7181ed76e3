"""Which store a location names: a PostgreSQL DSN, ``":memory:"`` or a SQLite file path."""

from __future__ import annotations

import os

from memtree.store.base import Store
from memtree.store.memory import MemoryBackend

POSTGRES_SCHEMES = ("postgresql://", "postgres://")
IN_MEMORY = ":memory:"
"""The location of a store that lives in this process (SQLite's spelling)."""


def is_postgres_dsn(location: str | os.PathLike[str]) -> bool:
    """Whether ``location`` is a ``postgresql://`` or ``postgres://`` URL."""
    return isinstance(location, str) and location.lower().startswith(POSTGRES_SCHEMES)


def open_store(location: str | os.PathLike[str]) -> Store:
    """Open the store at ``location``: a PostgreSQL DSN opens a :class:`PostgresBackend`,
    ``":memory:"`` (SQLite's name for a database in memory) a :class:`MemoryBackend`,
    anything else is a SQLite file path (created if missing)."""
    if not isinstance(location, (str, os.PathLike)):
        raise TypeError(f"location must be a file path or a postgresql:// DSN, got {type(location).__name__}")
    if location == IN_MEMORY:
        return MemoryBackend()
    if is_postgres_dsn(location):
        from memtree.store.postgres import PostgresBackend

        return PostgresBackend(str(location))
    from memtree.store.sqlite import SQLiteBackend

    return SQLiteBackend(location)


def as_store(value: Store | str | os.PathLike[str] | None) -> tuple[Store, bool]:
    """The store a ``store=`` argument names, and whether the caller owns it.

    * a :class:`Store` is used as given: ``(value, False)``; whoever made it closes it.
    * a path or a ``postgresql://`` DSN is opened with :func:`open_store`:
      ``(store, True)``; the caller must close it when done.
    * ``None`` is a new :class:`MemoryBackend`: ``(store, False)`` (nothing to release).

    Anything else raises ``TypeError`` naming what is accepted, before anything is opened.

    Example::

        store, owned = as_store("memory.db")  # a SQLiteBackend, owned
        try:
            ...
        finally:
            if owned:
                store.close()
    """
    if value is None:
        from memtree.store.memory import MemoryBackend

        return MemoryBackend(), False
    if isinstance(value, Store):
        return value, False
    if isinstance(value, (str, os.PathLike)) and isinstance(os.fspath(value), str):
        return open_store(value), True
    raise TypeError(
        "store must be a Store (MemoryBackend, SQLiteBackend, PostgresBackend), a SQLite file path or a "
        f"postgresql:// DSN, got {type(value).__name__}"
    )
