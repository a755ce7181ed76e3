"""The handles a memory keeps open to other namespaces of its store (``MemTree.sibling``).

Opening a namespace loads its tree from the store; reusing a handle only catches up
with what other writers committed. Servers and adapters that keep a namespace per
user or chat session therefore reuse handles, the most recently used ones.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

from memtree.store.base import NamespaceKey

H = TypeVar("H")


class Siblings(Generic[H]):
    """At most ``size`` handles made by ``open(namespace)``, least recently used dropped."""

    def __init__(self, open_handle: Callable[[NamespaceKey], H], size: int) -> None:
        self._open = open_handle
        self._size = size
        self._handles: OrderedDict[NamespaceKey, H] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: NamespaceKey) -> H:
        """The handle of ``key``, opened on first use (outside the lock: it reads the store)."""
        with self._lock:
            handle = self._handles.pop(key, None)
        if handle is None:
            handle = self._open(key)
        with self._lock:
            handle = self._handles.setdefault(key, handle)
            self._handles.move_to_end(key)
            while len(self._handles) > self._size:
                self._handles.popitem(last=False)
        return handle

    def handles(self) -> list[H]:
        """Every handle kept, least recently used first (for closing them)."""
        with self._lock:
            return list(self._handles.values())
