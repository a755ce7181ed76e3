"""Background aggregation: summaries written by a worker thread, off the caller's path.

With ``aggregation="background"`` an insert is committed the way a deferred one is
(:mod:`memtree.deferral`): the leaf and the structure at once, searchable as soon as
``add`` returns, the summaries on its path committed stale and remembered in the
memory's ledger of pending summaries. ``add`` then only *notifies* this worker, which
calls ``flush()``: every summary waiting in the ledger is rewritten once, with all the
leaves that arrived since, in one optimistic write (:mod:`memtree.optimistic`), so it
commits beside the caller's inserts without holding the store's lock through model
calls. Inserts that arrive while a flush runs are coalesced into the next one: with a
model slower than the caller, summaries lag by about one flush, and the model is
called once per summary per flush rather than once per summary per insert.

Nothing depends on the worker for correctness:

* the queue of notifications is bounded (``config.background_queue_size``). When it
  is full a notification is dropped, not the work: the ledger already holds the
  summaries, and the notifications still queued guarantee a flush that takes them;
* a flush that fails leaves its summaries stale and in the ledger (the existing
  retry / stale machinery); the next flush, ``flush()`` or ``repair()`` writes them;
* ``close()`` stops the worker after a last flush, waiting at most its ``timeout``
  (``CLOSE_SECONDS`` by default), and names in one warning the summaries it
  leaves stale; a flush still waiting for its model then drops its write, so
  nothing is written or logged after ``close()`` returns, and exit does not wait
  for that memory again. At interpreter exit every open memory's
  pending summaries get a last flush with a bounded wait (``EXIT_FLUSH_SECONDS``
  for all memories together); a crash or a timeout leaves them stale for
  ``repair()``. The leaves are committed before any of this, so none is ever lost;
* a write that arrives while the worker stops still stores its leaf; its summaries
  stay pending for ``close()``'s own last flush, or stale for ``repair()``.

A worker thread is started on the first notification and ends after
``IDLE_SECONDS`` without work, so a process holding many namespaces keeps threads
only for those being written.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import queue
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import TypeVar

logger = logging.getLogger(__name__)

EXIT_FLUSH_SECONDS = 10.0
"""How long interpreter exit waits, for all memories together, for pending summaries."""

CLOSE_SECONDS = 10.0
"""How long ``MemTree.close()`` waits by default for its pending summaries (like exit)."""

IDLE_SECONDS = 30.0
"""A worker with nothing to do for this long ends (the next insert starts another)."""

T = TypeVar("T")
R = TypeVar("R")

_STOP = object()
"""Queued to wake a waiting worker so that it sees it must stop."""


class KeptConflicting(Exception):
    """A background flush lost every optimistic attempt to concurrent inserts; the
    worker plans it again rather than hold the store's lock through model calls."""


class Abandoned(Exception):
    """The memory was closed while this background write waited for its model: the
    write is dropped (its summaries stay stale for ``repair()``), so nothing is
    written, and nothing fails, after ``close()`` returned."""


