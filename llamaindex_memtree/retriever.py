"""``MemTreeRetriever``: a LlamaIndex retriever over a memtree memory.

It translates the query and LlamaIndex's metadata filters into one call of
:meth:`MemTree.retrieve <memtree.MemTree.retrieve>` (or ``aretrieve``) and the
results into ``NodeWithScore`` objects; the ranking is the engine's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.callbacks.base import CallbackManager
from llama_index.core.schema import NodeWithScore, QueryBundle
from llama_index.core.storage.docstore.types import BaseDocumentStore
from llama_index.core.vector_stores.types import FilterCondition, FilterOperator, MetadataFilter, MetadataFilters

from llamaindex_memtree.nodes import to_node_with_score
from memtree import MemTree, RetrievedNode
from memtree.inputs import TimeLike


class MemTreeRetriever(BaseRetriever):
    """Retrieve leaves and summaries of a :class:`~memtree.MemTree` for a query.

    ``similarity_top_k`` is the number of results, ``mode`` ``"collapsed"`` (every
    node scored at once) or ``"traversal"`` (beam descent), ``token_budget`` caps the
    tokens of the joined results (the last one is cut to fit). ``filters`` are
    LlamaIndex ``MetadataFilters`` of equality conditions joined by AND (they keep
    leaves whose metadata match); ``time_range=(start, end)`` keeps nodes whose event
    time lies inside. Unset options take the memory's ``config`` defaults.

    Leaves come back as their original nodes when ``docstore`` holds them, summaries
    as ``TextNode`` s whose ``CHILD`` relationships name the nodes they summarize.
    Every result's metadata has ``memtree_id``, ``depth``, ``is_leaf``, ``timestamp``
    and ``leaf_ids``.

    Example::

        retriever = MemTreeRetriever(memory, similarity_top_k=5, token_budget=800)
        for result in retriever.retrieve("Where did Maya go hiking?"):
            print(result.score, result.node.metadata["depth"], result.node.get_content())
    """

    def __init__(
        self,
        memory: MemTree,
        *,
        similarity_top_k: int | None = None,
        mode: str | None = None,
        token_budget: int | None = None,
        leaves_only: bool = False,
        filters: MetadataFilters | None = None,
        time_range: tuple[TimeLike | None, TimeLike | None] | None = None,
        min_score: float | None = None,
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
        self.where = where_from_filters(filters)
        self.time_range = time_range
        self.min_score = min_score
        self.docstore = docstore
        super().__init__(callback_manager=callback_manager, object_map=object_map, verbose=verbose)

    def _options(self) -> dict[str, Any]:
        return {
            "k": self.similarity_top_k,
            "mode": self.mode,
            "token_budget": self.token_budget,
            "leaves_only": self.leaves_only,
            "where": self.where,
            "time_range": self.time_range,
            "min_score": self.min_score,
        }

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return self._convert(self.memory.retrieve(query_bundle.query_str, **self._options()))

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return self._convert(await self.memory.aretrieve(query_bundle.query_str, **self._options()))

    def _convert(self, hits: Sequence[RetrievedNode]) -> list[NodeWithScore]:
        summarized = {leaf_id for hit in hits if not hit.is_leaf for leaf_id in hit.leaf_ids}
        source_ids = {leaf_id: leaf.source_id for leaf_id, leaf in self.memory.get_many(summarized).items()}
        return [to_node_with_score(hit, self.docstore, source_ids) for hit in hits]


def where_from_filters(filters: MetadataFilters | None) -> dict[str, Any] | None:
    """LlamaIndex metadata filters as the engine's ``where`` (metadata equality, AND).

    Raises ``ValueError`` naming what the engine cannot filter on: another operator,
    an OR / NOT condition, nested filter groups, or two values for one key.
    """
    if filters is None:
        return None
    if not isinstance(filters, MetadataFilters):
        raise TypeError(f"filters must be llama_index MetadataFilters, got {type(filters).__name__}")
    if filters.condition not in (None, FilterCondition.AND) and len(filters.filters) > 1:
        raise ValueError(
            f"memtree filters support only equality conditions joined by AND, got condition {filters.condition!r}"
        )
    where: dict[str, Any] = {}
    for condition in filters.filters:
        if not isinstance(condition, MetadataFilter):
            raise ValueError("memtree filters do not support nested MetadataFilters; flatten them into one AND list")
        if condition.operator != FilterOperator.EQ:
            raise ValueError(
                f"memtree filters support only equality (FilterOperator.EQ), got {condition.operator!r} "
                f"for key {condition.key!r}"
            )
        if condition.key in where and where[condition.key] != condition.value:
            raise ValueError(f"two different values for metadata key {condition.key!r} can never both match")
        where[condition.key] = condition.value
    return where or None
