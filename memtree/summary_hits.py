"""What a summary that ranks among the results delivers: its best leaves, or its text.

A summary matches a question by what its subtree is about ("Caroline's hobbies",
"the trip in May"), often better than any one leaf does. But a reader answers from
the details, and a summary holds them only in part: a model-written summary
paraphrases, and an extractive one only quotes its most central sentences. Delivered
in place of the evidence, a model's prose summary cost 11.6 points of LoCoMo
evidence recall against flat hybrid search at 500 words
(benchmarks/results/locomo_llm.md).

So by default (``MemTreeConfig.summary_hits="leaves"``) a summary that ranks is a
pointer: in its place come its best leaves that were not delivered yet, by their
own scores, until they cost :data:`LEAF_ALLOWANCE` times the tokens the summary's
own text would have; each such result names the summary in ``found_by``. Hybrid
ranking then discounts a summary's score by :data:`SUMMARY_HIT_WEIGHT`. The summaries find, the leaves
answer (benchmarks/results/locomo_llm_retrieval.md measures it on model-written and
extractive trees). ``summary_hits="text"`` delivers the summary's own text instead,
as the paper does and as memtree did before.
"""

from __future__ import annotations

from collections.abc import Callable

from memtree.feedback import Feedback, passes_floor
from memtree.index import VectorIndex
from memtree.node import Vector
from memtree.state import TreeState

SUMMARY_HITS: tuple[str, ...] = ("leaves", "text")
"""What a summary that ranks delivers: its best leaves (the default) or its own text."""

Ranked = list[tuple[str, float]]

SUMMARY_HIT_WEIGHT = 0.75
"""What hybrid collapsed ranking multiplies a summary's score by when a summary hit
delivers leaves (``SUMMARY_WEIGHT``, 0.85, when it delivers its text). Chosen on the
tuning conversations, LoCoMo 0-4 with extractive summaries and conversation 1 with
Qwen2.5-Coder-1.5B's (benchmarks/results/locomo_llm_retrieval.md): with a model's
summaries, 0.75 with twice the allowance gave +4.5 / +5.6 / +4.8 / +2.3 points of
evidence recall over flat hybrid at 250 / 500 / 1000 / 2000 words where 0.85 with
one gave -0.1 / -1.9 / +3.7 / -0.9; with extractive ones both are at or above flat
hybrid at every budget (+0.0 / +0.5 / +0.8 / +0.2 against +0.3 / +0.8 / +1.0 / +0.3)."""

LEAF_ALLOWANCE = 2.0
"""How many times the tokens of a summary's own text its leaves may cost in its place."""


def check_summary_hits(value: object) -> str:
    """``value`` if it is one of :data:`SUMMARY_HITS`, else a ``ValueError`` naming them."""
    if value not in SUMMARY_HITS:
        raise ValueError(f"summary_hits must be one of: {', '.join(SUMMARY_HITS)}; got {value!r}")
    return str(value)


def best_leaves_under(
    index: VectorIndex,
    state: TreeState,
    query: Vector,
    score: Callable[[list[str]], list[float]],
    allowed: Callable[[str], bool],
    min_score: float | None,
    min_similarity: float | None,
    feedback: Feedback | None = None,
) -> Callable[[str], Ranked]:
    """A function from a summary's id to its leaves that may be delivered, best
    first (ties by id), each with its own score (``score``: the ranking's scorer).

    A leaf may be delivered if ``allowed`` (the retrieval's filters: not expired,
    inside the time range) and if it passes the retrieval's own gates on its own
    score and the relevance floor (:func:`memtree.feedback.passes_floor`, with the
    retrieval's ``feedback``), so a summary never brings in a leaf that would have
    been cut had it ranked by itself."""

    known: dict[str, Ranked] = {}  # a retrieval that widens its search packs again

    def leaves_of(summary_id: str) -> Ranked:
        if summary_id not in known:
            known[summary_id] = _best(summary_id)
        return known[summary_id]

    def _best(summary_id: str) -> Ranked:
        leaves = [leaf for leaf in state.leaf_ids_under(summary_id) if allowed(leaf)]
        if not leaves:
            return []
        ranked = list(zip(leaves, score(leaves), strict=True))
        if min_score is not None:
            ranked = [pair for pair in ranked if pair[1] >= min_score]
        if min_similarity is not None and ranked:
            passing = passes_floor(index, state, query, [leaf for leaf, _ in ranked], min_similarity, feedback)
            ranked = [pair for pair, keep in zip(ranked, passing, strict=True) if keep]
        ranked.sort(key=lambda pair: (-pair[1], pair[0]))
        return ranked

    return leaves_of
