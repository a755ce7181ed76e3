"""The ``Store`` boundary: where a memory's nodes live between processes and restarts.

A store keeps many namespaces, one tree each. The engine talks to it in two ways:

* ``read_changes(namespace, since)``: every node written and every id deleted after
  sequence number ``since``. A fresh memory reads from 0; a running one reads only
  what other writers added, so its in-process index catches up incrementally.
* ``write(namespace)``: an exclusive, atomic write transaction. Writers to one
  namespace are serialized (across threads, processes and machines, as far as the
  backend reaches); everything committed in one transaction shares one new
  sequence number, and a failure before ``commit`` leaves the store untouched.

Stores persist the fields of :class:`~memtree.node.Node` except ``children``, which
the engine derives from ``parent``.

Besides the tree, a namespace holds *records*: small JSON documents under a
``kind`` and a key, for what adapters must keep exactly as given next to the tree
(a chat history's message log, a key-value store's items). Records are not
embedded and never routed; they only share the namespace, its lifetime and the
store's durability.

A namespace also keeps each leaf's *history*: the :class:`~memtree.node.LeafVersion`
s that ``MemTree.update`` replaced, committed in the same transaction as the update.
Deleting a leaf deletes its history with it (forgetting a memory forgets every
version of it); deleting a namespace deletes all of it.
"""

from __future__ import annotations

import json
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from memtree.node import JSONDict, LeafVersion, Node
from memtree.text import unstorable

Namespace = str | tuple[str, ...]
NamespaceKey = tuple[str, ...]

DEFAULT_NAMESPACE: NamespaceKey = ("default",)

_SNAPSHOT_ATTEMPTS = 5


def namespace_key(namespace: Namespace) -> NamespaceKey:
    """Normalize a namespace (``"alice"`` or ``("users", "alice")``) to a tuple.

    Raises ``TypeError`` for anything else and ``ValueError`` for an empty namespace
    or an empty part.
    """
    if not isinstance(namespace, (str, tuple, list)):
        raise TypeError(
            f"namespace must be a str or a tuple of str such as ('users', 'alice'), got {type(namespace).__name__} "
            f"{namespace!r}"
        )
    parts: tuple[Any, ...] = (namespace,) if isinstance(namespace, str) else tuple(namespace)
    if not parts:
        raise ValueError(f"namespace must be a non-empty str or tuple of str, got {namespace!r}")
    for part in parts:
        if not isinstance(part, str):
            raise TypeError(f"namespace parts must be str, got {type(part).__name__} in {namespace!r}")
        if not part or "\x00" in part:
            raise ValueError(f"namespace parts must be non-empty text without NUL, got {namespace!r}")
    return tuple(parts)


def encode_namespace(key: NamespaceKey) -> str:
    """The text form stores use as a column value (a JSON array)."""
    return json.dumps(list(key), ensure_ascii=False, separators=(",", ":"))


def decode_namespace(text: str) -> NamespaceKey:
    return tuple(json.loads(text))


