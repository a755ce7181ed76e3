"""``MemTree``: the public entry point of the engine.

Each write is written once, as a generator of *requests* (run these aggregation
jobs, embed these texts) that a sync driver (thread pool) or an async driver
(``asyncio.gather``) answers. The generator does all the bookkeeping: it reads what
other writers committed, plans the change, fills in what the models returned and
commits everything in one store transaction. The in-process tree and index then
apply that commit exactly as they would apply another writer's.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TextIO, TypeVar

import numpy as np

from memtree import backup, calibration
from memtree import update as updating
from memtree.aggregate import Aggregator, LLMAggregator
from memtree.background import BackgroundSummaries, KeptConflicting, map_in_daemon_threads
from memtree.config import AGGREGATION_MODES, RETRIEVAL_MODES, Aggregation, MemTreeConfig
from memtree.deferral import FlushPlan, PendingSummaries, flush_base, rebase_flush
from memtree.embed import Embedder, Matrix, check_embeddings, check_query_embedding
from memtree.gcpause import paused_gc
from memtree.index import VectorIndex
from memtree.inputs import Item, TimeLike, make_item, to_min_score, to_time_range
from memtree.integrity import integrity_problems
from memtree.locks import ReadWriteLock
from memtree.models.resolve import default_aggregator, default_embedder, resolve_embedder
from memtree.node import ROOT_ID, LeafVersion, Node, RetrievedNode, Vector
from memtree.optimistic import OPTIMISTIC_ATTEMPTS, Footprint, PreparedWrite, footprint_of, still_valid
from memtree.planning import (
    AggregationJob,
    DeletePlan,
    InsertPlan,
    centroid_of,
    latest,
    normalized,
    path_jobs,
    plan_delete_many,
    plan_insert,
    rebuild_job,
    root_node,
)
from memtree.retrieval import Filters, LexicalQuery, Packing
from memtree.retrieval import retrieve as retrieve_ranked
from memtree.retry import ModelResponseError
from memtree.routing import route
from memtree.state import TreeState
from memtree.stats import Counters, TreeStats, tree_stats
from memtree.store.base import (
    ChangeBatch,
    Namespace,
    NamespaceInfo,
    NamespaceKey,
    Store,
    WriteTransaction,
    namespace_key,
)
from memtree.store.location import as_store, open_store
from memtree.text import count_words, require_text, unstorable
from memtree.usage import recording
from memtree.viz import format_tree
from memtree.viz.dot import to_dot
from memtree.viz.graphviz import ImageFormat, render_dot
from memtree.viz.html import HtmlQuery, to_html
from memtree.viz.mermaid import to_mermaid
from memtree.viz.picture import Direction
from memtree.where import parse_where

logger = logging.getLogger(__name__)

T = TypeVar("T")

_EMBED_CHUNK = 256
"""Texts per embedding call when many arrive together."""

SIBLING_CACHE_SIZE = 256
"""Namespace handles :meth:`MemTree.sibling` keeps open per memory."""


@dataclass(frozen=True)
class _Aggregate:
    """Request: run these jobs concurrently; answer with a text or an exception each."""

    jobs: list[AggregationJob]


@dataclass(frozen=True)
class _Embed:
    """Request: embed these texts in one call; answer with a matrix or the exception.
    ``query`` asks for the embedder's query embedding of a single text."""

    texts: list[str]
    query: bool = False


_Request = _Aggregate | _Embed
_Steps = Generator[_Request, Any, T]

__all__ = ["AGGREGATION_MODES", "Aggregation", "DeferredAggregation", "MemTree"]


