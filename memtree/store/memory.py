"""An in-process store: for tests and throwaway memories; gone when the process ends.

Each namespace keeps a log of its last commits (which ids each wrote and deleted),
so a memory sharing the store catches up by reading only the tail. The log is
bounded (``log_limit``): a memory that fell further behind than the log reaches is
sent the whole tree, marked complete, and starts over from it, so a long-running
process with heavy churn does not keep every commit it ever made.
"""

from __future__ import annotations

import bisect
import copy
import json
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from memtree.node import JSONDict, LeafVersion, Node
from memtree.store.base import (
    ChangeBatch,
    NamespaceInfo,
    NamespaceKey,
    NamespaceSnapshot,
    RecordChanges,
    Store,
    WriteTransaction,
    check_record_name,
    encode_record_changes,
    encode_records,
    new_generation,
)

LOG_LIMIT = 1024
"""Commits a namespace's log keeps at least (at most twice that) for readers to catch up."""


@dataclass
class _Namespace:
    generation: str = field(default_factory=new_generation)
    seq: int = 0
    nodes: dict[str, Node] = field(default_factory=dict)
    log: list[tuple[int, list[str], list[str]]] = field(default_factory=list)
    """(seq, ids written, ids deleted) per recent commit: catching up reads only the tail."""
    log_floor: int = 0
    """The last sequence number dropped from ``log``: a reader behind it reloads in full."""
    info: NamespaceInfo = field(default_factory=NamespaceInfo)
    records: dict[str, dict[str, JSONDict]] = field(default_factory=dict)
    history: dict[str, list[LeafVersion]] = field(default_factory=dict)
    """Each leaf's earlier versions, oldest first (frozen dataclasses: shared safely)."""
    writer: threading.Lock = field(default_factory=threading.Lock)


class MemoryBackend(Store):
    """Keeps nodes in dictionaries, with the same sequence and lock semantics as the
    durable stores, so the engine behaves identically on every store.

    Several memories in one process may share one ``MemoryBackend``; writers to a
    namespace are serialized by a per-namespace lock. Each namespace remembers
    between ``log_limit`` and twice that many recent commits for the others to
    catch up with; one that fell further behind reloads the whole tree.
    """

    def __init__(self, *, log_limit: int = LOG_LIMIT) -> None:
        if isinstance(log_limit, bool) or not isinstance(log_limit, int) or log_limit < 1:
            raise ValueError(f"log_limit must be an integer >= 1, got {log_limit!r}")
        self.log_limit = log_limit
        self._namespaces: dict[NamespaceKey, _Namespace] = {}
        self._data_lock = threading.Lock()  # short critical sections only

    def _space(self, namespace: NamespaceKey) -> _Namespace:
        with self._data_lock:
            space = self._namespaces.get(namespace)
            if space is None:
                space = self._namespaces[namespace] = _Namespace()
            return space

    def read_changes(self, namespace: NamespaceKey, since: int) -> ChangeBatch:
        space = self._space(namespace)
        with self._data_lock:
            return _changes(space, since)

    def read_snapshot(self, namespace: NamespaceKey, since: int = 0) -> NamespaceSnapshot:
        space = self._space(namespace)
        with self._data_lock:  # commits and record writes take it too: one moment
            records = {kind: copy.deepcopy(table) for kind, table in sorted(space.records.items()) if table}
            return NamespaceSnapshot(_changes(space, since), records, _history(space, None))

    def head(self, namespace: NamespaceKey) -> tuple[int, str]:
        space = self._space(namespace)
        with self._data_lock:
            return space.seq, space.generation

    def begin(self, namespace: NamespaceKey) -> WriteTransaction:
        space = self._space(namespace)
        space.writer.acquire()
        return _MemoryTransaction(self, space)

    def list_namespaces(self, prefix: NamespaceKey = ()) -> list[NamespaceKey]:
        with self._data_lock:
            return sorted(
                key for key, space in self._namespaces.items() if _holds_data(space) and key[: len(prefix)] == prefix
            )

    def delete_namespace(self, namespace: NamespaceKey) -> bool:
        space = self._space(namespace)
        # As in the SQL stores: a write in progress commits first, then goes with it.
        with space.writer, self._data_lock:
            if self._namespaces.get(namespace) is space:
                del self._namespaces[namespace]
        return _holds_data(space)

    def put_records(self, namespace: NamespaceKey, kind: str, records: Mapping[str, JSONDict | None]) -> None:
        encoded = encode_records(kind, records)
        staged = {key: None if text is None else json.loads(text) for key, text in encoded.items()}
        space = self._space(namespace)
        with self._data_lock:
            _write_records(space, kind, staged)

    def get_records(self, namespace: NamespaceKey, kind: str, keys: Sequence[str] | None = None) -> dict[str, JSONDict]:
        check_record_name(kind, "record kind")
        space = self._space(namespace)
        with self._data_lock:
            table = space.records.get(kind, {})
            if keys is None:
                return copy.deepcopy(table)
            wanted = set(keys)
            return {key: copy.deepcopy(value) for key, value in table.items() if key in wanted}

    def delete_records(self, namespace: NamespaceKey, kind: str) -> int:
        space = self._space(namespace)
        with self._data_lock:
            return len(space.records.pop(kind, {}))

    def record_kinds(self, namespace: NamespaceKey) -> list[str]:
        space = self._space(namespace)
        with self._data_lock:
            return sorted(kind for kind, table in space.records.items() if table)

    def read_history(self, namespace: NamespaceKey, leaf_id: str | None = None) -> list[LeafVersion]:
        space = self._space(namespace)
        with self._data_lock:
            return _history(space, leaf_id)


