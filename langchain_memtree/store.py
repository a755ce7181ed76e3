"""``MemTreeStore``: a LangGraph long-term store whose semantic search is MemTree retrieval.

Each LangGraph namespace (``("memories", "alice")``) is one memtree namespace under
the store's ``prefix`` (``("store", "memories", "alice")``), holding:

* the items, exactly as put: JSON records (value, created and updated times) in
  the engine store's record table, which ``get``, filtered listing and
  ``list_namespaces`` read;
* with an ``index`` (as in LangGraph), a memory tree in which every indexed text
  of an item (the fields the index names) is a leaf whose ``source_id`` is the
  item's key. ``search(query=...)`` retrieves leaves and maps them back to items,
  scoring each item by its best leaf.

Without an ``index`` the store is an exact key-value store, as LangGraph's own
stores are: nothing is embedded or summarized, a ``query`` is ignored (a search
is a filtered listing). The items still live in the memory's engine store, so
they persist in SQLite or PostgreSQL. They are kept as records, the key-value
table every engine backend already has (with its schema migrations), rather
than as leaves without embeddings: a node without a vector would break the
engine's rule that every node can be routed and ranked, and every reader of the
tree would have to skip it.

The records are the truth and the tree is the index: a put or delete commits the
record and every change of the item's leaves (only the leaves whose text changed)
in one transaction (``MemTree.replace_source``), so a crash never leaves them
apart. :meth:`MemTreeStore.repair` reconciles files written before that from the
records.

Operations in a batch run in order. Puts and deletes are serialized within a
process; the store's own locks serialize writers to one tree across processes.

Items expire as in LangGraph's SQLite and PostgreSQL stores (``ttl=`` on ``put``,
``TTLConfig``): the record holds the expiry and the item's leaves carry the same
one, so an expired item is gone from every read at once (:mod:`langchain_memtree.ttl`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from langgraph.store.base import (
    BaseStore,
    GetOp,
    IndexConfig,
    InvalidNamespaceError,
    Item,
    ListNamespacesOp,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    TTLConfig,
    get_text_at_path,
    validate_op_namespace,
)

from langchain_memtree._calls import Call, Procedure, WriteLock, arun, run
from langchain_memtree._text import storable
from langchain_memtree.filters import check_filter, matches, namespace_matches
from langchain_memtree.index_config import Path, StoreIndex, read_index, tokenized
from langchain_memtree.middleware import MemTreeMemoryMiddleware
from langchain_memtree.namespaces import NamespaceChoice, NamespaceTemplate, namespace_chooser
from langchain_memtree.ttl import Sweeper, check_ttl_config, check_ttl_minutes, expiry_fields, is_expired, refreshable
from memtree import MemTree, RetrievedNode
from memtree.config import Aggregation, RetrievalMode
from memtree.source_leaves import SOURCES
from memtree.store import Namespace, NamespaceKey, namespace_key
from memtree.text import unstorable

logger = logging.getLogger(__name__)

ITEMS = "store_items"
"""Record kind of the items (key: the item's key)."""

_Hit = tuple[tuple[float, float] | None, NamespaceKey, str, dict[str, Any]]
"""(cosine and hybrid score of the item's best leaf, or ``None`` for a listed item), namespace, key, record."""


class MemTreeSearchItem(SearchItem):
    """A ``SearchItem`` whose ``score`` is the cosine similarity of the item's best
    text to the query, as in LangGraph's ``InMemoryStore``, and whose
    ``memtree_score`` is the hybrid score (cosine and BM25) that ranked it, as in
    ``MemTreeIndex``; both ``None`` for an item listed, not ranked."""

    __slots__ = ("memtree_score",)

    def __init__(self, *args: Any, memtree_score: float | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.memtree_score = memtree_score

    def dict(self) -> dict[str, Any]:
        return {**super().dict(), "memtree_score": self.memtree_score}


class MemTreeStore(BaseStore):
    """A LangGraph ``BaseStore`` on a MemTree: exact items, tree-backed semantic search.

    ``memory`` supplies the engine store (SQLite, PostgreSQL or in-memory; default:
    a new in-memory ``MemTree()``), the summary writer and, unless ``index`` names
    another, the embedder. ``index`` is LangGraph's ``IndexConfig``:

    * no ``index``: an exact key-value store. Nothing is embedded or summarized;
      ``search`` lists and filters items, ignoring ``query``, as LangGraph's stores do.
    * ``index={"fields": ["text"]}``: those fields of each value (LangGraph's path
      syntax; default ``["$"]``, the whole value as JSON) become leaves of a tree
      per namespace, embedded by the memory's embedder.
    * ``"embed"``: another embedder for the store's trees (a LangChain
      ``Embeddings``, a function, or ``"provider:model"``; see
      :mod:`langchain_memtree.index_config`); ``"dims"``: the embedding size,
      checked on every embedding.

    ``put(..., index=False)`` stores an item without indexing it; ``index=[...]``
    names its fields for that put. ``mode`` (``"collapsed"`` or ``"traversal"``;
    default: the memory's) is how searches walk each tree. A traversal search lists
    first the items its beam reaches, best first, then the other matching items by
    collapsed score, so ``limit`` and ``filter`` behave as in collapsed mode.

    One tree can serve the store and :class:`MemTreeMemoryMiddleware`: see
    :meth:`middleware`.

    ``ttl`` is LangGraph's ``TTLConfig``: ``default_ttl`` (minutes) for puts that
    pass no ``ttl``, ``refresh_on_read`` (reads extend what they return; default
    ``True``), ``sweep_interval_minutes`` (a daemon thread deletes expired items
    that often; :meth:`sweep_ttl` does it once). An expired item is never returned,
    listed or found, in any process (see :mod:`langchain_memtree.ttl`).

    ``aggregation`` is when the summaries above an indexed text are written: by the
    memory's background worker (default: a put waits for embeddings only, never for
    a chat request), ``"deferred"`` to ``flush()`` / ``close()`` of the memory, or
    ``"eager"`` inside the put (see :class:`memtree.MemTreeConfig`).

    Example::

        store = MemTreeStore(MemTree(), index={"fields": ["text"]})
        store.put(("memories", "alice"), "pet", {"text": "Alice has a cat named Miso."})
        store.search(("memories",), query="What is Alice's cat called?", limit=3)
        agent = create_agent(model, tools, store=store)
    """

    supports_ttl: bool = True
    """Items expire as in LangGraph's SQLite and PostgreSQL stores (:mod:`langchain_memtree.ttl`)."""

    def __init__(
        self,
        memory: MemTree | None = None,
        *,
        index: IndexConfig | None = None,
        prefix: Namespace = ("store",),
        mode: RetrievalMode | None = None,
        aggregation: Aggregation = "background",
        ttl: TTLConfig | None = None,
    ) -> None:
        if memory is not None and not isinstance(memory, MemTree):
            raise TypeError(f"memory must be a memtree.MemTree, got {type(memory).__name__}")
        self.prefix: NamespaceKey = namespace_key(prefix)
        self.ttl_config: TTLConfig | None = check_ttl_config(ttl)
        self.index: StoreIndex | None = read_index(index)
        """The index configuration read from ``index`` (``None``: exact key-value store)."""
        self.index_config: IndexConfig | None = {**index} if index else None  # type: ignore[typeddict-item]
        """The ``index`` given, as LangGraph's stores keep it (``None``: no index)."""
        self._opened: list[MemTree] = []  # memories this store made and must close
        if memory is None:
            memory = MemTree()
            self._opened.append(memory)
        if mode is not None:
            memory.config.with_options(mode=mode)  # refuses an unknown mode now, not at the first search
        self.memory = memory
        self.mode = mode
        embedder = self.index.embedder_over(memory.embedder) if self.index is not None else None
        if embedder is None:
            self._base = memory
        else:  # the store's trees embed with the index's model; everything else is the memory's
            self._base = MemTree(
                embedder=embedder,
                aggregator=memory.aggregator,
                store=memory.store,
                namespace=self.prefix,
                config=memory.config,
                refresh_interval=memory.refresh_interval,
            )
            self._opened.append(self._base)
        # Items are indexed independently: equal texts of two items are two leaves
        # (no de-duplication), and search must see every leaf (no sentence dropping).
        config = memory.config.with_options(deduplicate=False, drop_repeated_sentences=False, aggregation=aggregation)
        self._memories = self._base.with_namespace(self.prefix, config=config)
        self._opened.append(self._memories)
        self._paths: list[Path] = self.index.paths if self.index is not None else []
        self._write_lock = WriteLock()
        self._sweeper = Sweeper(self.sweep_ttl, closed=lambda: bool(self.memory.store.closed))
        interval = (self.ttl_config or {}).get("sweep_interval_minutes")
        if interval is not None:
            self._sweeper.start(interval)

    @classmethod
    @contextlib.contextmanager
    def from_conn_string(
        cls,
        conn_string: str | os.PathLike[str],
        *,
        index: IndexConfig | None = None,
        ttl: TTLConfig | None = None,
        prefix: Namespace = ("store",),
        mode: RetrievalMode | None = None,
        aggregation: Aggregation = "background",
        **memory_options: Any,
    ) -> Iterator[MemTreeStore]:
        """A store on a SQLite file (created if missing) or a ``postgresql://`` DSN,
        closed when the ``with`` block ends, like LangGraph's ``SqliteStore`` and
        ``PostgresStore``. ``memory_options`` go to :meth:`MemTree.open`
        (``embedder=``, ``llm=``, ``config=``...); ``ttl`` is LangGraph's ``TTLConfig``.

        Example::

            with MemTreeStore.from_conn_string("memory.db", index={"fields": ["text"]}) as store:
                agent = create_agent(model, tools, store=store)
        """
        read_index(index)  # a bad index or TTL config fails before a file is made
        check_ttl_config(ttl)
        memory = MemTree.open(conn_string, namespace=prefix, **memory_options)
        try:
            store = cls(memory, index=index, prefix=prefix, mode=mode, aggregation=aggregation, ttl=ttl)
        except BaseException:
            memory.close()
            raise
        store._opened.append(memory)
        try:
            yield store
        finally:
            store.close()

    def setup(self) -> None:
        """Nothing to do: the engine store creates and migrates its schema when it is
        opened. Here so code written for LangGraph's ``PostgresStore`` /
        ``SqliteStore`` (which need ``setup()`` once) runs unchanged."""

    def close(self) -> None:
        """Close what this store opened (the memory of :meth:`from_conn_string`);
        a memory passed in stays open, it is the caller's. Stops the TTL sweeper."""
        self._sweeper.stop()
        while self._opened:  # in the order opened: the handles before the memory that owns the store
            self._opened.pop(0).close()

    def middleware(self, namespace: NamespaceChoice = None, **options: Any) -> MemTreeMemoryMiddleware:
        """Agent middleware that records into and recalls from this store's tree of
        ``namespace``: as for :class:`MemTreeMemoryMiddleware`, one per user by default
        (``("memories", "{user_id}")``, filled from the run), a template, a function of
        the runtime, or a fixed LangGraph namespace (shared by every run).

        The middleware's exchanges and the items tools ``put`` then grow one tree:
        the model is reminded of both, nothing is kept twice in two trees, and
        ``search`` still returns only items (exchanges are leaves without an item).
        ``options`` go to :class:`MemTreeMemoryMiddleware` (``k``, ``token_budget``...).

        Example::

            store = MemTreeStore(memory, index={"fields": ["text"]})
            agent = create_agent(
                model,
                tools,
                store=store,
                middleware=[store.middleware(("memories", "{user_id}"))],  # the default; filled per run
            )
        """
        choose = namespace_chooser(namespace)  # a template ("memories", "{user_id}") is filled per run
        if callable(namespace) or isinstance(choose, NamespaceTemplate):
            return MemTreeMemoryMiddleware(
                memory=self._base, namespace=lambda runtime: self._key(choose(runtime)), **options
            )
        return MemTreeMemoryMiddleware(memory=self._base, namespace=self._key(choose(None)), **options)

    def check(self) -> list[str]:
        """Every problem of this store's trees, described (empty: sound); reads only.

        Per namespace: the tree's invariants, items whose leaves differ from what
        their put wrote (:meth:`MemTree.check_integrity`) and, in files written
        before a put committed item and leaves together, items whose leaves differ
        from their record and leaves of items that no longer exist.
        """
        problems: list[str] = []
        for namespace, memory in self._namespaces():
            label = "/".join(namespace[len(self.prefix) :])
            found = memory.check_integrity() + [problem for problem, _ in self._unmanaged(namespace, memory)]
            problems += [f"{label}: {problem}" for problem in found]
        return problems

    def repair(self) -> int:
        """Bring every tree in step with the item records, the truth, and rewrite
        stale summaries; return how many items and summaries were fixed.

        An item whose leaves differ from its record (a file from before puts were
        atomic, interrupted between the two) gets the leaves its record calls for;
        leaves of a deleted item are removed. Example: ``store.repair()`` once after
        upgrading, then ``store.check() == []``.
        """
        fixed = 0
        for namespace, memory in self._namespaces():
            for _, fix in self._unmanaged(namespace, memory):
                if fix is not None:
                    key, texts = fix
                    record = self._records.get_records(namespace, ITEMS, [key]).get(key) or {}
                    memory.replace_source(
                        key,
                        [text for _, text in texts],
                        metadata=[{"path": path} for path, _ in texts],
                        expires_at=record.get("expires_at"),
                    )
                    fixed += 1
            fixed += memory.repair()
        return fixed

    def _namespaces(self) -> Iterator[tuple[NamespaceKey, MemTree]]:
        for namespace in self._records.list_namespaces(self.prefix):
            if len(namespace) > len(self.prefix):
                yield namespace, self._memories.sibling(namespace)

    def _unmanaged(
        self, namespace: NamespaceKey, memory: MemTree
    ) -> list[tuple[str, tuple[str, list[tuple[str, str]]] | None]]:
        """Problems of the items no manifest covers (written before puts were atomic),
        each with its fix: (key, the texts its leaves must hold), or ``None`` when
        the record cannot tell (a put that named its own fields)."""
        items = self._records.get_records(namespace, ITEMS)
        managed = self._records.get_records(namespace, SOURCES)
        held: dict[str, list[tuple[str, str]]] = {}
        for leaf in memory.leaves():
            if leaf.source_id is not None and isinstance(leaf.metadata.get("path"), str):
                held.setdefault(leaf.source_id, []).append((leaf.metadata["path"], leaf.text))
        out: list[tuple[str, tuple[str, list[tuple[str, str]]] | None]] = []
        now = time.time()
        for key, record in items.items():
            if key in managed or is_expired(record, now):
                continue  # check_integrity compares it with its manifest; an expired item is gone
            count = int(record.get("vectors", 0))
            wanted = _texts(record["value"], self._paths) if count and self.index is not None else []
            leaves = sorted(held.get(key, []))
            if sorted(wanted) == leaves:
                continue
            problem = f"item {key!r}: its record calls for {count} leaves, the tree holds {len(leaves)} that differ"
            if len(wanted) != count:
                out.append((problem + " (put with other fields: repair() cannot tell which; put it again)", None))
            else:
                out.append((problem + "; repair() rewrites them from the record", (key, wanted)))
        for key in sorted(set(held) - set(items) - set(managed)):
            out.append(
                (f"{len(held[key])} leaves of item {key!r}, which no longer exists; repair() removes them", (key, []))
            )
        return out

    # -- the LangGraph interface --------------------------------------------------

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """Run operations in order and return their results (``None`` for puts)."""
        return [run(self._op_steps(op)) for op in _checked_ops(ops)]

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        """Async :meth:`batch`: model calls are awaited, store I/O runs in threads."""
        return [await arun(self._op_steps(op)) for op in _checked_ops(ops)]

    def tree(self, namespace: tuple[str, ...]) -> MemTree:
        """The memory tree behind a LangGraph namespace, with the memory's own
        config, for reading: a ``MemTreeRetriever``, ``format_tree()``, ``stats()``.
        Change items through the store, which keeps tree and items in step."""
        return self._base.sibling(self._key(namespace))

    def sweep_ttl(self) -> int:
        """Delete every expired item (its record and its leaves, the summaries above
        rewritten) and every expired leaf of the store's trees; return how many items.
        Expired items are invisible before this runs; it frees their space."""
        return run(self._sweep_steps())

    async def asweep_ttl(self) -> int:
        """Async :meth:`sweep_ttl`."""
        return await arun(self._sweep_steps())

    def start_ttl_sweeper(self, sweep_interval_minutes: float | None = None) -> None:
        """Run :meth:`sweep_ttl` every ``sweep_interval_minutes`` (default: the
        ``TTLConfig``'s, else 5) in a daemon thread, as LangGraph's stores do;
        :meth:`stop_ttl_sweeper` or :meth:`close` stops it."""
        interval = sweep_interval_minutes
        if interval is None:
            interval = (self.ttl_config or {}).get("sweep_interval_minutes") or 5
        self._sweeper.start(interval)

    def stop_ttl_sweeper(self, timeout: float | None = None) -> bool:
        """Stop the sweeper thread; whether it stopped within ``timeout`` seconds."""
        return self._sweeper.stop(timeout)

    # -- operations ----------------------------------------------------------------

    def _op_steps(self, op: Op) -> Procedure[Result]:
        if isinstance(op, GetOp):
            return (yield from self._get_steps(op))
        if isinstance(op, SearchOp):
            return (yield from self._search_steps(op))
        if isinstance(op, ListNamespacesOp):
            return (yield from self._list_steps(op))
        yield Call(self._write_lock, "acquire")
        try:
            if op.value is None:
                yield from self._delete_steps(op)
            else:
                yield from self._put_steps(op)
        finally:
            self._write_lock.release()
        return None

    def _get_steps(self, op: GetOp) -> Procedure[Item | None]:
        key = self._key(op.namespace)
        found = yield Call(self._records, "get_records", (key, ITEMS, [op.key]))
        record = found.get(op.key)
        if record is None or is_expired(record, time.time()):
            return None
        if op.refresh_ttl and refreshable(record):
            refreshed = yield from self._refresh_steps(key, [op.key])
            record = refreshed.get(op.key)
            if record is None:  # deleted or expired meanwhile
                return None
        return _item(op.namespace, op.key, record)

    def _put_steps(self, op: PutOp) -> Procedure[None]:
        key = self._key(op.namespace)
        value = _checked_value(op.value)
        memory = yield Call(self._memories, "sibling", (key,))
        old = yield Call(self._records, "get_records", (key, ITEMS, [op.key]))
        now = datetime.now(UTC)
        texts = [] if self.index is None or op.index is False else _texts(value, self._paths_for(op.index))
        expiry = expiry_fields(op.ttl, now.timestamp())
        present = op.key in old and not is_expired(old[op.key], now.timestamp())  # an expired item is gone
        record = {
            "value": value,
            "created_at": old[op.key]["created_at"] if present else now.isoformat(),
            "updated_at": now.isoformat(),
            "vectors": len(texts),
            **expiry,
        }
        yield from _replace_steps(memory, op.key, texts, now, record, expiry["expires_at"])

    def _delete_steps(self, op: PutOp) -> Procedure[None]:
        key = self._key(op.namespace)
        memory = yield Call(self._memories, "sibling", (key,))
        old = yield Call(self._records, "get_records", (key, ITEMS, [op.key]))
        leaf_ids = yield Call(memory, "find", kwargs={"source_id": op.key})
        if op.key in old or leaf_ids:
            yield from _replace_steps(memory, op.key, [], None, None)
        # The namespace itself stays, even empty: deleting it here would need its
        # emptiness checked in the same transaction as the delete, or another
        # process's put acknowledged in between is wiped with it (issue 39). An empty
        # namespace is not listed (_holds_live_items), so nothing shows it.

    def _search_steps(self, op: SearchOp) -> Procedure[list[SearchItem]]:
        wanted = op.offset + op.limit
        if wanted == 0:
            return []
        found = yield Call(self._records, "list_namespaces", (self._key(op.namespace_prefix, allow_empty=True),))
        namespaces = [ns for ns in found if len(ns) > len(self.prefix)]
        hits: list[_Hit] = []
        ranked = bool(op.query) and self.index is not None  # without an index a query is ignored, as in LangGraph
        if ranked:
            hits = yield from self._ranked_steps(op, namespaces, wanted)
        if len(hits) < wanted:  # listing, or items no query can score (nothing indexed)
            hits += yield from self._listed_steps(op, namespaces, wanted - len(hits), unscored_only=ranked)
        page = hits[op.offset : wanted]
        if op.refresh_ttl:
            page = yield from self._refreshed_page(page)
        return [
            _item(ns[len(self.prefix) :], item_key, record, scores=scores, result=MemTreeSearchItem)
            for scores, ns, item_key, record in page
        ]

    def _ranked_steps(self, op: SearchOp, namespaces: list[NamespaceKey], wanted: int) -> Procedure[list[_Hit]]:
        """Items by their best leaf's score, across namespaces, filtered; a leaf under
        the memory's relevance floor (``config.min_similarity``, by default its
        embedder's calibrated one) does not count, as in ``MemTree.retrieve``.

        The filter applies to item values the tree does not hold, so this asks each
        tree for more leaves (4x per round) until enough items pass or every tree
        has given all it has. In traversal mode the beam reaches only a few leaves
        whatever ``k`` is, so the items it reaches come first (best first) and the
        other items follow by their collapsed score: ``limit`` and ``filter`` work
        as in collapsed mode, and the beam decides what leads.
        """
        assert op.query is not None
        vector = yield Call(self._memories, "embed_query", (op.query,))
        memories = []
        for ns in namespaces:
            memories.append((ns, (yield Call(self._memories, "sibling", (ns,)))))
        traversal = (self.mode or self._memories.config.mode) == "traversal"
        # A store search ranks items (LangGraph's scores are relevances): an overview
        # request is searched as a lookup, not answered by MemTree.overview.
        options = {"leaves_only": True, "query_embedding": vector, "route_overviews": False}
        k = wanted * 2 + 8
        while True:
            leaves: list[tuple[int, float, float, NamespaceKey, str]] = []  # (tier, hybrid, cosine, ...): tier 0 leads
            exhausted = True
            for ns, memory in memories:
                if traversal:
                    reached = yield Call(memory, "retrieve", (op.query,), {"k": k, "mode": "traversal", **options})
                    leaves += [_leaf(0, hit, ns) for hit in reached if hit.source_id is not None]
                results = yield Call(memory, "retrieve", (op.query,), {"k": k, "mode": "collapsed", **options})
                exhausted = exhausted and len(results) < k
                leaves += [_leaf(1, hit, ns) for hit in results if hit.source_id is not None]
            leaves.sort(key=lambda leaf: (leaf[0], -leaf[1]))
            best: dict[tuple[NamespaceKey, str], tuple[int, float, float]] = {}
            for tier, hybrid, cosine, ns, item_key in leaves:
                best.setdefault((ns, item_key), (tier, hybrid, cosine))
            hits: list[_Hit] = []
            now = time.time()
            for ns in namespaces:
                keys = [item_key for (space, item_key) in best if space == ns]
                records = (yield Call(self._records, "get_records", (ns, ITEMS, keys))) if keys else {}
                hits += [
                    ((best[(ns, item_key)][2], best[(ns, item_key)][1]), ns, item_key, record)
                    for item_key, record in records.items()
                    if not is_expired(record, now) and matches(record["value"], op.filter)
                ]
            # beam-reached first; equal scores in namespace order, then in the order first put
            # (leaf ids are random, so the tree's own order of equal scores is no order at all)
            place = {ns: position for position, ns in enumerate(namespaces)}
            hits.sort(
                key=lambda hit: (
                    best[(hit[1], hit[2])][0],
                    -best[(hit[1], hit[2])][1],
                    place[hit[1]],
                    str(hit[3].get("created_at", "")),
                    hit[2],
                )
            )
            if len(hits) >= wanted or exhausted:
                return hits
            k *= 4

    def _listed_steps(
        self, op: SearchOp, namespaces: list[NamespaceKey], wanted: int, *, unscored_only: bool
    ) -> Procedure[list[_Hit]]:
        """Items in namespace order, then in the order first put, filtered."""
        hits: list[_Hit] = []
        now = time.time()
        for ns in namespaces:
            records = yield Call(self._records, "get_records", (ns, ITEMS))
            for item_key, record in records.items():
                if (unscored_only and record.get("vectors", 0) > 0) or is_expired(record, now):
                    continue
                if matches(record["value"], op.filter):
                    hits.append((None, ns, item_key, record))
                    if len(hits) >= wanted:
                        return hits
        return hits

    def _list_steps(self, op: ListNamespacesOp) -> Procedure[list[tuple[str, ...]]]:
        found = yield Call(self._records, "list_namespaces", (self.prefix,))
        spaces = [ns for ns in found if len(ns) > len(self.prefix)]
        names = []
        for ns in spaces:
            if (yield from self._holds_live_items(ns)):
                names.append(ns[len(self.prefix) :])
        for condition in op.match_conditions or ():
            names = [ns for ns in names if namespace_matches(condition, ns)]
        if op.max_depth is not None:
            names = list({ns[: op.max_depth]: None for ns in names})
        names.sort()
        return names[op.offset : op.offset + op.limit]

    # -- expiry ------------------------------------------------------------------------

    def _holds_live_items(self, ns: NamespaceKey) -> Procedure[bool]:
        """Whether a namespace should be listed: it has an item that has not expired,
        or no items at all but leaves (as a middleware's tree does). One whose last
        item was deleted holds neither: namespaces are never deleted implicitly."""
        records = yield Call(self._records, "get_records", (ns, ITEMS))
        if not records:
            memory = yield Call(self._memories, "sibling", (ns,))
            return bool((yield Call(memory, "__len__")))
        now = time.time()
        return any(not is_expired(record, now) for record in records.values())

    def _refresh_steps(self, ns: NamespaceKey, keys: list[str]) -> Procedure[dict[str, dict[str, Any]]]:
        """Extend the expiry of these items by their own TTL from now (records and
        leaves), re-read under the write lock so a concurrent put is never undone;
        return the records as they are now (expired or deleted ones left out)."""
        yield Call(self._write_lock, "acquire")
        try:
            found = yield Call(self._records, "get_records", (ns, ITEMS, keys))
            now = time.time()
            live = {key: record for key, record in found.items() if not is_expired(record, now)}
            changed = {
                key: {**record, **expiry_fields(record["ttl_minutes"], now)}
                for key, record in live.items()
                if refreshable(record)
            }
            if changed:
                yield Call(self._records, "put_records", (ns, ITEMS, changed))
                memory = yield Call(self._memories, "sibling", (ns,))
                by_expiry: dict[float, list[str]] = {}  # one tree commit per expiry, not per item
                for key, record in changed.items():
                    by_expiry.setdefault(record["expires_at"], []).extend(
                        (yield Call(memory, "find", (), {"source_id": key}))
                    )
                for expires_at, leaf_ids in by_expiry.items():
                    yield from _set_expiry_steps(memory, leaf_ids, expires_at)
            return {**live, **changed}
        finally:
            self._write_lock.release()

    def _refreshed_page(self, page: list[_Hit]) -> Procedure[list[_Hit]]:
        """A search page with the expiry of its items refreshed (LangGraph's
        ``refresh_ttl``); an item deleted or expired meanwhile drops out."""
        keys: dict[NamespaceKey, list[str]] = {}
        for _, ns, item_key, record in page:
            if refreshable(record):
                keys.setdefault(ns, []).append(item_key)
        if not keys:
            return page
        current: dict[tuple[NamespaceKey, str], dict[str, Any]] = {}
        for ns, wanted in keys.items():
            refreshed = yield from self._refresh_steps(ns, wanted)
            current.update({(ns, key): record for key, record in refreshed.items()})
        return [
            (scores, ns, key, current.get((ns, key), record))
            for scores, ns, key, record in page
            if (ns, key) in current or not refreshable(record)
        ]

    def _sweep_steps(self) -> Procedure[int]:
        """Delete the expired items of every namespace (each checked again under the
        write lock: a put may have renewed it), then the trees' expired leaves."""
        found = yield Call(self._records, "list_namespaces", (self.prefix,))
        swept = 0
        for ns in (ns for ns in found if len(ns) > len(self.prefix)):
            records = yield Call(self._records, "get_records", (ns, ITEMS))
            now = time.time()
            for item_key in [key for key, record in records.items() if is_expired(record, now)]:
                yield Call(self._write_lock, "acquire")
                try:
                    again = yield Call(self._records, "get_records", (ns, ITEMS, [item_key]))
                    if item_key in again and is_expired(again[item_key], time.time()):
                        yield from self._delete_steps(PutOp(ns[len(self.prefix) :], item_key, None))
                        swept += 1
                finally:
                    self._write_lock.release()
            memory = yield Call(self._memories, "sibling", (ns,))
            yield Call(memory, "sweep_expired")
        return swept

    # -- helpers ---------------------------------------------------------------------

    def _paths_for(self, fields: list[str] | None) -> list[Path]:
        return self._paths if fields is None else tokenized(fields)

    @property
    def _records(self) -> Any:
        return self._memories.store

    def _key(self, namespace: Sequence[str], *, allow_empty: bool = False) -> NamespaceKey:
        if not allow_empty and not namespace:
            raise InvalidNamespaceError("Namespace cannot be empty.")
        return (*self.prefix, *namespace)


def _replace_steps(
    memory: MemTree,
    key: str,
    texts: list[tuple[str, str]],
    moment: datetime | None,
    record: dict[str, Any] | None,
    expires_at: float | None = None,
) -> Procedure[None]:
    """Make the item's leaves exactly ``texts`` and its record ``record`` (``None``:
    deleted) in one transaction (:meth:`MemTree.replace_source`), so a crash leaves
    both as they were or both as put. The leaves expire at ``expires_at``
    with the record.

    A leaf whose text is unchanged stays as it is. A changed text at a path the
    item already had corrects that path's leaf in place (the leaf keeps its id and
    is routed again if its meaning moved), so ``put`` on an existing key is an
    update, not a delete and a new memory. As in every LangGraph store, the value
    put over is gone: the leaf keeps no history of it (``keep_history=False``), so
    no export or read path shows a value the caller overwrote to be rid of it.
    Leaves no text needs any more are removed; texts at new paths are added.
    """
    if expires_at is not None and expires_at <= time.time():
        texts = []  # the item expired while it was being written: nothing to index
    yield Call(
        memory,
        "replace_source",
        (key, [text for _, text in texts]),
        {
            "metadata": [{"path": path} for path, _ in texts],
            "timestamp": moment,
            "records": {ITEMS: {key: record}},
            "expires_at": expires_at,
            "keep_history": False,
        },
    )


def _set_expiry_steps(memory: MemTree, leaf_ids: list[str], expires_at: float) -> Procedure[None]:
    """Give these leaves ``expires_at``; a leaf another writer removed meanwhile is
    left out (the others still get it)."""
    for _ in range(2):
        if not leaf_ids or expires_at <= time.time():
            return
        try:
            yield Call(memory, "set_expiry", (leaf_ids,), {"expires_at": expires_at})
            return
        except KeyError:
            leaf_ids = list((yield Call(memory, "get_many", (leaf_ids,))))


def _texts(value: Mapping[str, Any], paths: list[Path]) -> list[tuple[str, str]]:
    """(path label, text) for every non-empty text at the paths, as LangGraph names them."""
    out: list[tuple[str, str]] = []
    for path, tokens in paths:
        texts = [storable(text) for text in get_text_at_path(value, tokens)]
        for i, text in enumerate(texts):
            if text:
                out.append((f"{path}.{i}" if len(texts) > 1 else path, text))
    return out


def _checked_ops(ops: Iterable[Op]) -> list[Op]:
    """Every operation of a batch checked before any runs, so a bad one applies
    nothing (LangGraph's own stores also check every op before writing any)."""
    checked = [_tuple_namespace(op) for op in ops]
    for op in checked:
        if not isinstance(op, (GetOp, SearchOp, ListNamespacesOp, PutOp)):
            raise TypeError(f"unknown store operation {type(op).__name__}")
        if isinstance(op, ListNamespacesOp):
            _check_listing(op)
            continue
        namespace = op.namespace_prefix if isinstance(op, SearchOp) else op.namespace
        if not isinstance(namespace, tuple):
            raise InvalidNamespaceError(
                f"a namespace is a tuple of labels, got the {type(namespace).__name__} {namespace!r}; "
                f"write ({namespace!r},) for a namespace of one label"
            )
        validate_op_namespace(op)
        for label in namespace:
            _check_text(label, "namespace label", InvalidNamespaceError)
        if isinstance(op, SearchOp):
            check_filter(op.filter)
            for name in ("limit", "offset"):
                number = getattr(op, name)
                if isinstance(number, bool) or not isinstance(number, int):
                    raise TypeError(f"search: {name} must be an int >= 0, got {type(number).__name__} {number!r}")
                if number < 0:
                    raise ValueError(f"search: {name} must be an int >= 0, got {number!r}")
            continue
        if not isinstance(op.key, str):
            raise TypeError(f"item keys must be str, got {type(op.key).__name__}")
        _check_text(op.key, "item key", ValueError)
        if isinstance(op, PutOp):
            if op.namespace and op.namespace[0] == "langgraph":
                raise InvalidNamespaceError(f'Root label for namespace cannot be "langgraph". Got: {op.namespace}')
            if op.ttl is not None and op.value is not None:
                check_ttl_minutes(op.ttl)
            if op.index is not None and op.index is not False:
                tokenized(op.index, "put: index")  # False, None or a list of paths
            if op.value is not None:
                _checked_value(op.value)
    return checked


def _tuple_namespace(op: Op) -> Op:
    """``op`` with a list namespace (or search prefix) made a tuple, as LangGraph's
    ``SqliteStore`` and ``PostgresStore`` take ``store.search(["docs"])``."""
    if isinstance(op, SearchOp) and isinstance(op.namespace_prefix, list):
        return op._replace(namespace_prefix=tuple(op.namespace_prefix))
    if isinstance(op, (GetOp, PutOp)) and isinstance(op.namespace, list):
        return op._replace(namespace=tuple(op.namespace))
    return op


def _check_listing(op: ListNamespacesOp) -> None:
    for name in ("limit", "offset", "max_depth"):
        number = getattr(op, name)
        if number is not None and (isinstance(number, bool) or not isinstance(number, int) or number < 0):
            raise ValueError(f"list_namespaces: {name} must be >= 0 (an int), got {number!r}")


def _check_text(text: str, what: str, error: type[ValueError]) -> None:
    """A namespace label or item key the durable stores can hold: no NUL, valid Unicode."""
    problem = unstorable(text)
    if problem:
        raise error(f"{what} {text!r} {problem}; remove it (SQLite and PostgreSQL cannot store it)")


def _checked_value(value: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise TypeError(f"item values must be dicts, got {type(value).__name__}")
    try:
        text = json.dumps(dict(value), ensure_ascii=False, allow_nan=False)
    except RecursionError:
        raise ValueError(
            "item value is nested too deeply to store as JSON; flatten it (a few hundred levels at most)"
        ) from None
    except (TypeError, ValueError) as error:
        raise TypeError(f"item values must be JSON-serializable: {error}") from None
    problem = unstorable(value)
    if problem:
        raise ValueError(f"item value {problem}; fix the text before storing")
    try:
        return json.loads(text)  # type: ignore[no-any-return]
    except RecursionError:  # json.dumps nests deeper than json.loads reads back
        raise ValueError(
            "item value is nested too deeply to store as JSON; flatten it (a few hundred levels at most)"
        ) from None


def _leaf(tier: int, hit: RetrievedNode, ns: NamespaceKey) -> tuple[int, float, float, NamespaceKey, str]:
    """A ranked leaf as (tier, hybrid score, cosine, namespace, item key)."""
    assert hit.source_id is not None
    cosine = hit.similarity if hit.similarity is not None else hit.score
    return (tier, hit.score, cosine, ns, hit.source_id)


def _item(
    namespace: tuple[str, ...],
    key: str,
    record: dict[str, Any],
    *,
    scores: tuple[float, float] | None = None,
    result: type[Item] = Item,
) -> Any:
    times = {
        "created_at": datetime.fromisoformat(record["created_at"]),
        "updated_at": datetime.fromisoformat(record["updated_at"]),
    }
    if result is MemTreeSearchItem:
        cosine, hybrid = scores if scores is not None else (None, None)
        return MemTreeSearchItem(tuple(namespace), key, record["value"], score=cosine, memtree_score=hybrid, **times)
    return Item(value=record["value"], key=key, namespace=tuple(namespace), **times)