class MemTree:
    """A long-term memory that grows as a tree of texts and their summaries.

    New texts are routed down from the root by similarity and hang as leaves; every
    summary on the way is re-aggregated, so shallow nodes hold broad themes and deep
    nodes hold details. Retrieval scores every node at once ("collapsed") or
    descends by beam ("traversal").

    Models: ``embedder`` and ``llm`` take memtree models, LangChain or LlamaIndex
    models, a ``prompt -> text`` callable (``llm``) or the names ``"openai"`` /
    ``"local"`` (see :mod:`memtree.models`). Left out, each is OpenAI when
    ``OPENAI_API_KEY`` is set and otherwise offline (local sentence-transformers
    embeddings, extractive summaries). ``aggregator`` replaces the summary writer
    altogether. ``store`` keeps the tree: in memory by default; a SQLite file path
    or a ``postgresql://`` DSN opens that store, which the memory then owns and
    closes (like :meth:`open`); a :class:`~memtree.store.Store` you pass stays yours.

    Example::

        memory = MemTree()
        memory.add("Alice adopted a cat named Miso.", timestamp="2024-05-01")
        for hit in memory.retrieve("What is Alice's pet called?", k=3):
            print(round(hit.score, 2), hit.text)
    """

    def __init__(
        self,
        *,
        embedder: Embedder | Any | None = None,
        aggregator: Aggregator | None = None,
        llm: Any | None = None,
        store: Store | str | os.PathLike[str] | None = None,
        namespace: Namespace = "default",
        config: MemTreeConfig | None = None,
        refresh_interval: float = 0.0,
    ) -> None:
        self.config = config or MemTreeConfig()
        # Everything is resolved before any work, so a bad model or a missing key fails here.
        self.embedder, self.aggregator = _resolve_models(embedder, aggregator, llm)
        self.namespace: NamespaceKey = namespace_key(namespace)
        self.store, owns_store = as_store(store)
        if refresh_interval < 0:
            raise ValueError(f"refresh_interval must be >= 0 seconds, got {refresh_interval}")
        self.refresh_interval = refresh_interval
        self._state = TreeState(lexical=self.config.lexical_weight > 0)
        self._index: VectorIndex | None = None
        self._rw = ReadWriteLock()
        self._sync_lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        self._counters = Counters()
        self._pending = PendingSummaries()
        self._deferring = 0
        self._deferring_lock = threading.Lock()
        self._background = BackgroundSummaries(
            self._background_flush,
            lambda: len(self._pending),
            queue_size=self.config.background_queue_size,
            name=f"memtree-background-{'/'.join(self.namespace) or 'root'}",
        )
        self._last_refresh = 0.0
        self._closed = False
        self._owns_store = owns_store
        self._siblings: OrderedDict[NamespaceKey, MemTree] = OrderedDict()
        self._siblings_lock = threading.Lock()
        try:
            self.refresh(force=True)
        except BaseException:
            if owns_store:
                self.store.close()
            raise

    @classmethod
    def open(cls, location: str | os.PathLike[str], *, namespace: Namespace = "default", **kwargs: Any) -> MemTree:
        """Open a durable memory: a SQLite file (created if missing) or, for a
        ``postgresql://`` / ``postgres://`` DSN, a PostgreSQL database.

        The memory owns that store: :meth:`close` (or leaving a ``with`` block)
        closes it, so siblings from :meth:`with_namespace` must be done by then.
        Every other keyword goes to :class:`MemTree`.

        Example::

            with MemTree.open("memory.db", namespace=("users", "alice")) as memory:
                memory.add("Alice's sister is called Rosa.")
        """
        if "store" in kwargs:
            raise TypeError("MemTree.open makes the store from location; to pass a store, use MemTree(store=...)")
        # Models first: a bad model or a missing API key must fail before a file is made.
        kwargs["embedder"], kwargs["aggregator"] = _resolve_models(
            kwargs.get("embedder"), kwargs.get("aggregator"), kwargs.pop("llm", None)
        )
        store = open_store(location)
        try:
            memory = cls(store=store, namespace=namespace, **kwargs)
        except BaseException:
            store.close()
            raise
        memory._owns_store = True
        return memory

    # -- siblings and lifecycle ----------------------------------------------------

    def with_namespace(self, namespace: Namespace, *, config: MemTreeConfig | None = None) -> MemTree:
        """The memory of another namespace in the same store, sharing models and
        config (or using ``config`` instead). Each call opens a new handle, which
        loads the namespace's tree; :meth:`sibling` reuses handles."""
        return MemTree(
            embedder=self.embedder,
            aggregator=self.aggregator,
            store=self.store,
            namespace=namespace,
            config=config or self.config,
            refresh_interval=self.refresh_interval,
        )

    def sibling(self, namespace: Namespace) -> MemTree:
        """Like :meth:`with_namespace`, but each namespace is opened once and the
        handle reused (the ``SIBLING_CACHE_SIZE`` most recently used are kept).

        Meant for servers and adapters that touch many namespaces (one per user or
        chat session): opening one loads its tree from the store, reusing it only
        catches up with what other writers committed. ``sibling(memory.namespace)``
        is the memory itself.
        """
        key = namespace_key(namespace)
        if key == self.namespace:
            return self
        with self._siblings_lock:
            memory = self._siblings.pop(key, None)
        if memory is None:
            memory = self.with_namespace(key)  # outside the lock: loading reads the store
        with self._siblings_lock:
            memory = self._siblings.setdefault(key, memory)
            self._siblings.move_to_end(key)
            while len(self._siblings) > SIBLING_CACHE_SIZE:
                self._siblings.popitem(last=False)
        return memory

    def namespaces(self, prefix: Namespace | None = None) -> list[NamespaceKey]:
        """Namespaces in this memory's store that hold a tree (optionally under ``prefix``)."""
        return self.store.list_namespaces(namespace_key(prefix) if prefix is not None else ())

    def delete_namespace(self, namespace: Namespace | None = None) -> bool:
        """Delete a whole namespace (this one by default). Returns whether it existed."""
        key = self.namespace if namespace is None else namespace_key(namespace)
        existed = self.store.delete_namespace(key)
        if key == self.namespace:
            self.refresh(force=True)
        return existed

    def close(self) -> None:
        """Write the summaries still pending (background or deferred aggregation),
        here and in the namespaces opened with :meth:`sibling`, stop worker threads,
        and close the store if this memory opened it (:meth:`open`); a store passed
        in is the caller's to close.

        A summary that cannot be written (the model fails) stays stale in the store;
        ``repair()`` rewrites it later. No leaf depends on it."""
        if not self._closed:
            self._closed = True
            with self._siblings_lock:
                siblings = list(self._siblings.values())
            for sibling in siblings:
                sibling.close()
            self._background.stop()
            try:
                self.flush()  # writes that arrived while the worker stopped
            except Exception:  # closing must go on; the summaries stay stale
                logger.exception("flushing pending summaries on close failed; they stay stale: call repair() later")
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        if self._owns_store:
            self._owns_store = False
            self.store.close()

    def __enter__(self) -> MemTree:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- adding ----------------------------------------------------------------------

    def add(
        self,
        text: str,
        *,
        metadata: Mapping[str, Any] | None = None,
        timestamp: TimeLike | None = None,
        source_id: str | None = None,
        aggregation: Aggregation | None = None,
    ) -> str:
        """Remember one text; return its leaf id (with ``config.deduplicate``, the id of
        a stored leaf with the same text, metadata and source id, if there is one).
        ``timestamp`` is when the event happened; ``source_id``
        is your id for it (message id, document node id).

        ``aggregation`` says when the summaries above it are written (default:
        ``config.aggregation``; inside a :meth:`deferred` block, at the block's end).
        With ``"deferred"`` or ``"background"`` the leaf is stored and searchable when
        this returns, and no model call but its embedding is made here; see
        :class:`~memtree.MemTreeConfig`."""
        item = make_item(text, metadata, timestamp, source_id)
        mode = self._aggregation_mode(aggregation)
        existing = self._stored_duplicate(item)
        if existing is not None:
            return existing
        vectors = self._drive(self._embed_steps([item.text]))
        leaf_id = self._write(lambda: self._insert_steps(item, vectors[0], defer=mode != "eager"))
        self._after_insert(mode)
        return leaf_id

    async def aadd(
        self,
        text: str,
        *,
        metadata: Mapping[str, Any] | None = None,
        timestamp: TimeLike | None = None,
        source_id: str | None = None,
        aggregation: Aggregation | None = None,
    ) -> str:
        """Async :meth:`add`: aggregations run on the event loop (``aaggregate``);
        in background mode the worker thread writes them."""
        item = make_item(text, metadata, timestamp, source_id)
        mode = self._aggregation_mode(aggregation)
        existing = self._stored_duplicate(item)
        if existing is not None:
            return existing
        vectors = await self._adrive(self._embed_steps([item.text]))
        leaf_id = await self._awrite(lambda: self._insert_steps(item, vectors[0], defer=mode != "eager"))
        self._after_insert(mode)
        return leaf_id

    def add_many(
        self,
        texts: Sequence[str],
        *,
        metadata: Sequence[Mapping[str, Any] | None] | None = None,
        timestamps: Sequence[TimeLike | None] | None = None,
        source_ids: Sequence[str | None] | None = None,
        aggregation: Aggregation | None = None,
    ) -> list[str]:
        """Remember several texts in order; embeddings are computed in batches.

        Every item is checked before anything is stored, so one bad item stores
        nothing. Each item is then routed and committed in turn.

        ``aggregation="eager"`` rewrites the summaries on each item's path as it
        goes, as in the paper. ``"deferred"`` commits every leaf first and then
        rewrites each touched summary once with all its new texts in one model call:
        the same leaves for far fewer calls (the default inside a :meth:`deferred`
        block). ``"background"`` commits every leaf and returns; the worker thread
        writes the summaries the same way. Left out: ``config.aggregation``, where
        ``"deferred"`` means the memory's (the summaries wait for :meth:`flush` or
        :meth:`close`, as for :meth:`add`), not this call's.
        """
        mode = self._aggregation_mode(aggregation)
        items = _make_items(texts, metadata, timestamps, source_ids)
        stored = self._stored_mask(items)
        vectors = _fill_in(stored, self._drive(self._embed_steps(_unstored_texts(items, stored))))
        if aggregation is None or mode != "deferred" or self._is_deferring():
            ids = self._insert_all(items, vectors, defer=mode != "eager")
            self._after_insert(mode)
            return ids
        with self.deferred():
            return self._insert_all(items, vectors, defer=True)

    async def aadd_many(
        self,
        texts: Sequence[str],
        *,
        metadata: Sequence[Mapping[str, Any] | None] | None = None,
        timestamps: Sequence[TimeLike | None] | None = None,
        source_ids: Sequence[str | None] | None = None,
        aggregation: Aggregation | None = None,
    ) -> list[str]:
        """Async :meth:`add_many`."""
        mode = self._aggregation_mode(aggregation)
        items = _make_items(texts, metadata, timestamps, source_ids)
        stored = self._stored_mask(items)
        vectors = _fill_in(stored, await self._adrive(self._embed_steps(_unstored_texts(items, stored))))
        if aggregation is None or mode != "deferred" or self._is_deferring():
            ids = await self._ainsert_all(items, vectors, defer=mode != "eager")
            self._after_insert(mode)
            return ids
        async with self.deferred():
            return await self._ainsert_all(items, vectors, defer=True)

    def _stored_duplicate(self, item: Item, *, refresh: bool = True) -> str | None:
        """The id of a leaf already holding exactly ``item`` (text, metadata, source
        id), if duplicates are not kept (checked before embedding, so a repeated text
        costs no model call)."""
        if not self.config.deduplicate:
            return None
        if refresh:
            self._maybe_refresh()
        return self._state.duplicate_of(item.text, item.metadata, item.source_id)

    def _stored_mask(self, items: list[Item]) -> list[bool]:
        """Which items are already stored (and need no embedding)."""
        self._maybe_refresh()
        return [self._stored_duplicate(item, refresh=False) is not None for item in items]

    def _insert_all(self, items: list[Item], vectors: list[Vector | None], *, defer: bool) -> list[str]:
        ids = []
        for item, vector in zip(items, vectors, strict=True):
            existing = self._stored_duplicate(item, refresh=False) if vector is None else None
            if existing is not None:
                ids.append(existing)
                continue
            if vector is None:  # the stored copy was deleted meanwhile
                vector = self._drive(self._embed_steps([item.text]))[0]
            ids.append(self._write(functools.partial(self._insert_steps, item, vector, defer=defer)))
        return ids

    async def _ainsert_all(self, items: list[Item], vectors: list[Vector | None], *, defer: bool) -> list[str]:
        ids = []
        for item, vector in zip(items, vectors, strict=True):
            existing = self._stored_duplicate(item, refresh=False) if vector is None else None
            if existing is not None:
                ids.append(existing)
                continue
            if vector is None:  # the stored copy was deleted meanwhile
                vector = (await self._adrive(self._embed_steps([item.text])))[0]
            ids.append(await self._awrite(functools.partial(self._insert_steps, item, vector, defer=defer)))
        return ids

    # -- deferred aggregation ------------------------------------------------------------

    def deferred(self) -> DeferredAggregation:
        """A block in which inserts defer their summaries to one rewrite at the end.

        Use ``with memory.deferred():`` (or ``async with``) around a stream of
        :meth:`add` / :meth:`aadd` calls. Each leaf is stored at once; the summaries
        it passes are marked stale and keep their texts until the block ends, when
        :meth:`flush` rewrites each of them once with all its new texts. Routing and
        retrieval meanwhile see the new leaves and the previous summaries. Blocks
        nest; the outermost one flushes. If the process dies inside the block no
        leaf is lost: the summaries stay stale and :meth:`repair` rewrites them.

        Example::

            with memory.deferred():
                for message in chat_log:
                    memory.add(message)
        """
        return DeferredAggregation(self)

    def flush(self) -> int:
        """Write every summary whose aggregation was deferred; return how many.

        Each is rewritten once, in one model call with all its new texts (several
        calls if they exceed ``config.aggregation_max_words``). Calls run
        concurrently up to ``config.max_concurrency``. A summary that still cannot
        be written stays stale; the next :meth:`flush` or :meth:`repair` retries it.
        """
        if not len(self._pending):
            return 0
        return self._write(self._flush_steps)

    async def aflush(self) -> int:
        """Async :meth:`flush`."""
        if not len(self._pending):
            return 0
        return await self._awrite(self._flush_steps)

    def _is_deferring(self) -> bool:
        with self._deferring_lock:
            return self._deferring > 0

    def _enter_deferred(self) -> None:
        with self._deferring_lock:
            self._deferring += 1

    def _leave_deferred(self) -> bool:
        """Close one block; whether it was the outermost."""
        with self._deferring_lock:
            self._deferring -= 1
            return self._deferring == 0

    def wait_for_summaries(self, timeout: float | None = None) -> bool:
        """Block until the background worker has written the summaries of every
        insert made so far; return ``False`` if ``timeout`` seconds passed first.
        Summaries a failing model could not write stay stale (see ``stats().stale``)."""
        return self._background.wait(timeout)

    def _aggregation_mode(self, aggregation: str | None) -> str:
        if aggregation is None:
            return "deferred" if self._is_deferring() else self.config.aggregation
        if aggregation not in AGGREGATION_MODES:
            raise ValueError(f"aggregation must be one of: {', '.join(AGGREGATION_MODES)}; got {aggregation!r}")
        if aggregation == "background" and self._is_deferring():
            return "deferred"  # the block's end writes them; a worker would race it
        return aggregation

    def _background_flush(self, last: bool) -> int:
        """The worker's flush: optimistic only (see :class:`~memtree.background.KeptConflicting`)
        except for the ``last`` one."""
        if not len(self._pending):
            return 0
        return self._write(self._flush_steps, plan_under_lock=last)

    def _after_insert(self, mode: str) -> None:
        """Hand a committed background insert's summaries to the worker."""
        if mode == "background":
            self._background.notify()

    # -- retrieving -----------------------------------------------------------------

    def retrieve(
        self,
        query: str,
        *,
        k: int | None = None,
        token_budget: int | None = None,
        mode: str | None = None,
        leaves_only: bool = False,
        where: Mapping[str, Any] | None = None,
        time_range: tuple[TimeLike | None, TimeLike | None] | None = None,
        min_score: float | None = None,
        query_embedding: Vector | Sequence[float] | None = None,
        lexical_weight: float | None = None,
    ) -> list[RetrievedNode]:
        """The nodes most relevant to ``query``, best first.

        ``mode`` is ``"collapsed"`` (every node scored at once) or ``"traversal"``
        (beam descent from the root). ``token_budget`` caps the tokens of the
        results' ``context`` (the last result is cut to fit). ``where`` keeps leaves
        whose metadata pass it: ``{"speaker": "Leo"}`` for equality, operators as in
        ``{"age": {"$gte": 30}, "tag": {"$in": ["a", "b"]}}``, and ``$and`` / ``$or``
        / ``$not`` (see :mod:`memtree.where`); ``time_range=(start, end)`` keeps
        nodes whose event time lies inside (either side may be ``None``).
        ``query_embedding`` is the query's vector if you already have it (from this
        memory's embedder), e.g. to search many namespaces with one embedding call.
        ``lexical_weight`` overrides the config's share of BM25 in the score for this
        call (``0`` ranks by cosine similarity alone, as the paper does).
        """
        options = self._retrieval_options(
            query, k, token_budget, mode, leaves_only, where, time_range, min_score, lexical_weight
        )
        self._maybe_refresh()
        if query_embedding is not None:
            vector = check_query_embedding(query_embedding, self._state.info.dimension)
            return self._retrieve_embedded(vector, query, *options)
        vectors = self._drive(self._embed_steps([query], query=True))
        return self._retrieve_embedded(vectors[0], query, *options)

    async def aretrieve(
        self,
        query: str,
        *,
        k: int | None = None,
        token_budget: int | None = None,
        mode: str | None = None,
        leaves_only: bool = False,
        where: Mapping[str, Any] | None = None,
        time_range: tuple[TimeLike | None, TimeLike | None] | None = None,
        min_score: float | None = None,
        query_embedding: Vector | Sequence[float] | None = None,
        lexical_weight: float | None = None,
    ) -> list[RetrievedNode]:
        """Async :meth:`retrieve`."""
        options = self._retrieval_options(
            query, k, token_budget, mode, leaves_only, where, time_range, min_score, lexical_weight
        )
        await asyncio.to_thread(self._maybe_refresh)
        if query_embedding is not None:
            vector = check_query_embedding(query_embedding, self._state.info.dimension)
            return self._retrieve_embedded(vector, query, *options)
        vectors = await self._adrive(self._embed_steps([query], query=True))
        return self._retrieve_embedded(vectors[0], query, *options)

    def embed_query(self, query: str) -> Vector:
        """The vector :meth:`retrieve` would compute for ``query`` (checked, unit
        length); pass it back as ``query_embedding`` to search many namespaces
        that share this memory's embedder with a single embedding call."""
        require_text(query, "query")
        return self._drive(self._embed_steps([query], query=True))[0]

    async def aembed_query(self, query: str) -> Vector:
        """Async :meth:`embed_query`."""
        require_text(query, "query")
        return (await self._adrive(self._embed_steps([query], query=True)))[0]

    def _retrieval_options(
        self,
        query: str,
        k: int | None,
        token_budget: int | None,
        mode: str | None,
        leaves_only: bool,
        where: Mapping[str, Any] | None,
        time_range: tuple[TimeLike | None, TimeLike | None] | None,
        min_score: float | None,
        lexical_weight: float | None,
    ) -> tuple[str, Packing, Filters, float]:
        require_text(query, "query")
        k = self.config.k if k is None else k
        if isinstance(k, bool) or not isinstance(k, int) or k <= 0:
            raise ValueError(f"k must be a positive integer, got {k!r}")
        budget = self.config.token_budget if token_budget is None else token_budget
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget <= 0):
            raise ValueError(f"token_budget must be a positive integer or None, got {budget!r}")
        mode = self.config.mode if mode is None else mode
        if mode not in RETRIEVAL_MODES:
            raise ValueError(f"unknown mode {mode!r}; choose one of: {', '.join(RETRIEVAL_MODES)}")
        threshold = self.config.retrieve_threshold if min_score is None else to_min_score(min_score)  # None: no cut
        packing = Packing(k, budget, threshold, self.config.drop_repeated_sentences, self.config.token_counter)
        filters = Filters(leaves_only, parse_where(where), to_time_range(time_range))
        weight = self.config.lexical_weight if lexical_weight is None else lexical_weight
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 <= weight <= 10:
            raise ValueError(f"lexical_weight must be a number between 0 and 10, got {weight!r}")
        if weight > 0 and self._state.lexical is None:
            raise ValueError(
                "this memory keeps no lexical index (its config has lexical_weight=0); "
                "open it with MemTreeConfig(lexical_weight=...) > 0 to use hybrid retrieval"
            )
        return mode, packing, filters, float(weight)

    def _retrieve_embedded(
        self, query: Vector, text: str, mode: str, packing: Packing, filters: Filters, lexical_weight: float
    ) -> list[RetrievedNode]:
        lexical = LexicalQuery(text, lexical_weight) if lexical_weight > 0 else None
        with self._rw.read():
            index = self._index
            if index is None or len(index) == 0:
                return []
            return retrieve_ranked(index, self._state, query, mode, self.config.beam, packing, filters, lexical)

    # -- deleting and repairing ----------------------------------------------------

    def delete(self, node_id: str) -> None:
        """Forget a leaf. Its ancestors are rewritten from what remains (no summary
        keeps its text) and a parent left with one child is folded away.
        Raises ``KeyError`` for an unknown id and ``ValueError`` for a summary id."""
        self._check_leaf_id(node_id)
        self._write(lambda: self._delete_steps([node_id]))

    async def adelete(self, node_id: str) -> None:
        """Async :meth:`delete`."""
        self._check_leaf_id(node_id)
        await self._awrite(lambda: self._delete_steps([node_id]))

    def delete_many(self, node_ids: Iterable[str]) -> int:
        """Forget several leaves in one change (for example all of one ``source_id``:
        ``memory.delete_many(memory.find(source_id=...))``); return how many.

        The tree left is the one :meth:`delete` would leave one leaf at a time, but
        each affected summary is rewritten once, and summaries of one depth are
        rewritten concurrently. Every id is checked first: an unknown id
        (``KeyError``) or a summary id (``ValueError``) deletes nothing.
        """
        ids = self._check_leaf_ids(node_ids)
        if ids:
            self._write(lambda: self._delete_steps(ids))
        return len(ids)

    async def adelete_many(self, node_ids: Iterable[str]) -> int:
        """Async :meth:`delete_many`."""
        ids = self._check_leaf_ids(node_ids)
        if ids:
            await self._awrite(lambda: self._delete_steps(ids))
        return len(ids)

    def update(
        self,
        leaf_id: str,
        text: str,
        *,
        metadata: Mapping[str, Any] | None = None,
        timestamp: TimeLike | None = None,
    ) -> str:
        """Correct a leaf; return its id, which stays the same.

        ``metadata`` and ``timestamp`` left ``None`` keep the leaf's. If the new text
        would now be routed elsewhere the leaf moves there; either way every summary
        above its old and new place is rewritten, so none keeps the old text. The
        version replaced is kept: :meth:`history` lists it. Deleting the leaf deletes
        its history too. Raises ``KeyError`` for an unknown id and ``ValueError`` for
        a summary id. See :mod:`memtree.update`.

        Example::

            leaf = memory.add("Alice lives in Paris.")
            memory.update(leaf, "Alice moved to Lyon in 2024.")
            memory.history(leaf)[0].text  # 'Alice lives in Paris.'
        """
        return updating.update(self, leaf_id, text, metadata=metadata, timestamp=timestamp)

    async def aupdate(
        self,
        leaf_id: str,
        text: str,
        *,
        metadata: Mapping[str, Any] | None = None,
        timestamp: TimeLike | None = None,
    ) -> str:
        """Async :meth:`update`."""
        return await updating.aupdate(self, leaf_id, text, metadata=metadata, timestamp=timestamp)

    def history(self, leaf_id: str) -> list[LeafVersion]:
        """The earlier versions of a leaf that :meth:`update` replaced, oldest first
        (empty if it was never updated). ``KeyError`` for an unknown (or deleted) id."""
        return updating.history(self, leaf_id)

    def repair(self) -> int:
        """Rewrite every stale summary (deepest first); return how many were fixed."""
        return self._write(self._repair_steps)

    async def arepair(self) -> int:
        """Async :meth:`repair`."""
        return await self._awrite(self._repair_steps)

    # -- backups ---------------------------------------------------------------------------

    def export_jsonl(self, target: str | os.PathLike[str] | TextIO) -> int:
        """Write this namespace (tree and records) as a JSONL backup to a path or text
        stream; return the number of nodes written. The format is documented in
        :mod:`memtree.backup`: human-readable, embeddings included, no pickle."""
        return backup.export_jsonl(self, target)

    def import_jsonl(self, source: str | os.PathLike[str] | TextIO, *, skip_bad: bool = False) -> int:
        """Restore a JSONL backup into this namespace, which must be empty; return the
        number of nodes imported. Nothing is re-embedded. The whole file is checked
        first: a problem raises ``ValueError("line N: ...")`` and imports nothing,
        unless ``skip_bad=True`` skips bad lines (with a warning) and routes leaves
        that lost their summaries in again. The tree is written in one transaction,
        records and re-routed leaves after it: if an import is interrupted, delete
        the namespace and import again."""
        return backup.import_jsonl(self, source, skip_bad=skip_bad)

    def _restore(self, nodes: list[Node], info: NamespaceInfo, versions: Sequence[LeafVersion] = ()) -> None:
        """Write a whole checked tree (and its leaves' history) into this (empty)
        namespace in one transaction."""
        self._write(lambda: self._restore_steps(nodes, info, versions))

    def _restore_steps(
        self, nodes: list[Node], info: NamespaceInfo, versions: Sequence[LeafVersion] = ()
    ) -> _Steps[PreparedWrite[None]]:
        leaves = self._state.leaf_total
        kinds = self.store.record_kinds(self.namespace)
        if leaves or kinds:
            held = f"{leaves} leaves" + (f" and records ({', '.join(kinds)})" if kinds else "")
            raise ValueError(
                f"namespace {self.namespace!r} is not empty ({held}); import into a new namespace "
                "or delete this one first (delete_namespace())"
            )
        base = (self._state.seq, self._state.generation)
        yield from ()
        return PreparedWrite(
            None, base, nodes, [], Footprint(everything=True), info=lambda _current: info, versions=list(versions)
        )

    def _reinsert_leaf(self, leaf: Node) -> None:
        """Route a stored leaf in again with its own id, times and embedding."""
        item = Item(leaf.text, dict(leaf.metadata), leaf.timestamp, leaf.source_id)
        assert leaf.embedding is not None
        embedding = leaf.embedding
        self._write(lambda: self._insert_steps(item, embedding, restore=leaf))

    # -- reading the tree -------------------------------------------------------------

    def get(self, node_id: str) -> Node:
        """A copy of a node (``KeyError`` naming the id if there is none)."""
        self._maybe_refresh()
        with self._rw.read():
            node = self._state.nodes.get(node_id)
            if node is None:
                raise KeyError(f"no node with id {node_id!r} in namespace {self.namespace!r}")
            return self._copy_out(node)

    def get_many(self, node_ids: Iterable[str]) -> dict[str, Node]:
        """Copies of those of ``node_ids`` that exist, by id, read from one snapshot.

        Ids not in the tree are left out instead of raising, so a caller resolving
        the ``leaf_ids`` of a retrieval result tolerates a delete that happened since.
        """
        self._maybe_refresh()
        with self._rw.read():
            nodes = self._state.nodes
            return {node_id: self._copy_out(nodes[node_id]) for node_id in node_ids if node_id in nodes}

    def _copy_out(self, node: Node) -> Node:
        out = node.copy()
        if node.id == ROOT_ID:  # the stored root does not count; the state does
            out.leaf_count = self._state.leaf_total
        return out

    def find(self, *, source_id: str) -> list[str]:
        """Ids of the leaves stored with this ``source_id``, oldest first."""
        self._maybe_refresh()
        with self._rw.read():
            return list(self._state.leaves_by_source.get(source_id, []))

    def leaf_ids_under(self, node_id: str) -> tuple[str, ...]:
        """Ids of the leaves below a node."""
        with self._rw.read():
            if node_id not in self._state.nodes:
                raise KeyError(f"no node with id {node_id!r} in namespace {self.namespace!r}")
            return self._state.leaf_ids_under(node_id)

    def walk(self) -> Iterator[Node]:
        """Copies of every node, root first, in depth-first pre-order (a snapshot)."""
        self._maybe_refresh()
        with self._rw.read():
            snapshot = [self._copy_out(node) for node in self._state.walk()]
        return iter(snapshot)

    __iter__ = walk

    def leaves(self) -> list[Node]:
        """Copies of all leaves, oldest first."""
        return sorted((node for node in self.walk() if node.is_leaf), key=lambda n: (n.created_at, n.id))

    def __len__(self) -> int:
        """The number of leaves (texts remembered)."""
        self._maybe_refresh()
        with self._rw.read():
            return self._state.leaf_total

    def to_dict(self) -> dict[str, Any]:
        """The tree as nested dicts (id, text, depth, leaf_count, timestamp, metadata, children)."""
        self._maybe_refresh()
        with self._rw.read():

            def build(node_id: str) -> dict[str, Any]:
                node = self._state.nodes[node_id]
                return {
                    "id": node.id,
                    "text": node.text,
                    "depth": node.depth,
                    "is_leaf": node.is_leaf,
                    "leaf_count": self._state.leaf_total if node.id == ROOT_ID else node.leaf_count,
                    "timestamp": node.timestamp,
                    "metadata": dict(node.metadata),
                    "stale": node.stale,
                    "children": [build(child) for child in node.children],
                }

            if self._state.root is None:
                return {"id": ROOT_ID, "text": "", "depth": 0, "leaf_count": 0, "children": []}
            return build(ROOT_ID)

    def format_tree(self, *, max_depth: int | None = None, width: int = 72) -> str:
        """An indented outline of the tree (depth, leaf count and a preview per node)."""
        self._maybe_refresh()
        with self._rw.read():
            return format_tree(self._state, max_depth=max_depth, width=width)

    def to_mermaid(
        self, *, max_depth: int | None = None, width: int = 80, line_width: int = 28, direction: Direction = "LR"
    ) -> str:
        """The tree as a Mermaid ``flowchart`` (paste it into Markdown between
        ```` ```mermaid ```` fences). Each box shows a title (leaf count, or a leaf's
        date) over the first ``width`` characters of the node's text, wrapped at
        ``line_width``; below ``max_depth`` a "… N more below" box stands in."""
        self._maybe_refresh()
        with self._rw.read():
            return to_mermaid(self._state, max_depth=max_depth, width=width, line_width=line_width, direction=direction)

    def to_dot(
        self, *, max_depth: int | None = None, width: int = 80, line_width: int = 28, direction: Direction = "LR"
    ) -> str:
        """The tree as a Graphviz DOT ``digraph`` (same boxes as :meth:`to_mermaid`;
        in SVG output each box's tooltip is its full text)."""
        self._maybe_refresh()
        with self._rw.read():
            return to_dot(self._state, max_depth=max_depth, width=width, line_width=line_width, direction=direction)

    def to_png(self, path: str | os.PathLike[str] | None = None, **options: Any) -> bytes:
        """The :meth:`to_dot` picture drawn as PNG by Graphviz; written to ``path`` if given.

        Takes :meth:`to_dot`'s keyword options. Raises
        :class:`~memtree.viz.GraphvizNotFoundError` (naming ``apt-get install
        graphviz``) when the ``dot`` program is not installed.
        """
        return self._render("png", path, options)

    def to_svg(self, path: str | os.PathLike[str] | None = None, **options: Any) -> str:
        """The :meth:`to_dot` picture drawn as SVG by Graphviz (see :meth:`to_png`)."""
        return self._render("svg", path, options).decode("utf-8")

    def _render(self, image_format: ImageFormat, path: str | os.PathLike[str] | None, options: dict[str, Any]) -> bytes:
        image = render_dot(self.to_dot(**options), image_format)
        if path is not None:
            with open(path, "wb") as file:
                file.write(image)
        return image

    def to_html(
        self,
        *,
        queries: str | Sequence[str] = (),
        k: int | None = None,
        mode: str | None = None,
        expand_depth: int = 1,
        max_depth: int | None = None,
        title: str | None = None,
    ) -> str:
        """One self-contained HTML page to browse the tree: no server, no network.

        The tree opens to ``expand_depth`` and every node opens and closes; a click
        shows a node's full text and metadata. The page's search box matches words
        (BM25 over the node texts: the page has no embedding model), and each of
        ``queries`` is answered here by :meth:`retrieve` (``k``, ``mode``) so the page
        can highlight exactly the nodes this memory retrieves for it. ``max_depth``
        leaves deeper nodes out (for very large trees).

        Example::

            Path("tree.html").write_text(memory.to_html(queries=["Where did Leo eat ramen?"]))
        """
        asked = [queries] if isinstance(queries, str) else list(queries)
        answered = [
            HtmlQuery(
                query, [(hit.id, hit.score) for hit in self.retrieve(query, k=k, mode=mode)], mode or self.config.mode
            )
            for query in asked
        ]
        name = "/".join(self.namespace)
        self._maybe_refresh()
        with self._rw.read():
            return to_html(
                self._state,
                title=title or f"memtree · {name}",
                namespace=name,
                queries=answered,
                expand_depth=expand_depth,
                max_depth=max_depth,
                k=k or self.config.k,
            )

    def stats(self) -> TreeStats:
        """Size, shape and cost counters (see :class:`~memtree.stats.TreeStats`)."""
        self._maybe_refresh()
        with self._rw.read():
            return tree_stats(self._state, self._counters.snapshot(), self._theta0(), pending=len(self._pending))

    def check_integrity(self) -> list[str]:
        """Every broken invariant of the tree and its index, described (empty: sound)."""
        self._maybe_refresh()
        with self._rw.read():
            return integrity_problems(self._state, self._index, self.config.depth_cap)

    @property
    def dimension(self) -> int | None:
        """The embedding dimension of this memory (``None`` until something is stored)."""
        return self._state.info.dimension

    @property
    def stored_embedder(self) -> str | None:
        """The name of the embedder that wrote this memory's vectors, as its store
        recorded it (``None`` until something is stored). Differs from
        ``embedder.name`` when a memory is reopened with another model, whose vectors
        its stored ones cannot be compared with."""
        return self._state.info.embedder

    # -- catching up with the store --------------------------------------------------

    def refresh(self, *, force: bool = False) -> None:
        """Apply what other writers committed since this memory last looked."""
        if not force and self._state.generation is not None:
            seq, generation = self.store.head(self.namespace)
            if seq == self._state.seq and generation == self._state.generation:
                self._last_refresh = time.monotonic()
                return
        self._catch_up(lambda since: self.store.read_changes(self.namespace, since))

    def _maybe_refresh(self) -> None:
        if time.monotonic() - self._last_refresh >= self.refresh_interval:
            self.refresh()

    def _catch_up(self, read: Callable[[int], ChangeBatch]) -> None:
        with self._sync_lock, paused_gc():
            batch = read(self._state.seq)
            if batch.generation != self._state.generation and self._state.seq > 0:
                batch = read(0)  # the namespace was deleted and made again: start over
            self._apply(batch)
            self._last_refresh = time.monotonic()

    def _apply(self, batch: ChangeBatch) -> None:
        with self._rw.write():
            written, removed, reset = self._state.apply(batch)
            if reset:
                self._index = None
            dimension = self._state.info.dimension
            if self._index is None and dimension is not None:
                self._index = VectorIndex(dimension)
                written = [node for node in self._state.nodes.values() if not node.is_root]
                removed = []
            if self._index is None:
                return
            self._index.remove(removed)
            embedded = [node for node in written if node.embedding is not None]
            if embedded:
                self._index.upsert(
                    [node.id for node in embedded],
                    [node.embedding for node in embedded],  # type: ignore[misc]
                    [node.is_leaf for node in embedded],
                    [node.timestamp for node in embedded],
                )

    def _commit(
        self,
        transaction: WriteTransaction,
        upserts: list[Node],
        deletions: list[str],
        info: NamespaceInfo | None = None,
        versions: Sequence[LeafVersion] = (),
    ) -> None:
        """Commit atomically, then show the same change to this process's tree."""
        seq = transaction.commit(upserts, deletions, info, versions)
        batch = ChangeBatch(
            nodes=[node.copy() for node in upserts],
            deleted=list(deletions),
            seq=seq,
            generation=self._state.generation or "",
            info=info if info is not None else self._state.info,
        )
        with self._sync_lock:
            self._apply(batch)

    def _theta0(self) -> float:
        return calibration.effective_theta0(self.config, self._state.info.settings)

    # -- the write procedures (sans I/O) -------------------------------------------

    def _embed_steps(self, texts: list[str], *, query: bool = False) -> _Steps[Matrix]:
        """Embed texts in chunks, counting calls and checking every vector."""
        parts: list[Matrix] = []
        for start in range(0, len(texts), _EMBED_CHUNK):
            chunk = texts[start : start + _EMBED_CHUNK]
            answer = yield _Embed(chunk, query)
            if isinstance(answer, BaseException):
                raise answer
            parts.append(self._check_vectors(answer, len(chunk)))
        return np.concatenate(parts) if parts else np.zeros((0, self.dimension or 1), np.float32)

    def _check_vectors(self, vectors: Any, count: int) -> Matrix:
        return check_embeddings(vectors, count, self._state.info.dimension, type(self.embedder).__name__)

    def _write(self, procedure: Callable[[], _Steps[PreparedWrite[T]]], *, plan_under_lock: bool = True) -> T:
        """Plan a write and make its model calls outside the store's writer lock, then
        commit it under the lock if nothing it depends on changed meanwhile (else plan
        again; see :mod:`memtree.optimistic`). After ``OPTIMISTIC_ATTEMPTS`` conflicts
        the write is planned under the lock, which then waits for its model calls
        (``plan_under_lock=False`` raises :class:`KeptConflicting` instead)."""
        for _ in range(OPTIMISTIC_ATTEMPTS):
            self._maybe_refresh()
            prepared = self._drive(procedure())
            if prepared.empty:
                return prepared.result
            with self.store.write(self.namespace) as transaction:
                if self._commit_prepared(transaction, prepared):
                    return prepared.result
            self._counters.add("write_conflicts")
        if not plan_under_lock:
            raise KeptConflicting(f"{OPTIMISTIC_ATTEMPTS} plans in a row conflicted with other writes")
        with self.store.write(self.namespace) as transaction:
            self._catch_up(transaction.read_changes)
            prepared = self._drive(procedure())
            if not prepared.empty and not self._commit_prepared(transaction, prepared):
                raise RuntimeError("the tree changed while this memory held the store's writer lock")
            return prepared.result

    async def _awrite(self, procedure: Callable[[], _Steps[PreparedWrite[T]]]) -> T:
        """Async :meth:`_write`. Waiting for the store's writer lock happens in a
        dedicated thread, so other coroutines (and the default executor's threads,
        which model calls use) keep running."""
        for _ in range(OPTIMISTIC_ATTEMPTS):
            await asyncio.to_thread(self._maybe_refresh)
            prepared = await self._adrive(procedure())
            if prepared.empty:
                return prepared.result
            transaction = await _begin_in_thread(self.store, self.namespace)
            try:
                if self._commit_prepared(transaction, prepared):
                    return prepared.result
            finally:
                transaction.rollback()  # a no-op once committed
            self._counters.add("write_conflicts")
        transaction = await _begin_in_thread(self.store, self.namespace)
        try:
            self._catch_up(transaction.read_changes)
            prepared = await self._adrive(procedure())
            if not prepared.empty and not self._commit_prepared(transaction, prepared):
                raise RuntimeError("the tree changed while this memory held the store's writer lock")
            return prepared.result
        finally:
            transaction.rollback()

    def _commit_prepared(self, transaction: WriteTransaction, prepared: PreparedWrite[Any]) -> bool:
        """Catch up under the lock and commit ``prepared`` if it still holds; ``False``
        (and the plan abandoned) if another write changed what it depends on."""
        try:
            self._catch_up(transaction.read_changes)
            if prepared.recheck is not None:
                answer = prepared.recheck()
                if answer is not None:
                    prepared.result = answer
                    prepared.abandon()
                    return True
            if not still_valid(self._state, prepared) and not (prepared.rebase is not None and prepared.rebase()):
                prepared.abandon()
                return False
            info = prepared.info(self._state.info) if prepared.info is not None else None
            self._commit(transaction, prepared.upserts, prepared.deletions, info, prepared.versions)
        except BaseException:
            prepared.abandon()
            raise
        if prepared.committed is not None:
            prepared.committed()
        return True

    def _insert_steps(
        self,
        item: Item,
        embedding: Vector,
        restore: Node | None = None,
        *,
        defer: bool = False,
    ) -> _Steps[PreparedWrite[str]]:
        """Route and plan one leaf and write the summaries on its path (or, with
        ``defer``, mark them stale for :meth:`flush`). A ``restore`` leaf (from a
        backup) keeps its id and times."""
        dimension = int(embedding.shape[0])
        _check_dimension(dimension, self._state.info.dimension)
        deduplicate = self.config.deduplicate and restore is None
        with self._rw.read():
            base = (self._state.seq, self._state.generation)
            existing = self._stored_duplicate(item, refresh=False) if deduplicate else None
        if existing is not None:
            return PreparedWrite(existing, base)
        now = time.time()
        sample = self._calibration_sample(embedding)
        with self._rw.read():
            base = (self._state.seq, self._state.generation)
            path = route(self._state, self._scorer(embedding), self._theta0(), self.config)
            plan = plan_insert(
                self._state,
                path,
                text=item.text,
                embedding=embedding,
                metadata=item.metadata,
                timestamp=item.timestamp,
                source_id=item.source_id,
                now=now,
            )
            upserts = [] if self._state.root is not None else [root_node(now)]
            if restore is not None:  # a leaf coming back from a backup keeps who it is
                plan.leaf.id, plan.leaf.created_at, plan.leaf.updated_at = (
                    restore.id,
                    restore.created_at,
                    restore.updated_at,
                )
            footprint = _insert_footprint(self._state, plan)
            pending = self._pending.describe_insert(plan, self._state) if defer else []
            children = {node_id: self._state.children_of(node_id) for node_id in path.path}
        if defer:
            self._defer_summaries(plan.summaries.values(), plan.fallback_texts())
        else:
            yield from self._write_path_summaries(plan, children)

        def committed() -> None:
            self._pending.record(pending)
            self._counters.add("inserts")

        return PreparedWrite(
            plan.leaf.id,
            base,
            [*upserts, *plan.nodes()],
            [],
            footprint,
            info=lambda current: self._info_after_insert(current, dimension, sample),
            recheck=(lambda: self._stored_duplicate(item, refresh=False)) if deduplicate else None,
            committed=committed,
        )

    def _scorer(self, embedding: Vector) -> Callable[[Sequence[str]], Any]:
        index = self._index
        if index is None:
            return lambda ids: np.zeros(len(ids), dtype=np.float32)
        return lambda ids: index.score(embedding, ids)

    def _calibration_sample(self, embedding: Vector) -> float | None:
        """How similar a new text is to its nearest stored leaf, while θ0 is calibrating."""
        if not calibration.needs_sample(self.config, self._state.info.settings):
            return None
        with self._rw.read():
            if self._index is None:
                return None
            nearest = self._index.search(embedding, 1, self._index.mask(leaves_only=True))
        return nearest[0][1] if nearest else None

    def _info_after_insert(self, info: NamespaceInfo, dimension: int, sample: float | None) -> NamespaceInfo:
        """Namespace info after an insert (from the info current at commit): dimension,
        model name, calibration."""
        _check_dimension(dimension, info.dimension)
        settings = dict(info.settings)
        if sample is not None and calibration.needs_sample(self.config, settings):
            settings = calibration.with_sample(self.config, settings, sample)
        if info.embedder is not None and info.embedder != self.embedder.name:
            logger.warning(
                "namespace %r was built with %s but this memory uses %s",
                self.namespace,
                info.embedder,
                self.embedder.name,
            )
        return NamespaceInfo(dimension=dimension, embedder=info.embedder or self.embedder.name, settings=settings)

    def _write_path_summaries(
        self, plan: InsertPlan, children: Mapping[str, list[Node]]
    ) -> Generator[_Request, Any, None]:
        """Write the summaries on an insert's path in one concurrent round (see
        :func:`~memtree.planning.path_jobs`: a stale one is rebuilt, or merges the
        new text and stays stale when a rebuild would inherit a gap)."""
        jobs, kept_stale = path_jobs(plan, children)
        written = yield from self._write_texts(jobs, plan.summaries, fallback=plan.fallback_texts())
        for node in written:
            node.stale = node.id in kept_stale
        yield from self._embed_summaries(written, plan.summaries.values())

    def _write_summaries(
        self,
        jobs: list[AggregationJob],
        nodes: Mapping[str, Node],
        fallback: Mapping[str, str] | None = None,
    ) -> Generator[_Request, Any, None]:
        """Run aggregation jobs and give their nodes new texts and embeddings."""
        written = yield from self._write_texts(jobs, nodes, fallback)
        yield from self._embed_summaries(written, nodes.values())

    def _write_texts(
        self,
        jobs: list[AggregationJob],
        nodes: Mapping[str, Node],
        fallback: Mapping[str, str] | None = None,
    ) -> Generator[_Request, Any, list[Node]]:
        """Run aggregation jobs concurrently and give their nodes new texts; return
        the nodes written.

        A failed job leaves its node's old text (or ``fallback`` for a new node) and
        marks it stale; the node's embedding is then kept, or for a new node taken
        from its leaves' centroid. Nothing the caller gave is dropped.
        """
        if not jobs:
            return []
        outcomes = yield from self._aggregations(jobs)
        written: list[Node] = []
        for job, outcome in zip(jobs, outcomes, strict=True):
            node = nodes[job.node_id]
            if isinstance(outcome, BaseException):
                self._note_failure(node, outcome)
                if fallback is not None and job.node_id in fallback:
                    node.text = fallback[job.node_id]
            else:
                node.text = outcome
                node.stale = False
                written.append(node)
        return written

    def _aggregations(self, jobs: list[AggregationJob]) -> Generator[_Request, Any, list[str | BaseException]]:
        """Run jobs concurrently; each answer is a non-empty summary or the error."""
        outcomes = yield _Aggregate(jobs)
        return [self._checked_summary(outcome) for outcome in outcomes]

    def _checked_summary(self, outcome: object) -> str | BaseException:
        if isinstance(outcome, BaseException):
            return outcome
        if not isinstance(outcome, str):
            return TypeError(
                f"{type(self.aggregator).__name__}.aggregate returned {type(outcome).__name__}, "
                "not the summary text (str)"
            )
        problem = unstorable(outcome)
        if problem:  # every store must refuse it alike, or an export could not be imported back
            return ModelResponseError(f"the aggregator's summary {problem}, which cannot be stored")
        return outcome.strip() or ModelResponseError("the aggregator returned an empty summary")

    def _note_failure(self, node: Node, error: BaseException) -> None:
        logger.warning("aggregation failed for node %s; marked stale: %r", node.id, error)
        self._counters.add("aggregation_failures")
        node.stale = True

    def _embed_summaries(self, written: list[Node], nodes: Iterable[Node]) -> Generator[_Request, Any, None]:
        """Embed rewritten summaries (``parent_embedding="text"``) in batches; give
        the others their leaves' centroid where they need one."""
        if self.config.parent_embedding == "text" and written:
            try:
                vectors = yield from self._embed_steps([node.text for node in written])
            except Exception as error:  # noqa: BLE001 - a summary embedding must not lose the leaf
                logger.warning("embedding summaries failed; marked stale: %s", error)
                for node in written:
                    node.stale = True
            else:
                for node, vector in zip(written, vectors, strict=True):
                    node.embedding = vector
        self._centroid_embeddings(nodes)

    def _centroid_embeddings(self, nodes: Iterable[Node]) -> None:
        for node in nodes:
            if self.config.parent_embedding == "mean" or node.embedding is None:
                centroid = centroid_of(node)
                if centroid is not None:
                    node.embedding = normalized(centroid)

    def _defer_summaries(self, nodes: Iterable[Node], fallback: Mapping[str, str]) -> None:
        """Mark an insert's summaries stale for a later :meth:`flush`; texts stay as
        they were (a new parent says both its texts verbatim) and a summary without
        an embedding routes by its leaves' centroid meanwhile."""
        nodes = list(nodes)
        for node in nodes:
            node.stale = True
            if node.id in fallback:
                node.text = fallback[node.id]
        self._centroid_embeddings(nodes)

    def _flush_steps(self) -> _Steps[PreparedWrite[int]]:
        """Rewrite the deferred summaries: merges all at once, then rebuilds deepest first."""
        with self._rw.read():
            base = (self._state.seq, self._state.generation)
            plan = self._pending.take(self._state)
            nodes = {node_id: self._state.nodes[node_id].copy() for node_id in [*plan.merges, *plan.rebuilds]}
            footprint = footprint_of(self._state, nodes)
            children = {node_id: self._state.children_of(node_id) for node_id in plan.rebuilds}
            written_from = flush_base(self._state, nodes, (kid for kids in children.values() for kid in kids))
        if not nodes:
            return PreparedWrite(0, base)
        try:
            written = yield from self._merge_then_rebuild(plan, nodes, children)
            yield from self._embed_summaries(written, nodes.values())
        except BaseException:
            self._pending.restore(plan)  # nothing was written: the next flush tries them all again
            raise

        grown_bases: dict[str, tuple[str, int]] = {}

        def committed() -> None:
            with self._rw.read():
                self._pending.put_back((node_id for node_id, node in nodes.items() if node.stale), self._state)
            self._pending.rebase(grown_bases)
            self._counters.add("flushes")

        prepared = PreparedWrite(
            sum(1 for node in nodes.values() if not node.stale),
            base,
            list(nodes.values()),
            [],
            footprint,
            committed=committed,
            abandoned=lambda: self._pending.restore(plan),
        )

        def rebase() -> bool:  # under the lock, caught up: inserts came in while the models ran
            if self._state.generation != base[1]:
                return False
            rebased = rebase_flush(self._state, nodes.values(), written_from, self._pending.arrivals())
            if rebased is None:
                return False
            prepared.upserts, bases = rebased
            grown_bases.update(bases)
            self._counters.add("flush_rebases")
            return True

        prepared.rebase = rebase
        return prepared

    def _merge_then_rebuild(
        self, plan: FlushPlan, nodes: dict[str, Node], children: Mapping[str, list[Node]]
    ) -> Generator[_Request, Any, list[Node]]:
        """Give ``nodes`` their new texts; return those written. A rebuild reads its
        children's texts after the deeper levels were rewritten, and waits for the
        next flush (stays stale) if one of them could not be written."""
        written: list[Node] = []
        levels = sorted({nodes[node_id].depth for node_id in plan.rebuilds}, reverse=True)
        for step in range(1 + len(levels)):
            tasks: dict[str, tuple[str, int, list[str]]] = plan.merges if step == 0 else {}
            for node_id in plan.rebuilds if step > 0 else ():
                node = nodes[node_id]
                if node.depth != levels[step - 1]:
                    continue
                kids = [nodes.get(child.id, child) for child in children[node_id]]
                if any(child.stale for child in kids):
                    node.stale = True
                else:
                    tasks[node_id] = ("", 0, [child.text for child in kids])
            done = yield from self._fold(tasks, nodes)
            for node_id, text in done.items():
                nodes[node_id].text = text
                nodes[node_id].stale = False
                written.append(nodes[node_id])
        return written

    def _fold(
        self, tasks: Mapping[str, tuple[str, int, list[str]]], nodes: Mapping[str, Node]
    ) -> Generator[_Request, Any, dict[str, str]]:
        """Merge each task's texts into its summary, in one call per node when they fit
        ``config.aggregation_max_words`` and otherwise chunk after chunk; all nodes
        run concurrently. Returns the new text of every node that succeeded."""
        chunks = {node_id: self._chunks(texts) for node_id, (_, _, texts) in tasks.items()}
        progress = {node_id: (summary, count) for node_id, (summary, count, _) in tasks.items()}
        done: dict[str, str] = {}
        step = 0
        while progress:
            jobs = [
                AggregationJob(node_id, summary, chunks[node_id][step], count, centroid_of(nodes[node_id]))
                for node_id, (summary, count) in progress.items()
            ]
            outcomes = yield from self._aggregations(jobs)
            step += 1
            for job, outcome in zip(jobs, outcomes, strict=True):
                if isinstance(outcome, BaseException):
                    self._note_failure(nodes[job.node_id], outcome)
                    del progress[job.node_id]
                elif step == len(chunks[job.node_id]):
                    done[job.node_id] = outcome
                    del progress[job.node_id]
                else:
                    progress[job.node_id] = (outcome, job.count + len(job.new_texts))
        return done

    def _chunks(self, texts: list[str]) -> list[list[str]]:
        """Texts for successive calls: all at once unless a model call would exceed
        ``config.aggregation_max_words`` (offline aggregators take any amount)."""
        if not self.aggregator.calls_model:
            return [texts]
        limit = self.config.aggregation_max_words
        chunks: list[list[str]] = [[]]
        words = 0
        for text in texts:
            size = count_words(text)
            if chunks[-1] and words + size > limit:
                chunks.append([])
                words = 0
            chunks[-1].append(text)
            words += size
        return chunks

    def _check_leaf_id(self, node_id: object) -> None:
        if not isinstance(node_id, str):
            raise TypeError(f"node id must be a str, got {type(node_id).__name__}")

    def _check_leaf_ids(self, node_ids: Iterable[str]) -> list[str]:
        if isinstance(node_ids, str):
            raise TypeError("node_ids must be a list of ids (for one id use delete)")
        ids = list(dict.fromkeys(node_ids))
        for node_id in ids:
            self._check_leaf_id(node_id)
        return ids

    def _delete_steps(self, node_ids: list[str]) -> _Steps[PreparedWrite[None]]:
        with self._rw.read():
            for node_id in node_ids:
                node = self._state.nodes.get(node_id)
                if node is None:
                    raise KeyError(f"no node with id {node_id!r} in namespace {self.namespace!r}")
                if not node.is_leaf:
                    raise ValueError(f"node {node_id!r} is a summary, not a leaf; delete the leaves below it instead")
            base = (self._state.seq, self._state.generation)
            plan = plan_delete_many(self._state, node_ids, time.time())
            above = {ancestor.id for node_id in node_ids for ancestor in self._state.path_to_root(node_id)}
            parents = {self._state.nodes[node_id].parent or ROOT_ID for node_id in node_ids}
            footprint = footprint_of(self._state, above | parents, extra_reads=plan.moved)
        yield from self._rewrite_ancestors(plan)

        def committed() -> None:
            self._pending.mark_rebuild(node.id for node in plan.ancestors)
            self._counters.add("deletes", len(node_ids))

        return PreparedWrite(None, base, plan.nodes(), plan.deleted, footprint, committed=committed)

    def _rewrite_ancestors(self, plan: DeletePlan) -> Generator[_Request, Any, None]:
        """Rewrite the plan's ancestors level by level, deepest first: each needs its
        children's new texts, and the summaries of one level run concurrently. Every
        one is rebuilt (none may keep a deleted text); one that reads a stale child
        stays stale."""
        rewritten: dict[str, Node] = {}
        for depth in sorted({node.depth for node in plan.ancestors}, reverse=True):
            level = {node.id: node for node in plan.ancestors if node.depth == depth}
            jobs = []
            reads_stale: set[str] = set()
            for node in level.values():
                kids = plan.child_nodes(node.id, rewritten)
                node.timestamp = None
                for kid in kids:
                    node.timestamp = latest(node.timestamp, kid.timestamp)
                if any(kid.stale for kid in kids):
                    reads_stale.add(node.id)
                jobs.append(rebuild_job(node, [kid.text for kid in kids]))
            yield from self._write_summaries(jobs, level)
            for node_id in reads_stale:
                level[node_id].stale = True
            rewritten.update(level)

    def _repair_steps(self) -> _Steps[PreparedWrite[int]]:
        """Rebuild every stale summary from its children, deepest first; one whose
        child could not be rebuilt waits for the next repair."""
        with self._rw.read():
            base = (self._state.seq, self._state.generation)
            stale = [node.copy() for node in self._state.nodes.values() if node.stale]
            children = {node.id: self._state.children_of(node.id) for node in stale}
            footprint = footprint_of(self._state, children)
        if not stale:
            return PreparedWrite(0, base)
        fixed: dict[str, Node] = {}
        for depth in sorted({node.depth for node in stale}, reverse=True):
            level = {node.id: node for node in stale if node.depth == depth}
            jobs = []
            for node in level.values():
                kids = [fixed.get(child.id, child) for child in children[node.id]]
                if not any(kid.stale for kid in kids):
                    jobs.append(rebuild_job(node, [kid.text for kid in kids]))
            yield from self._write_summaries(jobs, {job.node_id: level[job.node_id] for job in jobs})
            fixed.update(level)
        changed = [node for node in fixed.values() if not node.stale]
        return PreparedWrite(len(changed), base, changed, [], footprint)

    # -- drivers -------------------------------------------------------------------------

    def _drive(self, steps: _Steps[T]) -> T:
        """Run a write procedure, answering its requests with threads."""
        answer: Any = None
        try:
            while True:
                request = steps.send(answer)
                answer = self._answer_sync(request)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]

    async def _adrive(self, steps: _Steps[T]) -> T:
        """Run a write procedure, answering its requests on the event loop.

        Reads and the final commit are short blocking store calls made from the
        loop's thread; model calls are awaited.
        """
        answer: Any = None
        try:
            while True:
                request = steps.send(answer)
                answer = await self._answer_async(request)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]

    def _answer_sync(self, request: _Request) -> Any:
        if isinstance(request, _Embed):
            self._count_embedding(request.texts)
            try:
                with recording(self._counters):
                    if request.query:
                        return _query_row(self.embedder.embed_query(request.texts[0]))
                    return self.embedder.embed(request.texts)
            except Exception as error:  # noqa: BLE001 - handed back to the procedure
                return error
        self._count_aggregations(request.jobs)
        if len(request.jobs) == 1 and not self.aggregator.calls_model:
            return [self._aggregate_one(request.jobs[0])]  # CPU-bound: no thread hop
        if self._background.is_worker_thread():  # threads that never hold up interpreter exit
            return map_in_daemon_threads(self._aggregate_one, request.jobs, self.config.max_concurrency)
        return list(self._thread_pool().map(self._aggregate_one, request.jobs))

    async def _answer_async(self, request: _Request) -> Any:
        if isinstance(request, _Embed):
            self._count_embedding(request.texts)
            try:
                with recording(self._counters):
                    if request.query:
                        return _query_row(await self.embedder.aembed_query(request.texts[0]))
                    return await self.embedder.aembed(request.texts)
            except Exception as error:  # noqa: BLE001
                return error
        self._count_aggregations(request.jobs)
        limit = asyncio.Semaphore(self.config.max_concurrency)

        async def one(job: AggregationJob) -> str | BaseException:
            async with limit:
                try:
                    with recording(self._counters):
                        return await self.aggregator.aaggregate(
                            job.summary, job.new_texts, job.count, centroid=job.centroid
                        )
                except Exception as error:  # noqa: BLE001
                    return error

        return list(await asyncio.gather(*(one(job) for job in request.jobs)))

    def _aggregate_one(self, job: AggregationJob) -> str | BaseException:
        try:
            with recording(self._counters):  # this runs in a worker thread: open the scope here
                return self.aggregator.aggregate(job.summary, job.new_texts, job.count, centroid=job.centroid)
        except Exception as error:  # noqa: BLE001 - the procedure marks the node stale
            return error

    def _thread_pool(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    max_workers=self.config.max_concurrency, thread_name_prefix="memtree-aggregate"
                )
            return self._pool

    def _count_embedding(self, texts: list[str]) -> None:
        self._counters.add("embedding_calls")
        self._counters.add("embedded_texts", len(texts))

    def _count_aggregations(self, jobs: list[AggregationJob]) -> None:
        self._counters.add("aggregation_calls", len(jobs))
        if self.aggregator.calls_model:
            self._counters.add("llm_calls", len(jobs))


