"""``MemTree``: the public entry point of the engine, a facade. Each operation
delegates in one step: writes to :class:`~memtree.writer.Writer` (a text enters once
and leaves committed), reads and catching up with other writers to
:class:`~memtree.replica.Replica`, queries to :mod:`memtree.retrieval`, pictures to
:mod:`memtree.viz`, backups to :mod:`memtree.backup`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, TextIO

from memtree import backup, source_leaves, viz
from memtree import update as updating
from memtree.aggregate import Aggregator
from memtree.background import CLOSE_SECONDS, remaining
from memtree.config import AGGREGATION_MODES, Aggregation, MemTreeConfig
from memtree.embed import Embedder, check_query_embedding
from memtree.index import VectorIndex
from memtree.inputs import TimeLike, TTLLike, expiry_of, make_item
from memtree.integrity import integrity_problems
from memtree.intent import routed_overview
from memtree.model_calls import ModelCalls
from memtree.model_choice import choose_models
from memtree.node import LeafVersion, Node, RetrievedNode, Vector
from memtree.overview import answer_overview, check_overview
from memtree.replica import Replica
from memtree.retrieval import answer, check_query, relevance_floor
from memtree.siblings import Siblings
from memtree.state import TreeState
from memtree.stats import Counters, TreeStats
from memtree.store.base import CompactionReport, Namespace, NamespaceKey, RecordChanges, Store, namespace_key
from memtree.store.location import as_store, open_store
from memtree.text import require_text
from memtree.viz.picture import Direction
from memtree.writer import DeferredAggregation, Writer, check_leaf_id, check_leaf_ids

__all__ = ["AGGREGATION_MODES", "SIBLING_CACHE_SIZE", "Aggregation", "DeferredAggregation", "MemTree"]

SIBLING_CACHE_SIZE = 256
"""Namespace handles :meth:`MemTree.sibling` keeps open per memory."""

STALE_NAMED = 20
"""Stale summaries :meth:`MemTree.close`'s warning names one by one (then a count)."""

logger = logging.getLogger(__name__)


