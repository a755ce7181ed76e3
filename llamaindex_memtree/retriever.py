"""``MemTreeRetriever``: a LlamaIndex retriever over a memtree memory.

It translates the query and LlamaIndex's metadata filters into one call of
:meth:`MemTree.retrieve <memtree.MemTree.retrieve>` (or ``aretrieve``) and the
results into ``NodeWithScore`` objects; the ranking is the engine's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.callbacks.base import CallbackManager
from llama_index.core.constants import DEFAULT_SIMILARITY_TOP_K
from llama_index.core.schema import NodeWithScore, QueryBundle
from llama_index.core.storage.docstore.types import BaseDocumentStore
from llama_index.core.vector_stores.types import MetadataFilters

from llamaindex_memtree.filters import narrowed_time_range, translate_filters
from llamaindex_memtree.nodes import to_node_with_score
from memtree import MemTree, RetrievedNode
from memtree.inputs import TimeLike, to_min_score, to_time_range
from memtree.intent import ALWAYS
from memtree.summary_hits import check_summary_hits


class MemTreeRetriever(BaseRetriever):
    """Retrieve leaves and summaries of a :class:`~memtree.MemTree` for a query.

    ``similarity_top_k`` is the number of results (LlamaIndex's default, 2, as for
    ``VectorIndexRetriever``; ``None``: the memory's ``config.k``), ``mode``
    ``"collapsed"`` (every node scored at once) or ``"traversal"`` (beam descent),
    ``token_budget`` caps the tokens of the joined results (the last one is cut to
    fit). ``filters`` are LlamaIndex ``MetadataFilters`` (every ``FilterOperator``;
    conditions ``AND``, ``OR``, ``NOT``, nested), kept as the engine's ``where``
    (they keep leaves whose metadata pass);
    ``time_range=(start, end)`` keeps nodes whose event time lies inside, and so do
    top-level ``AND`` conditions on ``timestamp_key`` (the index's, when the
    retriever comes from ``MemTreeIndex.as_retriever``), compared as times. Unset
    options take the memory's ``config`` defaults.

    Results come in the engine's order (its hybrid ranking: cosine and BM25 mixed,
    summaries discounted), and each ``NodeWithScore.score`` is the node's plain
    cosine with the query, as a ``VectorStoreIndex`` with the same embedder reports
    it: a ``SimilarityPostprocessor(similarity_cutoff=...)`` tuned there keeps the
    same meaning here. Scores therefore need not decrease down the list; the
    ranking score is in the node's ``memtree_score`` metadata, and ``min_score``
    cuts on it (not on the cosine).

    ``min_similarity`` is the relevance floor on that cosine, as ``MemTree.retrieve``
    applies it: ``"auto"`` (the default) is the memory's own
    (``config.min_similarity``, by default its embedder's calibrated floor), so a
    question nothing in the index is about retrieves nothing; ``None`` turns it
    off (``MemTreeConfig(min_similarity=None)`` turns it off everywhere).

    A summary that ranks delivers its best leaves in its place (``summary_hits``,
    default the memory's ``"leaves"``; ``"text"`` delivers the summary itself).
    Leaves come back as their original nodes when ``docstore`` holds them, summaries
    as ``TextNode`` s whose ``CHILD`` relationships name the nodes they summarize.
    Every result's metadata has ``memtree_id``, ``depth``, ``is_leaf``, ``timestamp``,
    ``leaf_ids``, ``memtree_score``, ``found_by`` (the summary that brought a leaf
    in, or ``None``) and ``answered_by``.

    ``route_overviews``: ``None`` (the memory's, on by default) answers an overview
    request ("What do you know about Maya?", "What happened in May?") with
    ``MemTree.overview``: the memory's parts about it, in time order, each dated
    (``answered_by="overview"``); ``False`` ranks it as any question; ``"always"``
    answers every query so, the retriever's (and its query and chat engines')
    overview mode.

    Example::

        retriever = MemTreeRetriever(memory, similarity_top_k=5, token_budget=800)
        for result in retriever.retrieve("Where did Maya go hiking?"):
            print(result.score, result.node.metadata["depth"], result.node.get_content())
    """

    def __init__(
        self,
        memory: MemTree,
        *,
        similarity_top_k: int | None = DEFAULT_SIMILARITY_TOP_K,
        mode: str | None = None,
        token_budget: int | None = None,
        leaves_only: bool = False,
        summary_hits: str | None = None,
        filters: MetadataFilters | None = None,
        time_range: tuple[TimeLike | None, TimeLike | None] | None = None,
        min_similarity: float | Literal["auto"] | None = "auto",
        min_score: float | None = None,
        route_overviews: bool | Literal["always"] | None = None,
        timestamp_key: str | None = None,
        docstore: BaseDocumentStore | None = None,
        callback_manager: CallbackManager | None = None,
        object_map: dict[str, Any] | None = None,
        verbose: bool = False,
    ) -> None:
        if not isinstance(memory, MemTree):
            raise TypeError(f"memory must be a memtree.MemTree, got {type(memory).__name__}")
        self.memory = memory
        self.similarity_top_k = similarity_top_k
        self.mode = mode
        self.token_budget = token_budget
        self.leaves_only = leaves_only
        self.summary_hits = check_summary_hits(summary_hits) if summary_hits is not None else None
        translated = translate_filters(filters, timestamp_key)
        self.where = translated.where
        self.time_range = narrowed_time_range(to_time_range(time_range), translated.time_range)
        start, end = self.time_range or (None, None)
        self._matches_nothing = start is not None and end is not None and start > end  # contradicting times
        if min_similarity != "auto" and min_similarity is not None:
            to_min_score(min_similarity, "min_similarity")  # a bad floor fails now, not at the first query
        self.min_similarity = min_similarity
        self.min_score = min_score
        if route_overviews not in (None, True, False, ALWAYS):
            raise ValueError(f"route_overviews must be True, False, 'always' or None, got {route_overviews!r}")
        self.route_overviews = route_overviews
        self.docstore = docstore
        super().__init__(callback_manager=callback_manager, object_map=object_map, verbose=verbose)

    def _options(self) -> dict[str, Any]:
        return {
            "k": self.similarity_top_k,
            "mode": self.mode,
            "token_budget": self.token_budget,
            "leaves_only": self.leaves_only,
            "summary_hits": self.summary_hits,
            "where": self.where,
            "time_range": self.time_range,
            "min_similarity": self.min_similarity,
            "min_score": self.min_score,
            "route_overviews": self.route_overviews,
        }

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        if self._matches_nothing:
            return []
        return self._convert(self.memory.retrieve(query_bundle.query_str, **self._options()))

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        if self._matches_nothing:
            return []
        return self._convert(await self.memory.aretrieve(query_bundle.query_str, **self._options()))

    def _convert(self, hits: Sequence[RetrievedNode]) -> list[NodeWithScore]:
        summarized = {leaf_id for hit in hits if not hit.is_leaf for leaf_id in hit.leaf_ids}
        source_ids = {leaf_id: leaf.source_id for leaf_id, leaf in self.memory.get_many(summarized).items()}
        return [to_node_with_score(hit, self.docstore, source_ids) for hit in hits]