_LOCK_WAITERS = ThreadPoolExecutor(max_workers=32, thread_name_prefix="memtree-lock-wait")
"""Threads that wait for stores' writer locks on behalf of coroutines. Not the event
loop's default executor: writers queued there could take every thread that the
lock's holder needs for its own model calls (``asyncio.to_thread``), and wait forever."""


async def _begin_in_thread(store: Store, namespace: NamespaceKey) -> WriteTransaction:
    """``store.begin`` in a lock-waiting thread. If the waiting coroutine is cancelled,
    the transaction the thread opens anyway is rolled back, so its lock is never left
    held (a held SQLite or PostgreSQL write lock would block every other writer)."""
    guard = threading.Lock()
    outcome: dict[str, Any] = {"abandoned": False, "transaction": None}

    def begin() -> WriteTransaction:
        transaction = store.begin(namespace)
        with guard:
            if outcome["abandoned"]:
                transaction.rollback()
            else:
                outcome["transaction"] = transaction
        return transaction

    try:
        return await asyncio.get_running_loop().run_in_executor(_LOCK_WAITERS, begin)
    except asyncio.CancelledError:
        with guard:
            outcome["abandoned"] = True
            opened = outcome["transaction"]
        if opened is not None:
            opened.rollback()
        raise


def _resolve_models(embedder: Any, aggregator: Any, llm: Any) -> tuple[Embedder, Aggregator]:
    """The memory's embedder and summary writer from what the caller passed (see
    :class:`MemTree`); raises before any work for a bad model or a missing key."""
    if aggregator is not None and llm is not None:
        raise ValueError("pass either aggregator or llm, not both")
    if aggregator is not None and not isinstance(aggregator, Aggregator):
        raise TypeError(
            f"aggregator must be a memtree Aggregator, got {type(aggregator).__name__} "
            "(pass chat models and prompt -> text callables as llm=)"
        )
    resolved: Embedder = resolve_embedder(embedder) if embedder is not None else default_embedder()
    if aggregator is not None:
        chosen: Aggregator = aggregator
    else:
        chosen = LLMAggregator(llm) if llm is not None else default_aggregator()
    return resolved, chosen.bound_to(resolved)


