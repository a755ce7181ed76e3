"""Model adapters: OpenAI (and compatible servers), LangChain and LlamaIndex models,
and a local GGUF model run by llama.cpp (experimental).

Every adapter is a memtree :class:`~memtree.embed.Embedder` or
:class:`~memtree.llm.ChatModel` with retries, per-call timeouts and usage reports.
Importing this package imports no framework: ``openai``, ``langchain_core`` and
``llama_index`` (and ``llama_cpp``) are only touched by the model objects you create or pass in.
``MemTree(embedder=..., llm=...)`` accepts framework objects directly and wraps them
with :func:`resolve_embedder` / :func:`resolve_chat_model`.
"""

from memtree.models.base import EmbeddingBatch, RemoteEmbedder
from memtree.models.langchain import LangChainChatModel, LangChainEmbedder
from memtree.models.llamacpp import LlamaCppChatModel
from memtree.models.llamaindex import LlamaIndexChatModel, LlamaIndexEmbedder
from memtree.models.openai import MissingAPIKeyError, OpenAIChatModel, OpenAIEmbedder
from memtree.models.resolve import default_embedder, resolve_chat_model, resolve_embedder

__all__ = [
    "EmbeddingBatch",
    "LangChainChatModel",
    "LangChainEmbedder",
    "LlamaCppChatModel",
    "LlamaIndexChatModel",
    "LlamaIndexEmbedder",
    "MissingAPIKeyError",
    "OpenAIChatModel",
    "OpenAIEmbedder",
    "RemoteEmbedder",
    "default_embedder",
    "resolve_chat_model",
    "resolve_embedder",
]
