"""memtree's offline all-MiniLM-L6-v2 as a LlamaIndex embed model.

:class:`LocalEmbedding` gives ``VectorStoreIndex`` (or any LlamaIndex component) the
vectors a memory's default embedder gives, so a flat index and a MemTreeIndex can be
built and compared with one model. It is a thin wrapper: the work is
:class:`memtree.LocalEmbedder`'s (the numpy encoder, no torch). Given to memtree
(``Settings.embed_model``, ``MemTree(embedder=...)``) it is unwrapped, so the memory
records the same model as its default and opens memories that the default built.
"""

from __future__ import annotations

from typing import Any

from llama_index.core.base.embeddings.base import BaseEmbedding, Embedding
from pydantic import Field, PrivateAttr

from memtree.embed import LocalEmbedder
from memtree.local_models import DEFAULT_LOCAL_MODEL


class LocalEmbedding(BaseEmbedding):
    """The bundled all-MiniLM-L6-v2 (or another local model ``LocalEmbedder`` runs) as
    a LlamaIndex ``BaseEmbedding``: unit-length vectors of 384 numbers, offline.

    ``model_name`` is what :class:`memtree.LocalEmbedder` takes (default: the bundled
    model); ``embedder=`` wraps one you made. Other keywords are ``BaseEmbedding``'s
    (``embed_batch_size``, ``callback_manager``...).

    Example::

        from llama_index.core import Settings, VectorStoreIndex
        from llamaindex_memtree import LocalEmbedding

        Settings.embed_model = LocalEmbedding()
        index = VectorStoreIndex.from_documents(documents)
    """

    model_name: str = Field(default=DEFAULT_LOCAL_MODEL, description="The local model's name or folder.")
    embed_batch_size: int = Field(default=64, gt=0, le=2048, description="Texts per embedding call.")
    _embedder: LocalEmbedder = PrivateAttr()

    def __init__(self, model_name: str | None = None, *, embedder: LocalEmbedder | None = None, **kwargs: Any) -> None:
        if embedder is not None and not isinstance(embedder, LocalEmbedder):
            raise TypeError(f"embedder must be a memtree.LocalEmbedder, got {type(embedder).__name__}")
        if embedder is None:
            embedder = LocalEmbedder(model_name)
        shown = embedder.model_name or DEFAULT_LOCAL_MODEL
        super().__init__(model_name=shown, **kwargs)
        self._embedder = embedder

    @classmethod
    def class_name(cls) -> str:
        return "MemTreeLocalEmbedding"

    @property
    def memtree_embedder(self) -> LocalEmbedder:
        """The memtree embedder doing the work (what memtree uses when given this model)."""
        return self._embedder

    def _get_query_embedding(self, query: str) -> Embedding:
        return [float(value) for value in self._embedder.embed_query(query)]

    async def _aget_query_embedding(self, query: str) -> Embedding:
        return [float(value) for value in await self._embedder.aembed_query(query)]

    def _get_text_embedding(self, text: str) -> Embedding:
        return self._get_text_embeddings([text])[0]

    async def _aget_text_embedding(self, text: str) -> Embedding:
        return (await self._aget_text_embeddings([text]))[0]

    def _get_text_embeddings(self, texts: list[str]) -> list[Embedding]:
        return self._embedder.embed(texts).tolist()  # type: ignore[no-any-return]

    async def _aget_text_embeddings(self, texts: list[str]) -> list[Embedding]:
        return (await self._embedder.aembed(texts)).tolist()  # type: ignore[no-any-return]
