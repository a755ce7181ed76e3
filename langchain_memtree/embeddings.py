"""memtree's offline all-MiniLM-L6-v2 as a LangChain ``Embeddings``.

:class:`LocalEmbeddings` gives LangChain's vector stores (``InMemoryVectorStore``,
FAISS, Chroma...) the vectors a memory's default embedder gives. It is a thin
wrapper: the work is :class:`memtree.LocalEmbedder`'s (the numpy encoder, no
torch). Given to memtree (``MemTree(embedder=...)``, ``MemTreeStore(index=...)``) it
is unwrapped, so the memory records the same model as its default.
"""

from __future__ import annotations

from langchain_core.embeddings import Embeddings

from memtree.embed import LocalEmbedder


class LocalEmbeddings(Embeddings):
    """The bundled all-MiniLM-L6-v2 (or another local model ``LocalEmbedder`` runs) as
    a LangChain ``Embeddings``: unit-length vectors of 384 numbers, offline.

    ``model`` is what :class:`memtree.LocalEmbedder` takes (default: the bundled
    model); ``embedder=`` wraps one you made.

    Example::

        from langchain_core.vectorstores import InMemoryVectorStore
        from langchain_memtree import LocalEmbeddings

        store = InMemoryVectorStore(LocalEmbeddings())
        store.add_texts(["Maya adopted a greyhound."])
    """

    def __init__(self, model: str | None = None, *, embedder: LocalEmbedder | None = None) -> None:
        if embedder is not None and not isinstance(embedder, LocalEmbedder):
            raise TypeError(f"embedder must be a memtree.LocalEmbedder, got {type(embedder).__name__}")
        self.embedder = embedder if embedder is not None else LocalEmbedder(model)

    @property
    def memtree_embedder(self) -> LocalEmbedder:
        """The memtree embedder doing the work (what memtree uses when given this model)."""
        return self.embedder

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        """One vector per text, in order."""
        return self.embedder.embed(texts).tolist()  # type: ignore[no-any-return]

    def embed_query(self, text: str) -> list[float]:
        """The vector of a search query."""
        return [float(value) for value in self.embedder.embed_query(text)]

    async def aembed_documents(self, texts: list[str]) -> list[list[float]]:
        return (await self.embedder.aembed(texts)).tolist()  # type: ignore[no-any-return]

    async def aembed_query(self, text: str) -> list[float]:
        return [float(value) for value in await self.embedder.aembed_query(text)]
