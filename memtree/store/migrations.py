"""Schema versions of the SQL stores and the migrations between them.

Every SQL store keeps a ``memtree_schema`` table with one row per migration it
has applied. Opening a store applies the missing migrations in order, each in
the same transaction as its row, so a crash leaves the previous or the next
version. A store written by a newer memtree is refused untouched: an older
program cannot know what the newer schema means.

To change the schema, append a :class:`Migration` with the next version to the
backend's list; never edit one that has shipped.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

SCHEMA_TABLE = "memtree_schema"
TABLES = ("memtree_schema", "memtree_namespaces", "memtree_nodes", "memtree_records", "memtree_versions")
"""Every table memtree creates (names shared by all SQL backends)."""


class IncompatibleStoreError(ValueError):
    """The location holds something memtree cannot or must not use as a store
    (another application's database, a newer memtree schema, a damaged file)."""


@dataclass(frozen=True)
class Migration:
    """One step of a backend's schema: SQL statements that take it to ``version``."""

    version: int
    description: str
    statements: tuple[str, ...]


@dataclass(frozen=True)
class ColumnTypes:
    """How a backend spells the types of the schema both SQL stores share."""

    serial_key: str
    """An auto-assigned integer primary key (namespace ids, record positions)."""
    integer: str
    boolean: str
    false: str
    real: str
    blob: str
    namespace_reference: str
    """The constraint tying a row to its namespace (empty where deletes are explicit)."""
    node_key: str


SCHEMA_V1_DESCRIPTION = "namespaces, nodes with change sequence numbers and tombstones, records"


def schema_v1(types: ColumnTypes) -> tuple[str, ...]:
    """Version 1 of the tables described in :mod:`memtree.store.sql`."""
    t = types
    return (
        f"CREATE TABLE {SCHEMA_TABLE} (version INTEGER PRIMARY KEY, description TEXT NOT NULL, "
        f"applied_at {t.real} NOT NULL)",
        f"""CREATE TABLE memtree_namespaces (
            id {t.serial_key},
            name TEXT NOT NULL UNIQUE,
            generation TEXT NOT NULL,
            seq {t.integer} NOT NULL DEFAULT 0,
            dimension INTEGER,
            embedder TEXT,
            settings TEXT NOT NULL DEFAULT '{{}}'
        )""",
        f"""CREATE TABLE memtree_nodes (
            ns {t.integer} NOT NULL{t.namespace_reference},
            id TEXT NOT NULL,
            seq {t.integer} NOT NULL,
            deleted {t.boolean} NOT NULL DEFAULT {t.false},
            parent TEXT,
            text TEXT NOT NULL DEFAULT '',
            depth INTEGER NOT NULL DEFAULT 0,
            is_leaf {t.boolean} NOT NULL DEFAULT {t.false},
            leaf_count INTEGER NOT NULL DEFAULT 0,
            created_at {t.real} NOT NULL DEFAULT 0,
            updated_at {t.real} NOT NULL DEFAULT 0,
            event_time {t.real},
            metadata TEXT NOT NULL DEFAULT '{{}}',
            source_id TEXT,
            stale {t.boolean} NOT NULL DEFAULT {t.false},
            embedding {t.blob},
            leaf_sum {t.blob},
            {t.node_key}
        )""",
        "CREATE INDEX memtree_nodes_changes ON memtree_nodes (ns, seq)",
        f"""CREATE TABLE memtree_records (
            pos {t.serial_key},
            ns {t.integer} NOT NULL{t.namespace_reference},
            kind TEXT NOT NULL,
            key TEXT NOT NULL,
            value TEXT NOT NULL,
            UNIQUE (ns, kind, key)
        )""",
    )


SCHEMA_V2_DESCRIPTION = "leaf history: the versions MemTree.update replaced"


def schema_v2(types: ColumnTypes) -> tuple[str, ...]:
    """Version 2: ``memtree_versions``, one row per replaced leaf version; ``pos``
    orders them (oldest first), and a leaf's rows go when the leaf is deleted."""
    t = types
    return (
        f"""CREATE TABLE memtree_versions (
            pos {t.serial_key},
            ns {t.integer} NOT NULL{t.namespace_reference},
            leaf_id TEXT NOT NULL,
            text TEXT NOT NULL,
            metadata TEXT NOT NULL DEFAULT '{{}}',
            event_time {t.real},
            replaced_at {t.real} NOT NULL
        )""",
        "CREATE INDEX memtree_versions_leaf ON memtree_versions (ns, leaf_id, pos)",
    )


SCHEMA_V3_DESCRIPTION = "leaf expiry: when a leaf stops being remembered (MemTree.add(ttl=...))"


def schema_v3(types: ColumnTypes) -> tuple[str, ...]:
    """Version 3: ``memtree_nodes.expires_at`` (POSIX seconds; NULL: never), so an
    expiry survives a restart and every process hides the same leaves."""
    return (f"ALTER TABLE memtree_nodes ADD COLUMN expires_at {types.real}",)


def check_migrations(migrations: Sequence[Migration]) -> None:
    """Versions must be 1, 2, 3, … in order (a programming error otherwise)."""
    versions = [migration.version for migration in migrations]
    if versions != list(range(1, len(versions) + 1)):
        raise RuntimeError(f"migration versions must be 1..n in order, got {versions}")


def latest_version(migrations: Sequence[Migration]) -> int:
    return migrations[-1].version if migrations else 0


def pending(migrations: Sequence[Migration], current: int, location: str) -> list[Migration]:
    """The migrations still to apply to a store at ``current`` version.

    Raises :class:`IncompatibleStoreError` for a store newer than this memtree.
    """
    check_migrations(migrations)
    latest = latest_version(migrations)
    if current > latest:
        raise IncompatibleStoreError(
            f"{location} uses memtree schema version {current}, but this memtree only knows versions up to "
            f"{latest}; upgrade memtree (pip install -U memtree-llm) to open it. Nothing was changed."
        )
    return [migration for migration in migrations if migration.version > current]


def apply(connection: Any, steps: Sequence[Migration], placeholder: str) -> None:
    """Run ``steps`` on an open transaction and record each in the schema table."""
    values = ", ".join([placeholder] * 3)
    record = f"INSERT INTO {SCHEMA_TABLE} (version, description, applied_at) VALUES ({values})"
    for migration in steps:
        for statement in migration.statements:
            connection.execute(statement)
        connection.execute(record, (migration.version, migration.description, time.time()))


def current_version(connection: Any) -> int:
    """The highest migration recorded (the schema table must exist)."""
    row = connection.execute(f"SELECT max(version) FROM {SCHEMA_TABLE}").fetchone()
    return int(row[0] or 0)
