"""Turning what a caller passes as ``embedder=`` / ``llm=`` into memtree models.

Recognized without importing any framework: an object can only be a LangChain or
LlamaIndex model if that framework's module is already loaded, so the check looks
the base class up in ``sys.modules`` and never imports it.

When nothing is passed, the embedder is the bundled all-MiniLM-L6-v2 (offline)
for a new memory and the stored one (:func:`embedder_named`) for an existing one;
the environment never chooses a model (an ``OPENAI_API_KEY`` is read only by an
OpenAI model the caller asked for). The choice is logged once per process.
"""

from __future__ import annotations

import logging
import re
import sys
import threading
from collections.abc import Sequence

from memtree.embed import Embedder, HashingEmbedder, LocalEmbedder, Matrix
from memtree.llm import CallableChatModel, ChatModel
from memtree.local_models import is_bundled_name

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
    """The embedder of a new memory when none is passed: the bundled model, offline."""
    announce("memtree: embedding offline with all-MiniLM-L6-v2 (pass embedder= to choose a model)")
    return LocalEmbedder()


_STORED = re.compile(r"^(?P<kind>\w+)\((?P<model>[^,()]*)(?:, dimensions=(?P<dimensions>\d+))?\)$")
"""An embedder's stored name: ``LocalEmbedder(model)``, ``OpenAIEmbedder(model[, dimensions=N])``,
``HashingEmbedder(N)``, or another class's, which memtree cannot make by itself."""


def spec_of(stored: str) -> str | None:
    """What to pass as ``embedder=`` for the model a stored name describes (a name
    :func:`resolve_embedder` takes), or ``None`` for a model memtree cannot make."""
    match = _STORED.match(stored.strip())
    if match is None:
        return None
    kind, model, dimensions = match["kind"], match["model"].strip(), match["dimensions"]
    if kind == "LocalEmbedder" and model and dimensions is None:
        return "local" if is_bundled_name(model) else f"local:{model}"
    if kind == "OpenAIEmbedder" and model and dimensions is None:
        return f"openai:{model}"
    return None


class UnavailableEmbedder(Embedder):
    """Stands for the model that built a memory when memtree cannot make it here (a
    LangChain or LlamaIndex model, your own class, OpenAI without a key): reads that
    embed nothing (stats, pictures, backups, compaction) work, and the first
    embedding raises ``problem``, which says what to pass."""

    call_timeout = None

    def __init__(self, stored: str, problem: Exception) -> None:
        self.stored = stored
        self.problem = problem

    @property
    def name(self) -> str:
        return self.stored

    def embed(self, texts: Sequence[str]) -> Matrix:
        raise self.problem


def embedder_named(stored: str) -> Embedder:
    """The embedder that built a memory, from the name stored with its namespace, so an
    existing memory opened with no ``embedder=`` embeds queries as its vectors were.
    A model memtree cannot make here is an :class:`UnavailableEmbedder`: its first
    embedding raises, saying to pass the model as ``embedder=``."""
    match = _STORED.match(stored.strip())
    if match is not None and match["kind"] == "HashingEmbedder" and match["model"].isdigit():
        return HashingEmbedder(int(match["model"]))
    try:
        if match is not None and match["kind"] == "OpenAIEmbedder" and match["model"].strip():
            from memtree.models.openai import OpenAIEmbedder

            dimensions = int(match["dimensions"]) if match["dimensions"] else None
            return OpenAIEmbedder(match["model"].strip(), dimensions=dimensions)
    except (ImportError, RuntimeError) as error:  # no openai package, or no key (MissingAPIKeyError)
        return UnavailableEmbedder(stored, type(error)(f"this memory was built with {stored}: {error}"))
    spec = spec_of(stored)
    if spec is None:
        problem = ValueError(
            f"this memory was built with {stored}, which memtree cannot make from its name; "
            "pass embedder=<the same model> to embed with it"
        )
        return UnavailableEmbedder(stored, problem)
    return resolve_embedder(spec)


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
