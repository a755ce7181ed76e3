"""The retrieval metrics of design.md §5: evidence recall and answer recall at a word budget.

Every method is scored on the same thing: the text it would put in a prompt,
its retrieved texts concatenated in rank order and cut at ``budget`` whitespace
words. A method that returns long summaries pays for their length.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import lru_cache

from memtree.text import fold, split_sentences


def context_at_budget(texts: Iterable[str], budget: int) -> str:
    """``texts`` joined in order and cut after ``budget`` whitespace words."""
    if budget <= 0:
        raise ValueError(f"budget must be a positive number of words, got {budget}")
    words: list[str] = []
    for text in texts:
        words.extend(text.split())
        if len(words) >= budget:
            break
    return " ".join(words[:budget])


def contexts_at_budgets(texts: Sequence[str], budgets: Sequence[int]) -> dict[int, str]:
    """:func:`context_at_budget` for several budgets at once (one pass over the words)."""
    if not budgets:
        raise ValueError("no budgets given")
    words = " ".join(texts).split()
    return {budget: " ".join(words[:budget]) for budget in budgets}


def turn_recall(utterance: str, context_folded: str) -> float:
    """Fraction of the utterance's sentences found verbatim in the (folded) context."""
    sentences = _folded_sentences(utterance)
    if not sentences:
        return 0.0
    return sum(sentence in context_folded for sentence in sentences) / len(sentences)


@lru_cache(maxsize=100_000)
def _folded_sentences(utterance: str) -> tuple[str, ...]:
    """An utterance's non-empty folded sentences, split once however many contexts it is scored against."""
    return tuple(sentence for sentence in (fold(part) for part in split_sentences(utterance)) if sentence)


def evidence_recall(evidence_utterances: Sequence[str], context: str) -> float:
    """Mean :func:`turn_recall` over a question's gold turns."""
    if not evidence_utterances:
        raise ValueError("a question needs at least one evidence turn")
    context_folded = fold(context)
    return sum(turn_recall(text, context_folded) for text in evidence_utterances) / len(evidence_utterances)


def answer_recall(answer: str, context: str) -> float:
    """1.0 when the gold answer string appears in the context (case and space folded)."""
    gold = fold(answer)
    return float(bool(gold) and gold in fold(context))
