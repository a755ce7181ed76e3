"""Saving an in-memory tree with ``StorageContext.persist`` and getting it back.

``StorageContext.persist(dir)`` writes the docstore, the index store and every
vector store in ``storage_context.vector_stores``; ``StorageContext.from_defaults(
persist_dir=dir)`` reads them back, vector stores as ``SimpleVectorStore`` s. That
is the only hook that runs at persist time and is read again on load without extra
arguments, so an index whose tree is held in memory registers a
:class:`TreeSnapshotStore` there: at persist time it takes the engine's exact JSONL
export of the tree (``MemTree.export_jsonl``) and writes it, inside an ordinary
``SimpleVectorStore`` file, ``memtree_tree__vector_store.json``, next to the
docstore. Loading imports those lines into
a fresh memory (``MemTree.import_jsonl``). Trees in a durable engine store (SQLite,
PostgreSQL) need no snapshot: the index reopens the store.
"""

from __future__ import annotations

import io
import json
from typing import Any

from llama_index.core.bridge.pydantic import PrivateAttr
from llama_index.core.storage.storage_context import StorageContext
from llama_index.core.vector_stores.simple import SimpleVectorStore

from memtree import MemTree

SNAPSHOT_FORMAT = "memtree.jsonl"
"""Marks the metadata entry that holds a tree export."""


SNAPSHOT_KEY = "memtree_tree"
"""The ``vector_stores`` key of an index's tree, so ``persist`` names its file
``memtree_tree__vector_store.json`` (LlamaIndex appends ``__vector_store.json`` to
the key). Directories persisted before used ``memtree-<uuid>``; the index struct
records the key, so they load as they are."""


def new_snapshot_key(storage_context: StorageContext) -> str:
    """A free ``vector_stores`` key for one index's tree: :data:`SNAPSHOT_KEY`, or
    ``memtree_tree_2``, ``_3``… when other MemTreeIndexes share the storage context
    (no ``__``: LlamaIndex splits persisted file names there)."""
    taken = set(storage_context.vector_stores)
    taken.update(
        str(snapshot)
        for struct in storage_context.index_store.index_structs()
        if (snapshot := getattr(struct, "snapshot", None)) is not None
    )
    key, number = SNAPSHOT_KEY, 1
    while key in taken:
        number += 1
        key = f"{SNAPSHOT_KEY}_{number}"
    return key


class TreeSnapshotStore(SimpleVectorStore):
    """A ``SimpleVectorStore`` that, when persisted, holds a memory's JSONL export.

    It is not used for vector search: it only rides along with the storage
    context, so that ``storage_context.persist`` saves the tree and
    ``StorageContext.from_defaults(persist_dir=...)`` reads it back.
    """

    _memory: MemTree = PrivateAttr()

    def __init__(self, memory: MemTree, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._memory = memory

    @classmethod
    def class_name(cls) -> str:
        return "TreeSnapshotStore"

    def capture(self) -> None:
        """Replace the stored snapshot with the memory's current tree."""
        buffer = io.StringIO()
        self._memory.export_jsonl(buffer)
        self.data.metadata_dict = {SNAPSHOT_FORMAT: {"lines": buffer.getvalue().splitlines()}}

    def persist(self, persist_path: str = "", fs: Any = None) -> None:
        self.capture()
        super().persist(persist_path, fs=fs)

    def to_dict(self, **kwargs: Any) -> dict[str, Any]:
        self.capture()
        return super().to_dict(**kwargs)


def attach_snapshot(storage_context: StorageContext, key: str, memory: MemTree) -> None:
    """Make ``storage_context.persist`` save ``memory``'s tree under ``key``."""
    storage_context.add_vector_store(TreeSnapshotStore(memory), key)


def restore_snapshot(storage_context: StorageContext, key: str, memory: MemTree) -> None:
    """Import the tree persisted under ``key`` into ``memory`` (which must be empty).

    Raises ``ValueError`` naming what is missing when the persist directory holds no
    snapshot for this index (a file removed, or a directory persisted before the
    index was built), and naming the stored model when ``memory`` embeds with
    another one (its vectors could not be compared with the stored ones).
    """
    store = storage_context.vector_stores.get(key)
    if isinstance(store, TreeSnapshotStore):
        store.capture()  # a storage context reused in-process: take the live tree
    entry = store.data.metadata_dict.get(SNAPSHOT_FORMAT) if isinstance(store, SimpleVectorStore) else None
    if not isinstance(entry, dict) or not isinstance(entry.get("lines"), list):
        raise ValueError(
            f"the storage holds a MemTreeIndex but not its tree (no {key}__vector_store.json with a "
            f"{SNAPSHOT_FORMAT} snapshot); persist the index again with index.storage_context.persist(dir)"
        )
    lines: list[str] = entry["lines"]
    if len(memory) > 0:
        raise ValueError(
            f"the memory given already holds {len(memory)} leaves; pass an empty memory to load "
            "a persisted MemTreeIndex into, or omit memory= to get a new in-memory one"
        )
    check_embedder(_header(lines), memory)
    memory.import_jsonl(io.StringIO("".join(line + "\n" for line in lines)))


def check_embedder(header: dict[str, Any], memory: MemTree) -> None:
    """Refuse to load a tree into a memory whose embedder is not the one that built it.

    The engine would import it with a warning and then fail at the first query
    (another dimension) or, worse, rank by comparing vectors of two models.
    """
    stored, dimension = header.get("embedder"), header.get("dimension")
    if stored is None or stored == memory.embedder.name:
        return
    raise ValueError(
        f"this MemTreeIndex's tree was embedded with {stored} ({dimension} dimensions), but the memory to load "
        f"it into embeds with {memory.embedder.name}; set Settings.embed_model to the model the index was "
        "built with before loading, or pass memory=MemTree(embedder=<that model>, config=...) "
        "to load_index_from_storage / MemTreeIndex.from_persist_dir"
    )


def _header(lines: list[str]) -> dict[str, Any]:
    """The export's header line (``{}`` if unreadable: the import then names the problem)."""
    try:
        header = json.loads(lines[0]) if lines else {}
    except (TypeError, ValueError):
        return {}
    return header if isinstance(header, dict) else {}
