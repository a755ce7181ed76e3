"""Turning what a caller passes as ``embedder=`` / ``llm=`` into memtree models.

Recognized without importing any framework: an object can only be a LangChain or
LlamaIndex model if that framework's module is already loaded, so the check looks
the base class up in ``sys.modules`` and never imports it.

When nothing is passed, each model defaults to OpenAI if ``OPENAI_API_KEY`` is set
(``text-embedding-3-small``, ``gpt-4o-mini``) and otherwise to the offline ones
(local all-MiniLM-L6-v2 embeddings, extractive summaries); the choice is logged
once per process.
"""

from __future__ import annotations

import logging
import os
import sys
import threading

from memtree.embed import Embedder, LocalEmbedder
from memtree.llm import CallableChatModel, ChatModel

logger = logging.getLogger("memtree")

EMBEDDER_KINDS = (
    "a memtree Embedder, a LangChain Embeddings, a LlamaIndex BaseEmbedding, "
    "or one of the names 'openai', 'openai:<model>', 'local', 'local:<model or path>'"
)
LLM_KINDS = (
    "a memtree ChatModel, a LangChain chat model / LLM / runnable, a LlamaIndex LLM, "
    "a callable prompt -> text (sync or async), or the name 'openai' / 'openai:<model>' "
    "/ 'llama-cpp:<path to .gguf>'"
)

_announced: set[str] = set()
_announce_lock = threading.Lock()


def _loaded_class(module: str, name: str) -> type | None:
    """A class from a module only if that module is already imported."""
    loaded = sys.modules.get(module)
    cls = getattr(loaded, name, None) if loaded is not None else None
    return cls if isinstance(cls, type) else None


def _is_instance(obj: object, module: str, name: str) -> bool:
    cls = _loaded_class(module, name)
    return cls is not None and isinstance(obj, cls)


def is_aggregator(obj: object) -> bool:
    """A memtree summary writer (looked up, not imported: :mod:`memtree.aggregate`
    imports this module to resolve the chat model an ``LLMAggregator`` is given)."""
    return _is_instance(obj, "memtree.aggregate", "Aggregator")


def is_langchain_embeddings(obj: object) -> bool:
    return _is_instance(obj, "langchain_core.embeddings.embeddings", "Embeddings")


def is_langchain_runnable(obj: object) -> bool:
    return _is_instance(obj, "langchain_core.runnables.base", "Runnable")


def is_llamaindex_embedding(obj: object) -> bool:
    return _is_instance(obj, "llama_index.core.base.embeddings.base", "BaseEmbedding")


def is_llamaindex_llm(obj: object) -> bool:
    return _is_instance(obj, "llama_index.core.base.llms.base", "BaseLLM")


def resolve_embedder(embedder: object) -> Embedder:
    """A memtree :class:`~memtree.embed.Embedder` for anything in :data:`EMBEDDER_KINDS`.

    Raises ``TypeError`` naming the supported kinds for anything else.
    """
    if isinstance(embedder, Embedder):
        return embedder
    wrapped = getattr(embedder, "memtree_embedder", None)
    if isinstance(wrapped, Embedder):  # memtree's own model, exported to a framework: the same vectors
        return wrapped
    if isinstance(embedder, str):
        scheme, _, model = embedder.partition(":")
        if scheme == "openai":
            from memtree.models.openai import DEFAULT_EMBEDDING_MODEL, OpenAIEmbedder

            return OpenAIEmbedder(model or DEFAULT_EMBEDDING_MODEL)
        if scheme == "local":
            return LocalEmbedder(model or None)
    elif is_langchain_embeddings(embedder):
        from memtree.models.langchain import LangChainEmbedder

        return LangChainEmbedder(embedder)
    elif is_llamaindex_embedding(embedder):
        from memtree.models.llamaindex import LlamaIndexEmbedder

        return LlamaIndexEmbedder(embedder)
    raise TypeError(f"embedder must be {EMBEDDER_KINDS}; got {_shown(embedder)}")


def resolve_chat_model(llm: object) -> ChatModel:
    """A memtree :class:`~memtree.llm.ChatModel` for anything in :data:`LLM_KINDS`.

    Raises ``TypeError`` naming the supported kinds for anything else.
    """
    if isinstance(llm, ChatModel):
        return llm
    if isinstance(llm, str):
        scheme, _, model = llm.partition(":")
        if scheme == "openai":
            from memtree.models.openai import DEFAULT_CHAT_MODEL, OpenAIChatModel

            return OpenAIChatModel(model or DEFAULT_CHAT_MODEL)
        if scheme == "llama-cpp":
            if not model.strip():
                raise ValueError("llm='llama-cpp:' needs the model file: llm='llama-cpp:/path/to/model.gguf'")
            from memtree.models.llamacpp import LlamaCppChatModel

            return LlamaCppChatModel(model.strip())
    elif is_langchain_runnable(llm):
        from memtree.models.langchain import LangChainChatModel

        return LangChainChatModel(llm)
    elif is_llamaindex_llm(llm):
        from memtree.models.llamaindex import LlamaIndexChatModel

        return LlamaIndexChatModel(llm)
    elif (
        isinstance(llm, Embedder) or is_aggregator(llm) or is_langchain_embeddings(llm) or is_llamaindex_embedding(llm)
    ):
        hint = "aggregator=" if is_aggregator(llm) else "embedder="
        raise TypeError(f"llm must be {LLM_KINDS}; got {_shown(llm)} (pass it as {hint})")
    elif callable(llm):
        return CallableChatModel(llm)
    raise TypeError(f"llm must be {LLM_KINDS}; got {_shown(llm)}")


def default_embedder() -> Embedder:
    """OpenAI embeddings when ``OPENAI_API_KEY`` is set, else the local model."""
    if openai_usable():
        from memtree.models.openai import DEFAULT_EMBEDDING_MODEL, OpenAIEmbedder

        announce(f"memtree: embedding with OpenAI {DEFAULT_EMBEDDING_MODEL} (OPENAI_API_KEY is set)")
        return OpenAIEmbedder()
    announce("memtree: embedding offline with all-MiniLM-L6-v2 (no OPENAI_API_KEY; pass embedder= to choose)")
    return LocalEmbedder()


def openai_usable() -> bool:
    """Whether the default models are OpenAI's: a key is set and the client installed."""
    if not os.environ.get("OPENAI_API_KEY"):
        return False
    try:
        import openai  # noqa: F401
    except ImportError:
        announce("memtree: OPENAI_API_KEY is set but the openai package is missing; using offline models")
        return False
    return True


def announce(message: str) -> None:
    """Log a default model choice once per process."""
    with _announce_lock:
        if message in _announced:
            return
        _announced.add(message)
    logger.info(message)


def _shown(obj: object) -> str:
    if isinstance(obj, str):
        return f"str {obj!r}"
    return f"{type(obj).__module__}.{type(obj).__qualname__}"
