"""The index struct LlamaIndex keeps for a :class:`~llamaindex_memtree.MemTreeIndex`.

LlamaIndex stores one small JSON "index struct" per index in its index store and
finds the index class again from the struct's type string. A MemTreeIndex's
struct says where its tree lives (the engine store and namespace) and, for a tree
held in memory, under which storage-context key its persisted copy is found. The
tree itself is never copied into the struct: it is the engine's.

:func:`register` adds the type to LlamaIndex's two registries, so that
``load_index_from_storage`` gives back a MemTreeIndex.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

from llama_index.core.data_structs.data_structs import IndexStruct
from llama_index.core.data_structs.registry import INDEX_STRUCT_TYPE_TO_INDEX_STRUCT_CLASS
from llama_index.core.data_structs.struct_type import IndexStructType
from llama_index.core.indices.registry import INDEX_STRUCT_TYPE_TO_INDEX_CLASS

MEMTREE_INDEX_TYPE = "memtree"
"""The struct type string written to ``index_store.json``."""


@dataclass
class MemTreeIndexStruct(IndexStruct):
    """Where a MemTreeIndex's tree lives.

    ``namespace`` is the engine namespace of the tree; ``store`` the class name of
    the engine store that held it when the index was built; ``snapshot`` the key
    in ``StorageContext.vector_stores`` under which ``persist`` writes a tree held
    in memory (``None`` when the tree lives in a durable store); ``timestamp_key``
    the node metadata key read as each leaf's event time; ``aggregation`` how
    inserts write summaries (``None``: the memory's default).
    """

    namespace: list[str] = field(default_factory=lambda: ["default"])
    store: str = "InMemoryStore"
    snapshot: str | None = None
    timestamp_key: str | None = None
    aggregation: str | None = None

    @classmethod
    def get_type(cls) -> IndexStructType:
        # Not a member of LlamaIndex's enum, which cannot be extended; the registries
        # are plain dicts and the enum is a str enum, so the string works as a key.
        return cast(IndexStructType, MEMTREE_INDEX_TYPE)


def register(index_cls: type[Any]) -> None:
    """Map the ``"memtree"`` struct type to its struct class and ``index_cls``."""
    key = cast(IndexStructType, MEMTREE_INDEX_TYPE)
    INDEX_STRUCT_TYPE_TO_INDEX_STRUCT_CLASS[key] = MemTreeIndexStruct
    INDEX_STRUCT_TYPE_TO_INDEX_CLASS[key] = index_cls
