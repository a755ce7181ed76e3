"""``PostgresBackend``: memory shared by many processes and machines through PostgreSQL.

* psycopg 3 with a connection pool (``pip install 'memtree-llm[postgres]'``).
* Writers to one namespace are serialized by a transaction-scoped advisory lock
  (``pg_advisory_xact_lock``) taken first in the write transaction, so writers to
  different namespaces run in parallel and a crashed client's lock dies with its
  transaction. Waiting is bounded by ``lock_timeout`` (``TimeoutError`` after it).
* Readers use ``REPEATABLE READ READ ONLY`` snapshots: never blocked, always a
  committed tree.
* Embeddings are ``bytea`` (little-endian float32): no pgvector needed; search runs
  in each process's FAISS index.
* Tables are named ``memtree_*`` in the connection's ``search_path``; put
  ``options=-csearch_path=myschema`` in the DSN to keep them in their own schema.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from memtree.store import migrations
from memtree.store.base import NamespaceKey, encode_namespace
from memtree.store.migrations import (
    SCHEMA_TABLE,
    SCHEMA_V1_DESCRIPTION,
    SCHEMA_V2_DESCRIPTION,
    SCHEMA_V3_DESCRIPTION,
    TABLES,
    ColumnTypes,
    IncompatibleStoreError,
    Migration,
    schema_v1,
    schema_v2,
    schema_v3,
)
from memtree.store.sql import NAMESPACE_ID, SQLBackend

_LOCK_CLASS = 0x6D656D74
"""First key of memtree's namespace advisory locks ("memt"): keeps them apart from the application's."""
_SCHEMA_LOCK_CLASS = 0x6D656D73
"""First key of the advisory lock held while migrating the schema ("mems")."""

POSTGRES_TYPES = ColumnTypes(
    serial_key="BIGSERIAL PRIMARY KEY",
    integer="BIGINT",
    boolean="BOOLEAN",
    false="FALSE",
    real="DOUBLE PRECISION",
    blob="BYTEA",
    namespace_reference=" REFERENCES memtree_namespaces (id) ON DELETE CASCADE",
    node_key="PRIMARY KEY (ns, id)",
)

POSTGRES_MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, SCHEMA_V1_DESCRIPTION, schema_v1(POSTGRES_TYPES)),
    Migration(2, SCHEMA_V2_DESCRIPTION, schema_v2(POSTGRES_TYPES)),
    Migration(3, SCHEMA_V3_DESCRIPTION, schema_v3(POSTGRES_TYPES)),
)


def _psycopg() -> Any:
    try:
        import psycopg
        import psycopg_pool  # noqa: F401 - checked here so the error names the extra
    except ImportError as error:
        raise ImportError(
            "PostgresBackend needs psycopg 3 and psycopg_pool; install the postgres extra: "
            "pip install 'memtree-llm[postgres]'"
        ) from error
    return psycopg


class PostgresBackend(SQLBackend):
    """Memory in a PostgreSQL database, shared by every process that opens the same DSN.

    ``min_size`` / ``max_size`` size the connection pool; ``lock_timeout`` bounds
    how long a writer waits for another writer of the same namespace (and how long
    any call waits for a free pooled connection).

    Example::

        store = PostgresBackend("postgresql://memtree@db.internal/memory")
        memory = MemTree(store=store, namespace=("users", "alice"))

    (``MemTree.open("postgresql://...")`` does the same and closes the store for you.)
    """

    placeholder = "%s"
    namespace_for_records = NAMESPACE_ID + " FOR KEY SHARE"  # a concurrent delete_namespace waits for us

    def __init__(
        self, dsn: str, *, min_size: int = 1, max_size: int = 10, lock_timeout: float = 30.0, read_only: bool = False
    ) -> None:
        super().__init__()
        self.read_only = read_only
        """Opened for reading only (``memtree check``): every session is read-only on the
        server, a write raises ``PermissionError``, and a schema that needs creating or
        upgrading is refused instead."""
        psycopg = _psycopg()
        from psycopg_pool import ConnectionPool

        if not isinstance(dsn, str) or not dsn:
            raise ValueError("PostgresBackend needs a DSN such as postgresql://user@host:5432/dbname")
        if min_size < 0 or max_size < max(min_size, 1):
            raise ValueError(f"need 0 <= min_size <= max_size and max_size >= 1, got {min_size}, {max_size}")
        if lock_timeout <= 0:
            raise ValueError(f"lock_timeout must be > 0 seconds, got {lock_timeout}")
        self.lock_timeout = lock_timeout
        self._errors = psycopg.errors
        self._label = _describe(dsn)
        try:
            with psycopg.connect(dsn, autocommit=True, connect_timeout=max(2, int(lock_timeout))) as connection:
                self._migrate(connection)
        except psycopg.OperationalError as error:
            raise ConnectionError(f"cannot connect to PostgreSQL at {self._label}: {error}".strip()) from error
        self._pool = ConnectionPool(
            dsn,
            min_size=min_size,
            max_size=max_size,
            kwargs={"autocommit": True},
            configure=_read_only_session if read_only else None,
            timeout=lock_timeout,
            open=True,
            name="memtree",
        )

    def __repr__(self) -> str:
        return f"PostgresBackend({self._label})"

    def _migrate(self, connection: Any) -> None:
        """Create or upgrade memtree's tables under a lock, so concurrent first opens agree."""
        with connection.transaction():
            connection.execute("SELECT pg_advisory_xact_lock(%s::int4, 0)", (_SCHEMA_LOCK_CLASS,))
            present = {
                table
                for table in TABLES
                if connection.execute("SELECT to_regclass(%s)", (table,)).fetchone()[0] is not None
            }
            if present and SCHEMA_TABLE not in present:
                raise IncompatibleStoreError(
                    f"{self!r}: tables {', '.join(sorted(present))} exist but were not made by memtree; "
                    "point memtree at another database or schema (options=-csearch_path=...). Nothing was changed."
                )
            current = migrations.current_version(connection) if present else 0
            steps = migrations.pending(POSTGRES_MIGRATIONS, current, repr(self))
            if steps and self.read_only:
                raise IncompatibleStoreError(
                    f"{self!r} holds no memtree memory yet (no tables)"
                    if not present
                    else f"{self!r} has memtree schema version {current}, older than this memtree's; upgrading it "
                    "is a write, so open it once with write access (any memtree command that writes upgrades it)"
                )
            migrations.apply(connection, steps, "%s")

    # -- the SQLBackend hooks ----------------------------------------------------------

    @contextmanager
    def _read_session(self, snapshot: bool = False) -> Iterator[Any]:
        with self._pool.connection() as connection:
            if not snapshot:
                yield connection
                return
            connection.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            try:
                yield connection
            finally:
                connection.execute("ROLLBACK")  # nothing to keep: it only read

    def _fetch_nodes(self, connection: Any, query: str, params: tuple[Any, ...]) -> list[Any]:
        # Binary results: embeddings arrive as raw bytes instead of hex text to parse.
        return list(connection.execute(query, params, binary=True).fetchall())

    def _open_write(self, namespace: NamespaceKey | None) -> Any:
        if self.read_only:
            raise PermissionError(f"{self!r} is open read-only; changing the memory needs a writable connection")
        connection = self._pool.getconn()
        try:
            connection.execute("BEGIN")
            connection.execute(f"SET LOCAL lock_timeout = {int(self.lock_timeout * 1000)}")
            if namespace is not None:
                connection.execute(
                    "SELECT pg_advisory_xact_lock(%s::int4, %s::int4)", (_LOCK_CLASS, _lock_key(namespace))
                )
        except self._errors.LockNotAvailable as error:
            self._release(connection, commit=False)
            raise TimeoutError(
                f"{self!r}: another writer held namespace {namespace!r} for more than {self.lock_timeout}s "
                "(lock_timeout); try again or raise lock_timeout"
            ) from error
        except BaseException:
            self._release(connection, commit=False)
            raise
        return connection

    def _close_write(self, connection: Any, commit: bool) -> None:
        self._release(connection, commit)

    def _release(self, connection: Any, commit: bool) -> None:
        from psycopg.pq import TransactionStatus

        try:
            status = connection.info.transaction_status
            if connection.closed or status == TransactionStatus.IDLE:
                return
            if commit and status == TransactionStatus.INERROR:
                # COMMIT would quietly roll back: say so instead of acknowledging a lost write.
                connection.execute("ROLLBACK")
                raise RuntimeError(f"{self!r}: the write transaction failed before commit; nothing was written")
            connection.execute("COMMIT" if commit else "ROLLBACK")
        finally:
            self._pool.putconn(connection)

    def _reclaim_space(self) -> None:  # (compact's tombstone drops already refused a read-only store)
        """Plain ``VACUUM (ANALYZE)``: the dead rows' space is reused by later writes
        and readers and writers never wait for it. (``VACUUM FULL`` would return it
        to the operating system but locks the tables against readers: leave it to a
        maintenance window.)"""
        with self._pool.connection() as connection:  # autocommit: VACUUM refuses a transaction
            for table in _TABLES:
                connection.execute(f"VACUUM (ANALYZE) {table}")

    def _size_bytes(self) -> int | None:
        """The memtree tables with their indexes and TOAST data."""
        with self._read_session() as connection:
            query = " + ".join(f"pg_total_relation_size('{table}')" for table in _TABLES)
            return int(connection.execute(f"SELECT {query}").fetchone()[0])

    def close(self) -> None:
        """Close the pool's connections."""
        if not self._closed:
            self._closed = True
            self._pool.close()


def _read_only_session(connection: Any) -> None:
    """Make a pooled connection read-only on the server: nothing it runs can write."""
    connection.execute("SET default_transaction_read_only = on")


_TABLES = ("memtree_nodes", "memtree_versions", "memtree_records", "memtree_namespaces")
"""memtree's tables, as compaction vacuums and measures them."""


def _lock_key(namespace: NamespaceKey) -> int:
    """A signed 32-bit key per namespace (a collision only serializes two namespaces)."""
    digest = hashlib.blake2b(encode_namespace(namespace).encode("utf-8"), digest_size=4).digest()
    return int.from_bytes(digest, "big", signed=True)


def _describe(dsn: str) -> str:
    """The DSN without its password, for messages."""
    try:
        from psycopg.conninfo import conninfo_to_dict

        parts = conninfo_to_dict(dsn)
    except Exception:  # noqa: BLE001 - a malformed DSN fails properly when connecting
        return "<unparsable DSN>"
    shown = {key: parts[key] for key in ("host", "port", "dbname", "user") if parts.get(key)}
    return " ".join(f"{key}={value}" for key, value in shown.items()) or "default connection"
