"""``MemTreeRetriever``: a MemTree as a LangChain retriever.

Every option of :meth:`memtree.MemTree.retrieve` is a field; as for LangChain's
vector-store retrievers, ``search_kwargs`` (``{"k": 1}``, ``{"filter": {...}}``,
``{"score_threshold": 0.4}``) override them, and so do keywords of one call
(``retriever.invoke("query", k=3)``). An unknown field, search keyword or call
keyword raises instead of being ignored. Each result becomes a
``Document`` whose ``page_content`` is the result's ``context`` (its text minus
sentences a better-ranked result already gave; budgets are charged on it, so the
documents joined fit ``token_budget``) and whose metadata is plain JSON.
"""

from __future__ import annotations

from typing import Any, Literal

from langchain_core.callbacks import AsyncCallbackManagerForRetrieverRun, CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from pydantic import ConfigDict, Field, ValidationInfo, field_validator

from memtree import MemTree, RetrievedNode
from memtree.config import RetrievalMode
from memtree.inputs import TimeLike, to_min_score, to_time_range
from memtree.node import time_text

OPTIONS = (
    "k",
    "token_budget",
    "mode",
    "leaves_only",
    "where",
    "time_range",
    "min_similarity",
    "min_score",
    "summary_hits",
    "route_overviews",
)
"""Retrieval options a call (or ``search_kwargs``) may override."""

SEARCH_ALIASES = {"filter": "where", "score_threshold": "min_similarity"}
"""``search_kwargs`` names of LangChain's vector-store retrievers and the options
they stand for: a metadata filter, and a relevance floor on cosine similarity."""


class MemTreeRetriever(BaseRetriever):
    """Retrieve the nodes of a memory tree (leaves and summaries) as Documents.

    Fields (each overridable per call as a keyword of ``invoke``/``ainvoke``):
    ``k`` (default: the memory's ``config.k``), ``token_budget``, ``mode``
    (``"collapsed"`` or ``"traversal"``), ``leaves_only``, ``where`` (a leaf
    metadata filter, ``{"topic": "dog", "year": {"$gte": 2024}}``: see
    :mod:`memtree.where`), ``time_range`` (``(start, end)`` on event time),
    ``min_similarity`` (the relevance floor, a cosine; ``"auto"``, the default: the
    memory's, as ``MemTree.retrieve`` applies it, by default its embedder's
    calibrated floor; ``None``: no floor), ``min_score`` and ``summary_hits`` (what
    a summary that ranks delivers: ``"leaves"``, its best leaves, by default;
    ``"text"``, its own text) and ``route_overviews`` (``None``: the memory's, which
    answers an overview request such as "What do you know about Maya?" with
    ``MemTree.overview``; ``False``: never; ``"always"``: the retriever's overview
    mode, every query answered by an overview of what it names, in time order, each
    part dated). ``search_kwargs`` takes the same names, and
    LangChain's ``filter`` (for ``where``) and ``score_threshold`` (for
    ``min_similarity``).

    Document metadata: ``id``, ``score``, ``depth``, ``is_leaf``, ``timestamp``
    (ISO 8601, UTC, or ``None``; a stored number no date can show comes raw), ``leaf_ids`` (the leaves below the node),
    ``source_id``, ``found_by`` (the summary whose match brought the leaf in, or
    ``None``), ``answered_by`` (``"retrieve"`` or ``"overview"``: which path gave it)
    and ``metadata`` (the node's own metadata).

    Example::

        retriever = MemTreeRetriever(memory=memory, k=4, token_budget=300)
        docs = retriever.invoke("What is Maya's dog called?", k=2)
        retriever = MemTreeRetriever(memory=memory, search_kwargs={"k": 1})  # as a vector store's
        overview = MemTreeRetriever(memory=memory, route_overviews="always", token_budget=500)
        docs = overview.invoke("Maya's running")  # her running, breadth first, in time order
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")

    memory: MemTree
    k: int | None = None
    token_budget: int | None = None
    mode: RetrievalMode | None = None
    leaves_only: bool = False
    where: dict[str, Any] | None = None
    time_range: tuple[TimeLike | None, TimeLike | None] | None = None
    min_similarity: float | Literal["auto"] | None = "auto"
    min_score: float | None = None
    summary_hits: Literal["leaves", "text"] | None = None
    route_overviews: bool | Literal["always"] | None = None
    search_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Options as LangChain's vector-store retrievers take them; they override the fields."""

    @field_validator("k", "token_budget", mode="before")
    @classmethod
    def _positive(cls, value: Any, info: ValidationInfo) -> Any:
        """Refuse a count the engine would refuse, now rather than at the first query."""
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
            default = "config.k" if info.field_name == "k" else "config.token_budget"
            raise ValueError(
                f"{info.field_name} must be a positive integer, got {value!r}; pass None to use the memory's {default}"
            )
        return value

    @field_validator("min_similarity")
    @classmethod
    def _floor(cls, value: Any) -> Any:
        if value != "auto" and value is not None:
            to_min_score(value, "min_similarity")  # NaN would keep everything
        return value

    @field_validator("search_kwargs")
    @classmethod
    def _search_names(cls, value: dict[str, Any]) -> dict[str, Any]:
        _translated(value, "search_kwargs")  # an unknown name fails now, not at the first query
        return value

    @field_validator("time_range")
    @classmethod
    def _times(cls, value: Any) -> Any:
        to_time_range(value)  # raises, naming the bad side, for text that is not a date
        return value

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun, **options: Any
    ) -> list[Document]:
        return [to_document(hit) for hit in self.memory.retrieve(query, **self._options(options))]

    async def _aget_relevant_documents(
        self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun, **options: Any
    ) -> list[Document]:
        return [to_document(hit) for hit in await self.memory.aretrieve(query, **self._options(options))]

    def _options(self, overrides: dict[str, Any]) -> dict[str, Any]:
        options = {name: getattr(self, name) for name in OPTIONS}
        options.update(_translated(self.search_kwargs, "search_kwargs"))  # read per call: callers change it
        options.update(_translated(overrides, "retrieval option"))
        return options


def _translated(given: dict[str, Any], what: str) -> dict[str, Any]:
    """``given`` with LangChain's names made memtree's; an unknown name raises."""
    unknown = sorted(set(given) - set(OPTIONS) - set(SEARCH_ALIASES))
    if unknown:
        allowed = ", ".join([*OPTIONS, *SEARCH_ALIASES])
        raise TypeError(f"unknown {what}(s) {unknown}; choose from: {allowed}")
    return {SEARCH_ALIASES.get(name, name): value for name, value in given.items()}


def to_document(hit: RetrievedNode) -> Document:
    """A retrieval result as a Document with JSON-friendly metadata."""
    return Document(
        id=hit.id,
        page_content=hit.context or hit.text,
        metadata={
            "id": hit.id,
            "score": float(hit.score),
            "depth": hit.depth,
            "is_leaf": hit.is_leaf,
            "timestamp": time_text(hit.timestamp),
            "leaf_ids": list(hit.leaf_ids),
            "source_id": hit.source_id,
            "found_by": hit.found_by,
            "answered_by": hit.answered_by,
            "metadata": dict(hit.metadata),
        },
    )
