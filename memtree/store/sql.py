"""What the SQLite and PostgreSQL stores share: the tables' meaning and every query.

Tables (created by each backend's migrations, same columns on both):

* ``memtree_namespaces``: one row per namespace: its JSON-array ``name``, the
  ``generation`` token (new each time the namespace is created), ``seq`` (the last
  commit's sequence number) and the namespace info (dimension, embedder, settings).
* ``memtree_nodes``: one row per node ever written, keyed by (namespace, id). Each
  commit stamps the rows it writes with its ``seq``; a deleted node stays as a
  tombstone (``deleted``, data cleared) stamped with the deleting commit's ``seq``.
  So "what changed after ``since``" is one index range scan on ``(ns, seq)``, and
  a process catches up with other writers without reloading anything else.
  Tombstones (an id and a number each) stay, so a process that last looked long
  ago still learns of every deletion; they go when the namespace is deleted, or
  with :meth:`SQLBackend.compact`, which drops them and gives the namespace a new
  ``generation``: a process that had read it before reloads it whole (it could no
  longer learn of those deletions from the rows).
* ``memtree_records``: JSON records by (namespace, kind, key); ``pos`` keeps the
  order they were first written.
* ``memtree_versions`` (schema version 2): the leaf versions ``MemTree.update``
  replaced, ``pos`` in the order written; written and deleted in the same
  transaction as the leaf's change.

A backend supplies connections and locking: :meth:`SQLBackend._read_session` (a
connection for reading, optionally inside one snapshot) and :meth:`SQLBackend._open_write` /
:meth:`SQLBackend._close_write` (a transaction holding the writer lock of a
namespace, or of the whole store). Queries are written with ``?`` placeholders;
a backend with another style sets :attr:`SQLBackend.placeholder`.
"""

from __future__ import annotations

import os
from abc import abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from functools import cache
from typing import Any

from memtree.node import JSONDict, LeafVersion, Node
from memtree.store.base import (
    ChangeBatch,
    CompactionReport,
    NamespaceInfo,
    NamespaceKey,
    NamespaceSnapshot,
    RecordChanges,
    Store,
    WriteTransaction,
    check_record_name,
    decode_namespace,
    encode_namespace,
    encode_record_changes,
    encode_records,
    new_generation,
)
from memtree.store.codec import (
    NODE_COLUMNS,
    WRITTEN_COLUMNS,
    CorruptDataError,
    decode_rows,
    json_object,
    json_text,
    node_values,
)

ABSENT_GENERATION = ""
"""The generation reported for a namespace that does not exist (yet)."""

_NODE_SELECT = ", ".join(NODE_COLUMNS)
_UPDATE_LIVE = ", ".join(f"{column} = excluded.{column}" for column in WRITTEN_COLUMNS)

