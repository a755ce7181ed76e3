"""``MemTreeIndex``: a LlamaIndex index whose nodes live as leaves of a memtree tree.

Documents are split by the usual transformations; each node becomes a leaf,
inserted in order (its node id is the leaf's ``source_id``, its metadata kept),
and the engine grows the summaries above it. The docstore keeps the nodes
themselves, as for any LlamaIndex index; the tree lives in a
:class:`~memtree.MemTree` (in memory, or in the engine's SQLite / PostgreSQL
stores). Everything tree-shaped is the engine's: this class only translates.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Sequence
from typing import Any, cast

from llama_index.core.base.base_query_engine import BaseQueryEngine
from llama_index.core.callbacks.base import CallbackManager
from llama_index.core.chat_engine.types import BaseChatEngine, ChatMode
from llama_index.core.constants import DEFAULT_SIMILARITY_TOP_K
from llama_index.core.data_structs.data_structs import IndexStruct
from llama_index.core.indices.base import BaseIndex
from llama_index.core.indices.registry import INDEX_STRUCT_TYPE_TO_INDEX_CLASS
from llama_index.core.ingestion import arun_transformations, run_transformations
from llama_index.core.llms.utils import LLMType, resolve_llm
from llama_index.core.schema import BaseNode, Document, IndexNode, TransformComponent
from llama_index.core.settings import Settings
from llama_index.core.storage.docstore.types import RefDocInfo
from llama_index.core.storage.storage_context import StorageContext

from llamaindex_memtree.budget import context_budget
from llamaindex_memtree.engines import engine_options
from llamaindex_memtree.nodes import holds, leaf_item, without_empty_documents, without_empty_nodes
from llamaindex_memtree.persist import attach_snapshot, check_embedder, new_snapshot_key, restore_snapshot
from llamaindex_memtree.progress import embedding_bar
from llamaindex_memtree.retriever import MemTreeRetriever
from llamaindex_memtree.settings import memory_from_settings, open_memory
from llamaindex_memtree.struct import (
    SAMPLED_SOURCE_IDS,
    MemTreeIndexStruct,
    config_fields,
    register,
    stored_config,
)
from memtree import MemoryBackend, MemTree, MemTreeConfig
from memtree.config import AGGREGATION_MODES, Aggregation
from memtree.inputs import Item
from memtree.writer import DeferredAggregation

logger = logging.getLogger(__name__)

INDEX_CONFIG = MemTreeConfig(deduplicate=False)
"""Config of the memory an index makes for itself. Duplicate texts stay separate
leaves: each belongs to its own node, and deleting one document must not take
another document's identical chunk with it."""

RETRIEVER_OPTIONS: tuple[str, ...] = (
    "leaves_only",
    "summary_hits",
    "filters",
    "time_range",
    "min_similarity",
    "min_score",
    "route_overviews",
    "verbose",
    "callback_manager",
)
"""Keyword arguments ``as_retriever`` hands to :class:`MemTreeRetriever` beside the named ones."""


