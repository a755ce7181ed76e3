"""``MemTree``: the public entry point of the engine, a facade. Each operation
delegates in one step: writes to :class:`~memtree.writer.Writer` (a text enters once
and leaves committed), reads and catching up with other writers to
:class:`~memtree.replica.Replica`, queries to :mod:`memtree.retrieval`, pictures to
:mod:`memtree.viz`, backups to :mod:`memtree.backup`."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TextIO, TypeVar, Unpack

from memtree import backup, keywords, source_leaves, viz
from memtree import update as updating
from memtree.aggregate import Aggregator
from memtree.background import CLOSE_SECONDS, remaining
from memtree.config import AGGREGATION_MODES, Aggregation, MemTreeConfig
from memtree.deprecation import deprecated
from memtree.embed import Embedder
from memtree.index import VectorIndex
from memtree.model_calls import ModelCalls
from memtree.model_choice import choose_models, given_models
from memtree.node import LeafVersion, Node, RetrievedNode, Vector
from memtree.overview import OverviewOptions, answer_overview, check_overview
from memtree.replica import Replica
from memtree.retrieval import RetrieveOptions, answer, check_query, relevance_floor
from memtree.siblings import Siblings
from memtree.state import TreeState
from memtree.stats import Counters, TreeStats
from memtree.store.base import CompactionReport, Namespace, NamespaceKey, Store, namespace_key
from memtree.store.location import as_store, open_store
from memtree.text import require_text
from memtree.viz.outline import format_tree
from memtree.writer import DeferredAggregation, Writer, check_leaf_ids, stop_writers_on, warn_left_stale

__all__ = ["AGGREGATION_MODES", "SIBLING_CACHE_SIZE", "Aggregation", "DeferredAggregation", "MemTree"]

SIBLING_CACHE_SIZE = 256
"""Namespace handles :meth:`MemTree.sibling` keeps open per memory."""

R = TypeVar("R")


class MemTree:
    """A long-term memory that grows as a tree of texts and their summaries.

    New texts are routed down from the root by similarity and hang as leaves; every
    summary on the way is re-aggregated, so shallow nodes hold broad themes and deep
    nodes hold details. Retrieval scores every node at once ("collapsed") or
    descends by beam ("traversal").

    ``embedder`` and ``llm`` take memtree, LangChain or LlamaIndex models, a ``prompt
    -> text`` callable (``llm``) or ``"openai"`` / ``"local"``. Left out, summaries are
    extractive and the embedder is the one that built this namespace (the bundled
    all-MiniLM-L6-v2 for a new one): offline, and never chosen by the environment
    (:mod:`memtree.model_choice`). ``store``: in memory by default; a SQLite path or
    ``postgresql://`` DSN opens a store the memory owns (like :meth:`open`); a
    :class:`~memtree.store.Store` you pass stays yours.

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
        given = given_models(embedder, aggregator, llm)  # a bad model fails before the store opens
        self.namespace: NamespaceKey = namespace_key(namespace)
        self.store, owns_store = as_store(store)
        self._owns_store, self._closed, self._counters = owns_store, False, Counters()
        self._siblings: Siblings[MemTree] = Siblings(self.with_namespace, SIBLING_CACHE_SIZE, MemTree.close)
        try:
            self._replica = Replica.configured(self.store, self.namespace, self.config, refresh_interval)
            self._replica.refresh(force=True)
            # A stored namespace embeds with the model that built it (model_choice).
            models = choose_models(*given, None, stored=self._replica.state.info.embedder)
            self._calls = ModelCalls(*models, self._counters, self.config.max_concurrency)
            self._writer = Writer(self._replica, self._calls, self.config)
            self._state, self._background = self._replica.state, self._writer.background  # (read-only aliases)
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
        kwargs["embedder"], kwargs["aggregator"] = given_models(
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
        threads, close the store if :meth:`open` opened it. Waits at most ``timeout``
        seconds in all (10 by default, as interpreter exit does; ``None``: as long as
        the model takes), so a hanging model cannot hold the caller; summaries not
        written by then stay stale (every leaf is committed): one warning names them,
        and :meth:`repair` writes them later."""
        if timeout is not None and not timeout >= 0:
            raise ValueError(f"timeout must be >= 0 seconds or None, got {timeout}")
        deadline = None if timeout is None else time.monotonic() + timeout
        left = self._stop_writing(deadline)
        if self._owns_store:  # other handles on the store (a MemTreeStore's) stop before it closes
            left += stop_writers_on(self.store, remaining(deadline))
        warn_left_stale(left, timeout)
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
        self._replica.close()
        return left

    def __enter__(self) -> MemTree:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def add(self, text: str, **options: Unpack[keywords.AddOptions]) -> str:
        """Remember one text; return its leaf id (with ``config.deduplicate``, that of a
        stored leaf with the same text, metadata and source id). Options
        (:class:`~memtree.keywords.AddOptions`): ``metadata``, ``timestamp`` (of the
        event), ``source_id``, ``aggregation``, ``ttl`` / ``expires_at``."""
        return self._writer.add(*keywords.add_item(text, options, self.config.default_ttl))

    async def aadd(self, text: str, **options: Unpack[keywords.AddOptions]) -> str:
        """Async :meth:`add`: aggregations run on the event loop (``aaggregate``);
        in background mode the worker thread writes them."""
        return await self._writer.aadd(*keywords.add_item(text, options, self.config.default_ttl))

    def add_many(self, texts: Sequence[str], **options: Unpack[keywords.AddManyOptions]) -> list[str]:
        """Remember several texts in order, embedded in batches; one bad item stores
        nothing. Options (:class:`~memtree.keywords.AddManyOptions`): ``metadata``,
        ``timestamps``, ``source_ids`` (one per text), ``aggregation``, ``ttl`` /
        ``expires_at``, and ``bulk=True`` for documents (grouped by clustering, each
        summary written once). ``"deferred"`` from the config waits for :meth:`flush`."""
        given, aggregation, bulk = keywords.many_items(texts, options, self.config.default_ttl)
        return self._writer.add_many(given, aggregation, self.deferred(), bulk=bulk)

    async def aadd_many(self, texts: Sequence[str], **options: Unpack[keywords.AddManyOptions]) -> list[str]:
        """Async :meth:`add_many`."""
        given, aggregation, bulk = keywords.many_items(texts, options, self.config.default_ttl)
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

    def retrieve(self, query: str, **options: Unpack[RetrieveOptions]) -> list[RetrievedNode]:
        """The nodes most relevant to ``query``, best first; options as keywords, each left out
        the config's (:class:`~memtree.retrieval.RetrieveOptions`). The relevance floor
        applies by default (:attr:`relevance_floor`; ``min_similarity=None``: off)."""
        checked = check_query(self.config, self._state, query, options, self.relevance_floor)
        if checked.routed is not None:  # an overview request ("what do you know about...")
            return self.overview(**checked.routed)
        self._replica.maybe_refresh()
        vector = self._writer.embed_query(query) if checked.vector is None else checked.vector
        return answer(self._replica, checked, vector, self.config.beam)

    async def aretrieve(self, query: str, **options: Unpack[RetrieveOptions]) -> list[RetrievedNode]:
        """Async :meth:`retrieve` (same options)."""
        checked = check_query(self.config, self._state, query, options, self.relevance_floor)
        if checked.routed is not None:
            return await self.aoverview(**checked.routed)
        await asyncio.to_thread(self._replica.maybe_refresh)
        vector = await self._writer.aembed_query(query) if checked.vector is None else checked.vector
        return answer(self._replica, checked, vector, self.config.beam)

    def overview(self, about: str | None = None, **options: Unpack[OverviewOptions]) -> list[RetrievedNode]:
        """What the memory holds about ``about`` (``None``: all): :mod:`memtree.overview`."""
        checked = check_overview(self.config, about, options, self.relevance_floor)
        return answer_overview(self._replica, checked, self._writer.embed_query)

    async def aoverview(self, about: str | None = None, **options: Unpack[OverviewOptions]) -> list[RetrievedNode]:
        """Async :meth:`overview` (same options)."""
        return await asyncio.to_thread(self.overview, about, **options)

    @property
    def relevance_floor(self) -> float | None:
        """The relevance floor calibrated for this memory's embedder, which :meth:`retrieve`
        applies by default (``min_similarity="auto"``); ``None``: none measured for it."""
        return relevance_floor(self.embedder.name)

    def embed_query(self, query: str) -> Vector:
        """The vector :meth:`retrieve` would compute for ``query`` (unit length); pass it back
        as ``query_embedding`` to search many namespaces sharing this embedder with one call."""
        return self._writer.embed_query(require_text(query, "query"))

    async def aembed_query(self, query: str) -> Vector:
        """Async :meth:`embed_query`."""
        return await self._writer.aembed_query(require_text(query, "query"))

    def delete(self, node_ids: str | Iterable[str]) -> int:
        """Forget one leaf or several (ids) in one change; return how many. Each affected
        summary is rewritten once from what remains, a parent left with one child folded away.
        An unknown id (``KeyError``) or a summary's id (``ValueError``) deletes nothing.
        ``delete(find(source_id="..."))`` forgets a source."""
        return self._writer.delete([node_ids] if isinstance(node_ids, str) else node_ids)

    async def adelete(self, node_ids: str | Iterable[str]) -> int:
        """Async :meth:`delete`."""
        return await self._writer.adelete([node_ids] if isinstance(node_ids, str) else node_ids)

    delete_many = deprecated("delete_many", delete, "delete(ids)")
    adelete_many = deprecated("adelete_many", adelete, "adelete(ids)")

    def sweep_expired(self) -> int:
        """Delete every leaf whose expiry has passed, its ancestors rewritten as by :meth:`delete`;
        return how many (``stats().extra["expired"]`` counts them). Reads never return an
        expired leaf even before it is swept; writes (:meth:`add`...) and exports sweep too."""
        return self._writer.sweep_expired()

    async def asweep_expired(self) -> int:
        """Async :meth:`sweep_expired`."""
        return await self._writer.asweep_expired()

    def set_expiry(self, leaf_ids: Iterable[str], **options: Unpack[keywords.ExpiryOptions]) -> int:
        """Give stored leaves a new expiry: ``ttl`` seconds from now or ``expires_at``;
        neither: they never expire (``config.default_ttl`` does not apply here).
        Nothing else changes and no summary is rewritten. ``KeyError``: an unknown or
        already expired leaf (nothing is changed then)."""
        return self._writer.set_expiry(check_leaf_ids(leaf_ids), keywords.new_expiry(options))

    async def aset_expiry(self, leaf_ids: Iterable[str], **options: Unpack[keywords.ExpiryOptions]) -> int:
        """Async :meth:`set_expiry`."""
        return await self._writer.aset_expiry(check_leaf_ids(leaf_ids), keywords.new_expiry(options))

    def update(self, leaf_id: str, text: str, **options: Unpack[keywords.UpdateOptions]) -> str:
        """Correct a leaf in place (same id; options ``metadata`` / ``timestamp``, left out or
        ``None``: kept); summaries above its old and new place are rewritten, :meth:`history`
        keeps the version replaced (:mod:`memtree.update`); the leaf keeps its expiry."""
        self.get(leaf_id)  # an expired leaf is gone: KeyError, as for an unknown id
        return updating.update(self._writer, leaf_id, text, **keywords.update_options(options))

    async def aupdate(self, leaf_id: str, text: str, **options: Unpack[keywords.UpdateOptions]) -> str:
        """Async :meth:`update`."""
        self.get(leaf_id)
        return await updating.aupdate(self._writer, leaf_id, text, **keywords.update_options(options))

    def history(self, leaf_id: str) -> list[LeafVersion]:
        """The earlier versions of a leaf that :meth:`update` replaced, oldest first
        (``KeyError`` for an expired leaf, as for an unknown one)."""
        self.get(leaf_id)
        return updating.history(self._writer, leaf_id)

    def replace_source(
        self, source_id: str, texts: Sequence[str], **options: Unpack[keywords.ReplaceOptions]
    ) -> list[str]:
        """Make the leaves stored under ``source_id`` exactly ``texts`` (``metadata[i]``
        each; ``[]``: none), committed in ONE transaction with ``records`` (kind ->
        key -> dict, ``None`` deletes): a crash leaves both as before or both as
        after. A leaf already holding a text (and its metadata) stays; one with the
        same metadata is corrected in place; others are deleted. Returns the leaf
        ids in order (options: :class:`~memtree.keywords.ReplaceOptions`); :meth:`repair`
        restores the leaves from what this wrote (:mod:`memtree.source_leaves`). Example::

            memory.replace_source("note-7", ["Alice's PIN is 4921."], records={"notes": {"note-7": {"v": 1}}})
            memory.replace_source("note-7", [], records={"notes": {"note-7": None}})  # forget both at once
        """
        given = keywords.source_options(options, self.config.default_ttl)
        return source_leaves.replace_source(self._writer, source_id, texts, **given)

    async def areplace_source(
        self, source_id: str, texts: Sequence[str], **options: Unpack[keywords.ReplaceOptions]
    ) -> list[str]:
        """Async :meth:`replace_source` (new texts embedded on the event loop)."""
        given = keywords.source_options(options, self.config.default_ttl)
        return await source_leaves.areplace_source(self._writer, source_id, texts, **given)

    def repair(self) -> int:
        """Sweep expired leaves, rewrite every stale summary and every summary that
        still quotes a removed text (deepest first), and restore the leaves of any
        source whose leaves differ from what :meth:`replace_source` last wrote for it;
        return how many summaries and sources were fixed."""
        fixed = self._writer.repair()
        return fixed + source_leaves.reconcile(self._writer)

    async def arepair(self) -> int:
        """Async :meth:`repair`."""
        fixed = await self._writer.arepair()
        return fixed + await asyncio.to_thread(source_leaves.reconcile, self._writer)

    def compact(self) -> CompactionReport:
        """Drop the store's dead rows (tombstones, in every namespace) and give their
        space back (``VACUUM``), safely while other processes read and write (they
        reload a compacted namespace whole), then replace this namespace's index files
        by ones holding no deleted or replaced text; returns what was dropped and the sizes."""
        return self._replica.compact()

    def export_jsonl(self, target: str | os.PathLike[str] | TextIO) -> int:
        """Write this namespace as a JSONL backup (:mod:`memtree.backup`: readable,
        embeddings included, no pickle) to a path or stream; return the nodes written
        (expired leaves swept first; a leaf's expiry is kept)."""
        self._writer.sweep_before_showing()
        return backup.export_jsonl(self.store, self.namespace, target, sweep=self.sweep_expired)

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

    def format_tree(self, *, max_depth: int | None = None, width: int = 72) -> str:
        """An indented outline of the tree (depth, leaf count and a preview per node).
        The other pictures are functions of the memory in :mod:`memtree.viz`
        (``to_mermaid(memory)``, ``to_dot``, ``to_png``, ``to_svg``, ``to_html``, ``to_dict``)."""
        return self.read_tree(format_tree, max_depth=max_depth, width=width)

    def read_tree(self, draw: Callable[..., R], /, **options: Any) -> R:
        """``draw(tree, **options)`` on this memory's in-process tree (a
        :class:`~memtree.state.TreeState`), under its read lock, after expired leaves
        are swept: how :mod:`memtree.viz` draws a snapshot; ``draw`` must not keep it."""
        self._writer.sweep_before_showing()
        return self._replica.show(draw, **options)

    to_dict = deprecated("to_dict", viz.to_dict, "memtree.viz.to_dict(memory)")
    to_mermaid = deprecated("to_mermaid", viz.to_mermaid, "memtree.viz.to_mermaid(memory)")
    to_dot = deprecated("to_dot", viz.to_dot, "memtree.viz.to_dot(memory)")
    to_png = deprecated("to_png", viz.to_png, "memtree.viz.to_png(memory, path)")
    to_svg = deprecated("to_svg", viz.to_svg, "memtree.viz.to_svg(memory)")
    to_html = deprecated("to_html", viz.to_html, "memtree.viz.to_html(memory)")

    def stats(self) -> TreeStats:
        """Size, shape and cost counters (see :class:`~memtree.stats.TreeStats`)."""
        return self._replica.read(self._writer.stats)

    def check_integrity(self) -> list[str]:
        """Every broken invariant of the tree and its index, every summary that still
        quotes a removed text (:mod:`memtree.redaction`), and every source whose
        leaves differ from what :meth:`replace_source` wrote, described (empty: sound)."""
        return source_leaves.problems(self._writer, self.config.depth_cap)

    @property
    def dimension(self) -> int | None:
        """The embedding dimension of this memory (``None`` until something is stored)."""
        return self._state.info.dimension

    @property
    def stored_embedder(self) -> str | None:
        """The name of the embedder that wrote the stored vectors (``None`` until one is
        stored): a memory opened with no ``embedder=`` embeds with that model."""
        return self._state.info.embedder

    def refresh(self, *, force: bool = False) -> None:
        """Apply what other writers committed since this memory last looked."""
        self._replica.refresh(force=force)

    @property
    def embedder(self) -> Embedder:
        """The model that embeds texts and queries."""
        return self._calls.embedder

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

    @property
    def _index(self) -> VectorIndex | None:
        return self._replica.index