HEAD = "SELECT seq, generation FROM memtree_namespaces WHERE name = ?"
NAMESPACE = "SELECT id, seq, generation, dimension, embedder, settings FROM memtree_namespaces WHERE name = ?"
CREATE_NAMESPACE = "INSERT INTO memtree_namespaces (name, generation) VALUES (?, ?) ON CONFLICT (name) DO NOTHING"
ALL_NODES = f"SELECT {_NODE_SELECT} FROM memtree_nodes WHERE ns = ? AND NOT deleted"
CHANGED_NODES = f"SELECT {_NODE_SELECT} FROM memtree_nodes WHERE ns = ? AND seq > ?"
UPSERT_NODE = (
    f"INSERT INTO memtree_nodes (ns, id, seq, deleted, {', '.join(WRITTEN_COLUMNS)}) "
    f"VALUES (?, ?, ?, FALSE, {', '.join('?' for _ in WRITTEN_COLUMNS)}) "
    f"ON CONFLICT (ns, id) DO UPDATE SET seq = excluded.seq, deleted = FALSE, {_UPDATE_LIVE}"
)
TOMBSTONE = (
    "UPDATE memtree_nodes SET seq = ?, deleted = TRUE, parent = NULL, text = '', metadata = '{}', "
    "source_id = NULL, embedding = NULL, leaf_sum = NULL, expires_at = NULL WHERE ns = ? AND id = ?"
)
COMMITTED = "UPDATE memtree_namespaces SET seq = ?, dimension = ?, embedder = ?, settings = ? WHERE id = ?"
HOLDS_DATA = (
    "SELECT EXISTS (SELECT 1 FROM memtree_nodes WHERE ns = ? AND NOT deleted) "
    "OR EXISTS (SELECT 1 FROM memtree_records WHERE ns = ?)"
)
_HOLDS_DATA_ROW = (
    "(EXISTS (SELECT 1 FROM memtree_nodes d WHERE d.ns = n.id AND NOT d.deleted) "
    "OR EXISTS (SELECT 1 FROM memtree_records r WHERE r.ns = n.id))"
)
LIST_NAMESPACES = "SELECT n.name FROM memtree_namespaces n WHERE " + _HOLDS_DATA_ROW
# Names are JSON arrays, so the namespaces under ("a", "b") are '["a","b"]' and the
# names that begin '["a","b",'. The name test runs first: only the namespaces it
# keeps are checked for data. (substr, not LIKE: no wildcards to escape, and no
# collation of PostgreSQL's that could order or fold the text.)
LIST_NAMESPACES_UNDER = (
    "SELECT n.name FROM memtree_namespaces n WHERE (n.name = ? OR substr(n.name, 1, ?) = ?) AND " + _HOLDS_DATA_ROW
)
DELETE_NODES = "DELETE FROM memtree_nodes WHERE ns = ?"
WITH_TOMBSTONES = (
    "SELECT n.name FROM memtree_namespaces n "
    "WHERE EXISTS (SELECT 1 FROM memtree_nodes d WHERE d.ns = n.id AND d.deleted)"
)
DROP_TOMBSTONES = "DELETE FROM memtree_nodes WHERE ns = ? AND deleted"
NEW_GENERATION = "UPDATE memtree_namespaces SET generation = ? WHERE id = ?"
DELETE_ALL_RECORDS = "DELETE FROM memtree_records WHERE ns = ?"
DELETE_NAMESPACE = "DELETE FROM memtree_namespaces WHERE id = ?"
DELETE_ALL_VERSIONS = "DELETE FROM memtree_versions WHERE ns = ?"
DELETE_VERSIONS = "DELETE FROM memtree_versions WHERE ns = ? AND leaf_id = ?"
ADD_VERSION = (
    "INSERT INTO memtree_versions (ns, leaf_id, text, metadata, event_time, replaced_at) VALUES (?, ?, ?, ?, ?, ?)"
)
_VERSION_SELECT = (
    "SELECT v.leaf_id, v.text, v.metadata, v.event_time, v.replaced_at FROM memtree_versions v "
    "JOIN memtree_namespaces n ON n.id = v.ns WHERE n.name = ?"
)
ALL_VERSIONS = _VERSION_SELECT + " ORDER BY v.pos"
LEAF_VERSIONS = _VERSION_SELECT + " AND v.leaf_id = ? ORDER BY v.pos"
NAMESPACE_ID = "SELECT id FROM memtree_namespaces WHERE name = ?"
PUT_RECORD = (
    "INSERT INTO memtree_records (ns, kind, key, value) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (ns, kind, key) DO UPDATE SET value = excluded.value"
)
DELETE_RECORD = "DELETE FROM memtree_records WHERE ns = ? AND kind = ? AND key = ?"
GET_RECORDS = (
    "SELECT r.pos, r.key, r.value FROM memtree_records r JOIN memtree_namespaces n ON n.id = r.ns "
    "WHERE n.name = ? AND r.kind = ? ORDER BY r.pos"
)
GET_SOME_RECORDS = (
    "SELECT r.pos, r.key, r.value FROM memtree_records r JOIN memtree_namespaces n ON n.id = r.ns "
    "WHERE n.name = ? AND r.kind = ? AND r.key IN ({keys})"
)
ALL_RECORDS = (
    "SELECT r.kind, r.key, r.value FROM memtree_records r JOIN memtree_namespaces n ON n.id = r.ns "
    "WHERE n.name = ? ORDER BY r.kind, r.pos"
)
_KEYS_PER_QUERY = 500
DELETE_KIND = "DELETE FROM memtree_records WHERE kind = ? AND ns = (SELECT id FROM memtree_namespaces WHERE name = ?)"
RECORD_KINDS = (
    "SELECT DISTINCT r.kind FROM memtree_records r JOIN memtree_namespaces n ON n.id = r.ns "
    "WHERE n.name = ? ORDER BY r.kind"
)


