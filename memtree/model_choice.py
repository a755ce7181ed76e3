"""Which embedder and summary writer a memory uses, from what its caller passed and
what the memory already holds.

Nothing in the environment chooses a model: an ``OPENAI_API_KEY`` set for a chat
model never turns a memory into a paid OpenAI one. Left out, the summary writer is
offline (extractive summaries), and the embedder is the one that built the
namespace (its stored name, :func:`memtree.models.resolve.embedder_named`) or, for
a new namespace, the bundled all-MiniLM-L6-v2. An embedder passed for a namespace
built by another raises :class:`EmbedderMismatchError`: their vectors cannot be
compared. Everything is resolved before any work, so a bad model fails at once.
"""

from __future__ import annotations

from typing import Any

from memtree.aggregate import Aggregator, ExtractiveAggregator, LLMAggregator
from memtree.embed import Embedder
from memtree.models.resolve import announce, default_embedder, embedder_named, resolve_embedder, spec_of


class EmbedderMismatchError(ValueError):
    """A memory was opened with an embedder other than the one that built it; the
    message names both and what to pass (``spec``: the ``embedder=`` name of the
    stored model, or ``None`` when memtree cannot make it from a name)."""

    def __init__(self, stored: str, given: str, spec: str | None, message: str | None = None) -> None:
        how = f"pass embedder={spec!r}" if spec else "pass embedder=<the model that built it>"
        super().__init__(
            message
            or f"this memory was built with {stored}, but embedder= is {given}: their vectors cannot be "
            f"compared. Leave embedder out to use the stored one, or {how} (a new memory or namespace takes any)"
        )
        self.stored, self.given, self.spec = stored, given, spec


def default_aggregator() -> Aggregator:
    """Extractive summaries: offline, no model call (pass ``llm=`` for a model's)."""
    announce("memtree: summarizing offline with extractive summaries (pass llm= to choose a model)")
    return ExtractiveAggregator()


def given_models(embedder: Any, aggregator: Any, llm: Any) -> tuple[Embedder | None, Aggregator | None]:
    """What the caller passed as ``embedder=``, ``aggregator=`` / ``llm=``, resolved and
    checked (``None`` where nothing was passed): a bad model fails here, before a
    store is opened."""
    if aggregator is not None and llm is not None:
        raise ValueError("pass either aggregator or llm, not both")
    if aggregator is not None and not isinstance(aggregator, Aggregator):
        raise TypeError(
            f"aggregator must be a memtree Aggregator, got {type(aggregator).__name__} "
            "(pass chat models and prompt -> text callables as llm=)"
        )
    resolved = resolve_embedder(embedder) if embedder is not None else None
    return resolved, LLMAggregator(llm) if llm is not None else aggregator


def choose_models(embedder: Any, aggregator: Any, llm: Any, stored: str | None = None) -> tuple[Embedder, Aggregator]:
    """The memory's embedder and summary writer from ``MemTree(embedder=, aggregator=,
    llm=)`` and ``stored``, the name of the embedder that built its namespace
    (``None``: nothing stored yet); raises before any work for a bad model, a
    mismatch with ``stored`` (:class:`EmbedderMismatchError`) or a stored model
    memtree cannot make by itself."""
    given, chosen = given_models(embedder, aggregator, llm)
    if given is not None:
        check_same_embedder(given, stored)
    resolved = given or (embedder_named(stored) if stored is not None else default_embedder())
    return resolved, (chosen or default_aggregator()).bound_to(resolved)


def check_same_embedder(embedder: Embedder, stored: str | None) -> None:
    """Refuse ``embedder`` for a namespace whose vectors ``stored`` made, if they differ."""
    if stored is None or embedder.name == stored:
        return
    raise EmbedderMismatchError(stored, embedder.name, spec_of(stored))
