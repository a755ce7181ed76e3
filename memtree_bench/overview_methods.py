"""The rows of the overview benchmark: each turns a question into a context per word budget.

All rows read the same conversation with the same embedder:

* ``random sample``: the turns of the question's scope (the asked person's, the
  asked span's; for a multi-hop question the one person it names, else all) in a
  seeded random order: the floor every method must clear;
* ``flat hybrid``: memtree's hybrid ranking (cosine + BM25) over the turns alone;
* ``flat hybrid, time filter``: the same, keeping only the turns inside the time
  range the question names (:mod:`memtree.time_expressions`, against the date of
  the latest turn);
* ``flat hybrid, MMR`` and ``flat hybrid, time filter + MMR``: the best
  :data:`MMR_POOL` of those, reordered by maximal marginal relevance (cosine
  between turns, ``lambda`` :data:`MMR_LAMBDA`; also :data:`MMR_SPAN_LAMBDA` with
  the time filter);
* ``RAPTOR-style tree``: :mod:`memtree_bench.raptor`, built offline with the whole
  conversation in view and extractive summaries, searched collapsed;
* ``memtree retrieve``: the tree's ``retrieve`` as it ranks a lookup
  (``route_overviews=False``);
* ``memtree retrieve, routed``: ``retrieve`` as a user calls it: an overview request
  is answered by ``overview``, any other question ranked;
* ``memtree overview``: ``overview`` itself, given what the question asks
  (:func:`memtree.intent.overview_request`; a question that is no overview request,
  such as a multi-hop one, is its own ``about``).

Ranked rows are cut at each word budget; the overview rows are asked once per
budget (an overview chooses its parts for the room it has), their memories opened
with a word counter so a token is a word.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from memtree.intent import OverviewRequest, overview_request
from memtree.overview import Settings, answer_overview, check_overview
from memtree.time_expressions import time_span
from memtree_bench.methods import deduplicated
from memtree_bench.metrics import contexts_at_budgets
from memtree_bench.overview_questions import AnnotatedConversation, OverviewQuestion

MMR_POOL = 150
"""How many of flat hybrid's best turns MMR reorders."""

MMR_LAMBDA = 0.5
"""MMR's weight of relevance against novelty (1: flat hybrid's order)."""

MMR_SPAN_LAMBDA = 0.3
"""A second weight, the best of 0.3 / 0.5 / 0.7 / 0.9 for day recaps with the time
filter on LoCoMo 0-4 (0.712 fact coverage at 500 words against 0.676 at 0.5): the
strongest flat baseline there, so it is in the report too."""


@dataclass
class Memories:
    """What the rows of one conversation read: its annotations, the flat tree and
    the memtree tree (``MemTree`` objects opened with a word counter), a RAPTOR tree
    built on first use."""

    conversation: AnnotatedConversation
    flat: Any
    tree: Any
    embedder: Any
    raptor: Any = None

    @property
    def now(self) -> float | None:
        return self.conversation.latest


class Row(ABC):
    name: str
    variant: bool = False

    @abstractmethod
    def contexts(self, memories: Memories, question: OverviewQuestion, budgets: Sequence[int]) -> dict[int, str]:
        """The context this row gives ``question`` at each budget (in words)."""