class MemTreeIndex(BaseIndex[MemTreeIndexStruct]):
    """A LlamaIndex index kept as a MemTree (Rezazadeh et al., ICLR 2025).

    Build it like any index (``from_documents``, or from nodes), then query it with
    ``as_retriever(mode=..., similarity_top_k=..., token_budget=...)``,
    ``as_query_engine()`` or ``as_chat_engine()``. Results include the tree's
    summaries next to the original chunks.

    ``memory`` is the tree to build in: by default an in-memory one using
    LlamaIndex's ``Settings.embed_model`` / ``Settings.llm`` when you set them, else
    the offline defaults. For a durable tree pass a SQLite path or PostgreSQL DSN
    (opened with ``Settings``' models too, see :func:`~llamaindex_memtree.open_memory`)
    or a memory you opened, ``MemTree.open(path_or_dsn, embedder=...)``.
    ``timestamp_key`` names a node metadata key holding each chunk's event time
    (a datetime, date, POSIX number or ISO 8601 string), used by time-range filters.
    The first batch (``from_documents``, or nodes given to the constructor) goes
    in with ``MemTree.add_many(bulk=True)``: grouped by clustering, each summary
    written and embedded once; nodes inserted later are routed one by one.
    ``aggregation="deferred"`` writes the summaries touched by one batch of nodes
    once, after all its leaves are in (far fewer LLM calls than the paper's
    ``"eager"`` procedure, the default).

    ``index.storage_context.persist(dir)`` saves an in-memory tree beside the
    docstore, with the memory's config; ``load_index_from_storage(
    StorageContext.from_defaults(persist_dir=dir))`` gives both back, embedding
    with ``Settings.embed_model`` (or the offline default), which must be the model
    the tree was built with. Pass ``memory=`` to choose the models and config
    yourself, or to reopen a durable tree: the memory must hold this index's tree
    (a path or DSN opens it in the index's namespace with its stored config).
    Import ``llamaindex_memtree`` first so LlamaIndex knows the index type.

    Example::

        index = MemTreeIndex.from_documents([Document(text="Maya adopted a greyhound.")])
        nodes = index.as_retriever(similarity_top_k=3).retrieve("What pet does Maya have?")
    """

    index_struct_cls = MemTreeIndexStruct

    def __init__(
        self,
        nodes: Sequence[BaseNode] | None = None,
        objects: Sequence[IndexNode] | None = None,
        index_struct: MemTreeIndexStruct | None = None,
        storage_context: StorageContext | None = None,
        callback_manager: CallbackManager | None = None,
        transformations: list[TransformComponent] | None = None,
        show_progress: bool = False,
        *,
        memory: MemTree | str | os.PathLike[str] | None = None,
        timestamp_key: str | None = None,
        aggregation: Aggregation | None = None,
        **kwargs: Any,
    ) -> None:
        if aggregation is not None and aggregation not in AGGREGATION_MODES:
            raise ValueError(f"aggregation must be one of {', '.join(AGGREGATION_MODES)} or None, got {aggregation!r}")
        if index_struct is not None and not isinstance(index_struct, MemTreeIndexStruct):
            raise TypeError(
                f"this storage holds {_describe(index_struct)}, not a MemTreeIndex; load it with "
                "llama_index.core.load_index_from_storage, or build a MemTreeIndex with from_documents"
            )
        if isinstance(memory, (str, os.PathLike)):  # a SQLite path or a PostgreSQL DSN
            memory = _open(memory, index_struct)
        if memory is not None and not isinstance(memory, MemTree):
            raise TypeError(
                f"memory must be a memtree.MemTree, or a SQLite path or PostgreSQL DSN to open, "
                f"got {type(memory).__name__}"
            )
        storage_context = storage_context or StorageContext.from_defaults()
        self._timestamp_key = timestamp_key
        self._aggregation = aggregation
        if index_struct is None:
            self._memory = memory if memory is not None else memory_from_settings(INDEX_CONFIG)
        else:
            self._timestamp_key = index_struct.timestamp_key
            self._aggregation = aggregation or cast("Aggregation | None", index_struct.aggregation)
            self._memory = _reopen(index_struct, storage_context, memory)
            index_struct.config = config_fields(self._memory.config)  # an explicit memory's config wins
        if self._memory.config.deduplicate:
            logger.warning(
                "this memory stores identical texts once (config.deduplicate=True): nodes with the same "
                "text share one leaf, and deleting one of their documents removes it for all; "
                "build the memory with MemTreeConfig(deduplicate=False) to keep them apart"
            )
        super().__init__(
            nodes=nodes,
            objects=objects,
            index_struct=index_struct,
            storage_context=storage_context,
            callback_manager=callback_manager,
            transformations=transformations,
            show_progress=show_progress,
            **kwargs,
        )
        if self._index_struct.snapshot is not None:
            attach_snapshot(self._storage_context, self._index_struct.snapshot, self._memory)

    @classmethod
    def from_documents(
        cls,
        documents: Sequence[Document],
        storage_context: StorageContext | None = None,
        show_progress: bool = False,
        callback_manager: CallbackManager | None = None,
        transformations: list[TransformComponent] | None = None,
        **kwargs: Any,
    ) -> MemTreeIndex:
        """Split documents into nodes with ``transformations`` (default:
        ``Settings.transformations``) and insert each node, in order, as a leaf.
        Documents with empty text are skipped with a warning. ``show_progress=True``
        shows LlamaIndex's bars: parsing the nodes, then "Generating embeddings"."""
        return super().from_documents(
            without_empty_documents(documents),
            storage_context=storage_context,
            show_progress=show_progress,
            callback_manager=callback_manager,
            transformations=transformations,
            **kwargs,
        )

    @classmethod
    def from_persist_dir(
        cls,
        persist_dir: str | os.PathLike[str],
        *,
        index_id: str | None = None,
        memory: MemTree | str | os.PathLike[str] | None = None,
        **kwargs: Any,
    ) -> MemTreeIndex:
        """Load a MemTreeIndex that ``storage_context.persist(persist_dir)`` saved.

        The same as ``load_index_from_storage(StorageContext.from_defaults(
        persist_dir=...), memory=...)``, but it raises a ``ValueError`` naming what
        the directory holds when that is another index type, or several indexes
        without ``index_id``.
        """
        storage_context = StorageContext.from_defaults(persist_dir=os.fspath(persist_dir))
        if index_id is not None:
            struct = storage_context.index_store.get_index_struct(index_id)
            if struct is None:
                raise ValueError(f"{os.fspath(persist_dir)!r} holds no index with id {index_id!r}")
            candidates = [struct]
        else:
            candidates = storage_context.index_store.index_structs()
        ours = [struct for struct in candidates if isinstance(struct, MemTreeIndexStruct)]
        if not ours:
            found = ", ".join(_describe(struct) for struct in candidates) or "no index at all"
            raise ValueError(
                f"{os.fspath(persist_dir)!r} holds {found}, not a MemTreeIndex; load other index types "
                "with llama_index.core.load_index_from_storage"
            )
        if len(ours) > 1:
            ids = ", ".join(repr(struct.index_id) for struct in ours)
            raise ValueError(f"{os.fspath(persist_dir)!r} holds several MemTreeIndexes ({ids}); pass index_id=")
        return cls(index_struct=ours[0], storage_context=storage_context, memory=memory, **kwargs)

    @property
    def memory(self) -> MemTree:
        """The tree behind this index (``index.memory.format_tree()`` shows it)."""
        return self._memory

    # -- building and changing ------------------------------------------------------

    def _build_index_from_nodes(self, nodes: Sequence[BaseNode], **build_kwargs: Any) -> MemTreeIndexStruct:
        memory = self._memory
        snapshot = new_snapshot_key(self._storage_context) if isinstance(memory.store, MemoryBackend) else None
        struct = MemTreeIndexStruct(
            namespace=list(memory.namespace),
            store=type(memory.store).__name__,
            snapshot=snapshot,
            timestamp_key=self._timestamp_key,
            aggregation=self._aggregation,
            config=config_fields(memory.config),
        )
        self._insert(nodes, struct=struct, bulk=True)  # documents: grouped by clustering, not routed one by one
        return struct

    def build_index_from_nodes(self, nodes: Sequence[BaseNode], **build_kwargs: Any) -> MemTreeIndexStruct:
        return super().build_index_from_nodes(self._checked(nodes), **build_kwargs)

    def insert(self, document: Document, **insert_kwargs: Any) -> None:
        """Split a document and insert its nodes (skipped with a warning if it is empty)."""
        if without_empty_documents([document]):
            super().insert(document, **insert_kwargs)

    async def ainsert(self, document: Document, **insert_kwargs: Any) -> None:
        """Async :meth:`insert`."""
        if without_empty_documents([document]):
            await super().ainsert(document, **insert_kwargs)

    def insert_nodes(self, nodes: Sequence[BaseNode], **insert_kwargs: Any) -> None:
        """Insert nodes as leaves, in order. A node already in the tree is updated
        (``MemTree.update``: same leaf, earlier version kept in its history) if its
        text, metadata or event time changed, and left alone otherwise."""
        super().insert_nodes(self._checked(nodes), **insert_kwargs)

    async def ainsert_nodes(self, nodes: Sequence[BaseNode], **insert_kwargs: Any) -> None:
        """Async :meth:`insert_nodes`; the engine's embedding and aggregation calls are awaited."""
        nodes = self._checked(nodes)
        with self._callback_manager.as_trace("ainsert_nodes"):
            await self.docstore.async_add_documents(nodes, allow_update=True)
            items, replaced, updates = self._changes(nodes)
            await self._memory.adelete(replaced)
            with embedding_bar(self._show_progress, len(items) + len(updates)):
                async with self._updating():
                    for leaf_id, item in updates:
                        await self._memory.aupdate(leaf_id, item.text, metadata=item.metadata, timestamp=item.timestamp)
                await self._memory.aadd_many(**_columns(items), aggregation=self._aggregation)
            self._note_leaves(self._index_struct, [item.source_id for item in items])
            await self._storage_context.index_store.async_add_index_struct(self._index_struct)

    def _checked(self, nodes: Sequence[BaseNode]) -> list[BaseNode]:
        """The nodes with text (others skipped with a warning), each checked as a leaf
        before the docstore sees any of them."""
        kept = without_empty_nodes(nodes)
        for node in kept:
            leaf_item(node, self._timestamp_key)
        return kept

    def _insert(
        self,
        nodes: Sequence[BaseNode],
        struct: MemTreeIndexStruct | None = None,
        *,
        bulk: bool = False,
        **insert_kwargs: Any,
    ) -> None:
        items, replaced, updates = self._changes(nodes)
        self._memory.delete(replaced)
        with embedding_bar(self._show_progress, len(items) + len(updates)):
            with self._updating():
                for leaf_id, item in updates:
                    self._memory.update(leaf_id, item.text, metadata=item.metadata, timestamp=item.timestamp)
            self._memory.add_many(**_columns(items), aggregation=self._aggregation, bulk=bulk)
        self._note_leaves(struct if struct is not None else self._index_struct, [item.source_id for item in items])

    def _note_leaves(self, struct: MemTreeIndexStruct, added: Sequence[str | None] = ()) -> None:
        """Record in ``struct`` how many leaves the memory holds and a few of this
        index's node ids, by which a load recognizes the tree (see :func:`_check_holds`).

        Sampled ids that left the tree are dropped and new ones fill the sample up:
        a handful of ``find`` lookups per change, whatever the tree's size.
        """
        kept = [source for source in struct.source_ids if self._memory.find(source_id=source)]
        for source in added:
            if len(kept) >= SAMPLED_SOURCE_IDS:
                break
            if source is not None and source not in kept:
                kept.append(source)
        if not kept:  # every sampled leaf deleted: sample what remains
            kept = [leaf.source_id for leaf in self._memory.leaves() if leaf.source_id is not None]
            kept = list(dict.fromkeys(kept))[:SAMPLED_SOURCE_IDS]
        struct.source_ids = kept
        struct.leaf_count = len(self._memory)

    def _updating(self) -> DeferredAggregation | _NoBlock:
        """Where updates run: in a deferred block when this index defers aggregation."""
        return self._memory.deferred() if self._aggregation == "deferred" else _NoBlock()

    def _changes(self, nodes: Sequence[BaseNode]) -> tuple[list[Item], list[str], list[tuple[str, Item]]]:
        """The leaves to add for ``nodes``, the stored leaves to delete, and the
        stored leaves to update in place (a node whose one leaf changed).

        Every node is checked first, so bad input changes nothing. A node whose
        leaf already holds the same text, metadata and time is skipped. A leaf that
        would lose its event time is replaced instead (an update keeps a time it is
        not given a new one for).
        """
        items: list[Item] = []
        replaced: list[str] = []
        updates: list[tuple[str, Item]] = []
        for node in nodes:
            item = leaf_item(node, self._timestamp_key)
            existing = self._memory.get_many(self._memory.find(source_id=node.node_id))
            if len(existing) == 1:
                (leaf,) = existing.values()
                if holds(leaf, item):
                    continue
                if item.timestamp is not None or leaf.timestamp is None:
                    updates.append((leaf.id, item))
                    continue
            replaced.extend(existing)
            items.append(item)
        return items, replaced, updates

    def update_ref_doc(self, document: Document, **update_kwargs: Any) -> None:
        """Re-split a changed document and correct its leaves in place.

        LlamaIndex's contract is "delete the document, then insert it again"; this
        gives the same nodes and texts, but the i-th new node takes the id of the
        document's i-th old node, so node ids and leaf ids stay and each leaf's
        previous text stays in ``index.memory.history(leaf_id)``. New nodes beyond
        the old count are inserted; old nodes beyond the new count are deleted.
        ``insert_kwargs`` / ``delete_kwargs`` are passed on as LlamaIndex does.
        """
        with self._callback_manager.as_trace("update_ref_doc"):
            insert_kwargs = update_kwargs.pop("insert_kwargs", {})
            delete_kwargs = update_kwargs.pop("delete_kwargs", {})
            info = self.docstore.get_ref_doc_info(document.id_)
            if info is None or not without_empty_documents([document]):
                self.delete_ref_doc(document.id_, delete_from_docstore=True, **delete_kwargs)
                self.insert(document, **insert_kwargs)
                return
            nodes = run_transformations(
                [document], self._transformations, show_progress=self._show_progress, **insert_kwargs
            )
            left_over = _reuse_ids(nodes, info.node_ids)
            if left_over:
                self.delete_nodes(left_over, delete_from_docstore=True, **delete_kwargs)
            self.insert_nodes(nodes, **insert_kwargs)
            self.docstore.set_document_hash(document.id_, document.hash)

    async def aupdate_ref_doc(self, document: Document, **update_kwargs: Any) -> None:
        """Async :meth:`update_ref_doc`."""
        with self._callback_manager.as_trace("aupdate_ref_doc"):
            insert_kwargs = update_kwargs.pop("insert_kwargs", {})
            delete_kwargs = update_kwargs.pop("delete_kwargs", {})
            info = await self.docstore.aget_ref_doc_info(document.id_)
            if info is None or not without_empty_documents([document]):
                await self.adelete_ref_doc(document.id_, delete_from_docstore=True, **delete_kwargs)
                await self.ainsert(document, **insert_kwargs)
                return
            nodes = await arun_transformations(
                [document], self._transformations, show_progress=self._show_progress, **insert_kwargs
            )
            left_over = _reuse_ids(nodes, info.node_ids)
            if left_over:
                await self.adelete_nodes(left_over, **delete_kwargs)
                for node_id in left_over:
                    # The sync call: llama-index-core's adelete_document looks the
                    # document up by the node's id and leaves it in ref_doc_info.
                    self.docstore.delete_document(node_id, raise_error=False)
            await self.ainsert_nodes(nodes, **insert_kwargs)
            await self.docstore.aset_document_hash(document.id_, document.hash)

    def delete_nodes(self, node_ids: list[str], delete_from_docstore: bool = False, **delete_kwargs: Any) -> None:
        """Remove the nodes' leaves in one change; their ancestors are rewritten once
        each from what remains."""
        node_ids = list(node_ids)  # delete_ref_doc passes a list the docstore edits as it deletes
        with self._callback_manager.as_trace("delete_nodes"):
            self._memory.delete(self._leaves_of(node_ids))
            self._note_leaves(self._index_struct)
            if delete_from_docstore:
                for node_id in node_ids:
                    self.docstore.delete_document(node_id, raise_error=False)
            self._storage_context.index_store.add_index_struct(self._index_struct)

    async def adelete_nodes(
        self, node_ids: list[str], delete_from_docstore: bool = False, **delete_kwargs: Any
    ) -> None:
        """Async :meth:`delete_nodes`."""
        node_ids = list(node_ids)
        with self._callback_manager.as_trace("adelete_nodes"):
            await self._memory.adelete(self._leaves_of(node_ids))
            self._note_leaves(self._index_struct)
            if delete_from_docstore:
                for node_id in node_ids:
                    await self.docstore.adelete_document(node_id, raise_error=False)
            await self._storage_context.index_store.async_add_index_struct(self._index_struct)

    def _delete_node(self, node_id: str, **delete_kwargs: Any) -> None:
        self._memory.delete(self._leaves_of([node_id]))
        self._note_leaves(self._index_struct)

    def _leaves_of(self, node_ids: Sequence[str]) -> list[str]:
        return [leaf_id for node_id in node_ids for leaf_id in self._memory.find(source_id=node_id)]

    # -- reading ---------------------------------------------------------------------

    @property
    def ref_doc_info(self) -> dict[str, RefDocInfo]:
        """The ingested documents whose nodes are in the tree, with their node ids and metadata."""
        node_ids = list(dict.fromkeys(leaf.source_id for leaf in self._memory.leaves() if leaf.source_id))
        info: dict[str, RefDocInfo] = {}
        for node in self.docstore.get_nodes(node_ids, raise_error=False):
            ref_node = node.source_node
            if ref_node is None or ref_node.node_id in info:
                continue
            ref_doc_info = self.docstore.get_ref_doc_info(ref_node.node_id)
            if ref_doc_info is not None:
                info[ref_node.node_id] = ref_doc_info
        return info

    def as_query_engine(self, llm: LLMType | None = None, **kwargs: Any) -> BaseQueryEngine:
        """A query engine over :meth:`as_retriever` (same options), answering with
        ``llm`` (default ``Settings.llm``).

        Without ``token_budget``, the retrieved context is capped at half of what
        ``llm`` can read (:func:`~llamaindex_memtree.budget.context_budget`), so it
        fits one LLM call: no refine step, whatever ``similarity_top_k``.
        """
        resolved = resolve_llm(llm, callback_manager=self._callback_manager) if llm else Settings.llm
        return super().as_query_engine(llm=resolved, **self._fitted(resolved, kwargs))

    def as_chat_engine(
        self, chat_mode: ChatMode = ChatMode.BEST, llm: LLMType | None = None, **kwargs: Any
    ) -> BaseChatEngine:
        """A chat engine over :meth:`as_retriever` (same options); without
        ``token_budget`` the context is capped for ``llm`` as in :meth:`as_query_engine`."""
        resolved = resolve_llm(llm, callback_manager=self._callback_manager) if llm else Settings.llm
        return super().as_chat_engine(chat_mode=chat_mode, llm=resolved, **self._fitted(resolved, kwargs))

    def _fitted(self, llm: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
        """``kwargs`` with a ``token_budget`` that fits ``llm``'s window, unless the
        caller chose one (the memory's own budget wins when smaller)."""
        if "token_budget" in kwargs:
            return kwargs
        budget = context_budget(llm)
        configured = self._memory.config.token_budget
        if budget is None or (configured is not None and configured < budget):
            return kwargs
        return {**kwargs, "token_budget": budget}

    def as_retriever(
        self,
        mode: str | None = None,
        similarity_top_k: int = DEFAULT_SIMILARITY_TOP_K,
        token_budget: int | None = None,
        **kwargs: Any,
    ) -> MemTreeRetriever:
        """A :class:`MemTreeRetriever` over this index's tree (options there:
        ``leaves_only``, ``summary_hits``, ``filters``, ``time_range``, ``min_similarity``, ``min_score``,
        ``route_overviews``, ``verbose``, ``callback_manager``; ``as_query_engine(route_overviews="always")``
        answers every question with an overview). ``similarity_top_k`` defaults to LlamaIndex's own
        default (2), as ``VectorStoreIndex``'s does.

        ``as_query_engine`` and ``as_chat_engine`` pass their own keyword arguments
        here too (``response_mode``, ``system_prompt``…); those are accepted and
        left to the engine. Anything else raises ``TypeError``: a misspelt option
        (``top_k`` for ``similarity_top_k``) must not silently fall back to a default.
        """
        unknown = sorted(set(kwargs) - set(RETRIEVER_OPTIONS) - engine_options())
        if unknown:
            accepted = ", ".join(["mode", "similarity_top_k", "token_budget", *RETRIEVER_OPTIONS])
            raise TypeError(
                f"as_retriever() got unknown keyword argument(s) {', '.join(map(repr, unknown))}; "
                f"MemTreeIndex retrievers take {accepted} (and the query and chat engines' own options "
                "when called through as_query_engine / as_chat_engine)"
            )
        options = {name: kwargs[name] for name in RETRIEVER_OPTIONS if name in kwargs and name != "callback_manager"}
        return MemTreeRetriever(
            self._memory,
            mode=mode,
            similarity_top_k=similarity_top_k,
            token_budget=token_budget,
            timestamp_key=self._timestamp_key,
            docstore=self.docstore,
            callback_manager=kwargs.get("callback_manager") or self._callback_manager,
            object_map=self._object_map,
            **options,
        )


def _describe(struct: IndexStruct) -> str:
    """``a SummaryIndex (index type 'list')``, for error messages."""
    kind = struct.get_type()
    index_cls = INDEX_STRUCT_TYPE_TO_INDEX_CLASS.get(kind)
    name = index_cls.__name__ if index_cls is not None else type(struct).__name__
    return f"a {name} (index type {getattr(kind, 'value', kind)!r})"


def _open(location: str | os.PathLike[str], struct: IndexStruct | None) -> MemTree:
    """The durable memory at ``location`` with ``Settings``' models: for a stored
    index, in its namespace with its stored config; for a new one, with the
    index's default config."""
    if isinstance(struct, MemTreeIndexStruct):
        return open_memory(location, namespace=tuple(struct.namespace), config=stored_config(struct) or INDEX_CONFIG)
    return open_memory(location, config=INDEX_CONFIG)


def _reopen(struct: MemTreeIndexStruct, storage_context: StorageContext, memory: MemTree | None) -> MemTree:
    """The tree of a stored index: restored from its snapshot (into a memory with
    the stored config, unless ``memory`` is given), or ``memory`` itself when the
    tree lives in a durable store, checked to hold it."""
    namespace = tuple(struct.namespace)
    if struct.snapshot is not None:
        target = memory if memory is not None else memory_from_settings(stored_config(struct) or INDEX_CONFIG)
        restore_snapshot(storage_context, struct.snapshot, target)
        return target
    if memory is None:
        raise ValueError(
            f"this MemTreeIndex keeps its tree in a {struct.store} (namespace {namespace!r}), not in the "
            "persist directory; pass the memory to reopen, e.g. "
            "load_index_from_storage(storage_context, memory=MemTree.open(...))"
        )
    if memory.namespace != namespace:
        raise ValueError(
            f"this MemTreeIndex was built in namespace {namespace!r} but the memory given is in "
            f"{memory.namespace!r}; pass memory.with_namespace({namespace!r})"
        )
    _check_holds(struct, memory)
    check_embedder({"embedder": memory.stored_embedder, "dimension": memory.dimension}, memory)
    return memory


def _check_holds(struct: MemTreeIndexStruct, memory: MemTree) -> None:
    """Refuse a memory that does not hold the index's tree (another database, a new
    in-memory tree): loading it would give an index whose docstore has nodes and
    whose retrieval finds none of them.

    The tree may have changed since the struct was written (other processes share a
    durable store), so only a memory holding *none* of the sampled nodes, or no
    leaves at all where the index had some, is refused; some sampled nodes missing
    is logged.
    """
    expected = struct.leaf_count
    if expected is None:  # persisted before the struct recorded its leaves
        return
    missing = [source for source in struct.source_ids if not memory.find(source_id=source)]
    held = len(memory)
    if (expected > 0 and held == 0) or (struct.source_ids and len(missing) == len(struct.source_ids)):
        where = f"{type(memory.store).__name__}, namespace {memory.namespace!r}"
        example = f" (such as node {struct.source_ids[0]!r})" if struct.source_ids else ""
        raise ValueError(
            f"the memory given ({where}) does not hold this MemTreeIndex's tree: the index was built in a "
            f"{struct.store} and had {expected} leaves, the memory holds {held} and none of the index's "
            f"nodes{example}; pass the memory the index was built in, e.g. "
            f"MemTree.open(<the same SQLite path or PostgreSQL DSN>, namespace={tuple(struct.namespace)!r})"
        )
    if missing:
        logger.warning(
            "the memory given lacks %d of %d sampled nodes of this MemTreeIndex (%s); the tree changed "
            "since the index was persisted, and those nodes will not be retrieved",
            len(missing),
            len(struct.source_ids),
            ", ".join(missing),
        )


class _NoBlock(contextlib.nullcontext[None]):
    """A sync and async block that does nothing (updates outside a deferred block)."""

    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, *exc: object) -> None:
        return None


def _reuse_ids(nodes: Sequence[BaseNode], old_ids: Sequence[str]) -> list[str]:
    """Give the i-th new node the i-th old node id (and point the nodes' links to
    each other at the ids they now have); return the old ids left over."""
    old_ids = list(old_ids)
    renamed = {node.node_id: old_id for node, old_id in zip(nodes, old_ids, strict=False)}
    for node in nodes:
        node.id_ = renamed.get(node.node_id, node.node_id)
        for related in node.relationships.values():
            for info in related if isinstance(related, list) else [related]:
                info.node_id = renamed.get(info.node_id, info.node_id)
    return old_ids[len(nodes) :]


def _columns(items: Sequence[Item]) -> dict[str, Any]:
    """``add_many``'s parallel lists."""
    return {
        "texts": [item.text for item in items],
        "metadata": [item.metadata for item in items],
        "timestamps": [item.timestamp for item in items],
        "source_ids": [item.source_id for item in items],
    }


register(MemTreeIndex)