def _query_row(vector: Any) -> Any:
    """A query embedding as a one-row matrix; anything else is left for the vector
    check to reject with a clear message."""
    try:
        array = np.asarray(vector)
    except Exception:  # noqa: BLE001 - reported by check_embeddings
        return vector
    return array[None, :] if array.ndim == 1 else array


def _insert_footprint(state: TreeState, plan: InsertPlan) -> Footprint:
    """What an insert's plan depends on: the summaries it rewrites (their texts,
    counts and places), the leaf it splits, the children a stale summary is rebuilt
    from, and the root if it creates it. Siblings it only compared on the way down
    are not included: had one changed meanwhile, the text would still land in a
    sound place, and every concurrent insert rewrites the top of its own path, so
    counting those would make every pair of inserts conflict."""
    reads = set(plan.route.path)
    reads.update(node_id for node_id in (plan.route.parent, plan.route.split) if node_id is not None)
    for node_id in plan.route.path:
        if state.nodes[node_id].stale:
            reads.update(state.nodes[node_id].children)
    return Footprint(frozenset(reads))  # the parent may be the root: only its creation writes it


def _check_dimension(dimension: int, stored: int | None) -> None:
    if stored is not None and dimension != stored:
        raise ValueError(
            f"embedding dimension {dimension} does not match this memory's {stored}; "
            "use the embedder this memory was built with"
        )