def _history(space: _Namespace, leaf_id: str | None) -> list[LeafVersion]:
    """Copies (a caller may change a version's metadata dict; the store's stays)."""
    chosen = [space.history.get(leaf_id, [])] if leaf_id is not None else list(space.history.values())
    return [replace(version, metadata=copy.deepcopy(version.metadata)) for versions in chosen for version in versions]


def _holds_data(space: _Namespace) -> bool:
    return bool(space.nodes) or any(space.records.values())


def _changes(space: _Namespace, since: int) -> ChangeBatch:
    complete = 0 < since < space.log_floor  # the commits since then were dropped from the log
    if since <= 0 or complete:
        nodes = [_detached(node) for node in space.nodes.values()]
        deleted: list[str] = []
    else:
        start = bisect.bisect_right(space.log, since, key=lambda entry: entry[0])
        written: dict[str, None] = {}
        deleted_ids: dict[str, None] = {}
        for _, ids, gone in space.log[start:]:
            written.update(dict.fromkeys(ids))
            deleted_ids.update(dict.fromkeys(gone))
        nodes = [_detached(space.nodes[i]) for i in written if i in space.nodes]
        deleted = [i for i in deleted_ids if i not in space.nodes]
    return ChangeBatch(nodes, deleted, space.seq, space.generation, copy.deepcopy(space.info), complete)


def _trim_log(space: _Namespace, limit: int) -> None:
    """Keep the last ``limit`` commits once the log holds twice that (dropping half
    at once costs O(1) a commit, amortized); readers behind the floor reload whole."""
    if len(space.log) > 2 * limit:
        cut = len(space.log) - limit
        space.log_floor = space.log[cut - 1][0]
        del space.log[:cut]


def _detached(node: Node) -> Node:
    out = node.copy()
    out.children = []
    return out


@dataclass
class _Staged:
    """One batch of a memory transaction, copied and checked, waiting for the commit."""

    seq: int
    nodes: list[Node]
    deletions: list[str]
    info: NamespaceInfo | None
    versions: list[LeafVersion]
    records: dict[str, dict[str, JSONDict | None]]


class _MemoryTransaction(WriteTransaction):
    def __init__(self, store: MemoryBackend, space: _Namespace) -> None:
        self._store = store
        self._space = space
        self._open = True
        self._staged: list[_Staged] = []

    def read_changes(self, since: int) -> ChangeBatch:
        with self._store._data_lock:
            return _changes(self._space, since)

    def stage(
        self,
        upserts: Sequence[Node],
        deletions: Sequence[str],
        info: NamespaceInfo | None = None,
        versions: Sequence[LeafVersion] = (),
        records: RecordChanges | None = None,
    ) -> int:
        if not self._open:
            raise RuntimeError("this transaction is already finished")
        encoded = encode_record_changes(records)  # copy and check first: a failure changes nothing
        staged = _Staged(
            seq=(self._staged[-1].seq if self._staged else self._space.seq) + 1,
            nodes=[_detached(node) for node in upserts],
            deletions=list(deletions),
            info=copy.deepcopy(info),
            versions=[replace(version, metadata=copy.deepcopy(version.metadata)) for version in versions],
            records={
                kind: {key: None if text is None else json.loads(text) for key, text in table.items()}
                for kind, table in encoded.items()
            },
        )
        self._staged.append(staged)
        return staged.seq

    def commit_staged(self) -> None:
        if not self._open:
            raise RuntimeError("this transaction is already finished")
        with self._store._data_lock:
            space = self._space
            for staged in self._staged:
                for node in staged.nodes:
                    space.nodes[node.id] = node
                for node_id in staged.deletions:
                    space.nodes.pop(node_id, None)
                    space.history.pop(node_id, None)
                for version in staged.versions:
                    space.history.setdefault(version.leaf_id, []).append(version)
                for kind, changes in staged.records.items():
                    _write_records(space, kind, changes)
                space.log.append((staged.seq, [node.id for node in staged.nodes], staged.deletions))
                _trim_log(space, self._store.log_limit)
                if staged.info is not None:
                    space.info = staged.info
                space.seq = staged.seq
        self._finish()

    def rollback(self) -> None:
        self._finish()

    def _finish(self) -> None:
        if self._open:
            self._open = False
            self._staged = []
            self._space.writer.release()


def _write_records(space: _Namespace, kind: str, changes: Mapping[str, JSONDict | None]) -> None:
    table = space.records.setdefault(kind, {})
    for key, value in changes.items():
        if value is None:
            table.pop(key, None)
        else:
            table[key] = value
