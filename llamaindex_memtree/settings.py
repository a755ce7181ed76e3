"""Which models a memory built by this package uses: the user's LlamaIndex ones, if set.

Both the in-memory trees the adapters make (:func:`memory_from_settings`) and the
durable ones they open from a path or DSN (:func:`open_memory`) use them.

LlamaIndex's ``Settings.embed_model`` and ``Settings.llm`` resolve lazily to OpenAI
defaults the first time they are *read*, which fails without an API key. Reading
the private fields instead tells whether the user set them without triggering that
resolution; when they did not, the engine's defaults apply.

``Settings.llm = None`` and ``Settings.embed_model = None`` are LlamaIndex's way to
switch a model off: ``resolve_llm(None)`` stores a default ``MockLLM()`` (which
answers by echoing its prompt) and ``resolve_embed_model(None)`` a
``MockEmbedding(embed_dim=1)`` (one constant number per text). Nothing marks them
as switched off, so they are recognized by what they are: a ``MockLLM`` with every
field at its default, a one-dimensional ``MockEmbedding``. Summaries echoed from a
prompt, or a tree where every text embeds alike, are of no use, so a switched-off
model counts as "not set" and the engine's *offline* model takes its place (not
OpenAI, even with a key: the user switched the model off). A mock model given on
purpose still works through ``MemTree(llm=MockLLM())`` / ``MemTree(embedder=...)``.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from llama_index.core import Settings
from llama_index.core.embeddings import MockEmbedding
from llama_index.core.llms import MockLLM

from memtree import EmbedderMismatchError, ExtractiveAggregator, LocalEmbedder, MemTree, MemTreeConfig
from memtree.store.base import Namespace, namespace_key

logger = logging.getLogger(__name__)

_logged: set[str] = set()
_logged_lock = threading.Lock()


def is_switched_off_llm(llm: object) -> bool:
    """Whether ``llm`` is what ``Settings.llm = None`` stores: a ``MockLLM()`` with
    every field at its default (a ``MockLLM(max_tokens=...)`` counts as chosen)."""
    return type(llm) is MockLLM and llm.max_tokens is None and llm.system_prompt is None and not llm.is_chat_model


def is_switched_off_embedder(embed_model: object) -> bool:
    """Whether ``embed_model`` is what ``Settings.embed_model = None`` stores: a
    one-dimensional ``MockEmbedding``."""
    return type(embed_model) is MockEmbedding and embed_model.embed_dim == 1


def models_from_settings() -> dict[str, Any]:
    """``embedder`` and ``llm`` / ``aggregator`` keyword arguments for
    :class:`~memtree.MemTree`: the models the user set on LlamaIndex's ``Settings``,
    the offline ones for a model switched off there, nothing for a model not set."""
    chosen: dict[str, Any] = {}
    embed_model = getattr(Settings, "_embed_model", None)
    if is_switched_off_embedder(embed_model):
        _log_once(
            "embedder",
            "Settings.embed_model is switched off (a 1-dim MockEmbedding); memtree embeds offline with "
            "LocalEmbedder (all-MiniLM-L6-v2)",
        )
        chosen["embedder"] = LocalEmbedder()
    elif embed_model is not None:
        chosen["embedder"] = embed_model
    llm = getattr(Settings, "_llm", None)
    if is_switched_off_llm(llm):
        _log_once(
            "llm",
            "Settings.llm is switched off (a default MockLLM); memtree writes extractive summaries offline "
            "(ExtractiveAggregator)",
        )
        chosen["aggregator"] = ExtractiveAggregator()
    elif llm is not None:
        chosen["llm"] = llm
    return chosen


def memory_from_settings(config: MemTreeConfig | None = None) -> MemTree:
    """An in-memory :class:`~memtree.MemTree` using ``Settings``' models when set,
    else the engine's defaults."""
    return MemTree(config=config, **models_from_settings())


def open_memory(location: str | os.PathLike[str], *, namespace: Namespace = "default", **kwargs: Any) -> MemTree:
    """A durable memory (a SQLite path or a PostgreSQL DSN, as :meth:`MemTree.open
    <memtree.MemTree.open>`) using ``Settings``' models when set.

    ``MemTree.open`` is the engine's and knows nothing of LlamaIndex: it takes the
    models passed to it, else its own defaults. This passes ``Settings.embed_model``
    and ``Settings.llm`` (as :func:`models_from_settings` reads them) unless
    ``embedder=`` / ``llm=`` / ``aggregator=`` are given; the adapters call it when
    given a path or DSN as ``memory=``.

    A memory that already holds vectors of another model is refused with an
    :class:`~memtree.EmbedderMismatchError` (a ``ValueError``) naming both models: its
    stored vectors could not be compared with the new ones. With neither
    ``Settings.embed_model`` nor ``embedder=``, an existing memory embeds with the
    model that built it. The memory owns the store: ``memory.close()`` closes it.

    Example::

        Settings.embed_model = HuggingFaceEmbedding("BAAI/bge-small-en-v1.5")
        memory = open_memory("chat.db")  # embeds with bge-small, now and when reopened
    """
    chosen = models_from_settings()
    if "embedder" in kwargs:
        chosen.pop("embedder", None)
    if "llm" in kwargs or "aggregator" in kwargs:
        chosen.pop("llm", None)
        chosen.pop("aggregator", None)
    try:
        return MemTree.open(location, namespace=namespace, **chosen, **kwargs)
    except EmbedderMismatchError as error:
        source = "the embedder= given" if "embedder" in kwargs else _embedder_source(chosen)
        raise EmbedderMismatchError(
            error.stored,
            error.given,
            error.spec,
            f"{os.fspath(location)!r} (namespace {namespace_key(namespace)!r}) holds vectors of {error.stored}, but "
            f"{source} is {error.given}; their vectors cannot be compared. Set Settings.embed_model "
            "to the model the memory was built with, or pass embedder=<that model>",
        ) from None


def _embedder_source(chosen: dict[str, Any]) -> str:
    if isinstance(chosen["embedder"], LocalEmbedder):
        return "the offline embedder (Settings.embed_model is switched off)"
    return "Settings.embed_model"


def _log_once(kind: str, message: str) -> None:
    """Log ``message`` at INFO the first time a ``kind`` of model is replaced."""
    with _logged_lock:
        if kind in _logged:
            return
        _logged.add(kind)
    logger.info(message)
