"""LangGraph's ``index`` configuration, read for :class:`~langchain_memtree.MemTreeStore`.

LangGraph stores take ``index={"dims": ..., "embed": ..., "fields": [...]}``: no
``index``, no embeddings (an exact key-value store); with it, the named fields of
each value are embedded for semantic search. This module turns that dictionary
into what the store needs: the fields (as LangGraph's tokenized paths) and the
memtree :class:`~memtree.embed.Embedder` to use, or ``None`` for the memory's own.

``embed`` may be anything LangGraph accepts that can run here:

* a LangChain ``Embeddings`` (or a LlamaIndex embedding, or a memtree ``Embedder``);
* a function ``texts -> vectors``, sync or async (as LangGraph, an async one
  serves only the async methods: ``aput``, ``asearch``...);
* a ``"provider:model"`` string: ``"local:<sentence-transformers model>"``
  (offline) and ``"openai:<model>"`` are memtree's own clients; other providers go
  through LangChain's ``init_embeddings``, which needs that provider's package.

``dims``, when given, is checked against every embedding the store makes, so a
model of another size fails on its first call with both numbers in the message.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from langgraph.store.base import IndexConfig, tokenize_path
from langgraph.store.base.embed import ensure_embeddings

from memtree.embed import Embedder, Matrix
from memtree.models.resolve import is_langchain_embeddings, is_llamaindex_embedding, resolve_embedder

INDEX_KEYS = ("dims", "embed", "fields", "distance_type")
"""The keys of LangGraph's ``IndexConfig`` (and ``PostgresIndexConfig``'s
``distance_type``) that ``MemTreeStore`` accepts."""

DISTANCE_TYPES = ("cosine",)
"""The ``distance_type`` values accepted: memtree ranks by cosine similarity."""

MEMTREE_PROVIDERS = ("local", "openai")
"""``"provider:model"`` strings memtree's own clients serve (no LangChain package needed)."""

Path = tuple[str, str | list[str]]
"""A field as written (``"notes[*].body"``) and as LangGraph tokenizes it (``"$"``: the whole value)."""


@dataclass(frozen=True)
class StoreIndex:
    """What a store's ``index`` configuration asks for.

    ``fields`` are the JSON paths embedded by default; ``embedder`` embeds them
    (``None``: the memory's own embedder); ``dims`` is the size the caller declared.
    """

    fields: tuple[str, ...]
    embedder: Embedder | None
    dims: int | None

    @property
    def paths(self) -> list[Path]:
        return tokenized(self.fields)

    def embedder_over(self, default: Embedder) -> Embedder | None:
        """The embedder the store's trees need instead of ``default`` (the memory's),
        or ``None`` when ``default`` serves as it is."""
        if self.dims is not None:
            return SizeCheckedEmbedder(self.embedder or default, self.dims)
        return self.embedder


def read_index(index: IndexConfig | Mapping[str, Any] | None) -> StoreIndex | None:
    """The store's index, or ``None`` for an exact key-value store.

    As in LangGraph's stores, no ``index`` (or an empty one) means no embeddings.
    Raises ``ValueError`` for an unknown key (listing the accepted ones) or a bad
    ``dims``, ``TypeError`` for an ``embed`` or ``fields`` of the wrong kind.
    """
    if not index:
        return None
    if not isinstance(index, Mapping):
        raise TypeError(f"index must be a dict like {{'fields': ['text']}}, got {type(index).__name__}")
    unknown = sorted(set(index) - set(INDEX_KEYS))
    if unknown:
        raise ValueError(
            f"unknown index key(s) {unknown}; MemTreeStore accepts {list(INDEX_KEYS)} "
            "(as LangGraph's IndexConfig: dims, embed, fields; and distance_type as PostgresStore's)"
        )
    distance = index.get("distance_type", "cosine")
    if distance not in DISTANCE_TYPES:
        raise ValueError(
            f"index distance_type {distance!r} is not supported; MemTreeStore accepts: {', '.join(DISTANCE_TYPES)} "
            "(its trees route and rank by cosine similarity)"
        )
    dims = index.get("dims")
    if dims is not None and (isinstance(dims, bool) or not isinstance(dims, int) or dims <= 0):
        raise ValueError(f"index dims must be a positive int (the embedding size), got {dims!r}")
    given = index.get("fields") or ["$"]
    tokenized(given)
    fields = tuple(given)
    embed = index.get("embed")
    embedder = None if embed is None else embedder_for(embed)
    return StoreIndex(fields=fields, embedder=embedder, dims=dims)


