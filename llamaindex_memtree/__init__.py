"""LlamaIndex adapters for memtree: an index, a retriever and a memory block.

Importing this package registers the MemTreeIndex type with LlamaIndex, so
``load_index_from_storage`` can give back a :class:`MemTreeIndex` (LlamaIndex has
no plugin registry for index types: without the import, it raises a ``KeyError``
whose text says to import this package). :func:`open_memory` opens a durable
memory with LlamaIndex's ``Settings`` models. :class:`LocalEmbedding` is memtree's
offline all-MiniLM-L6-v2 as a LlamaIndex embed model (for ``VectorStoreIndex`` too).
"""

from llamaindex_memtree.embeddings import LocalEmbedding
from llamaindex_memtree.filters import UnsupportedFilterError
from llamaindex_memtree.index import MemTreeIndex
from llamaindex_memtree.memory import MemTreeMemoryBlock
from llamaindex_memtree.persist import TreeSnapshotStore
from llamaindex_memtree.retriever import MemTreeRetriever
from llamaindex_memtree.settings import open_memory
from llamaindex_memtree.struct import MEMTREE_INDEX_TYPE, MemTreeIndexStruct

__all__ = [
    "MEMTREE_INDEX_TYPE",
    "LocalEmbedding",
    "MemTreeIndex",
    "MemTreeIndexStruct",
    "MemTreeMemoryBlock",
    "MemTreeRetriever",
    "TreeSnapshotStore",
    "UnsupportedFilterError",
    "open_memory",
]
