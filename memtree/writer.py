"""``Writer``: where a text enters a memory once and leaves committed.

Every write (add, flush, delete, repair, import) runs the same pipeline: check the
input, embed it, plan the change and make its model calls outside the store's
writer lock (:mod:`memtree.procedures`), then take the lock, catch up with other
writers and commit if nothing the plan read has changed (:mod:`memtree.optimistic`);
else plan again. After ``OPTIMISTIC_ATTEMPTS`` conflicts the write is planned under
the lock, which then waits for its model calls. The committed change is shown to
this process's replica exactly as another writer's would be.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType
from typing import Any, Generic, TypeVar

import numpy as np

from memtree.background import Abandoned, BackgroundSummaries, KeptConflicting, remaining, run_bounded
from memtree.config import AGGREGATION_MODES, MemTreeConfig
from memtree.deferral import PendingSummaries
from memtree.embed import Matrix
from memtree.inputs import Item, TimeLike, make_item
from memtree.model_calls import ModelCalls, Steps
from memtree.node import LeafVersion, Node, Vector
from memtree.optimistic import OPTIMISTIC_ATTEMPTS, PreparedWrite, still_valid
from memtree.procedures import Procedures
from memtree.redaction import leaked
from memtree.replica import Replica
from memtree.state import ContentKey, TreeState, content_key
from memtree.stats import TreeStats, tree_stats
from memtree.store.base import NamespaceInfo, NamespaceKey, RecordChanges, Store, WriteTransaction

logger = logging.getLogger(__name__)

STALE_NAMED = 20
"""Stale summaries :func:`warn_left_stale` names one by one (then a count)."""


def warn_left_stale(left: list[str], timeout: float | None) -> None:
    """One warning naming the summaries ``MemTree.close`` left stale (as
    ``namespace:id``) within ``timeout`` seconds: they keep their old text, and
    ``repair()`` writes them later."""
    if not left:
        return
    shown = ", ".join(left[:STALE_NAMED])
    more = f" and {len(left) - STALE_NAMED} more" if len(left) > STALE_NAMED else ""
    logger.warning(
        "close() left %d summaries stale (not written within %s, or their model call failed): %s%s; "
        "call repair() later",
        len(left),
        "the time allowed" if timeout is None else f"{timeout:g} s",
        shown,
        more,
    )


T = TypeVar("T")
M = TypeVar("M")

ItemLists = tuple[
    Sequence[str],
    Sequence[Mapping[str, Any] | None] | None,
    Sequence[TimeLike | None] | None,
    Sequence[str | None] | None,
    float | None,
]
"""``add_many``'s texts, metadata, timestamps and source ids, not yet checked, and
when all of them expire (checked: POSIX seconds, ``None``: never)."""


class Writer:
    """The write side of one memory: entry points, the deferred-aggregation blocks
    and the optimistic commit loop."""

    def __init__(self, replica: Replica, calls: ModelCalls, config: MemTreeConfig) -> None:
        self.replica = replica
        self.calls = calls
        self.config = config
        self.pending = PendingSummaries()
        self.procedures = Procedures(replica, calls, config, self.pending)
        self._deferring = 0
        self._deferring_lock = threading.Lock()
        self.background = BackgroundSummaries(
            self._background_flush,
            lambda: len(self.pending),
            queue_size=config.background_queue_size,
            name=f"memtree-background-{'/'.join(replica.namespace) or 'root'}",
        )
        calls.in_worker_thread = self.background.is_worker_thread
        _WRITERS.add(self)

    # -- entry points ----------------------------------------------------------------

    def add(self, item: Item, aggregation: str | None) -> str:
        mode = self.aggregation_mode(aggregation)
        self.sweep_if_due()
        existing = self.stored_duplicate(item)
        if existing is not None:
            return existing
        vector = self.calls.drive(self.procedures.embed_new_text(item.text))
        leaf_id = self.write(lambda: self.procedures.insert(item, vector, defer=mode != "eager"))
        self._after_insert(mode)
        return leaf_id

    async def aadd(self, item: Item, aggregation: str | None) -> str:
        mode = self.aggregation_mode(aggregation)
        await self.asweep_if_due()
        existing = self.stored_duplicate(item)
        if existing is not None:
            return existing
        vector = await self.calls.adrive(self.procedures.embed_new_text(item.text))
        leaf_id = await self.awrite(lambda: self.procedures.insert(item, vector, defer=mode != "eager"))
        self._after_insert(mode)
        return leaf_id

    def add_many(
        self, given: ItemLists, aggregation: str | None, block: DeferredAggregation[Any], *, bulk: bool = False
    ) -> list[str]:
        mode = self.aggregation_mode(aggregation)
        items = make_items(*given)
        self.sweep_if_due()
        stored = self._stored_mask(items)
        vectors = _fill_in(stored, self.calls.drive(self.procedures.embed(_unstored_texts(items, stored))))
        if bulk:
            new, matrix, places = self._bulk_batch(items, vectors)
            added = self.write(functools.partial(self.procedures.insert_bulk, new, matrix)) if new else []
            return [place if isinstance(place, str) else added[place] for place in places]
        if aggregation is None or mode != "deferred" or self.is_deferring():
            ids = self._insert_all(items, vectors, defer=mode != "eager")
            self._after_insert(mode)
            return ids
        with block:
            return self._insert_all(items, vectors, defer=True)

    async def aadd_many(
        self, given: ItemLists, aggregation: str | None, block: DeferredAggregation[Any], *, bulk: bool = False
    ) -> list[str]:
        mode = self.aggregation_mode(aggregation)
        items = make_items(*given)
        await self.asweep_if_due()
        stored = self._stored_mask(items)
        vectors = _fill_in(stored, await self.calls.adrive(self.procedures.embed(_unstored_texts(items, stored))))
        if bulk:
            new, matrix, places = self._bulk_batch(items, vectors)
            added = await self.awrite(functools.partial(self.procedures.insert_bulk, new, matrix)) if new else []
            return [place if isinstance(place, str) else added[place] for place in places]
        if aggregation is None or mode != "deferred" or self.is_deferring():
            ids = await self._ainsert_all(items, vectors, defer=mode != "eager")
            self._after_insert(mode)
            return ids
        async with block:
            return await self._ainsert_all(items, vectors, defer=True)

    def stored_duplicate(self, item: Item, *, refresh: bool = True) -> str | None:
        """The id of a leaf already holding exactly ``item`` (text, metadata, source
        id), if duplicates are not kept (checked before embedding, so a repeated text
        costs no model call)."""
        if not self.config.deduplicate:
            return None
        if refresh:
            self.replica.maybe_refresh()
        return self.replica.state.duplicate_of(item.text, item.metadata, item.source_id)

    def _stored_mask(self, items: list[Item]) -> list[bool]:
        """Which items are already stored (and need no embedding)."""
        self.replica.maybe_refresh()
        return [self.stored_duplicate(item, refresh=False) is not None for item in items]

    def _bulk_batch(
        self, items: list[Item], vectors: list[Vector | None]
    ) -> tuple[list[Item], Matrix, list[str | int]]:
        """A bulk batch: the items to store and their vectors, and for every item
        either the id of the leaf already holding it or its place among those to
        store. With ``config.deduplicate`` an item repeated within the batch is
        stored once."""
        new: list[Item] = []
        rows: list[Vector] = []
        places: list[str | int] = []
        first: dict[ContentKey, int] = {}
        for item, vector in zip(items, vectors, strict=True):
            if vector is None:
                existing = self.stored_duplicate(item, refresh=False)
                if existing is not None:
                    places.append(existing)
                    continue
                vector = self.calls.drive(self.procedures.embed([item.text]))[0]  # deleted meanwhile
            key = content_key(item.text, item.metadata, item.source_id)
            if self.config.deduplicate and key in first:
                places.append(first[key])
                continue
            first[key] = len(new)
            places.append(len(new))
            new.append(item)
            rows.append(vector)
        matrix = np.stack(rows).astype(np.float32) if rows else np.zeros((0, 1), np.float32)
        return new, matrix, places

    def _insert_all(self, items: list[Item], vectors: list[Vector | None], *, defer: bool) -> list[str]:
        ids = []
        for item, vector in zip(items, vectors, strict=True):
            existing = self.stored_duplicate(item, refresh=False) if vector is None else None
            if existing is not None:
                ids.append(existing)
                continue
            if vector is None:  # the stored copy was deleted meanwhile
                vector = self.calls.drive(self.procedures.embed([item.text]))[0]
            ids.append(self.write(functools.partial(self.procedures.insert, item, vector, defer=defer)))
        return ids

    async def _ainsert_all(self, items: list[Item], vectors: list[Vector | None], *, defer: bool) -> list[str]:
        ids = []
        for item, vector in zip(items, vectors, strict=True):
            existing = self.stored_duplicate(item, refresh=False) if vector is None else None
            if existing is not None:
                ids.append(existing)
                continue
            if vector is None:  # the stored copy was deleted meanwhile
                vector = (await self.calls.adrive(self.procedures.embed([item.text])))[0]
            ids.append(await self.awrite(functools.partial(self.procedures.insert, item, vector, defer=defer)))
        return ids

    def flush(self) -> int:
        if not len(self.pending):
            return 0
        return self.write(self.procedures.flush)

    async def aflush(self) -> int:
        if not len(self.pending):
            return 0
        return await self.awrite(self.procedures.flush)

    def delete(self, node_ids: Iterable[str]) -> int:
        ids = check_leaf_ids(node_ids)
        if ids:
            background = self.in_background()
            self.write(lambda: self.procedures.delete(ids, defer=background))
            if background:
                self.background.notify()
        return len(ids)

    async def adelete(self, node_ids: Iterable[str]) -> int:
        ids = check_leaf_ids(node_ids)
        if ids:
            background = self.in_background()
            await self.awrite(lambda: self.procedures.delete(ids, defer=background))
            if background:
                self.background.notify()
        return len(ids)

    def sweep_expired(self) -> int:
        """Delete every expired leaf (the summaries above rewritten as by a delete; in
        background mode given stand-ins at once and rewritten by the worker)."""
        background = self.in_background()
        swept = self.write(lambda: self.procedures.sweep(defer=background))
        if background and swept:
            self.background.notify()
        return swept

    async def asweep_expired(self) -> int:
        background = self.in_background()
        swept = await self.awrite(lambda: self.procedures.sweep(defer=background))
        if background and swept:
            self.background.notify()
        return swept

    def sweep_if_due(self) -> None:
        """:meth:`sweep_expired` when a leaf this process knows of has expired: writes
        sweep on the way, so expired memories do not wait for an explicit sweep. A
        sweep that fails is logged and left for the next one; the write goes on."""
        if self.replica.sweep_due():
            try:
                self.sweep_expired()
            except Exception:  # the caller's write must not fail because an old memory could not go
                logger.exception("sweeping expired memories failed; the next write or sweep_expired() retries")

    async def asweep_if_due(self) -> None:
        if self.replica.sweep_due():
            try:
                await self.asweep_expired()
            except Exception:  # as in sweep_if_due
                logger.exception("sweeping expired memories failed; the next write or sweep_expired() retries")

    def repair(self) -> int:
        """Sweep what expired, then rebuild every stale summary and every summary that
        still quotes a removed text (:func:`~memtree.redaction.leaked`); return how
        many were rebuilt."""
        self.sweep_expired()
        leaked = self._leaked()
        return self.write(lambda: self.procedures.repair(also=leaked))

    async def arepair(self) -> int:
        await self.asweep_expired()
        leaked = await asyncio.to_thread(self._leaked)
        return await self.awrite(lambda: self.procedures.repair(also=leaked))

    def _leaked(self) -> list[str]:
        versions = self.replica.store.read_history(self.replica.namespace)
        self.replica.maybe_refresh()
        with self.replica.lock.read():
            return leaked(self.replica.state, versions, time.time())

    def set_expiry(self, leaf_ids: list[str], expires_at: float | None) -> int:
        return self.write(lambda: self.procedures.set_expiry(leaf_ids, expires_at))

    async def aset_expiry(self, leaf_ids: list[str], expires_at: float | None) -> int:
        return await self.awrite(lambda: self.procedures.set_expiry(leaf_ids, expires_at))

    def in_background(self) -> bool:
        """Whether a delete or an update left to the configured mode hands its
        summaries to the background worker (``aggregation="background"``, outside a
        ``deferred()`` block), so that it never waits for a chat model."""
        return self.aggregation_mode(None) == "background"

    def restore(self, nodes: list[Node], info: NamespaceInfo, versions: Sequence[LeafVersion] = ()) -> None:
        """Write a whole checked tree (and its leaves' history) into this (empty)
        namespace in one transaction. The aggregator learns the leaves' vectors, as it
        does a new leaf's, so summaries rewritten later do not embed them again."""
        leaves = [(node.text, node.embedding) for node in nodes if node.is_leaf and node.embedding is not None]
        if leaves:
            self.calls.aggregator.learn_vectors([text for text, _ in leaves], np.stack([v for _, v in leaves]))
        self.write(lambda: self.procedures.restore(nodes, info, versions))

    def reinsert_leaf(self, leaf: Node) -> None:
        """Route a stored leaf in again with its own id, times and embedding."""
        item = Item(leaf.text, dict(leaf.metadata), leaf.timestamp, leaf.source_id, leaf.expires_at)
        assert leaf.embedding is not None
        embedding = leaf.embedding
        self.calls.aggregator.learn_vectors([leaf.text], embedding[None, :])  # as a new leaf's, not embedded again
        self.write(lambda: self.procedures.insert(item, embedding, restore=leaf))

    def embed_query(self, query: str) -> Vector:
        return self.calls.drive(self.procedures.embed([query], query=True))[0]

    async def aembed_query(self, query: str) -> Vector:
        return (await self.calls.adrive(self.procedures.embed([query], query=True)))[0]

    def stats(self, state: TreeState) -> TreeStats:
        """The memory's size, shape and cost counters, with the θ0 in force and the
        summaries waiting for a flush (``state`` read under the replica's lock)."""
        return tree_stats(state, self.calls.counters.snapshot(), self.procedures.theta0(), pending=len(self.pending))

    def stop(self, timeout: float | None) -> list[str]:
        """Stop the background worker and write the summaries still pending, waiting
        at most ``timeout`` seconds in all (``None``: as long as it takes); return the
        ids of the stale summaries if not everything pending could be written (they
        wait for ``repair()``; closing goes on), else ``[]``.

        Whatever happened by then, the worker is stopped when this returns: a flush
        still waiting for its model drops its write instead of committing later, so
        nothing is written (or logged) after ``close()``, even into a closed store."""
        if self.background.abandoned:  # stopped before (closing its store stops every writer on it)
            return []
        deadline = None if timeout is None else time.monotonic() + timeout
        done = self.background.stop(remaining(deadline))
        if done and self._pending_stale():  # writes that arrived while the worker stopped
            done = run_bounded(self._finish_on_close, remaining(deadline), f"{self.background.name}-close")
        self.background.abandon()
        if done and not self._pending_stale():
            return []
        with self.replica.lock.read():
            return sorted(node.id for node in self.replica.state.nodes.values() if node.stale)

    def sweep_before_showing(self) -> None:
        """Sweep expired leaves before a picture or a backup shows the whole tree
        (their summaries' texts too must stop mentioning them). A store this process
        may not write (read-only) cannot be swept: there the picture shows them."""
        self.replica.maybe_refresh()
        if self.replica.sweep_due():
            with contextlib.suppress(PermissionError):
                self.sweep_expired()

    def _pending_stale(self) -> bool:
        """Whether a summary this memory still has to write is stale in the tree."""
        if not len(self.pending):
            return False
        with self.replica.lock.read():
            nodes = self.replica.state.nodes
            return any(node_id in nodes and nodes[node_id].stale for node_id in self.pending.ids())

    def _finish_on_close(self) -> None:
        """The last flush, then, for a summary it could not rebuild because one of its
        children is stale (another writer's pending summary, or one a crash left), a
        repair, which rebuilds those children first."""
        try:
            self.write(self.procedures.flush, cancelled=lambda: self.background.abandoned)
            if self._pending_stale():
                self.write(self.procedures.repair, cancelled=lambda: self.background.abandoned)
        except Abandoned:
            pass
        except Exception as error:  # noqa: BLE001 - closing must go on; the summaries stay stale
            if self.background.abandoned:
                logger.debug("the last flush of %s after close dropped: %r", self.background.name, error)
            else:
                logger.warning("flushing pending summaries on close failed (%s); they stay stale", error)

    # -- deferred aggregation --------------------------------------------------------

    def is_deferring(self) -> bool:
        with self._deferring_lock:
            return self._deferring > 0

    def enter_deferred(self) -> None:
        with self._deferring_lock:
            self._deferring += 1

    def leave_deferred(self) -> bool:
        """Close one block; whether it was the outermost."""
        with self._deferring_lock:
            self._deferring -= 1
            return self._deferring == 0

    def aggregation_mode(self, aggregation: str | None) -> str:
        if aggregation is None:
            return "deferred" if self.is_deferring() else self.config.aggregation
        if aggregation not in AGGREGATION_MODES:
            raise ValueError(f"aggregation must be one of: {', '.join(AGGREGATION_MODES)}; got {aggregation!r}")
        if aggregation == "background" and self.is_deferring():
            return "deferred"  # the block's end writes them; a worker would race it
        return aggregation

    def _background_flush(self, last: bool) -> int:
        """The worker's flush: optimistic only (see :class:`~memtree.background.KeptConflicting`)
        except for the ``last`` one; dropped once the memory is closed."""
        if not len(self.pending) or self.background.abandoned:
            return 0
        return self.write(self.procedures.flush, plan_under_lock=last, cancelled=lambda: self.background.abandoned)

    def _after_insert(self, mode: str) -> None:
        """Hand a committed background insert's summaries to the worker."""
        if mode == "background":
            self.background.notify()

    # -- the optimistic commit loop ----------------------------------------------------

    def write(
        self,
        procedure: Callable[[], Steps[PreparedWrite[T]]],
        *,
        plan_under_lock: bool = True,
        cancelled: Callable[[], bool] | None = None,
    ) -> T:
        """Plan a write and make its model calls outside the store's writer lock, then
        commit it under the lock if nothing it depends on changed meanwhile (else plan
        again; see :mod:`memtree.optimistic`). After ``OPTIMISTIC_ATTEMPTS`` conflicts
        the write is planned under the lock, which then waits for its model calls
        (``plan_under_lock=False`` raises :class:`KeptConflicting` instead).
        ``cancelled`` (the background worker's: the memory was closed) is asked after
        the model calls, before anything is committed: if it says so, nothing is and
        :class:`~memtree.background.Abandoned` is raised."""
        store, namespace = self.replica.store, self.replica.namespace
        for _ in range(OPTIMISTIC_ATTEMPTS):
            _check_cancelled(cancelled)
            self.replica.maybe_refresh()
            prepared = self.calls.drive(procedure())
            if prepared.empty:
                return prepared.result
            if cancelled is not None and cancelled():
                prepared.abandon()
                raise Abandoned(f"{self.background.name}: the memory was closed")
            with store.write(namespace) as transaction:
                if self._commit_prepared(transaction, prepared):
                    return prepared.result
            self.calls.counters.add("write_conflicts")
        if not plan_under_lock:
            raise KeptConflicting(f"{OPTIMISTIC_ATTEMPTS} plans in a row conflicted with other writes")
        _check_cancelled(cancelled)
        with store.write(namespace) as transaction:
            self.replica.catch_up(transaction.read_changes)
            prepared = self.calls.drive(procedure())
            if cancelled is not None and cancelled():
                prepared.abandon()
                raise Abandoned(f"{self.background.name}: the memory was closed")
            if not prepared.empty and not self._commit_prepared(transaction, prepared):
                raise RuntimeError("the tree changed while this memory held the store's writer lock")
            return prepared.result

    async def awrite(self, procedure: Callable[[], Steps[PreparedWrite[T]]]) -> T:
        """Async :meth:`write`. Waiting for the store's writer lock happens in a
        dedicated thread, so other coroutines (and the default executor's threads,
        which model calls use) keep running."""
        store, namespace = self.replica.store, self.replica.namespace
        for _ in range(OPTIMISTIC_ATTEMPTS):
            await asyncio.to_thread(self.replica.maybe_refresh)
            prepared = await self.calls.adrive(procedure())
            if prepared.empty:
                return prepared.result
            transaction = await _begin_in_thread(store, namespace)
            try:
                if self._commit_prepared(transaction, prepared):
                    return prepared.result
            finally:
                transaction.rollback()  # a no-op once committed
            self.calls.counters.add("write_conflicts")
        transaction = await _begin_in_thread(store, namespace)
        try:
            self.replica.catch_up(transaction.read_changes)
            prepared = await self.calls.adrive(procedure())
            if not prepared.empty and not self._commit_prepared(transaction, prepared):
                raise RuntimeError("the tree changed while this memory held the store's writer lock")
            return prepared.result
        finally:
            transaction.rollback()

    def write_together(self, plan: Callable[[Staging], T], records: RecordChanges | None = None) -> T:
        """Several write procedures and record changes committed as ONE transaction.

        ``plan`` runs under the store's writer lock, after catching up: each
        procedure it hands to :meth:`Staging.run` is planned on the tree the ones
        before it left, its model calls made there and then (so the lock waits for
        them; deferred and background summaries make none), and its batch staged.
        ``records`` are committed with them, in the same transaction. Other
        processes see all of it or, if this process dies or anything raises first,
        none of it; this process's tree is then read again from the store.
        """
        store, namespace = self.replica.store, self.replica.namespace
        self.replica.maybe_refresh()
        staging: Staging | None = None
        try:
            with store.write(namespace) as transaction:
                self.replica.catch_up(transaction.read_changes)
                staging = Staging(self, transaction)
                result = plan(staging)
                if records:
                    self.replica.stage(transaction, [], [], records=records)
                transaction.commit_staged()
        except BaseException:
            if staging is not None and staging.staged:
                for prepared in staging.staged:
                    prepared.abandon()
                self.replica.reload()
            raise
        for prepared in staging.staged:
            if prepared.committed is not None:
                prepared.committed()
        return result

    def _commit_prepared(self, transaction: WriteTransaction, prepared: PreparedWrite[Any]) -> bool:
        """Catch up under the lock and commit ``prepared`` if it still holds; ``False``
        (and the plan abandoned) if another write changed what it depends on."""
        replica = self.replica
        try:
            replica.catch_up(transaction.read_changes)
            if prepared.recheck is not None:
                answer = prepared.recheck()
                if answer is not None:
                    prepared.result = answer
                    prepared.abandon()
                    return True
            if not still_valid(replica.state, prepared) and not (prepared.rebase is not None and prepared.rebase()):
                prepared.abandon()
                return False
            info = prepared.info(replica.state.info) if prepared.info is not None else None
            replica.commit(transaction, prepared.upserts, prepared.deletions, info, prepared.versions)
        except BaseException:
            prepared.abandon()
            raise
        if prepared.committed is not None:
            prepared.committed()
        return True


def _check_cancelled(cancelled: Callable[[], bool] | None) -> None:
    if cancelled is not None and cancelled():
        raise Abandoned("the memory was closed")


_WRITERS: weakref.WeakSet[Writer] = weakref.WeakSet()
"""Every writer of this process, so that closing a store stops the writers of every
memory handle on it first (:func:`stop_writers_on`)."""


def stop_writers_on(store: Store, timeout: float | None) -> list[str]:
    """Stop the writers of every memory handle on ``store`` not closed yet (handles a
    ``MemTreeStore`` or :meth:`~memtree.MemTree.with_namespace` made), sharing
    ``timeout``; return the stale summaries they leave, as ``namespace:id``. Called
    before a memory closes the store it owns, so no worker writes into a closed store."""
    deadline = None if timeout is None else time.monotonic() + timeout
    left: list[str] = []
    for writer in list(_WRITERS):
        if writer.replica.store is store and not writer.background.abandoned:
            name = "/".join(writer.replica.namespace)
            left += [f"{name}:{node_id}" for node_id in writer.stop(remaining(deadline))]
    return left


_LOCK_WAITERS = ThreadPoolExecutor(max_workers=32, thread_name_prefix="memtree-lock-wait")
"""Threads that wait for stores' writer locks on behalf of coroutines. Not the event
loop's default executor: writers queued there could take every thread that the
lock's holder needs for its own model calls (``asyncio.to_thread``), and wait forever."""


async def _begin_in_thread(store: Store, namespace: NamespaceKey) -> WriteTransaction:
    """``store.begin`` in a lock-waiting thread. If the waiting coroutine is cancelled,
    the transaction the thread opens anyway is rolled back, so its lock is never left
    held (a held SQLite or PostgreSQL write lock would block every other writer)."""
    guard = threading.Lock()
    outcome: dict[str, Any] = {"abandoned": False, "transaction": None}

    def begin() -> WriteTransaction:
        transaction = store.begin(namespace)
        with guard:
            if outcome["abandoned"]:
                transaction.rollback()
            else:
                outcome["transaction"] = transaction
        return transaction

    try:
        return await asyncio.get_running_loop().run_in_executor(_LOCK_WAITERS, begin)
    except asyncio.CancelledError:
        with guard:
            outcome["abandoned"] = True
            opened = outcome["transaction"]
        if opened is not None:
            opened.rollback()
        raise


class Staging:
    """The procedures of one :meth:`Writer.write_together`, staged one after another."""

    def __init__(self, writer: Writer, transaction: WriteTransaction) -> None:
        self.writer = writer
        self.transaction = transaction
        self.staged: list[PreparedWrite[Any]] = []

    def run(self, procedure: Steps[PreparedWrite[T]]) -> T:
        """Plan ``procedure`` on the tree as staged so far, make its model calls and
        stage its batch; return its result (committed only with the rest)."""
        replica = self.writer.replica
        prepared = self.writer.calls.drive(procedure)
        if prepared.empty:
            return prepared.result
        self.staged.append(prepared)
        info = prepared.info(replica.state.info) if prepared.info is not None else None
        replica.stage(self.transaction, prepared.upserts, prepared.deletions, info, prepared.versions)
        return prepared.result


class DeferredAggregation(Generic[M]):
    """The block returned by :meth:`MemTree.deferred`: a sync and async context manager.

    Entering returns the memory. Leaving the outermost block flushes, also when the
    block raised an ``Exception`` (the leaves are stored, so their summaries should
    catch up; a flush error is then logged, not raised over the original one). On
    ``KeyboardInterrupt`` or cancellation nothing is flushed: call ``flush()``.
    """

    def __init__(self, writer: Writer, memory: M) -> None:
        self.writer = writer
        self.memory = memory

    def __enter__(self) -> M:
        self.writer.enter_deferred()
        return self.memory

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if self.writer.leave_deferred() and _should_flush(exc_type):
            if exc_type is None:
                self.writer.flush()
                return
            try:
                self.writer.flush()
            except Exception:  # the block's own error is the one to raise
                logger.exception("flushing deferred summaries after an error failed; they stay stale")

    async def __aenter__(self) -> M:
        return self.__enter__()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if self.writer.leave_deferred() and _should_flush(exc_type):
            if exc_type is None:
                await self.writer.aflush()
                return
            try:
                await self.writer.aflush()
            except Exception:  # the block's own error is the one to raise
                logger.exception("flushing deferred summaries after an error failed; they stay stale")


def _should_flush(exc_type: type[BaseException] | None) -> bool:
    return exc_type is None or issubclass(exc_type, Exception)


def check_leaf_ids(node_ids: Iterable[str]) -> list[str]:
    """The ids to delete, once each; a single id passed as the list is refused."""
    if isinstance(node_ids, str):
        raise TypeError("node_ids must be a list of ids (for one id use delete)")
    ids = list(dict.fromkeys(node_ids))
    for node_id in ids:
        check_leaf_id(node_id)
    return ids


def check_leaf_id(node_id: object) -> None:
    if not isinstance(node_id, str):
        raise TypeError(f"node id must be a str, got {type(node_id).__name__}")


def make_items(
    texts: Sequence[str],
    metadata: Sequence[Mapping[str, Any] | None] | None,
    timestamps: Sequence[TimeLike | None] | None,
    source_ids: Sequence[str | None] | None,
    expires_at: float | None = None,
) -> list[Item]:
    """Every item of an ``add_many`` checked before anything is stored."""
    if isinstance(texts, str) or not isinstance(texts, Sequence):
        raise TypeError("texts must be a list of str (for one text use add)")
    count = len(texts)
    for name, values in (("metadata", metadata), ("timestamps", timestamps), ("source_ids", source_ids)):
        if values is not None and len(values) != count:
            raise ValueError(f"{name} has {len(values)} entries for {count} texts")
    return [
        make_item(
            text,
            metadata[i] if metadata is not None else None,
            timestamps[i] if timestamps is not None else None,
            source_ids[i] if source_ids is not None else None,
            expires_at,
        )
        for i, text in enumerate(texts)
    ]


def _unstored_texts(items: list[Item], stored: list[bool]) -> list[str]:
    return [item.text for item, known in zip(items, stored, strict=True) if not known]


def _fill_in(stored: list[bool], vectors: Matrix) -> list[Vector | None]:
    """Each item's vector in order, ``None`` for the stored duplicates not embedded."""
    rows = iter(vectors)
    return [None if known else next(rows) for known in stored]