class SQLBackend(Store):
    """The :class:`Store` semantics over SQL tables; backends add connections and locks."""

    placeholder = "?"
    namespace_for_records = NAMESPACE_ID
    """How a record writer finds (and, where the backend can, pins) its namespace row."""

    def __init__(self) -> None:
        self._pid = os.getpid()
        self._closed = False

    # -- backend hooks ------------------------------------------------------------------

    @abstractmethod
    def _read_session(self, snapshot: bool = False) -> AbstractContextManager[Any]:
        """A connection for reading; with ``snapshot`` every statement of the block
        sees the same committed state (one statement alone always does)."""

    @abstractmethod
    def _open_write(self, namespace: NamespaceKey | None) -> Any:
        """Begin a write transaction holding the writer lock of ``namespace``
        (``None``: no tree lock needed, records only) and return its connection."""

    @abstractmethod
    def _close_write(self, connection: Any, commit: bool) -> None:
        """Commit or roll back a transaction from :meth:`_open_write` and release it."""

    def _reclaim_space(self) -> None:
        """Give the space of deleted rows back (SQLite: ``VACUUM``; PostgreSQL: plain
        ``VACUUM``, which readers and writers do not wait for). Runs outside any
        transaction, after the tombstones are gone."""

    def _size_bytes(self) -> int | None:
        """The store's size on disk, if the backend can tell."""
        return None

    # -- helpers -------------------------------------------------------------------------

    def sql(self, query: str) -> str:
        """``query`` in this backend's placeholder style."""
        return _translate(query, self.placeholder)

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_usable(self) -> None:
        if self._closed:
            raise RuntimeError(f"{self!r} is closed; open a new store")
        if os.getpid() != self._pid:
            raise RuntimeError(
                f"{self!r} was opened in another process (before a fork); open a new store in this process"
            )

    @contextmanager
    def _write_session(self, namespace: NamespaceKey | None) -> Iterator[Any]:
        self._check_usable()
        connection = self._open_write(namespace)
        try:
            yield connection
        except BaseException:
            self._close_write(connection, commit=False)
            raise
        self._close_write(connection, commit=True)

    def _fetch_nodes(self, connection: Any, query: str, params: tuple[Any, ...]) -> list[Any]:
        """Run a node query (a backend may choose a faster wire format)."""
        return list(connection.execute(query, params).fetchall())

    def _namespace_row(self, connection: Any, namespace: NamespaceKey) -> tuple[Any, ...] | None:
        row = connection.execute(self.sql(NAMESPACE), (encode_namespace(namespace),)).fetchone()
        return tuple(row) if row is not None else None

    def _changes(self, connection: Any, namespace: NamespaceKey, since: int) -> ChangeBatch:
        row = self._namespace_row(connection, namespace)
        if row is None:
            return ChangeBatch([], [], 0, ABSENT_GENERATION, NamespaceInfo())
        ns_id, seq, generation, dimension, embedder, settings = row
        info = _info(dimension, embedder, settings, namespace)
        if since >= seq and since > 0:
            return ChangeBatch([], [], seq, generation, info)
        if since <= 0:
            rows = self._fetch_nodes(connection, self.sql(ALL_NODES), (ns_id,))
        else:
            rows = self._fetch_nodes(connection, self.sql(CHANGED_NODES), (ns_id, since))
        try:
            nodes, deleted = decode_rows(rows, dimension)
        except CorruptDataError as error:
            raise CorruptDataError(f"namespace {namespace!r} in {self!r}: {error}") from None
        return ChangeBatch(nodes, deleted, seq, generation, info)

    # -- the Store interface ------------------------------------------------------------

    def read_changes(self, namespace: NamespaceKey, since: int) -> ChangeBatch:
        self._check_usable()
        with self._read_session(snapshot=True) as connection:
            return self._changes(connection, namespace, since)

    def read_snapshot(self, namespace: NamespaceKey, since: int = 0) -> NamespaceSnapshot:
        self._check_usable()
        with self._read_session(snapshot=True) as connection:  # one read transaction
            changes = self._changes(connection, namespace, since)
            rows = connection.execute(self.sql(ALL_RECORDS), (encode_namespace(namespace),)).fetchall()
            history = self._history(connection, namespace, None)
        records: dict[str, dict[str, JSONDict]] = {}
        for kind, key, value in rows:
            records.setdefault(kind, {})[key] = json_object(value, key)
        return NamespaceSnapshot(changes, records, history)

    def read_history(self, namespace: NamespaceKey, leaf_id: str | None = None) -> list[LeafVersion]:
        self._check_usable()
        with self._read_session() as connection:
            return self._history(connection, namespace, leaf_id)

    def _history(self, connection: Any, namespace: NamespaceKey, leaf_id: str | None) -> list[LeafVersion]:
        name = encode_namespace(namespace)
        if leaf_id is None:
            rows = connection.execute(self.sql(ALL_VERSIONS), (name,)).fetchall()
        else:
            rows = connection.execute(self.sql(LEAF_VERSIONS), (name, leaf_id)).fetchall()
        return [
            LeafVersion(
                leaf_id=row[0],
                text=row[1],
                metadata=json_object(row[2], f"version of leaf {row[0]!r}"),
                timestamp=None if row[3] is None else float(row[3]),
                replaced_at=float(row[4]),
            )
            for row in rows
        ]

    def head(self, namespace: NamespaceKey) -> tuple[int, str]:
        self._check_usable()
        with self._read_session() as connection:
            row = connection.execute(self.sql(HEAD), (encode_namespace(namespace),)).fetchone()
        return (0, ABSENT_GENERATION) if row is None else (int(row[0]), str(row[1]))

    def begin(self, namespace: NamespaceKey) -> WriteTransaction:
        self._check_usable()
        connection = self._open_write(namespace)
        try:
            row = self._namespace_row(connection, namespace)
            if row is None:  # the first write makes the namespace, with a new generation
                connection.execute(self.sql(CREATE_NAMESPACE), (encode_namespace(namespace), new_generation()))
                row = self._namespace_row(connection, namespace)
            assert row is not None
        except BaseException:
            self._close_write(connection, commit=False)
            raise
        return _SQLTransaction(self, connection, namespace, row)

    def list_namespaces(self, prefix: NamespaceKey = ()) -> list[NamespaceKey]:
        self._check_usable()
        with self._read_session() as connection:
            if prefix:
                whole = encode_namespace(prefix)
                under = whole[:-1] + ","  # '["a","b"]' -> '["a","b",'
                query = connection.execute(self.sql(LIST_NAMESPACES_UNDER), (whole, len(under), under))
            else:
                query = connection.execute(LIST_NAMESPACES)
            names = [row[0] for row in query.fetchall()]
        keys = (decode_namespace(name) for name in names)
        return sorted(key for key in keys if key[: len(prefix)] == prefix)

    def delete_namespace(self, namespace: NamespaceKey) -> bool:
        with self._write_session(namespace) as connection:
            row = self._namespace_row(connection, namespace)
            if row is None:
                return False
            ns_id = row[0]
            existed = bool(connection.execute(self.sql(HOLDS_DATA), (ns_id, ns_id)).fetchone()[0])
            for query in (DELETE_NODES, DELETE_ALL_RECORDS, DELETE_ALL_VERSIONS, DELETE_NAMESPACE):
                connection.execute(self.sql(query), (ns_id,))
            return existed

    def compact(self) -> CompactionReport:
        """Drop every tombstone and reclaim the space (see the module docstring).

        Each namespace is compacted in its own write transaction, under its writer
        lock, so writers wait at most for one namespace's ``DELETE``; readers never
        wait. The namespace's new generation makes a process that had read it reload
        it whole on its next refresh, so none misses a deletion whose tombstone went.
        """
        self._check_usable()
        before = self._size_bytes()
        with self._read_session() as connection:
            names = [row[0] for row in connection.execute(WITH_TOMBSTONES).fetchall()]
        dropped = namespaces = 0
        for name in names:
            namespace = decode_namespace(name)
            with self._write_session(namespace) as connection:
                row = self._namespace_row(connection, namespace)
                if row is None:  # deleted meanwhile
                    continue
                count = connection.execute(self.sql(DROP_TOMBSTONES), (row[0],)).rowcount
                if count:
                    connection.execute(self.sql(NEW_GENERATION), (new_generation(), row[0]))
                    dropped += count
                    namespaces += 1
        self._reclaim_space()
        return CompactionReport(dropped, namespaces, before, self._size_bytes())

    def put_records(self, namespace: NamespaceKey, kind: str, records: Mapping[str, JSONDict | None]) -> None:
        encoded = encode_records(kind, records)
        if not encoded:
            return
        name = encode_namespace(namespace)
        with self._write_session(None) as connection:
            ns_id = None
            for _ in range(3):  # the namespace may be deleted between the statements
                row = connection.execute(self.sql(self.namespace_for_records), (name,)).fetchone()
                if row is None:
                    connection.execute(self.sql(CREATE_NAMESPACE), (name, new_generation()))
                    row = connection.execute(self.sql(self.namespace_for_records), (name,)).fetchone()
                if row is not None:
                    ns_id = row[0]
                    break
            if ns_id is None:
                raise RuntimeError(f"namespace {namespace!r} kept disappearing while records were written")
            cursor = connection.cursor()
            for key, text in encoded.items():  # in the caller's order, so positions follow it
                if text is None:
                    cursor.execute(self.sql(DELETE_RECORD), (ns_id, kind, key))
                else:
                    cursor.execute(self.sql(PUT_RECORD), (ns_id, kind, key, text))

    def get_records(self, namespace: NamespaceKey, kind: str, keys: Sequence[str] | None = None) -> dict[str, JSONDict]:
        check_record_name(kind, "record kind")
        self._check_usable()
        name = encode_namespace(namespace)
        if keys is None:
            with self._read_session() as connection:
                rows = connection.execute(self.sql(GET_RECORDS), (name, kind)).fetchall()
            return {key: json_object(value, key) for _, key, value in rows}
        wanted = list(dict.fromkeys(keys))
        found: list[tuple[Any, ...]] = []
        with self._read_session(snapshot=True) as connection:
            for start in range(0, len(wanted), _KEYS_PER_QUERY):  # only the rows asked for
                chunk = wanted[start : start + _KEYS_PER_QUERY]
                query = GET_SOME_RECORDS.format(keys=", ".join("?" for _ in chunk))
                found += connection.execute(self.sql(query), (name, kind, *chunk)).fetchall()
        found.sort(key=lambda row: row[0])
        return {key: json_object(value, key) for _, key, value in found}

    def delete_records(self, namespace: NamespaceKey, kind: str) -> int:
        check_record_name(kind, "record kind")
        with self._write_session(None) as connection:
            cursor = connection.execute(self.sql(DELETE_KIND), (kind, encode_namespace(namespace)))
            return max(int(cursor.rowcount), 0)

    def record_kinds(self, namespace: NamespaceKey) -> list[str]:
        self._check_usable()
        with self._read_session() as connection:
            rows = connection.execute(self.sql(RECORD_KINDS), (encode_namespace(namespace),)).fetchall()
        return [row[0] for row in rows]


