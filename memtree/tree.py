"""``MemTree``: the public entry point of the engine, a facade.

Each operation delegates in one step to the part whose job it is:

* writes (add, delete, repair, flush, import) to :class:`~memtree.writer.Writer`,
  where a text enters once and leaves committed;
* reads and the catch-up with other writers to :class:`~memtree.replica.Replica`,
  this process's copy of the namespace;
* queries to :mod:`memtree.retrieval`, pictures to :mod:`memtree.viz`, backups to
  :mod:`memtree.backup`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, TextIO

import numpy as np

from memtree import backup, viz
from memtree.aggregate import Aggregator
from memtree.config import MemTreeConfig
from memtree.embed import Embedder
from memtree.index import VectorIndex
from memtree.inputs import TimeLike, make_item
from memtree.integrity import integrity_problems
from memtree.model_calls import ModelCalls
from memtree.model_choice import choose_models
from memtree.node import Node, RetrievedNode, Vector
from memtree.replica import Replica
from memtree.retrieval import answer, check_query
from memtree.state import TreeState
from memtree.stats import Counters, TreeStats, tree_stats
from memtree.store.base import Namespace, NamespaceKey, Store, namespace_key
from memtree.store.location import as_store, open_store
from memtree.text import require_text
from memtree.viz.picture import Direction
from memtree.writer import AGGREGATION_MODES, Aggregation, DeferredAggregation, Writer, check_leaf_id

__all__ = ["AGGREGATION_MODES", "SIBLING_CACHE_SIZE", "Aggregation", "DeferredAggregation", "MemTree"]

logger = logging.getLogger(__name__)

SIBLING_CACHE_SIZE = 256
"""Namespace handles :meth:`MemTree.sibling` keeps open per memory."""


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
        embedder, aggregator = choose_models(embedder, aggregator, llm)
        self.namespace: NamespaceKey = namespace_key(namespace)
        self.store, owns_store = as_store(store)
        try:
            self._replica = Replica(
                self.store, self.namespace, lexical=self.config.lexical_weight > 0, refresh_interval=refresh_interval
            )
        except BaseException:
            if owns_store:
                self.store.close()
            raise
        self._counters = Counters()
        self._calls = ModelCalls(embedder, aggregator, self._counters, self.config.max_concurrency)
        self._writer = Writer(self._replica, self._calls, self.config)
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
        """Stop worker threads, and close the store if this memory opened it
        (:meth:`open`); a store passed in is the caller's to close.

        Summaries still waiting for a deferred aggregation are not written (they stay
        stale in the store; ``repair()`` rewrites them later)."""
        pending = len(self._writer.pending)
        if pending and not self._closed:
            logger.warning("closing with %d summaries still deferred; call flush() first or repair() later", pending)
        self._closed = True
        self._calls.close()
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
    ) -> str:
        """Remember one text; return its leaf id (an identical stored text's id if
        ``config.deduplicate``). ``timestamp`` is when the event happened; ``source_id``
        is your id for it (message id, document node id). Inside a
        :meth:`deferred` block the summaries above it are written at the block's end."""
        return self._writer.add(make_item(text, metadata, timestamp, source_id))

    async def aadd(
        self,
        text: str,
        *,
        metadata: Mapping[str, Any] | None = None,
        timestamp: TimeLike | None = None,
        source_id: str | None = None,
    ) -> str:
        """Async :meth:`add`: aggregations run on the event loop (``aaggregate``)."""
        return await self._writer.aadd(make_item(text, metadata, timestamp, source_id))

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

        ``aggregation="eager"`` (the default outside a :meth:`deferred` block)
        rewrites the summaries on each item's path as it goes, as in the paper.
        ``"deferred"`` commits every leaf first and then rewrites each touched
        summary once with all its new texts in one model call: the same leaves for
        far fewer calls (the default inside a :meth:`deferred` block).
        """
        return self._writer.add_many((texts, metadata, timestamps, source_ids), aggregation, self.deferred())

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
        return await self._writer.aadd_many((texts, metadata, timestamps, source_ids), aggregation, self.deferred())

    # -- deferred aggregation ------------------------------------------------------------

    def deferred(self) -> DeferredAggregation[MemTree]:
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
        return DeferredAggregation(self._writer, self)

    def flush(self) -> int:
        """Write every summary whose aggregation was deferred; return how many.

        Each is rewritten once, in one model call with all its new texts (several
        calls if they exceed ``config.aggregation_max_words``). Calls run
        concurrently up to ``config.max_concurrency``. A summary that still cannot
        be written stays stale; the next :meth:`flush` or :meth:`repair` retries it.
        """
        return self._writer.flush()

    async def aflush(self) -> int:
        """Async :meth:`flush`."""
        return await self._writer.aflush()

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
        whose metadata equals each given item; ``time_range=(start, end)`` keeps
        nodes whose event time lies inside (either side may be ``None``).
        ``query_embedding`` is the query's vector if you already have it (from this
        memory's embedder), e.g. to search many namespaces with one embedding call.
        ``lexical_weight`` overrides the config's share of BM25 in the score for this
        call (``0`` ranks by cosine similarity alone, as the paper does).
        """
        options = (k, token_budget, mode, leaves_only, where, time_range, min_score, lexical_weight)
        checked = check_query(self.config, self._state, query, *options)
        self._replica.maybe_refresh()
        if query_embedding is not None:
            vector = self._writer.procedures.check_vectors(np.atleast_2d(query_embedding), 1)[0]
        else:
            vector = self._writer.embed_query(query)
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
    ) -> list[RetrievedNode]:
        """Async :meth:`retrieve`."""
        options = (k, token_budget, mode, leaves_only, where, time_range, min_score, lexical_weight)
        checked = check_query(self.config, self._state, query, *options)
        await asyncio.to_thread(self._replica.maybe_refresh)
        if query_embedding is not None:
            vector = self._writer.procedures.check_vectors(np.atleast_2d(query_embedding), 1)[0]
        else:
            vector = await self._writer.aembed_query(query)
        return answer(self._replica, checked, vector, self.config.beam)

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

    # -- deleting and repairing ----------------------------------------------------

    def delete(self, node_id: str) -> None:
        """Forget a leaf. Its ancestors are rewritten from what remains (no summary
        keeps its text) and a parent left with one child is folded away.
        Raises ``KeyError`` for an unknown id and ``ValueError`` for a summary id."""
        check_leaf_id(node_id)
        self._writer.delete([node_id])

    async def adelete(self, node_id: str) -> None:
        """Async :meth:`delete`."""
        check_leaf_id(node_id)
        await self._writer.adelete([node_id])

    def delete_many(self, node_ids: Iterable[str]) -> int:
        """Forget several leaves in one change (for example all of one ``source_id``:
        ``memory.delete_many(memory.find(source_id=...))``); return how many.

        The tree left is the one :meth:`delete` would leave one leaf at a time, but
        each affected summary is rewritten once, and summaries of one depth are
        rewritten concurrently. Every id is checked first: an unknown id
        (``KeyError``) or a summary id (``ValueError``) deletes nothing.
        """
        return self._writer.delete(node_ids)

    async def adelete_many(self, node_ids: Iterable[str]) -> int:
        """Async :meth:`delete_many`."""
        return await self._writer.adelete(node_ids)

    def repair(self) -> int:
        """Rewrite every stale summary (deepest first); return how many were fixed."""
        return self._writer.write(self._writer.procedures.repair)

    async def arepair(self) -> int:
        """Async :meth:`repair`."""
        return await self._writer.awrite(self._writer.procedures.repair)

    # -- backups ---------------------------------------------------------------------------

    def export_jsonl(self, target: str | os.PathLike[str] | TextIO) -> int:
        """Write this namespace (tree and records) as a JSONL backup to a path or text
        stream; return the number of nodes written. The format is documented in
        :mod:`memtree.backup`: human-readable, embeddings included, no pickle."""
        return backup.export_jsonl(self.store, self.namespace, target)

    def import_jsonl(self, source: str | os.PathLike[str] | TextIO, *, skip_bad: bool = False) -> int:
        """Restore a JSONL backup into this namespace, which must be empty; return the
        number of nodes imported. Nothing is re-embedded. The whole file is checked
        first: a problem raises ``ValueError("line N: ...")`` and imports nothing,
        unless ``skip_bad=True`` skips bad lines (with a warning) and routes leaves
        that lost their summaries in again. The tree is written in one transaction,
        records and re-routed leaves after it: if an import is interrupted, delete
        the namespace and import again."""
        return backup.import_jsonl(self._writer, source, skip_bad=skip_bad)

    # -- reading the tree -------------------------------------------------------------

    def get(self, node_id: str) -> Node:
        """A copy of a node (``KeyError`` naming the id if there is none)."""
        return self._replica.get(node_id)

    def get_many(self, node_ids: Iterable[str]) -> dict[str, Node]:
        """Copies of those of ``node_ids`` that exist, by id, read from one snapshot.

        Ids not in the tree are left out instead of raising, so a caller resolving
        the ``leaf_ids`` of a retrieval result tolerates a delete that happened since.
        """
        return self._replica.get_many(node_ids)

    def find(self, *, source_id: str) -> list[str]:
        """Ids of the leaves stored with this ``source_id``, oldest first."""
        return self._replica.read(lambda state: list(state.leaves_by_source.get(source_id, [])))

    def leaf_ids_under(self, node_id: str) -> tuple[str, ...]:
        """Ids of the leaves below a node."""
        return self._replica.leaf_ids_under(node_id)

    def walk(self) -> Iterator[Node]:
        """Copies of every node, root first, in depth-first pre-order (a snapshot)."""
        return iter(self._replica.snapshot())

    __iter__ = walk

    def leaves(self) -> list[Node]:
        """Copies of all leaves, oldest first."""
        return sorted((node for node in self.walk() if node.is_leaf), key=lambda n: (n.created_at, n.id))

    def __len__(self) -> int:
        """The number of leaves (texts remembered)."""
        return self._replica.read(lambda state: state.leaf_total)

    def to_dict(self) -> dict[str, Any]:
        """The tree as nested dicts (id, text, depth, leaf_count, timestamp, metadata, children)."""
        return self._replica.read(viz.to_dict)

    def format_tree(self, *, max_depth: int | None = None, width: int = 72) -> str:
        """An indented outline of the tree (depth, leaf count and a preview per node)."""
        return self._replica.read(viz.format_tree, max_depth=max_depth, width=width)

    def to_mermaid(
        self, *, max_depth: int | None = None, width: int = 80, line_width: int = 28, direction: Direction = "LR"
    ) -> str:
        """The tree as a Mermaid ``flowchart`` (paste it into Markdown between
        ```` ```mermaid ```` fences). Each box shows a title (leaf count, or a leaf's
        date) over the first ``width`` characters of the node's text, wrapped at
        ``line_width``; below ``max_depth`` a "… N more below" box stands in."""
        options = {"max_depth": max_depth, "width": width, "line_width": line_width, "direction": direction}
        return self._replica.read(viz.to_mermaid, **options)

    def to_dot(
        self, *, max_depth: int | None = None, width: int = 80, line_width: int = 28, direction: Direction = "LR"
    ) -> str:
        """The tree as a Graphviz DOT ``digraph`` (same boxes as :meth:`to_mermaid`;
        in SVG output each box's tooltip is its full text)."""
        options = {"max_depth": max_depth, "width": width, "line_width": line_width, "direction": direction}
        return self._replica.read(viz.to_dot, **options)

    def to_png(self, path: str | os.PathLike[str] | None = None, **options: Any) -> bytes:
        """The :meth:`to_dot` picture drawn as PNG by Graphviz; written to ``path`` if given.

        Takes :meth:`to_dot`'s keyword options. Raises
        :class:`~memtree.viz.GraphvizNotFoundError` (naming ``apt-get install
        graphviz``) when the ``dot`` program is not installed.
        """
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
        answered = viz.answer_queries(self.retrieve, queries, k=k, mode=mode, shown_mode=self.config.mode)
        name = "/".join(self.namespace)
        options = {"expand_depth": expand_depth, "max_depth": max_depth, "k": k or self.config.k}
        return self._replica.read(
            viz.to_html, title=title or f"memtree · {name}", namespace=name, queries=answered, **options
        )

    def stats(self) -> TreeStats:
        """Size, shape and cost counters (see :class:`~memtree.stats.TreeStats`)."""
        writer = self._writer
        return self._replica.read(
            lambda state: tree_stats(
                state, self._counters.snapshot(), writer.procedures.theta0(), pending=len(writer.pending)
            )
        )

    def check_integrity(self) -> list[str]:
        """Every broken invariant of the tree and its index, described (empty: sound)."""
        return self._replica.read(lambda state: integrity_problems(state, self._index, self.config.depth_cap))

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

    @property
    def _state(self) -> TreeState:
        return self._replica.state

    @property
    def _index(self) -> VectorIndex | None:
        return self._replica.index