class BackgroundSummaries:
    """The worker that writes one memory's pending summaries (thread-safe).

    ``flush(last)`` writes every pending summary and returns how many; it raises
    :class:`KeptConflicting` when inserts kept changing what it planned, unless
    ``last`` (the flush before the worker ends, which may then wait for the store's
    lock as a plain ``flush()`` does). ``pending`` says how many are waiting.

    Example (what :class:`~memtree.MemTree` does in background mode)::

        worker = BackgroundSummaries(flush, lambda: len(memory._pending), queue_size=1024)
        worker.notify()   # after each committed insert
        worker.wait()     # block until everything notified so far is written
        worker.stop()     # last flush, then the thread ends
    """

    def __init__(
        self,
        flush: Callable[[bool], int],
        pending: Callable[[], int],
        *,
        queue_size: int,
        name: str = "memtree-background",
    ) -> None:
        self._flush = flush
        self._pending = pending
        self._queue: queue.Queue[object] = queue.Queue(maxsize=queue_size)
        self._name = name
        self._lock = threading.Condition()
        self._thread: threading.Thread | None = None
        self._notified = 0
        self._finished = 0
        self._stopping = False
        self._abandoned = False
        self.overflows = 0
        """Notifications dropped because the queue was full (their work was not)."""
        self.failures = 0
        """Flushes that raised (their summaries stayed stale and pending)."""
        self.conflicts = 0
        """Flushes planned again because inserts changed what they had planned."""
        self.refused: str | None = None
        """Why no thread could be started for the last flush, if none could (exit on 3.12)."""
        _LIVE.add(self)

    def is_worker_thread(self) -> bool:
        """Whether the calling thread is this worker (its model calls then run in
        daemon threads, see :func:`map_in_daemon_threads`)."""
        return self._thread is threading.current_thread()

    @property
    def name(self) -> str:
        """The worker thread's name (it says which namespace it writes)."""
        return self._name

    @property
    def stopping(self) -> bool:
        """Whether :meth:`stop` was called (later notifications start no worker)."""
        return self._stopping

    @property
    def abandoned(self) -> bool:
        """Whether the memory was closed (:meth:`abandon`): nothing more is written."""
        return self._abandoned

    def abandon(self) -> None:
        """The memory is closed: the worker starts no flush any more and a flush still
        waiting for its model drops its write (:class:`Abandoned`) and logs nothing;
        interpreter exit no longer waits for this memory (``close()`` already did,
        and named what it left stale)."""
        with self._lock:
            self._stopping = self._abandoned = True
            self._lock.notify_all()
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait(_STOP)  # a worker waiting for work wakes and ends
        _LIVE.discard(self)

    def notify(self) -> bool:
        """Say that new summaries are pending; return whether the worker will see
        this notification (``False``: the queue was full or the worker is stopping,
        and the summaries wait for the next flush). Never blocks on the model."""
        with self._lock:
            if self._stopping:
                return False
            self._notified += 1
            try:
                self._queue.put_nowait(self._notified)
            except queue.Full:
                # The queue holds notifications the worker has not taken: it will
                # flush again, and that flush takes this insert's summaries too.
                self.overflows += 1
                return False
            try:
                self._start_locked()
            except RuntimeError as error:  # at exit on Python 3.12: the exit flush or repair() writes them
                self.refused = str(error)
                return False
            return True

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every notification made so far has been flushed; return
        ``False`` if ``timeout`` seconds passed first. (A flush that failed counts as
        done: its summaries are stale and pending, see :meth:`pending`.)"""
        with self._lock:
            ticket = self._notified
            return self._lock.wait_for(lambda: self._finished >= ticket, timeout)

    def request_stop(self) -> threading.Thread | None:
        """Ask the worker for a last flush and to end; return the thread to join
        (``None``: nothing to do, or no thread could be started)."""
        with self._lock:
            self._stopping = True
            if self._abandoned or (self._thread is None and self._pending() == 0):
                return None
            try:
                self._start_locked()
            except RuntimeError as error:  # Python 3.12 refuses new threads at exit
                self.refused = str(error)
                logger.debug("no thread for the last flush of %s: %s", self._name, error)
                return None
            with contextlib.suppress(queue.Full):  # a full queue: the worker will see _stopping
                self._queue.put_nowait(_STOP)
            return self._thread

    def stop(self, timeout: float | None = None) -> bool:
        """Last flush, then end the worker; return whether it finished in time
        (if not, the summaries it had not written stay stale for ``repair()``)."""
        thread = self.request_stop()
        if thread is None or thread is threading.current_thread():
            return True
        thread.join(timeout)
        return not thread.is_alive()

    # -- the worker -----------------------------------------------------------------

    def _start_locked(self) -> None:
        if self._thread is None:
            thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            thread.start()  # raises before self._thread is set: the next call retries
            self._thread = thread

    def _run(self) -> None:
        while True:
            try:
                self._queue.get(timeout=IDLE_SECONDS)
                if self._abandoned:
                    raise queue.Empty
            except queue.Empty:
                if self._abandoned:
                    with self._lock:
                        self._finished = self._notified
                        self._thread = None
                        self._lock.notify_all()
                    return
                with self._lock:
                    if self._queue.empty() and not self._stopping:
                        self._thread = None
                        return
                continue
            while True:  # coalesce: one flush answers every notification queued so far
                try:
                    self._queue.get_nowait()
                except queue.Empty:
                    break
            with self._lock:
                covered = self._notified  # every insert counted here is in the ledger
                stopping = self._stopping
            self._flush_safely(last=stopping)
            with self._lock:
                self._finished = max(self._finished, covered)
                if (stopping or self._stopping) and not (self._notified > covered and self._pending()):
                    # Last flush done (notifications made during it got one more round).
                    self._finished = self._notified
                    self._thread = None
                    self._lock.notify_all()
                    return
                self._lock.notify_all()

    def _flush_safely(self, *, last: bool) -> None:
        while not self._abandoned:
            try:
                self._flush(last or self._stopping)
            except KeptConflicting:
                # Never wait for the model under the store's lock: that would make the
                # caller's next insert wait for it. Plan again from the newer tree.
                self.conflicts += 1
                continue
            except Abandoned:
                pass
            except Exception as error:  # the worker must outlive a failed flush
                self.failures += 1
                if self._abandoned:  # closed meanwhile (its store too, maybe): close() named what is stale
                    logger.debug("background flush of %s after close dropped: %r", self._name, error)
                else:
                    left = self._pending()
                    logger.exception("background flush failed; %d summaries stay stale until the next flush", left)
            return


_LIVE: weakref.WeakSet[BackgroundSummaries] = weakref.WeakSet()


def map_in_daemon_threads(function: Callable[[T], R], items: Sequence[T], limit: int) -> list[R]:
    """``[function(item) for item in items]`` on at most ``limit`` daemon threads.

    The worker's model calls run here rather than in a ``ThreadPoolExecutor``:
    interpreter exit joins every executor thread, so one model call that hangs
    would hold the process for as long as it hangs, whatever the bounded wait at
    exit says. Daemon threads end with the process. Where no thread can be started
    (Python >= 3.12 at exit) the items run one after another in the caller.
    """
    results: list[R | None] = [None] * len(items)
    order = iter(range(len(items)))
    lock = threading.Lock()

    def work() -> None:
        while True:
            with lock:
                index = next(order, None)
            if index is None:
                return
            results[index] = function(items[index])

    threads = [threading.Thread(target=work, daemon=True) for _ in range(min(limit, len(items)))]
    started = []
    for thread in threads:
        try:
            thread.start()
        except RuntimeError:
            break
        started.append(thread)
    if not started:
        work()
    for thread in started:
        thread.join()
    return results  # type: ignore[return-value]  # every index was filled


def run_bounded(function: Callable[[], object], timeout: float | None, name: str) -> bool:
    """Run ``function`` in a daemon thread and wait at most ``timeout`` seconds;
    return whether it finished. If it did not, it goes on in the background and
    ends with the process at the latest (``close()`` uses this so that a model that
    hangs cannot hold it). ``False`` too where no thread can be started (at
    interpreter shutdown): then nothing runs."""
    thread = threading.Thread(target=function, name=name, daemon=True)
    try:
        thread.start()
    except RuntimeError as error:  # Python >= 3.12 refuses new threads at exit
        logger.warning("no thread to run %s (%s)", name, error)
        return False
    thread.join(timeout)
    return not thread.is_alive()


def remaining(deadline: float | None) -> float | None:
    """Seconds left until ``deadline`` (a ``time.monotonic()`` value; ``None``: no limit)."""
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def flush_all_at_exit(timeout: float | None = None) -> int:
    """Give every live memory's pending summaries a last flush, waiting at most
    ``timeout`` seconds in all (``EXIT_FLUSH_SECONDS`` by default); return how many
    summaries are still pending after that (they are stale: ``repair()`` writes
    them). Memories already closed are not waited for again. Registered with
    :mod:`atexit`; call it yourself before ``os._exit``."""
    deadline = time.monotonic() + (EXIT_FLUSH_SECONDS if timeout is None else timeout)
    workers = list(_LIVE)
    threads = [(worker, worker.request_stop()) for worker in workers]
    for _, thread in threads:
        if thread is not None:
            thread.join(max(0.0, deadline - time.monotonic()))
    left = 0
    where: list[str] = []
    refused: set[str] = set()
    for worker, _ in threads:
        try:
            pending = worker._pending()
        except Exception:  # noqa: BLE001 - a memory half torn down at exit
            continue
        if pending:
            left += pending
            where.append(f"{worker.name.removeprefix('memtree-background-')}: {pending}")
            if worker.refused:
                refused.add(worker.refused)
    if left:
        why = f"Python refused a thread to write them ({'; '.join(sorted(refused))})" if refused else "time ran out"
        logger.warning(
            "exiting with %d summaries not yet written (%s; by namespace: %s); they are stale: call repair() later",
            left,
            why,
            ", ".join(where),
        )
    return left


atexit.register(flush_all_at_exit)
