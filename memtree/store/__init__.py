"""Stores behind the engine's ``Store`` boundary."""

from memtree.store.base import (
    DEFAULT_NAMESPACE,
    ChangeBatch,
    CompactionReport,
    Namespace,
    NamespaceInfo,
    NamespaceKey,
    NamespaceSnapshot,
    RecordChanges,
    Store,
    WriteTransaction,
    namespace_key,
)
from memtree.store.codec import CorruptDataError
from memtree.store.location import as_store, open_store
from memtree.store.memory import MemoryBackend
from memtree.store.migrations import IncompatibleStoreError
from memtree.store.postgres import PostgresBackend
from memtree.store.sqlite import SQLiteBackend

__all__ = [
    "DEFAULT_NAMESPACE",
    "ChangeBatch",
    "CompactionReport",
    "CorruptDataError",
    "IncompatibleStoreError",
    "MemoryBackend",
    "Namespace",
    "NamespaceInfo",
    "NamespaceKey",
    "NamespaceSnapshot",
    "PostgresBackend",
    "RecordChanges",
    "SQLiteBackend",
    "Store",
    "WriteTransaction",
    "as_store",
    "namespace_key",
    "open_store",
]
