"""LlamaIndex models as memtree models: any ``BaseEmbedding``, any ``LLM``.

``llama_index`` is never imported here: the wrappers only call the documented
methods (``get_text_embedding_batch``, ``get_query_embedding``, ``complete`` and
their async twins), so memtree imports without LlamaIndex installed. Usage comes
from the reply's ``raw["usage"]`` or ``additional_kwargs`` when the provider fills
them in.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memtree.llm import ChatModel, Completion
from memtree.models.base import EmbeddingBatch, RemoteEmbedder, checked_batch_size, describe_model, optional_int
from memtree.retry import ModelResponseError, RetryPolicy


class LlamaIndexEmbedder(RemoteEmbedder):
    """Wraps a LlamaIndex ``BaseEmbedding`` (OpenAIEmbedding, HuggingFaceEmbedding, …).

    Texts go to the model in requests of ``batch_size`` (by default the model's own
    ``embed_batch_size``, as LlamaIndex's indexes send them), each with a timeout that
    grows with its size; a request that times out is split, not repeated.

    Example::

        from llama_index.core.embeddings import MockEmbedding
        embedder = LlamaIndexEmbedder(MockEmbedding(embed_dim=64))
    """

    def __init__(self, embedding: Any, *, retry: RetryPolicy | None = None, batch_size: int | None = None) -> None:
        if not callable(getattr(embedding, "get_text_embedding_batch", None)):
            raise TypeError(f"expected a LlamaIndex BaseEmbedding, got {type(embedding).__name__}")
        self.embedding = embedding
        self.batch_size = checked_batch_size(batch_size, getattr(embedding, "embed_batch_size", None))
        if retry is not None:
            self.retry = retry

    @property
    def name(self) -> str:
        return f"LlamaIndexEmbedder({describe_model(self.embedding)})"

    def _embed_batch(self, texts: list[str], timeout: float | None) -> EmbeddingBatch:
        return EmbeddingBatch(self.embedding.get_text_embedding_batch(texts))

    async def _aembed_batch(self, texts: list[str], timeout: float | None) -> EmbeddingBatch:
        return EmbeddingBatch(await self.embedding.aget_text_embedding_batch(texts))

    def _embed_query(self, text: str, timeout: float | None) -> EmbeddingBatch:
        return EmbeddingBatch([self.embedding.get_query_embedding(text)])

    async def _aembed_query(self, text: str, timeout: float | None) -> EmbeddingBatch:
        return EmbeddingBatch([await self.embedding.aget_query_embedding(text)])


class LlamaIndexChatModel(ChatModel):
    """Wraps a LlamaIndex ``LLM`` (completion or chat models alike) through ``complete``.

    Example::

        from llama_index.core.llms import MockLLM
        model = LlamaIndexChatModel(MockLLM())
    """

    def __init__(self, llm: Any, *, retry: RetryPolicy | None = None) -> None:
        if not callable(getattr(llm, "complete", None)):
            raise TypeError(f"expected a LlamaIndex LLM, got {type(llm).__name__}")
        self.llm = llm
        if retry is not None:
            self.retry = retry

    @property
    def name(self) -> str:
        return f"LlamaIndexChatModel({describe_model(self.llm)})"

    def _complete(self, prompt: str, timeout: float | None) -> Completion:
        return self._completion(self.llm.complete(prompt))

    async def _acomplete(self, prompt: str, timeout: float | None) -> Completion:
        return self._completion(await self.llm.acomplete(prompt))

    def _completion(self, response: Any) -> Completion:
        text = getattr(response, "text", None)
        if not isinstance(text, str):
            raise ModelResponseError(f"{self.name} returned {type(response).__name__}, which holds no text")
        prompt_tokens, completion_tokens = _usage(response)
        return Completion(text, prompt_tokens, completion_tokens)


def _usage(response: Any) -> tuple[int | None, int | None]:
    """Token counts from ``raw.usage`` (OpenAI-style) or ``additional_kwargs``."""
    raw = getattr(response, "raw", None)
    reported = raw.get("usage") if isinstance(raw, Mapping) else getattr(raw, "usage", None)
    if isinstance(reported, Mapping):
        return optional_int(reported.get("prompt_tokens")), optional_int(reported.get("completion_tokens"))
    if reported is not None:
        prompt_tokens = getattr(reported, "prompt_tokens", None)
        return optional_int(prompt_tokens), optional_int(getattr(reported, "completion_tokens", None))
    extra = getattr(response, "additional_kwargs", None) or {}
    return optional_int(extra.get("prompt_tokens")), optional_int(extra.get("completion_tokens"))