class MemTree:
    """A long-term memory that grows as a tree of texts and their summaries.

    New texts are routed down from the root by similarity and hang as leaves; every
    summary on the way is re-aggregated, so shallow nodes hold broad themes and deep
    nodes hold details. Retrieval scores every node at once ("collapsed") or
    descends by beam ("traversal").

    ``embedder`` and ``llm`` take memtree, LangChain or LlamaIndex models, a ``prompt
    -> text`` callable (``llm``) or ``"openai"`` / ``"local"``; left out, OpenAI when
    ``OPENAI_API_KEY`` is set, else offline (:mod:`memtree.model_choice`). ``store``:
    in memory by default; a SQLite path or ``postgresql://`` DSN opens a store the
    memory owns and closes (like :meth:`open`); a :class:`~memtree.store.Store` you
    pass stays yours.

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
        embedder, aggregator = choose_models(embedder, aggregator, llm)
        self.namespace: NamespaceKey = namespace_key(namespace)
        self.store, owns_store = as_store(store)
        self._owns_store, self._closed, self._counters = owns_store, False, Counters()
        self._siblings: Siblings[MemTree] = Siblings(self.with_namespace, SIBLING_CACHE_SIZE)
        lexical = self.config.lexical_weight > 0
        try:
            self._replica = Replica(self.store, self.namespace, lexical=lexical, refresh_interval=refresh_interval)
            self._calls = ModelCalls(embedder, aggregator, self._counters, self.config.max_concurrency)
            self._writer = Writer(self._replica, self._calls, self.config)
            self._state, self._background = self._replica.state, self._writer.background  # (read-only aliases)
            self.refresh(force=True)
        except BaseException:
            if owns_store:
                self.store.close()
            raise

    @classmethod
    def open(cls, location: str | os.PathLike[str], *, namespace: Namespace = "default", **kwargs: Any) -> MemTree:
        """Open a durable memory: a SQLite file (created if missing) or a PostgreSQL
        database (``postgresql://`` DSN), which :meth:`close` closes (siblings must be
        done by then). Other keywords go to :class:`MemTree`. Example::

            with MemTree.open("memory.db", namespace=("users", "alice")) as memory:
                memory.add("Alice's sister is called Rosa.")
        """
        if "store" in kwargs:
            raise TypeError("MemTree.open makes the store from location; to pass a store, use MemTree(store=...)")
        # Models first: a bad model or a missing API key must fail before a file is made.
        kwargs["embedder"], kwargs["aggregator"] = choose_models(
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

    def with_namespace(self, namespace: Namespace, *, config: MemTreeConfig | None = None) -> MemTree:
        """Another namespace of the same store, with these models and config (or
        ``config``): a new handle each call (loading its tree); :meth:`sibling` reuses."""
        return MemTree(
            embedder=self.embedder,
            aggregator=self.aggregator,
            store=self.store,
            namespace=namespace,
            config=config or self.config,
            refresh_interval=self.refresh_interval,
        )

    def sibling(self, namespace: Namespace) -> MemTree:
        """:meth:`with_namespace`, each namespace opened once and reused (the
        ``SIBLING_CACHE_SIZE`` most recently used kept): for servers and adapters with
        a namespace per user or chat. ``sibling(memory.namespace)`` is the memory."""
        key = namespace_key(namespace)
        return self if key == self.namespace else self._siblings.get(key)

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

    def close(self, *, timeout: float | None = CLOSE_SECONDS) -> None:
        """Write pending summaries (here and in :meth:`sibling` namespaces), stop worker
        threads, close the store if :meth:`open` opened it.

        Waits at most ``timeout`` seconds in all for the summaries (10 by default, as
        interpreter exit does; ``None``: as long as the model takes), so a model or
        embedder that hangs cannot hold the caller. Summaries not written by then, or
        whose model call failed, stay stale in the store (every leaf is already
        committed): one warning names them, and :meth:`repair` writes them later.
        """
        if timeout is not None and not timeout >= 0:
            raise ValueError(f"timeout must be >= 0 seconds or None, got {timeout}")
        left = self._stop_writing(None if timeout is None else time.monotonic() + timeout)
        if left:
            shown = ", ".join(left[:STALE_NAMED])
            more = f" and {len(left) - STALE_NAMED} more" if len(left) > STALE_NAMED else ""
            logger.warning(
                "close() left %d summaries stale (the model did not write them within %s): %s%s; "
                "they stay searchable with their old text: call repair() later",
                len(left),
                "the time allowed" if timeout is None else f"{timeout:g} s",
                shown,
                more,
            )
        if self._owns_store:
            self._owns_store = False
            self.store.close()

    def _stop_writing(self, deadline: float | None) -> list[str]:
        """Stop writing here and in the siblings, sharing one deadline; return the
        stale summaries left behind, as ``namespace:id``."""
        if self._closed:
            self._calls.close(wait=False)  # a call still hanging from the first close is not waited for
            return []
        self._closed = True
        left: list[str] = []
        for sibling in self._siblings.handles():
            left += sibling._stop_writing(deadline)
        name = "/".join(self.namespace)
        stale = self._writer.stop(remaining(deadline))
        left += [f"{name}:{node_id}" for node_id in stale]
        self._calls.close(wait=not stale)  # a thread still in a hanging model call is not waited for
        return left

    def __enter__(self) -> MemTree:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def add(
        self,
        text: str,
        *,
        metadata: Mapping[str, Any] | None = None,
        timestamp: TimeLike | None = None,
        source_id: str | None = None,
        aggregation: Aggregation | None = None,
        ttl: TTLLike | None = None,
        expires_at: TimeLike | None = None,
    ) -> str:
        """Remember one text; return its leaf id (with ``config.deduplicate``, that of a
        stored leaf with the same text, metadata and source id). ``timestamp``: when the
        event happened; ``source_id``: your id for it. ``aggregation``: when the summaries
        above it are written (default ``config.aggregation``; in a :meth:`deferred`
        block, at its end); ``"deferred"``/``"background"`` only embed it here.
        ``ttl`` (seconds or a ``timedelta``) or ``expires_at`` (a moment): when the
        memory expires; neither: ``config.default_ttl`` (``None``: never). An expired
        leaf is never returned by any read; a sweep deletes it (:meth:`sweep_expired`)."""
        expiry = expiry_of(ttl, expires_at, self.config.default_ttl)
        return self._writer.add(make_item(text, metadata, timestamp, source_id, expiry), aggregation)

    async def aadd(
        self,
        text: str,
        *,
        metadata: Mapping[str, Any] | None = None,
        timestamp: TimeLike | None = None,
        source_id: str | None = None,
        aggregation: Aggregation | None = None,
        ttl: TTLLike | None = None,
        expires_at: TimeLike | None = None,
    ) -> str:
        """Async :meth:`add`: aggregations run on the event loop (``aaggregate``);
        in background mode the worker thread writes them."""
        expiry = expiry_of(ttl, expires_at, self.config.default_ttl)
        return await self._writer.aadd(make_item(text, metadata, timestamp, source_id, expiry), aggregation)

    def add_many(
        self,
        texts: Sequence[str],
        *,
        metadata: Sequence[Mapping[str, Any] | None] | None = None,
        timestamps: Sequence[TimeLike | None] | None = None,
        source_ids: Sequence[str | None] | None = None,
        aggregation: Aggregation | None = None,
        bulk: bool = False,
        ttl: TTLLike | None = None,
        expires_at: TimeLike | None = None,
    ) -> list[str]:
        """Remember several texts in order, embedded in batches; one bad item stores
        nothing. ``"eager"`` rewrites each item's path as it goes (the paper);
        ``"deferred"`` commits every leaf, then rewrites each touched summary once;
        ``"background"`` commits the leaves and the worker writes the summaries. Left
        out: ``config.aggregation`` (``"deferred"`` there waits for :meth:`flush`).
        ``ttl`` / ``expires_at``: when all of them expire, as in :meth:`add`.

        ``bulk=True`` (documents, not chat turns) groups the batch by clustering
        instead of routing each text: new subtrees under the root, at most 8
        children per summary, every summary written and embedded once, all committed
        in one transaction (:mod:`memtree.bulk`); ``aggregation`` then does not
        matter. Later inserts route into these subtrees as usual."""
        expiry = expiry_of(ttl, expires_at, self.config.default_ttl)
        given = (texts, metadata, timestamps, source_ids, expiry)
        return self._writer.add_many(given, aggregation, self.deferred(), bulk=bulk)

    async def aadd_many(
        self,
        texts: Sequence[str],
        *,
        metadata: Sequence[Mapping[str, Any] | None] | None = None,
        timestamps: Sequence[TimeLike | None] | None = None,
        source_ids: Sequence[str | None] | None = None,
        aggregation: Aggregation | None = None,
        bulk: bool = False,
        ttl: TTLLike | None = None,
        expires_at: TimeLike | None = None,
    ) -> list[str]:
        """Async :meth:`add_many`."""
        expiry = expiry_of(ttl, expires_at, self.config.default_ttl)
        given = (texts, metadata, timestamps, source_ids, expiry)
        return await self._writer.aadd_many(given, aggregation, self.deferred(), bulk=bulk)

    def deferred(self) -> DeferredAggregation[MemTree]:
        """A block (``with`` or ``async with``) whose inserts store each leaf at once and
        leave the summaries it passes stale until the outermost block ends and
        :meth:`flush` rewrites each once with all its new texts. A crash inside loses
        no leaf: :meth:`repair` rewrites the stale summaries (docs/models-and-ingestion.md)."""
        return DeferredAggregation(self._writer, self)

    def flush(self) -> int:
        """Write every deferred summary, each in one model call (more past
        ``config.aggregation_max_words``); return how many. Failed ones stay stale."""
        return self._writer.flush()

    async def aflush(self) -> int:
        """Async :meth:`flush`."""
        return await self._writer.aflush()

    def wait_for_summaries(self, timeout: float | None = None) -> bool:
        """Block until the background worker has written the summaries of every insert
        so far; ``False`` if ``timeout`` seconds passed first (failed ones stay stale)."""
        return self._writer.background.wait(timeout)

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
        min_similarity: float | None = None,
        same_subject: float | None = None,
        summary_hits: str | None = None,
        now: TimeLike | None = None,
        parse_times: bool | None = None,
        route_overviews: bool | None = None,
        context_feedback: float | None = None,
    ) -> list[RetrievedNode]:
        """The nodes most relevant to ``query``, best first. ``mode``: ``"collapsed"``
        (every node scored) or ``"traversal"`` (beam descent). ``token_budget`` caps
        the results' ``context`` tokens. ``where`` filters leaves by metadata
        (``{"speaker": "Leo"}``, ``{"age": {"$gte": 30}}``, ``$and``/``$or``/``$not``:
        :mod:`memtree.where`); ``time_range=(start, end)`` by event time.
        ``query_embedding``: the query's vector from this embedder, if you have it.
        ``lexical_weight`` overrides the config's BM25 share (``0``: cosine alone).
        ``min_similarity`` is the relevance gate: results whose cosine similarity to
        the query is below it are left out, so an unrelated query gets nothing
        (:data:`memtree.retrieval.RELEVANCE_FLOOR` is the calibrated value;
        ``min_score`` instead cuts on the hybrid ``score``, which is relative to the
        best word match and so no measure of relevance by itself).
        ``same_subject`` (a cosine; ``memtree.recency.SIBLINGS``: siblings only)
        puts a newer memory about the same subject just above an older one
        (:func:`memtree.recency.newer_first`); ``None``: the config's, off by default.
        ``summary_hits``: what a summary that ranks delivers, ``"leaves"`` (its best
        leaves, marked ``found_by``; the config's default) or ``"text"`` (its own text).
        A time expression in ``query`` ("in May 2023", "last week", counted back from
        ``now``, default the current time) ranks the memories of that range higher
        unless ``time_range`` is given (``parse_times``, default ``config.parse_times``).
        An overview request ("what do you know about...", "recap...") is answered by
        :meth:`overview` (``route_overviews``, default ``config.route_overviews``; its
        parts say ``answered_by="overview"``). ``context_feedback``: how far the best
        first match's tree context moves the query (:mod:`memtree.feedback`; default
        ``config.context_feedback``, ``0``: not at all)."""
        options = (k, token_budget, mode, leaves_only, where, time_range, min_score, lexical_weight)
        checked = check_query(
            self.config,
            self._state,
            query,
            *options,
            min_similarity=min_similarity,
            same_subject=same_subject,
            summary_hits=summary_hits,
            now=now,
            parse_times=parse_times,
            context_feedback=context_feedback,
        )
        routed = routed_overview(self.config, query, now, route_overviews, time_range, token_budget, k, where)
        if routed is not None:
            return self.overview(**routed)
        self._replica.maybe_refresh()
        vector = self._writer.embed_query(query) if query_embedding is None else self._given(query_embedding)
        return answer(self._replica, checked, vector, self.config.beam)

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
        min_similarity: float | None = None,
        same_subject: float | None = None,
        summary_hits: str | None = None,
        now: TimeLike | None = None,
        parse_times: bool | None = None,
        route_overviews: bool | None = None,
        context_feedback: float | None = None,
    ) -> list[RetrievedNode]:
        """Async :meth:`retrieve`."""
        options = (k, token_budget, mode, leaves_only, where, time_range, min_score, lexical_weight)
        checked = check_query(
            self.config,
            self._state,
            query,
            *options,
            min_similarity=min_similarity,
            same_subject=same_subject,
            summary_hits=summary_hits,
            now=now,
            parse_times=parse_times,
            context_feedback=context_feedback,
        )
        routed = routed_overview(self.config, query, now, route_overviews, time_range, token_budget, k, where)
        if routed is not None:
            return await self.aoverview(**routed)
        await asyncio.to_thread(self._replica.maybe_refresh)
        vector = await self._writer.aembed_query(query) if query_embedding is None else self._given(query_embedding)
        return answer(self._replica, checked, vector, self.config.beam)

    def overview(
        self,
        about: str | None = None,
        *,
        since: TimeLike | None = None,
        until: TimeLike | None = None,
        token_budget: int | None = None,
        k: int | None = None,
        where: Mapping[str, Any] | None = None,
    ) -> list[RetrievedNode]:
        """What the memory holds about ``about`` (a person, a topic; ``None``:
        everything) between ``since`` and ``until``, breadth first: the most
        informative memories of each day (or subtree), a model's summary in place of
        the leaves it restates, in time order, each part dated, within
        ``token_budget`` tokens (default ``config.token_budget``, else 1,000) and at
        most ``k`` parts (:mod:`memtree.overview`). ``retrieve`` answers overview
        requests ("what do you know about...") with it."""
        checked = check_overview(self.config, about, since, until, token_budget, k, where, self.relevance_floor)
        self._replica.maybe_refresh()
        vector = self._writer.embed_query(checked.topic) if checked.topic else None
        return answer_overview(self._replica, checked, vector)

    async def aoverview(
        self,
        about: str | None = None,
        *,
        since: TimeLike | None = None,
        until: TimeLike | None = None,
        token_budget: int | None = None,
        k: int | None = None,
        where: Mapping[str, Any] | None = None,
    ) -> list[RetrievedNode]:
        """Async :meth:`overview`."""
        checked = check_overview(self.config, about, since, until, token_budget, k, where, self.relevance_floor)
        await asyncio.to_thread(self._replica.maybe_refresh)
        vector = await self._writer.aembed_query(checked.topic) if checked.topic else None
        return answer_overview(self._replica, checked, vector)

    @property
    def relevance_floor(self) -> float | None:
        """The relevance gate calibrated for this memory's embedder: pass it as
        ``retrieve(min_similarity=memory.relevance_floor)`` to get no results for a
        query nothing stored is about (``None``: no floor measured for this model;
        see :func:`memtree.retrieval.relevance_floor`)."""
        return relevance_floor(self.embedder.name)

    def embed_query(self, query: str) -> Vector:
        """The vector :meth:`retrieve` would compute for ``query`` (checked, unit
        length); pass it back as ``query_embedding`` to search many namespaces
        that share this memory's embedder with a single embedding call."""
        require_text(query, "query")
        return self._writer.embed_query(query)

    async def aembed_query(self, query: str) -> Vector:
        """Async :meth:`embed_query`."""
        require_text(query, "query")
        return await self._writer.aembed_query(query)

    def delete(self, node_id: str) -> None:
        """Forget a leaf: its ancestors are rewritten from what remains, a parent left
        with one child folded away. ``KeyError``: unknown id; ``ValueError``: a summary."""
        check_leaf_id(node_id)
        self._writer.delete([node_id])

    async def adelete(self, node_id: str) -> None:
        """Async :meth:`delete`."""
        check_leaf_id(node_id)
        await self._writer.adelete([node_id])

    def delete_many(self, node_ids: Iterable[str]) -> int:
        """Forget several leaves in one change (e.g. ``delete_many(find(source_id=...))``);
        return how many. Leaves the tree :meth:`delete` would, each affected summary
        rewritten once. An unknown id (``KeyError``) or a summary id (``ValueError``)
        deletes nothing."""
        return self._writer.delete(node_ids)

    async def adelete_many(self, node_ids: Iterable[str]) -> int:
        """Async :meth:`delete_many`."""
        return await self._writer.adelete(node_ids)

    def sweep_expired(self) -> int:
        """Delete every leaf whose expiry has passed, its ancestors rewritten as by
        :meth:`delete_many`; return how many (``stats().extra["expired"]`` counts
        them). Reads never return an expired leaf even before it is swept; writes
        (:meth:`add`, :meth:`add_many`) and exports sweep on the way."""
        return self._writer.sweep_expired()

    async def asweep_expired(self) -> int:
        """Async :meth:`sweep_expired`."""
        return await self._writer.asweep_expired()

    def set_expiry(
        self, leaf_ids: Iterable[str], *, ttl: TTLLike | None = None, expires_at: TimeLike | None = None
    ) -> int:
        """Give stored leaves a new expiry: ``ttl`` seconds from now or ``expires_at``;
        neither: they never expire (``config.default_ttl`` does not apply here).
        Nothing else changes and no summary is rewritten. ``KeyError``: an unknown or
        already expired leaf (nothing is changed then)."""
        expiry = expiry_of(ttl, expires_at)
        return self._writer.set_expiry(check_leaf_ids(leaf_ids), expiry)

    async def aset_expiry(
        self, leaf_ids: Iterable[str], *, ttl: TTLLike | None = None, expires_at: TimeLike | None = None
    ) -> int:
        """Async :meth:`set_expiry`."""
        expiry = expiry_of(ttl, expires_at)
        return await self._writer.aset_expiry(check_leaf_ids(leaf_ids), expiry)

    def update(
        self, leaf_id: str, text: str, *, metadata: Mapping[str, Any] | None = None, timestamp: TimeLike | None = None
    ) -> str:
        """Correct a leaf in place (same id; ``None`` keeps its metadata / timestamp);
        summaries above its old and new place are rewritten, :meth:`history` keeps the
        version replaced (:mod:`memtree.update`); the leaf keeps its expiry."""
        self.get(leaf_id)  # an expired leaf is gone: KeyError, as for an unknown id
        return updating.update(self._writer, leaf_id, text, metadata=metadata, timestamp=timestamp)

    async def aupdate(
        self, leaf_id: str, text: str, *, metadata: Mapping[str, Any] | None = None, timestamp: TimeLike | None = None
    ) -> str:
        """Async :meth:`update`."""
        self.get(leaf_id)
        return await updating.aupdate(self._writer, leaf_id, text, metadata=metadata, timestamp=timestamp)

    def history(self, leaf_id: str) -> list[LeafVersion]:
        """The earlier versions of a leaf that :meth:`update` replaced, oldest first
        (``KeyError`` for an expired leaf, as for an unknown one)."""
        self.get(leaf_id)
        return updating.history(self._writer, leaf_id)

    def replace_source(
        self,
        source_id: str,
        texts: Sequence[str],
        *,
        metadata: Sequence[Mapping[str, Any] | None] | None = None,
        timestamp: TimeLike | None = None,
        records: RecordChanges | None = None,
        aggregation: Aggregation | None = None,
        ttl: TTLLike | None = None,
        expires_at: TimeLike | None = None,
    ) -> list[str]:
        """Make the leaves stored under ``source_id`` exactly ``texts`` (``metadata[i]``
        each; ``[]``: none), committed in ONE transaction with ``records`` (kind ->
        key -> dict, ``None`` deletes): a crash leaves both as before or both as
        after. A leaf already holding a text (and its metadata) stays; one with the
        same metadata is corrected in place; others are deleted. Returns the leaf
        ids in order. ``ttl`` / ``expires_at``: when the leaves expire, as in
        :meth:`add` (kept leaves take it too). :meth:`repair` restores the leaves
        from what this wrote (:mod:`memtree.source_leaves`). Example::

            memory.replace_source("note-7", ["Alice's PIN is 4921."], records={"notes": {"note-7": {"v": 1}}})
            memory.replace_source("note-7", [], records={"notes": {"note-7": None}})  # forget both at once
        """
        return source_leaves.replace_source(
            self._writer,
            source_id,
            texts,
            metadata=metadata,
            timestamp=timestamp,
            records=records,
            aggregation=aggregation,
            expires_at=expiry_of(ttl, expires_at, self.config.default_ttl),
        )

    async def areplace_source(
        self,
        source_id: str,
        texts: Sequence[str],
        *,
        metadata: Sequence[Mapping[str, Any] | None] | None = None,
        timestamp: TimeLike | None = None,
        records: RecordChanges | None = None,
        aggregation: Aggregation | None = None,
        ttl: TTLLike | None = None,
        expires_at: TimeLike | None = None,
    ) -> list[str]:
        """Async :meth:`replace_source` (new texts embedded on the event loop)."""
        return await source_leaves.areplace_source(
            self._writer,
            source_id,
            texts,
            metadata=metadata,
            timestamp=timestamp,
            records=records,
            aggregation=aggregation,
            expires_at=expiry_of(ttl, expires_at, self.config.default_ttl),
        )

    def repair(self) -> int:
        """Rewrite every stale summary (deepest first), and restore the leaves of any
        source whose leaves differ from what :meth:`replace_source` last wrote for it;
        return how many summaries and sources were fixed."""
        fixed = self._writer.write(self._writer.procedures.repair)
        return fixed + source_leaves.reconcile(self._writer, self._manifests)

    async def arepair(self) -> int:
        """Async :meth:`repair`."""
        fixed = await self._writer.awrite(self._writer.procedures.repair)
        return fixed + await asyncio.to_thread(source_leaves.reconcile, self._writer, self._manifests)

    def _manifests(self) -> dict[str, Any]:
        return self.store.get_records(self.namespace, source_leaves.SOURCES)

    def compact(self) -> CompactionReport:
        """Drop the store's dead rows (tombstones of deleted nodes, in every namespace
        of the store) and give their space back (SQLite ``VACUUM``, PostgreSQL
        ``VACUUM``), safely while other processes read and write: each of them
        reloads a compacted namespace whole on its next read, so none misses a
        deletion. Returns what was dropped and the size before and after."""
        report = self.store.compact()
        self.refresh(force=True)
        return report

    def export_jsonl(self, target: str | os.PathLike[str] | TextIO) -> int:
        """Write this namespace as a JSONL backup (:mod:`memtree.backup`: readable,
        embeddings included, no pickle) to a path or stream; return the nodes written.
        Expired leaves are swept first, so a backup holds only what is remembered (a
        leaf's expiry is kept in it)."""
        self._sweep_before_showing()
        return backup.export_jsonl(self.store, self.namespace, target)

    def import_jsonl(self, source: str | os.PathLike[str] | TextIO, *, skip_bad: bool = False) -> int:
        """Restore a JSONL backup into this (empty) namespace, nothing re-embedded; return
        the number of nodes imported. A bad line raises ``ValueError("line N: ...")``
        and imports nothing, unless ``skip_bad=True`` (see :mod:`memtree.backup`)."""
        return backup.import_jsonl(self._writer, source, skip_bad=skip_bad)

    def get(self, node_id: str) -> Node:
        """A copy of a node (``KeyError`` naming the id if there is none)."""
        return self._replica.get(node_id)

    def get_many(self, node_ids: Iterable[str]) -> dict[str, Node]:
        """Copies of those of ``node_ids`` that exist, by id, from one snapshot."""
        return self._replica.get_many(node_ids)

    def find(self, *, source_id: str) -> list[str]:
        """Ids of the leaves stored with this ``source_id`` (and not expired), oldest first."""

        def live_ids(state: TreeState) -> list[str]:
            hidden = self._replica.hidden()
            return [leaf for leaf in state.leaves_by_source.get(source_id, []) if leaf not in hidden]

        return self._replica.read(live_ids)

    def leaf_ids_under(self, node_id: str) -> tuple[str, ...]:
        """Ids of the leaves below a node (not expired)."""
        return self._replica.leaf_ids_under(node_id)

    def walk(self) -> Iterator[Node]:
        """Copies of every node, root first, in depth-first pre-order (a snapshot).
        Expired leaves, and summaries of nothing but expired leaves, are left out."""
        return iter(self._replica.snapshot())

    __iter__ = walk

    def leaves(self) -> list[Node]:
        """Copies of all leaves, oldest first."""
        return sorted((node for node in self.walk() if node.is_leaf), key=lambda n: (n.created_at, n.id))

    def __len__(self) -> int:
        """The number of leaves (texts remembered, the expired ones not counted)."""
        return self._replica.read(lambda state: self._replica.live_leaf_total())

    def to_dict(self) -> dict[str, Any]:
        """The tree as nested dicts (id, text, depth, leaf_count, timestamp, metadata, children).
        Like every picture below, it sweeps expired leaves first (:meth:`sweep_expired`)."""
        self._sweep_before_showing()
        return self._replica.read(viz.to_dict)

    def format_tree(self, *, max_depth: int | None = None, width: int = 72) -> str:
        """An indented outline of the tree (depth, leaf count and a preview per node)."""
        self._sweep_before_showing()
        return self._replica.read(viz.format_tree, max_depth=max_depth, width=width)

    def to_mermaid(
        self, *, max_depth: int | None = None, width: int = 80, line_width: int = 28, direction: Direction = "LR"
    ) -> str:
        """The tree as a Mermaid ``flowchart``: boxes of a title over ``width`` characters
        wrapped at ``line_width``, "… N more below" past ``max_depth``."""
        options = {"max_depth": max_depth, "width": width, "line_width": line_width, "direction": direction}
        self._sweep_before_showing()
        return self._replica.read(viz.to_mermaid, **options)

    def to_dot(
        self, *, max_depth: int | None = None, width: int = 80, line_width: int = 28, direction: Direction = "LR"
    ) -> str:
        """The tree as a Graphviz DOT ``digraph`` (same boxes as :meth:`to_mermaid`;
        in SVG output each box's tooltip is its full text)."""
        options = {"max_depth": max_depth, "width": width, "line_width": line_width, "direction": direction}
        self._sweep_before_showing()
        return self._replica.read(viz.to_dot, **options)

    def to_png(self, path: str | os.PathLike[str] | None = None, **options: Any) -> bytes:
        """The :meth:`to_dot` picture (same options) drawn as PNG by Graphviz, written to
        ``path`` if given; :class:`~memtree.viz.GraphvizNotFoundError` without ``dot``."""
        return viz.render_dot_to(self.to_dot(**options), "png", path)

    def to_svg(self, path: str | os.PathLike[str] | None = None, **options: Any) -> str:
        """The :meth:`to_dot` picture drawn as SVG by Graphviz (see :meth:`to_png`)."""
        return viz.render_dot_to(self.to_dot(**options), "svg", path).decode("utf-8")

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
        """One self-contained HTML page to browse the tree (no server, no network),
        open to ``expand_depth``; a click shows a node's text and metadata. Its search
        box matches words (BM25); each of ``queries`` is answered by :meth:`retrieve`
        (``k``, ``mode``) so the page highlights the nodes this memory retrieves.
        ``max_depth`` leaves deeper nodes out. See :mod:`memtree.viz.html`."""
        self._sweep_before_showing()
        answered = viz.answer_queries(self.retrieve, queries, k=k, mode=mode, shown_mode=self.config.mode)
        name = "/".join(self.namespace)
        options = {"expand_depth": expand_depth, "max_depth": max_depth, "k": k or self.config.k}
        return self._replica.read(
            viz.to_html, title=title or f"memtree · {name}", namespace=name, queries=answered, **options
        )

    def stats(self) -> TreeStats:
        """Size, shape and cost counters (see :class:`~memtree.stats.TreeStats`)."""
        return self._replica.read(self._writer.stats)

    def check_integrity(self) -> list[str]:
        """Every broken invariant of the tree and its index, and every source whose
        leaves differ from what :meth:`replace_source` wrote, described (empty: sound)."""
        manifests = self._manifests()

        def problems(state: TreeState) -> list[str]:
            found = integrity_problems(state, self._index, self.config.depth_cap)
            return found + source_leaves.source_problems(state, manifests)

        return self._replica.read(problems)

    @property
    def dimension(self) -> int | None:
        """The embedding dimension of this memory (``None`` until something is stored)."""
        return self._state.info.dimension

    @property
    def stored_embedder(self) -> str | None:
        """The name of the embedder that wrote the stored vectors (``None`` until one is
        stored); not ``embedder.name`` when reopened with another model."""
        return self._state.info.embedder

    def refresh(self, *, force: bool = False) -> None:
        """Apply what other writers committed since this memory last looked."""
        self._replica.refresh(force=force)

    @property
    def embedder(self) -> Embedder:
        """The model that embeds texts and queries."""
        return self._calls.embedder

    @embedder.setter
    def embedder(self, embedder: Embedder) -> None:
        self._calls.embedder = embedder

    @property
    def aggregator(self) -> Aggregator:
        """The summary writer (an LLM's, or extractive)."""
        return self._calls.aggregator

    @aggregator.setter
    def aggregator(self, aggregator: Aggregator) -> None:
        self._calls.aggregator = aggregator

    @property
    def refresh_interval(self) -> float:
        """Seconds a read may skip asking the store for other writers' commits."""
        return self._replica.refresh_interval

    def _sweep_before_showing(self) -> None:
        """Sweep expired leaves before a picture or a backup shows the whole tree
        (their summaries' texts too must stop mentioning them). A store this process
        may not write (read-only) cannot be swept: there the picture shows them."""
        self._replica.maybe_refresh()
        if self._replica.sweep_due():
            with contextlib.suppress(PermissionError):
                self.sweep_expired()

    def _given(self, query_embedding: Vector | Sequence[float]) -> Vector:
        return check_query_embedding(query_embedding, self._state.info.dimension)

    @property
    def _index(self) -> VectorIndex | None:
        return self._replica.index
