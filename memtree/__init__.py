"""memtree: long-term memory for LLM applications as a dynamic tree (MemTree).

The public entry point is :class:`MemTree`; see the README for a tour.
"""

from memtree.aggregate import (
    AGGREGATE_PROMPT,
    AGGREGATE_PROMPT_VERSION,
    Aggregator,
    ExtractiveAggregator,
    LLMAggregator,
)
from memtree.config import MemTreeConfig
from memtree.digest import DigestAggregator
from memtree.embed import Embedder, HashingEmbedder, LocalEmbedder
from memtree.llm import CallableChatModel, ChatModel, Completion
from memtree.node import ROOT_ID, LeafVersion, Node, RetrievedNode
from memtree.retry import ModelResponseError, RetryPolicy
from memtree.stats import TreeStats
from memtree.store import IncompatibleStoreError, MemoryBackend, NamespaceInfo, PostgresBackend, SQLiteBackend, Store
from memtree.tree import MemTree

__version__ = "0.1.0"

__all__ = [
    "AGGREGATE_PROMPT",
    "AGGREGATE_PROMPT_VERSION",
    "ROOT_ID",
    "Aggregator",
    "CallableChatModel",
    "ChatModel",
    "Completion",
    "DigestAggregator",
    "Embedder",
    "ExtractiveAggregator",
    "HashingEmbedder",
    "IncompatibleStoreError",
    "LLMAggregator",
    "LeafVersion",
    "LocalEmbedder",
    "MemTree",
    "MemTreeConfig",
    "MemoryBackend",
    "ModelResponseError",
    "NamespaceInfo",
    "Node",
    "PostgresBackend",
    "RetrievedNode",
    "RetryPolicy",
    "SQLiteBackend",
    "Store",
    "TreeStats",
    "__version__",
]