def _ranked_limit(budgets: Sequence[int]) -> int:
    return max(10, max(budgets) // 8)


class RandomSample(Row):
    name = "random sample of the asked turns"

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    def contexts(self, memories: Memories, question: OverviewQuestion, budgets: Sequence[int]) -> dict[int, str]:
        conversation = memories.conversation.conversation
        turns = [turn.text for turn in conversation.turns if question.scope.holds(turn)]
        random.Random(f"{self.seed}:{conversation.sample_id}:{question.question}").shuffle(turns)
        return contexts_at_budgets(turns or [""], budgets)


class FlatHybrid(Row):
    def __init__(self, *, time_filter: bool = False, mmr: float | None = None) -> None:
        self.time_filter = time_filter
        self.mmr = mmr
        mmr_name = "MMR" if mmr in (None, MMR_LAMBDA) else f"MMR {mmr}"
        parts = [part for part, on in (("time filter", time_filter), (mmr_name, mmr is not None)) if on]
        self.name = "flat hybrid" + (f", {' + '.join(parts)}" if parts else "")

    def contexts(self, memories: Memories, question: OverviewQuestion, budgets: Sequence[int]) -> dict[int, str]:
        options: dict[str, Any] = {
            "k": _ranked_limit(budgets),
            "route_overviews": False,
            "parse_times": False,
            "context_feedback": 0.0,
            "min_similarity": None,  # ranked rows are scored on their ranking, as in `memtree bench locomo`
        }
        if self.time_filter:
            span = time_span(question.question, memories.now)
            if span is not None:
                options["time_range"] = span.as_range
        hits = memories.flat.retrieve(question.question, **options)
        if self.mmr is None:
            return contexts_at_budgets([hit.context for hit in hits] or [""], budgets)
        pool = hits[:MMR_POOL]
        if not pool:
            return contexts_at_budgets([""], budgets)
        vectors = stored_vectors(memories.flat, [hit.id for hit in pool])
        order = mmr_order(vectors, np.array([hit.score for hit in pool]), self.mmr)
        return contexts_at_budgets(deduplicated(pool[i].text for i in order) or [""], budgets)


def stored_vectors(memory: Any, ids: Sequence[str]) -> np.ndarray:
    """The vectors a memory stores for these nodes (its index's rows), so MMR embeds nothing."""
    replica = memory._replica  # the benchmark reads the engine's own vectors
    with replica.lock.read():
        return np.asarray(replica.index.vectors(list(ids)), dtype=np.float32)


def mmr_order(vectors: np.ndarray, relevance: np.ndarray, weight: float) -> list[int]:
    """Maximal marginal relevance: each next item maximizes ``weight * relevance -
    (1 - weight) * (its highest cosine with the items before it)``."""
    chosen: list[int] = []
    left = list(range(len(relevance)))
    similarity = vectors @ vectors.T
    while left:
        redundancy = similarity[np.ix_(left, chosen)].max(axis=1) if chosen else np.zeros(len(left))
        values = weight * relevance[left] - (1.0 - weight) * redundancy
        best = left[int(np.argmax(values))]
        chosen.append(best)
        left.remove(best)
    return chosen


class Raptor(Row):
    name = "RAPTOR-style tree (offline, extractive)"

    def contexts(self, memories: Memories, question: OverviewQuestion, budgets: Sequence[int]) -> dict[int, str]:
        tree = memories.raptor
        if tree is None:
            from memtree.aggregate import ExtractiveAggregator
            from memtree_bench.raptor import RaptorTree

            texts = [turn.text for turn in memories.conversation.conversation.turns]
            tree = memories.raptor = RaptorTree.build(texts, memories.embedder, ExtractiveAggregator(memories.embedder))
        query = np.asarray(memories.embedder.embed_query(question.question), dtype=np.float32).reshape(-1)
        searchable = int(tree.shape()["searchable"])
        words, limit = max(budgets), _ranked_limit(budgets)
        while True:
            texts = deduplicated(hit.text for hit in tree.search(query, min(limit, searchable)))
            if limit >= searchable or sum(len(text.split()) for text in texts) >= words:
                return contexts_at_budgets(texts or [""], budgets)
            limit *= 2


class Retrieve(Row):
    def __init__(self, *, routed: bool) -> None:
        self.routed = routed
        self.name = "memtree retrieve, routed" if routed else "memtree retrieve"

    def contexts(self, memories: Memories, question: OverviewQuestion, budgets: Sequence[int]) -> dict[int, str]:
        options = {"now": memories.now, "route_overviews": self.routed, "min_similarity": None}
        if not self.routed:
            hits = memories.tree.retrieve(question.question, k=_ranked_limit(budgets), **options)
            return contexts_at_budgets([hit.context for hit in hits] or [""], budgets)
        out = {}
        for budget in budgets:
            hits = memories.tree.retrieve(question.question, k=_ranked_limit(budgets), token_budget=budget, **options)
            out[budget] = contexts_at_budgets([hit.context for hit in hits] or [""], [budget])[budget]
        return out


class Overview(Row):
    def __init__(self, name: str = "memtree overview", settings: Settings | None = None, variant: bool = False) -> None:
        self.name = name
        self.settings = settings or Settings()
        self.variant = variant

    def contexts(self, memories: Memories, question: OverviewQuestion, budgets: Sequence[int]) -> dict[int, str]:
        request = overview_request(question.question, memories.now)
        if request is None:
            request = OverviewRequest(question.question, time_span(question.question, memories.now))
        since, until = request.span.as_range if request.span is not None else (None, None)
        tree = memories.tree
        out = {}
        options = {"since": since, "until": until}
        for budget in budgets:
            query = check_overview(
                tree.config, request.about, {**options, "token_budget": budget}, tree.relevance_floor
            )
            hits = answer_overview(tree._replica, query, tree.embed_query, self.settings)  # research rows: settings
            out[budget] = contexts_at_budgets([hit.context for hit in hits] or [""], [budget])[budget]
        return out


def default_rows() -> list[Row]:
    """The report's rows, baselines first."""
    return [
        RandomSample(),
        FlatHybrid(),
        FlatHybrid(time_filter=True),
        FlatHybrid(mmr=MMR_LAMBDA),
        FlatHybrid(time_filter=True, mmr=MMR_LAMBDA),
        FlatHybrid(time_filter=True, mmr=MMR_SPAN_LAMBDA),
        Raptor(),
        Retrieve(routed=False),
        Retrieve(routed=True),
        Overview(),
    ]


FLAT_BASELINES: tuple[str, ...] = (
    "flat hybrid",
    "flat hybrid, time filter",
    "flat hybrid, MMR",
    "flat hybrid, time filter + MMR",
    f"flat hybrid, time filter + MMR {MMR_SPAN_LAMBDA}",
)
"""The flat rows the goals compare the overview with (the best of them per family and budget)."""
