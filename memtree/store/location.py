"""Which store a location names: a PostgreSQL DSN or a SQLite file path."""

from __future__ import annotations

import os

from memtree.store.base import Store

POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def is_postgres_dsn(location: str | os.PathLike[str]) -> bool:
    """Whether ``location`` is a ``postgresql://`` or ``postgres://`` URL."""
    return isinstance(location, str) and location.lower().startswith(POSTGRES_SCHEMES)


def open_store(location: str | os.PathLike[str]) -> Store:
    """Open the store at ``location``: a PostgreSQL DSN opens a :class:`PostgresStore`,
    anything else is a SQLite file path (created if missing)."""
    if not isinstance(location, (str, os.PathLike)):
        raise TypeError(f"location must be a file path or a postgresql:// DSN, got {type(location).__name__}")
    if is_postgres_dsn(location):
        from memtree.store.postgres import PostgresStore

        return PostgresStore(str(location))
    from memtree.store.sqlite import SQLiteStore

    return SQLiteStore(location)
