"""Run a second, independent piece of work on a spare core while the caller does
the first.

Hybrid retrieval makes two independent searches per query: the FAISS scan of every
vector and the BM25 top-k search. FAISS scans a single query on one core and
releases the GIL while it does, so where a second core is free the BM25 search can
run during the scan instead of after it, and the query costs about the longer of
the two instead of their sum (benchmarks/results/scale.md measures it).

The helper threads never queue work: when every one of them is busy (many threads
querying at once, which already keeps the cores busy), or the machine has a single
core, the caller simply does both pieces itself, one after the other. The results
are the same either way; only the time differs.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import TypeVar

A = TypeVar("A")
B = TypeVar("B")


def spare_cores() -> int:
    """How many cores this process may use beyond the calling thread's one."""
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not every platform has affinity
        usable = os.cpu_count() or 1
    return max(0, usable - 1)


class Overlap:
    """Runs ``side`` on an idle helper thread while the caller runs ``main``.

    ``workers`` helper threads at most (started on first use). The side work must be
    safe to run on another thread while ``main`` runs, and must only read what the
    caller keeps stable until both return (retrieval holds the tree's read lock).
    """

    def __init__(self, workers: int) -> None:
        self.workers = max(0, workers)
        self._free = threading.BoundedSemaphore(self.workers) if self.workers else None
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        if hasattr(os, "register_at_fork"):  # a forked child has none of the parent's threads
            alive = weakref.ref(self)
            os.register_at_fork(after_in_child=lambda: _forget_threads(alive()))

    def run(self, main: Callable[[], A], side: Callable[[], B]) -> tuple[A, B]:
        """``(main(), side())``, with ``side`` on a helper thread when one is idle.

        An exception from either is raised here, after both have finished (the side
        work never outlives the call, so it never reads past the caller's lock)."""
        free = self._free
        if free is None or not free.acquire(blocking=False):
            return main(), side()
        try:
            future: Future[B] = self._executor().submit(side)
        except RuntimeError:  # the interpreter is shutting down its thread pools
            free.release()
            return main(), side()
        try:
            first = main()
        finally:
            wait([future])
            free.release()
        return first, future.result()

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="memtree-overlap")
            return self._pool


def _forget_threads(overlap: Overlap | None) -> None:
    """In a forked child: start from no helper threads (the parent's did not come along)."""
    if overlap is not None:
        overlap._lock = threading.Lock()
        overlap._pool = None
        overlap._free = threading.BoundedSemaphore(overlap.workers) if overlap.workers else None


SEARCHES = Overlap(spare_cores())
"""The helper threads hybrid retrieval runs its BM25 search on (one per spare core)."""

IN_TURN = Overlap(0)
"""No helper threads: the caller runs ``main`` and then ``side``."""
