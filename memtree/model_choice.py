"""Which embedder and summary writer a memory uses, from what its caller passed.

Left out, each model is OpenAI when ``OPENAI_API_KEY`` is set and otherwise
offline (the bundled all-MiniLM-L6-v2 embeddings, extractive summaries). Everything
is resolved before any work, so a bad model or a missing key fails at once.
"""

from __future__ import annotations

from typing import Any

from memtree.aggregate import Aggregator, ExtractiveAggregator, LLMAggregator
from memtree.embed import Embedder
from memtree.models.resolve import announce, default_embedder, openai_usable, resolve_embedder


def default_aggregator() -> Aggregator:
    """LLM summaries by OpenAI when ``OPENAI_API_KEY`` is set, else extractive summaries."""
    if openai_usable():
        from memtree.models.openai import DEFAULT_CHAT_MODEL, OpenAIChatModel

        announce(f"memtree: summarizing with OpenAI {DEFAULT_CHAT_MODEL} (OPENAI_API_KEY is set)")
        return LLMAggregator(OpenAIChatModel())
    announce("memtree: summarizing offline with extractive summaries (no OPENAI_API_KEY; pass llm= to choose)")
    return ExtractiveAggregator()


def choose_models(embedder: Any, aggregator: Any, llm: Any) -> tuple[Embedder, Aggregator]:
    """The memory's embedder and summary writer from ``MemTree(embedder=, aggregator=,
    llm=)``; raises before any work for a bad model or a missing key."""
    if aggregator is not None and llm is not None:
        raise ValueError("pass either aggregator or llm, not both")
    if aggregator is not None and not isinstance(aggregator, Aggregator):
        raise TypeError(
            f"aggregator must be a memtree Aggregator, got {type(aggregator).__name__} "
            "(pass chat models and prompt -> text callables as llm=)"
        )
    resolved: Embedder = resolve_embedder(embedder) if embedder is not None else default_embedder()
    if aggregator is not None:
        chosen: Aggregator = aggregator
    else:
        chosen = LLMAggregator(llm) if llm is not None else default_aggregator()
    return resolved, chosen.bound_to(resolved)