def embedder_for(embed: Any) -> Embedder:
    """A memtree embedder for LangGraph's ``embed`` (see the module docstring)."""
    if isinstance(embed, Embedder) or is_langchain_embeddings(embed) or is_llamaindex_embedding(embed):
        return resolve_embedder(embed)
    if isinstance(embed, str):
        provider, colon, model = embed.partition(":")
        if not colon or not provider or not model:
            raise ValueError(
                f"index embed string must be 'provider:model' (e.g. 'local:all-MiniLM-L6-v2'), got {embed!r}"
            )
        if provider in MEMTREE_PROVIDERS:
            return resolve_embedder(embed)
        return resolve_embedder(_langchain_embeddings(embed))
    if callable(embed):
        # LangGraph's own wrapper: the same rules for sync and async functions as its stores
        return resolve_embedder(ensure_embeddings(embed))
    raise TypeError(
        "index embed must be a LangChain Embeddings, a function texts -> vectors, or a 'provider:model' "
        f"string, got {type(embed).__name__}"
    )


def _langchain_embeddings(embed: str) -> Any:
    try:
        from langchain.embeddings import init_embeddings
    except ImportError as error:
        raise ValueError(
            f"index embed {embed!r} needs LangChain's init_embeddings ({error}); use 'local:<model>' (offline) "
            "or 'openai:<model>', or pass an Embeddings object"
        ) from None
    try:
        return init_embeddings(embed)
    except (ImportError, ValueError) as error:
        raise ValueError(
            f"index embed {embed!r} could not be loaded: {error}. memtree itself serves 'local:<model>' "
            "(sentence-transformers, offline) and 'openai:<model>'; or pass an Embeddings object or a function"
        ) from None


def tokenized(fields: Sequence[str], what: str = "index fields") -> list[Path]:
    """LangGraph's tokenized paths for ``fields``; ``TypeError`` (naming ``what``)
    unless a list of non-empty str."""
    if not isinstance(fields, (list, tuple)) or not all(isinstance(field, str) and field for field in fields):
        raise TypeError(f"{what} must be a list of JSON paths (str) such as ['text'], got {fields!r}")
    return [(field, "$" if field == "$" else tokenize_path(field)) for field in fields]


class SizeCheckedEmbedder(Embedder):
    """An embedder whose every output must be ``dims`` wide, as the index declared.

    The engine checks sizes against what a memory already stores; this catches the
    first embedding of a fresh store too, naming both sizes.
    """

    def __init__(self, inner: Embedder, dims: int) -> None:
        self.inner = inner
        self.dims = dims
        self.call_timeout = getattr(inner, "call_timeout", self.call_timeout)  # the inner model's bound

    @property
    def name(self) -> str:
        return self.inner.name  # the stored embedder name stays the model's own

    def preload(self, *, background: bool = False) -> threading.Thread | None:
        return self.inner.preload(background=background)

    def embed(self, texts: Sequence[str]) -> Matrix:
        return self._checked(self.inner.embed(texts))

    async def aembed(self, texts: Sequence[str]) -> Matrix:
        return self._checked(await self.inner.aembed(texts))

    @property
    def pools_parts(self) -> bool:  # type: ignore[override]
        return self.inner.pools_parts

    def embed_parts(self, texts: Sequence[str], parts: Sequence[Sequence[str]]) -> tuple[Matrix, list[Matrix]]:
        vectors, part_vectors = self.inner.embed_parts(texts, parts)
        return self._checked(vectors), [self._checked(rows) for rows in part_vectors]

    async def aembed_parts(self, texts: Sequence[str], parts: Sequence[Sequence[str]]) -> tuple[Matrix, list[Matrix]]:
        vectors, part_vectors = await self.inner.aembed_parts(texts, parts)
        return self._checked(vectors), [self._checked(rows) for rows in part_vectors]

    def embed_query(self, text: str) -> Matrix:
        return self._checked(self.inner.embed_query(text))

    async def aembed_query(self, text: str) -> Matrix:
        return self._checked(await self.inner.aembed_query(text))

    def _checked(self, vectors: Any) -> Any:
        width = np.shape(vectors)[-1] if np.ndim(vectors) in (1, 2) else None
        if width is not None and width != self.dims:
            raise ValueError(
                f"embedding dimension {width} does not match the store's index dims {self.dims}; "
                "set index['dims'] to the model's size or use a model of that size"
            )
        return vectors