def encode_records(kind: str, records: Mapping[str, JSONDict | None]) -> dict[str, str | None]:
    """Check records before anything is written and return them as JSON text.

    Kinds and keys are non-empty text without NUL (PostgreSQL cannot store it);
    values are JSON objects or ``None`` (delete). Raises ``TypeError`` or
    ``ValueError`` naming the offending key.
    """
    check_record_name(kind, "record kind")
    if not isinstance(records, Mapping):
        raise TypeError(f"records must be a dict of key -> dict (or None), got {type(records).__name__}")
    encoded: dict[str, str | None] = {}
    for key, value in records.items():
        check_record_name(key, "record key")
        if value is None:
            encoded[key] = None
            continue
        if not isinstance(value, Mapping):
            raise TypeError(f"record {key!r} must be a dict (or None to delete it), got {type(value).__name__}")
        try:
            text = json.dumps(dict(value), ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        except (TypeError, ValueError) as error:
            raise TypeError(f"record {key!r} is not JSON-serializable: {error}") from None
        problem = unstorable(value)
        if problem:
            raise ValueError(f"record {key!r} {problem}; remove it before storing")
        encoded[key] = text
    return encoded


def check_record_name(name: object, what: str) -> str:
    """A record kind or key: non-empty ``str`` without NUL."""
    if not isinstance(name, str):
        raise TypeError(f"{what} must be a str, got {type(name).__name__}")
    if not name or "\x00" in name:
        raise ValueError(f"{what} must be non-empty text without NUL, got {name!r}")
    return name


def new_generation() -> str:
    """A token that changes when a namespace is deleted and created again."""
    return uuid.uuid4().hex


@dataclass
class NamespaceInfo:
    """What a namespace remembers about itself besides its nodes.

    ``dimension`` and ``embedder`` catch a memory reopened with another model;
    ``settings`` holds engine state that must survive a restart (the calibrated θ0).
    """

    dimension: int | None = None
    embedder: str | None = None
    settings: dict[str, Any] = field(default_factory=dict)


@dataclass
class ChangeBatch:
    """Nodes written and ids deleted after some sequence number, up to ``seq``.

    ``generation`` identifies the namespace's current incarnation: if it differs
    from the one a memory loaded, the namespace was deleted (or compacted) meanwhile
    and the memory must start over from an empty tree.

    ``complete`` says ``nodes`` is the whole tree, not the changes after ``since``:
    the store no longer holds what changed since then (a bounded log dropped it), so
    the reader must start over from this batch, as after a new generation, rather
    than apply it on top of what it had and keep nodes deleted meanwhile.
    """

    nodes: list[Node]
    deleted: list[str]
    seq: int
    generation: str
    info: NamespaceInfo
    complete: bool = False


@dataclass
class NamespaceSnapshot:
    """A namespace's nodes and records as they were at one moment (for backups).

    ``changes`` holds what was committed after the ``since`` asked for (0: every
    node); ``records`` holds every record by kind (kinds sorted, records in the
    order first written); ``history`` every leaf's earlier versions, each leaf's
    oldest first.
    """

    changes: ChangeBatch
    records: dict[str, dict[str, JSONDict]]
    history: list[LeafVersion] = field(default_factory=list)


RecordChanges = Mapping[str, Mapping[str, JSONDict | None]]
"""Record writes by kind, then key: a dict writes the record, ``None`` deletes it."""


@dataclass(frozen=True)
class CompactionReport:
    """What :meth:`Store.compact` did: dead rows dropped (deleted nodes' tombstones),
    in how many namespaces, and the store's size on disk before and after (bytes;
    ``None`` where the store cannot tell, as in memory)."""

    rows_dropped: int = 0
    namespaces: int = 0
    bytes_before: int | None = None
    bytes_after: int | None = None


class WriteTransaction(ABC):
    """An exclusive write to one namespace, open until committed or rolled back.

    A transaction holds one or more change batches: :meth:`stage` writes one under
    the next sequence number, :meth:`commit_staged` makes every staged batch visible
    at once (or none, if the process dies first). :meth:`commit` is the common case
    of a single batch. Records staged with a batch commit with it, so a record and
    the tree change it describes are never seen apart.
    """

    @abstractmethod
    def read_changes(self, since: int) -> ChangeBatch:
        """What other writers committed after ``since`` (read inside the lock)."""

    @abstractmethod
    def stage(
        self,
        upserts: Sequence[Node],
        deletions: Sequence[str],
        info: NamespaceInfo | None = None,
        versions: Sequence[LeafVersion] = (),
        records: RecordChanges | None = None,
    ) -> int:
        """Write one change batch under the next sequence number, inside this
        transaction, and return that number; nothing is visible to other readers
        until :meth:`commit_staged`. ``versions`` are appended to their leaves'
        history; a deleted id's history is deleted with it. ``records`` (checked
        before anything is written) are written with the batch."""

    @abstractmethod
    def commit_staged(self) -> None:
        """Make every staged batch visible atomically and end the transaction."""

    def commit(
        self,
        upserts: Sequence[Node],
        deletions: Sequence[str],
        info: NamespaceInfo | None = None,
        versions: Sequence[LeafVersion] = (),
        records: RecordChanges | None = None,
    ) -> int:
        """Write one batch atomically under one new sequence number and return it."""
        seq = self.stage(upserts, deletions, info, versions, records)
        self.commit_staged()
        return seq

    @abstractmethod
    def rollback(self) -> None:
        """Give up the transaction; nothing it would have written is kept."""


def encode_record_changes(records: RecordChanges | None) -> dict[str, dict[str, str | None]]:
    """:func:`encode_records` for every kind of ``records``, all checked before any is written."""
    if not records:
        return {}
    if not isinstance(records, Mapping):
        raise TypeError(f"records must be a dict of kind -> key -> dict (or None), got {type(records).__name__}")
    return {kind: encode_records(kind, table) for kind, table in records.items()}


class Store(ABC):
    """Interface for memory backends (in-memory, SQLite, PostgreSQL).

    Implement :meth:`read_changes`, :meth:`begin`, :meth:`head`,
    :meth:`list_namespaces`, :meth:`delete_namespace`, the record methods and
    :meth:`read_history`; :meth:`write` wraps :meth:`begin` with commit-or-rollback.
    """

    @abstractmethod
    def read_changes(self, namespace: NamespaceKey, since: int) -> ChangeBatch:
        """Everything committed to ``namespace`` after ``since`` (0: everything)."""

    @abstractmethod
    def head(self, namespace: NamespaceKey) -> tuple[int, str]:
        """The namespace's latest sequence number and generation (cheap)."""

    @abstractmethod
    def begin(self, namespace: NamespaceKey) -> WriteTransaction:
        """Wait for the namespace's writer lock and open a transaction."""

    @abstractmethod
    def list_namespaces(self, prefix: NamespaceKey = ()) -> list[NamespaceKey]:
        """Namespaces that hold a tree, sorted, optionally those under ``prefix``."""

    @abstractmethod
    def delete_namespace(self, namespace: NamespaceKey) -> bool:
        """Delete a namespace's whole tree and its records; ``False`` if it did not exist."""

    @abstractmethod
    def put_records(self, namespace: NamespaceKey, kind: str, records: Mapping[str, JSONDict | None]) -> None:
        """Write records of one kind atomically; a ``None`` value deletes that key."""

    @abstractmethod
    def get_records(self, namespace: NamespaceKey, kind: str, keys: Sequence[str] | None = None) -> dict[str, JSONDict]:
        """Records of one kind (only ``keys`` if given), in the order first written."""

    @abstractmethod
    def delete_records(self, namespace: NamespaceKey, kind: str) -> int:
        """Delete every record of one kind; return how many there were."""

    @abstractmethod
    def record_kinds(self, namespace: NamespaceKey) -> list[str]:
        """The kinds of record a namespace holds, sorted (for backups)."""

    @abstractmethod
    def read_history(self, namespace: NamespaceKey, leaf_id: str | None = None) -> list[LeafVersion]:
        """A leaf's earlier versions, oldest first (``None``: every leaf's, each
        leaf's oldest first, for backups)."""

    def read_snapshot(self, namespace: NamespaceKey, since: int = 0) -> NamespaceSnapshot:
        """:meth:`read_changes` and every record of the namespace, as of one moment.

        The stores in memtree read both in one read transaction (or under one lock),
        so a backup taken during writes never pairs a tree with records from another
        moment. This default, for other stores, reads them one after the other and
        retries (a few times) while a commit lands in between; a record write alone
        goes unseen by that check (records carry no sequence number).
        """
        for _ in range(_SNAPSHOT_ATTEMPTS):
            changes = self.read_changes(namespace, since)
            records = {kind: self.get_records(namespace, kind) for kind in self.record_kinds(namespace)}
            history = self.read_history(namespace)
            if self.head(namespace) == (changes.seq, changes.generation):
                break
        return NamespaceSnapshot(changes, records, history)

    def compact(self) -> CompactionReport:
        """Drop what the store keeps only for readers catching up (tombstones of
        deleted nodes) and give the space back, safely while others read and write.
        A store that keeps no such rows has nothing to do (this default)."""
        return CompactionReport()

    def close(self) -> None:  # noqa: B027 - optional hook, nothing to release by default
        """Release connections and files."""

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called: a closed store refuses every call, so
        background threads (a LangGraph store's TTL sweeper) stop instead of failing."""
        return False

    @contextmanager
    def write(self, namespace: NamespaceKey) -> Iterator[WriteTransaction]:
        """``with store.write(ns) as txn:``; rolls back if the block raises or never commits."""
        transaction = self.begin(namespace)
        try:
            yield transaction
        except BaseException:
            transaction.rollback()
            raise
        else:
            transaction.rollback()  # a no-op after commit; releases the lock otherwise


LANGGRAPH_STORE_METHODS = (
    "get",
    "put",
    "delete",
    "search",
    "batch",
    "aget",
    "aput",
    "adelete",
    "asearch",
    "abatch",
    "alist_namespaces",
)
"""Methods of LangGraph's ``BaseStore`` that a memtree ``Store`` does not have."""


def not_a_langgraph_store(backend: Store, what: str) -> TypeError:
    """The error for an engine backend used where LangGraph expects its store:
    ``what`` it was asked to do, and the class that does it."""
    name = type(backend).__name__
    return TypeError(
        f"{name} is memtree's storage backend, not a LangGraph store: it cannot {what}. Where LangGraph "
        "expects a store (create_agent(store=...), graph.compile(store=...)), pass "
        f"langchain_memtree.MemTreeStore(MemTree(store=backend))"
    )


def _refusing(method: str) -> Any:
    """A stand-in for a LangGraph store method that says which class was meant.

    An engine backend handed to ``create_agent(store=...)`` is accepted by LangGraph
    (it checks nothing) and would otherwise fail at the agent's first store call
    with a bare ``AttributeError``; this fails at that same call, but names the fix.
    """

    def refuse(self: Store, *args: Any, **kwargs: Any) -> Any:
        raise not_a_langgraph_store(self, f"{method}()")

    refuse.__name__ = refuse.__qualname__ = method
    refuse.__doc__ = "Raises ``TypeError``: this is not a LangGraph store (use ``langchain_memtree.MemTreeStore``)."
    return refuse


for _method in LANGGRAPH_STORE_METHODS:
    setattr(Store, _method, _refusing(_method))
