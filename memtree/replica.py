"""``Replica``: this process's copy of one namespace, kept in step with its store.

A replica holds the tree (:class:`~memtree.state.TreeState`) and its vector index,
and changes only by applying change batches: those other writers committed (read
from the store by :meth:`Replica.refresh`) and this process's own commits
(:meth:`Replica.commit` shows each one exactly as another writer's would be seen).
Queries read it under a shared lock; applying a batch takes the lock alone.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from memtree.index import VectorIndex
from memtree.node import ROOT_ID, LeafVersion, Node
from memtree.redaction import masked_texts, redacted
from memtree.state import TreeState, paused_gc
from memtree.store.base import ChangeBatch, NamespaceInfo, NamespaceKey, RecordChanges, Store, WriteTransaction

R = TypeVar("R")


class Replica:
    """The tree and index of ``namespace`` in ``store``, as this process knows them.

    ``refresh_interval`` is how many seconds a read may skip asking the store
    whether another writer committed (0: ask every time).
    """

    def __init__(self, store: Store, namespace: NamespaceKey, *, lexical: bool, refresh_interval: float) -> None:
        if refresh_interval < 0:
            raise ValueError(f"refresh_interval must be >= 0 seconds, got {refresh_interval}")
        self.store = store
        self.namespace = namespace
        self.refresh_interval = refresh_interval
        self.state = TreeState(lexical=lexical)
        self.index: VectorIndex | None = None
        self.lock = ReadWriteLock()
        self._sync_lock = threading.Lock()
        self._last_refresh = 0.0

    # -- reading ------------------------------------------------------------------------

    def read(self, view: Callable[..., R], *args: Any, **kwargs: Any) -> R:
        """``view(state, *args, **kwargs)`` on the caught-up tree, under the read lock."""
        self.maybe_refresh()
        with self.lock.read():
            return view(self.state, *args, **kwargs)

    def get(self, node_id: str) -> Node:
        """A copy of a node (``KeyError`` naming the id if there is none, or it expired)."""
        self.maybe_refresh()
        with self.lock.read():
            node = self.state.nodes.get(node_id)
            hidden = self.hidden()
            if node is None or node_id in hidden:
                gone = "" if node is None else " (it expired)"
                raise KeyError(f"no node with id {node_id!r} in namespace {self.namespace!r}{gone}")
            return self._copy_out(node, hidden, self.masked(hidden))

    def get_many(self, node_ids: Iterable[str]) -> dict[str, Node]:
        """Copies of those of ``node_ids`` that exist (and have not expired), read
        from one snapshot."""
        self.maybe_refresh()
        with self.lock.read():
            nodes, hidden = self.state.nodes, self.hidden()
            masked = self.masked(hidden)
            return {
                node_id: self._copy_out(nodes[node_id], hidden, masked)
                for node_id in node_ids
                if node_id in nodes and node_id not in hidden
            }

    def snapshot(self) -> list[Node]:
        """Copies of every node but the expired ones, root first, in depth-first pre-order."""
        self.maybe_refresh()
        with self.lock.read():
            hidden = self.hidden()
            masked = self.masked(hidden)
            return [self._copy_out(node, hidden, masked) for node in self.state.walk() if node.id not in hidden]

    def show(self, view: Callable[..., R], *args: Any, **kwargs: Any) -> R:
        """``view`` (a picture) of the caught-up tree as a reader may see it: with
        leaves expired since the last sweep left out and the summaries above them in
        stand-in text (:func:`~memtree.redaction.redacted`)."""
        self.maybe_refresh()
        with self.lock.read():
            return view(redacted(self.state, time.time()), *args, **kwargs)

    def leaf_ids_under(self, node_id: str) -> tuple[str, ...]:
        """Ids of the leaves below a node that have not expired (as this replica
        knows it: no catch-up)."""
        with self.lock.read():
            hidden = self.hidden()
            if node_id not in self.state.nodes or node_id in hidden:
                raise KeyError(f"no node with id {node_id!r} in namespace {self.namespace!r}")
            leaves = self.state.leaf_ids_under(node_id)
            return tuple(leaf for leaf in leaves if leaf not in hidden) if hidden else leaves

    def hidden(self) -> frozenset[str]:
        """What reads must not return now: expired leaves and the summaries of
        nothing else (:meth:`TreeState.hidden`); call under the read lock."""
        return self.state.hidden(time.time())

    def masked(self, hidden: frozenset[str]) -> dict[str, str]:
        """Summaries that still hold the text of a leaf expired since the last sweep,
        with the stand-in text a reader gets instead (:mod:`memtree.redaction`); call
        under the read lock with :meth:`hidden`'s answer (empty: nothing expired)."""
        return masked_texts(self.state, time.time()) if hidden else {}

    def live_leaf_total(self) -> int:
        """Leaves not expired (call under the read lock)."""
        return self.state.leaf_total - len(self.state.expired(time.time()))

    def sweep_due(self) -> bool:
        """Whether a leaf this replica knows of has expired and waits for a sweep."""
        next_expiry = self.state.next_expiry
        return next_expiry is not None and next_expiry <= time.time()

    def _copy_out(self, node: Node, hidden: frozenset[str] = frozenset(), masked: dict[str, str] | None = None) -> Node:
        out = node.copy()
        if node.id == ROOT_ID:  # the stored root does not count; the state does
            out.leaf_count = self.live_leaf_total()
        if hidden:
            out.children = [child for child in out.children if child not in hidden]
        if masked and node.id in masked:
            out.text, out.stale = masked[node.id], True
        return out

    # -- catching up -----------------------------------------------------------------------

    def refresh(self, *, force: bool = False) -> None:
        """Apply what other writers committed since this replica last looked."""
        if not force and self.state.generation is not None:
            seq, generation = self.store.head(self.namespace)
            if seq == self.state.seq and generation == self.state.generation:
                self._last_refresh = time.monotonic()
                return
        self.catch_up(lambda since: self.store.read_changes(self.namespace, since))

    def maybe_refresh(self) -> None:
        """:meth:`refresh` unless one ran less than ``refresh_interval`` ago."""
        if time.monotonic() - self._last_refresh >= self.refresh_interval:
            self.refresh()

    def catch_up(self, read: Callable[[int], ChangeBatch]) -> None:
        """Apply the changes ``read(since)`` returns (from the store, or from a write
        transaction under the store's lock)."""
        with self._sync_lock, paused_gc():
            batch = read(self.state.seq)
            if batch.generation != self.state.generation and self.state.seq > 0:
                batch = read(0)  # the namespace was deleted and made again: start over
            self._apply(batch)
            self._last_refresh = time.monotonic()

    def commit(
        self,
        transaction: WriteTransaction,
        upserts: list[Node],
        deletions: list[str],
        info: NamespaceInfo | None = None,
        versions: Sequence[LeafVersion] = (),
    ) -> None:
        """Commit atomically, then show the same change to this process's tree."""
        seq = transaction.commit(upserts, deletions, info, versions)
        self._show(seq, upserts, deletions, info)

    def stage(
        self,
        transaction: WriteTransaction,
        upserts: list[Node],
        deletions: list[str],
        info: NamespaceInfo | None = None,
        versions: Sequence[LeafVersion] = (),
        records: RecordChanges | None = None,
    ) -> None:
        """Stage one batch of a transaction that holds several and show it to this
        process's tree at once, so the next batch is planned on top of it. If the
        transaction then fails, :meth:`reload` forgets what was shown."""
        seq = transaction.stage(upserts, deletions, info, versions, records)
        self._show(seq, upserts, deletions, info)

    def reload(self) -> None:
        """Forget this process's tree and read it again from the store (after a
        transaction whose staged batches were shown here failed to commit)."""
        with self._sync_lock, self.lock.write():
            self.state.__init__(lexical=self.state.lexical is not None)  # type: ignore[misc]
            self.index = None
        self.refresh(force=True)

    def _show(self, seq: int, upserts: list[Node], deletions: list[str], info: NamespaceInfo | None) -> None:
        batch = ChangeBatch(
            nodes=[node.copy() for node in upserts],
            deleted=list(deletions),
            seq=seq,
            generation=self.state.generation or "",
            info=info if info is not None else self.state.info,
        )
        with self._sync_lock:
            self._apply(batch)

    def _apply(self, batch: ChangeBatch) -> None:
        with self.lock.write():
            written, removed, reset = self.state.apply(batch)
            if reset:
                self.index = None
            dimension = self.state.info.dimension
            if self.index is None and dimension is not None:
                self.index = VectorIndex(dimension)
                written = [node for node in self.state.nodes.values() if not node.is_root]
                removed = []
            if self.index is None:
                return
            self.index.remove(removed)
            embedded = [node for node in written if node.embedding is not None]
            if embedded:
                self.index.upsert(
                    [node.id for node in embedded],
                    [node.embedding for node in embedded],  # type: ignore[misc]
                    [node.is_leaf for node in embedded],
                    [node.timestamp for node in embedded],
                )


class ReadWriteLock:
    """Many readers or one writer. Writers wait for readers to leave and block new
    readers while waiting, so a steady stream of queries cannot starve an insert."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._readers = 0
        self._writer = False
        self._writers_waiting = 0

    @contextmanager
    def read(self) -> Iterator[None]:
        with self._cond:
            while self._writer or self._writers_waiting:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                if self._readers == 0:
                    self._cond.notify_all()

    @contextmanager
    def write(self) -> Iterator[None]:
        with self._cond:
            self._writers_waiting += 1
            while self._writer or self._readers:
                self._cond.wait()
            self._writers_waiting -= 1
            self._writer = True
        try:
            yield
        finally:
            with self._cond:
                self._writer = False
                self._cond.notify_all()