def _unstored_texts(items: list[Item], stored: list[bool]) -> list[str]:
    return [item.text for item, known in zip(items, stored, strict=True) if not known]


def _fill_in(stored: list[bool], vectors: Matrix) -> list[Vector | None]:
    """Each item's vector in order, ``None`` for the stored duplicates not embedded."""
    rows = iter(vectors)
    return [None if known else next(rows) for known in stored]


def _make_items(
    texts: Sequence[str],
    metadata: Sequence[Mapping[str, Any] | None] | None,
    timestamps: Sequence[TimeLike | None] | None,
    source_ids: Sequence[str | None] | None,
) -> list[Item]:
    if isinstance(texts, str) or not isinstance(texts, Sequence):
        raise TypeError("texts must be a list of str (for one text use add)")
    count = len(texts)
    for name, values in (("metadata", metadata), ("timestamps", timestamps), ("source_ids", source_ids)):
        if values is not None and len(values) != count:
            raise ValueError(f"{name} has {len(values)} entries for {count} texts")
    return [
        make_item(
            text,
            metadata[i] if metadata is not None else None,
            timestamps[i] if timestamps is not None else None,
            source_ids[i] if source_ids is not None else None,
        )
        for i, text in enumerate(texts)
    ]


class DeferredAggregation:
    """The block returned by :meth:`MemTree.deferred`: a sync and async context manager.

    Entering returns the memory. Leaving the outermost block flushes, also when the
    block raised an ``Exception`` (the leaves are stored, so their summaries should
    catch up; a flush error is then logged, not raised over the original one). On
    ``KeyboardInterrupt`` or cancellation nothing is flushed: call ``flush()``.
    """

    def __init__(self, memory: MemTree) -> None:
        self.memory = memory

    def __enter__(self) -> MemTree:
        self.memory._enter_deferred()
        return self.memory

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if self.memory._leave_deferred() and _should_flush(exc_type):
            if exc_type is None:
                self.memory.flush()
                return
            try:
                self.memory.flush()
            except Exception:  # the block's own error is the one to raise
                logger.exception("flushing deferred summaries after an error failed; they stay stale")

    async def __aenter__(self) -> MemTree:
        return self.__enter__()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if self.memory._leave_deferred() and _should_flush(exc_type):
            if exc_type is None:
                await self.memory.aflush()
                return
            try:
                await self.memory.aflush()
            except Exception:  # the block's own error is the one to raise
                logger.exception("flushing deferred summaries after an error failed; they stay stale")


def _should_flush(exc_type: type[BaseException] | None) -> bool:
    return exc_type is None or issubclass(exc_type, Exception)
