"""The handles a memory keeps open to other namespaces of its store (``MemTree.sibling``).

Opening a namespace loads its tree from the store; reusing a handle only catches up
with what other writers committed. Servers and adapters that keep a namespace per
user or chat session therefore reuse handles, the most recently used ones. A handle
pushed out is closed (its pending summaries written, its threads stopped, within
the close timeout), not dropped with work still in it; so call ``sibling()`` each
time rather than keeping a handle.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

from memtree.store.base import NamespaceKey

H = TypeVar("H")

logger = logging.getLogger(__name__)


class Siblings(Generic[H]):
    """At most ``size`` handles made by ``open(namespace)``; the least recently used
    one is handed to ``close`` when a new one pushes it out."""

    def __init__(self, open_handle: Callable[[NamespaceKey], H], size: int, close: Callable[[H], None]) -> None:
        self._open = open_handle
        self._close = close
        self._size = size
        self._handles: OrderedDict[NamespaceKey, H] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: NamespaceKey) -> H:
        """The handle of ``key``, opened on first use (outside the lock: it reads the store)."""
        with self._lock:
            handle = self._handles.pop(key, None)
        if handle is None:
            handle = self._open(key)
        evicted: list[H] = []
        with self._lock:
            handle = self._handles.setdefault(key, handle)
            self._handles.move_to_end(key)
            while len(self._handles) > self._size:
                evicted.append(self._handles.popitem(last=False)[1])
        for old in evicted:  # outside the lock: closing may wait for a summary
            try:
                self._close(old)
            except Exception:  # the caller's call goes on; the summaries stay stale for repair()
                logger.exception("closing a namespace handle pushed out of the sibling cache failed")
        return handle

    def handles(self) -> list[H]:
        """Every handle kept, least recently used first (for closing them)."""
        with self._lock:
            return list(self._handles.values())
