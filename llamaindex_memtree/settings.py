"""Which models a memory built by this package uses: the user's LlamaIndex ones, if set.

LlamaIndex's ``Settings.embed_model`` and ``Settings.llm`` resolve lazily to OpenAI
defaults the first time they are *read*, which fails without an API key. Reading
the private fields instead tells whether the user set them without triggering that
resolution; when they did not, the engine's offline defaults (local embeddings,
extractive summaries) apply.
"""

from __future__ import annotations

from typing import Any

from llama_index.core import Settings

from memtree import MemTree, MemTreeConfig


def models_from_settings() -> dict[str, Any]:
    """``embedder`` and ``llm`` keyword arguments for :class:`~memtree.MemTree`, holding
    the models the user set on LlamaIndex's ``Settings`` (only those they set)."""
    chosen: dict[str, Any] = {}
    embed_model = getattr(Settings, "_embed_model", None)
    if embed_model is not None:
        chosen["embedder"] = embed_model
    llm = getattr(Settings, "_llm", None)
    if llm is not None:
        chosen["llm"] = llm
    return chosen


def memory_from_settings(config: MemTreeConfig | None = None) -> MemTree:
    """An in-memory :class:`~memtree.MemTree` using ``Settings``' models when set,
    else the offline defaults."""
    return MemTree(config=config, **models_from_settings())
