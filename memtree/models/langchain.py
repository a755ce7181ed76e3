"""LangChain models as memtree models: any ``Embeddings``, any chat model or LLM.

``langchain_core`` is never imported here: the wrappers only call the documented
methods (``embed_documents``/``embed_query`` and their async twins, ``invoke`` and
``ainvoke``), so memtree imports without LangChain installed. Usage comes from the
reply's ``usage_metadata`` when the provider fills it in.

LangChain provider models may retry on their own (``ChatOpenAI(max_retries=2)``);
set their ``max_retries=0`` to leave retries, and their counts, to memtree.
"""

from __future__ import annotations

from typing import Any

from memtree.llm import ChatModel, Completion
from memtree.models.base import EmbeddingBatch, RemoteEmbedder, checked_batch_size, describe_model, optional_int
from memtree.retry import RetryPolicy


class LangChainEmbedder(RemoteEmbedder):
    """Wraps a LangChain ``Embeddings`` (OpenAIEmbeddings, HuggingFaceEmbeddings, …).

    Texts go to ``embed_documents`` in calls of ``batch_size`` (default
    :data:`~memtree.models.base.DEFAULT_WRAPPED_BATCH`), each with a timeout that grows
    with its size; a call that times out is split, not repeated.

    Example::

        from langchain_core.embeddings import DeterministicFakeEmbedding
        embedder = LangChainEmbedder(DeterministicFakeEmbedding(size=64))
    """

    def __init__(self, embeddings: Any, *, retry: RetryPolicy | None = None, batch_size: int | None = None) -> None:
        if not callable(getattr(embeddings, "embed_documents", None)):
            raise TypeError(f"expected a LangChain Embeddings, got {type(embeddings).__name__}")
        self.embeddings = embeddings
        self.batch_size = checked_batch_size(batch_size, None)
        if retry is not None:
            self.retry = retry

    @property
    def name(self) -> str:
        return f"LangChainEmbedder({describe_model(self.embeddings)})"

    def _embed_batch(self, texts: list[str], timeout: float | None) -> EmbeddingBatch:
        return EmbeddingBatch(self.embeddings.embed_documents(texts))

    async def _aembed_batch(self, texts: list[str], timeout: float | None) -> EmbeddingBatch:
        return EmbeddingBatch(await self.embeddings.aembed_documents(texts))

    def _embed_query(self, text: str, timeout: float | None) -> EmbeddingBatch:
        return EmbeddingBatch([self.embeddings.embed_query(text)])

    async def _aembed_query(self, text: str, timeout: float | None) -> EmbeddingBatch:
        return EmbeddingBatch([await self.embeddings.aembed_query(text)])


class LangChainChatModel(ChatModel):
    """Wraps a LangChain chat model, LLM, or any runnable taking a prompt string and
    returning a message or a string (``prompt | model | StrOutputParser()``).

    Example::

        from langchain_core.language_models import FakeListChatModel
        model = LangChainChatModel(FakeListChatModel(responses=["A summary."]))
    """

    def __init__(self, model: Any, *, retry: RetryPolicy | None = None) -> None:
        if not callable(getattr(model, "invoke", None)):
            raise TypeError(f"expected a LangChain chat model or runnable, got {type(model).__name__}")
        self.model = model
        if retry is not None:
            self.retry = retry

    @property
    def name(self) -> str:
        return f"LangChainChatModel({describe_model(self.model)})"

    def _complete(self, prompt: str, timeout: float | None) -> Completion:
        return self._completion(self.model.invoke(prompt))

    async def _acomplete(self, prompt: str, timeout: float | None) -> Completion:
        return self._completion(await self.model.ainvoke(prompt))

    def _completion(self, reply: Any) -> Completion:
        if isinstance(reply, str):
            return Completion(reply)
        text = getattr(reply, "text", None)
        if callable(text) and not isinstance(text, str):  # langchain-core < 1.0: a method
            text = text()
        if not isinstance(text, str):
            # Not retried: a runnable that returns a dict or a number does so every time.
            raise TypeError(
                f"{self.name} returned {type(reply).__name__}, which holds no text; end the runnable "
                "with a chat model, an LLM or a StrOutputParser"
            )
        reported = getattr(reply, "usage_metadata", None) or {}
        return Completion(
            str(text), optional_int(reported.get("input_tokens")), optional_int(reported.get("output_tokens"))
        )
