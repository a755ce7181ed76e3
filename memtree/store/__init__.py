"""Stores behind the engine's ``Store`` boundary."""

from memtree.store.base import (
    DEFAULT_NAMESPACE,
    ChangeBatch,
    Namespace,
    NamespaceInfo,
    NamespaceKey,
    Store,
    WriteTransaction,
    namespace_key,
)
from memtree.store.memory import InMemoryStore

__all__ = [
    "DEFAULT_NAMESPACE",
    "ChangeBatch",
    "InMemoryStore",
    "Namespace",
    "NamespaceInfo",
    "NamespaceKey",
    "Store",
    "WriteTransaction",
    "namespace_key",
]