class _SQLTransaction(WriteTransaction):
    """A write transaction of a :class:`SQLBackend`: open from ``begin`` to commit or rollback.

    Safe to finish from another thread than the one that began it (the async
    engine begins in a worker thread and commits on the event loop), never used by
    two threads at once.
    """

    def __init__(self, store: SQLBackend, connection: Any, namespace: NamespaceKey, row: tuple[Any, ...]) -> None:
        self._store = store
        self._connection = connection
        self._namespace = namespace
        self._ns_id = row[0]
        self._seq = int(row[1])
        self._open = True

    def read_changes(self, since: int) -> ChangeBatch:
        self._check_open()
        return self._store._changes(self._connection, self._namespace, since)

    def stage(
        self,
        upserts: Sequence[Node],
        deletions: Sequence[str],
        info: NamespaceInfo | None = None,
        versions: Sequence[LeafVersion] = (),
        records: RecordChanges | None = None,
    ) -> int:
        self._check_open()
        encoded = encode_record_changes(records)  # checked before anything is written
        sql = self._store.sql
        try:
            row = self._store._namespace_row(self._connection, self._namespace)
            assert row is not None
            seq = int(row[1]) + 1
            current = _info(row[3], row[4], row[5], self._namespace)
            chosen = info if info is not None else current
            rows = [(self._ns_id, node.id, seq, *node_values(node)) for node in upserts]
            cursor = self._connection.cursor()
            if rows:
                cursor.executemany(sql(UPSERT_NODE), rows)
            if deletions:
                cursor.executemany(sql(TOMBSTONE), [(seq, self._ns_id, node_id) for node_id in deletions])
                cursor.executemany(sql(DELETE_VERSIONS), [(self._ns_id, node_id) for node_id in deletions])
            if versions:
                cursor.executemany(
                    sql(ADD_VERSION),
                    [
                        (
                            self._ns_id,
                            version.leaf_id,
                            version.text,
                            json_text(version.metadata),
                            version.timestamp,
                            version.replaced_at,
                        )
                        for version in versions
                    ],
                )
            for kind, table in encoded.items():
                for key, text in table.items():  # in the caller's order, so positions follow it
                    if text is None:
                        cursor.execute(sql(DELETE_RECORD), (self._ns_id, kind, key))
                    else:
                        cursor.execute(sql(PUT_RECORD), (self._ns_id, kind, key, text))
            cursor.execute(
                sql(COMMITTED), (seq, chosen.dimension, chosen.embedder, json_text(chosen.settings), self._ns_id)
            )
        except BaseException:
            self.rollback()
            raise
        return seq

    def commit_staged(self) -> None:
        self._check_open()
        self._open = False
        self._store._close_write(self._connection, commit=True)

    def rollback(self) -> None:
        if self._open:
            self._open = False
            self._store._close_write(self._connection, commit=False)

    def _check_open(self) -> None:
        if not self._open:
            raise RuntimeError("this transaction is already finished")


def _info(dimension: Any, embedder: Any, settings: Any, namespace: NamespaceKey) -> NamespaceInfo:
    values = json_object(settings or "{}", f"settings of namespace {namespace!r}")
    return NamespaceInfo(dimension=None if dimension is None else int(dimension), embedder=embedder, settings=values)


@cache
def _translate(query: str, placeholder: str) -> str:
    return query if placeholder == "?" else query.replace("?", placeholder)
