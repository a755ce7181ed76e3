"""Fact coverage: how many of a question's gold facts a context delivers.

The overview benchmark (:mod:`memtree_bench.overview_bench`) asks questions whose
gold is a set of facts written by LoCoMo's annotators (``observation`` facts, each
with the turn it rests on, and dated ``event_summary`` events). A context covers a
fact in one of two ways, and the rule is the same for every method:

* **delivered**: the fact's evidence turn is in the context verbatim. A turn counts
  by the share of its sentences found (:func:`memtree_bench.metrics.turn_recall`,
  the evidence recall of design.md §5); a fact resting on several turns takes their
  mean.
* **restated**: one sentence of the context holds at least :data:`RESTATED_SHARE`
  of the fact's content words, and at least :data:`RESTATED_MIN` of them. Content
  words are lower-cased alphabetic words of three letters or more, not in
  :data:`STOPWORDS` and not a name of the conversation's speakers (every turn
  carries one), each reduced to its Porter stem (``painted`` and ``painting`` are
  one word). A summary that says "Caroline attended an LGBTQ support group" covers
  "Caroline attended an LGBTQ support group recently and found the transgender
  stories inspiring" only if it says 60% of that (here: 6 of 9 words).

A fact's coverage is the larger of the two (a restated fact counts 1); a fact with
several wordings (a turn that several observations cite) is restated by any of them. A question's
coverage is the mean over its facts; its evidence recall is the mean turn recall
over the distinct evidence turns of its facts (events have none).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache

from memtree.text import fold, split_sentences
from memtree_bench.metrics import turn_recall

RESTATED_SHARE = 0.6
"""The share of a fact's content words one context sentence must hold to restate it."""

RESTATED_MIN = 2
"""The fewest content words a restating sentence must share with the fact."""

_WORD = re.compile(r"[a-z]+")

_STOPWORDS = """
    a about above after again against all also am an and any are as at be because been before being below
    between both but by can could did do does doing down during each few for from further had has have having
    he her here hers herself him himself his how i if in into is it its itself just me more most my myself no
    nor not now of off on once only or other our ours ourselves out over own same she should so some such than
    that the their theirs them themselves then there these they this those through to too under until up very
    was we were what when where which while who whom why will with would you your yours yourself yourselves
    really like get got getting one much many lot lots thing things something anything everything way also
    since still even ever always never another every around back going went gone come came make made take
    took give gave keep kept let say said tell told well yeah yes okay sure thanks thank great good awesome
    wow hey hope glad nice cool amazing totally definitely pretty super stuff
"""
STOPWORDS = frozenset(_STOPWORDS.split())
"""Words that carry no fact: function words and chat filler."""


@lru_cache(maxsize=1)
def _stemmer() -> Callable[[str], str]:
    from nltk.stem.porter import PorterStemmer  # the bench extra; no data download needed

    stem = PorterStemmer().stem
    return lru_cache(maxsize=200_000)(stem)


def content_words(text: str, names: Iterable[str] = ()) -> frozenset[str]:
    """The stems of ``text``'s content words, without the words of ``names``."""
    return _content_words(text, tuple(names))


@lru_cache(maxsize=500_000)
def _content_words(text: str, names: tuple[str, ...]) -> frozenset[str]:
    """:func:`content_words`, computed once per text: a benchmark scores the same
    facts and sentences against many contexts."""
    excluded = {word for name in names for word in _WORD.findall(name.lower())}
    stem = _stemmer()
    return frozenset(
        stem(word)
        for word in _WORD.findall(text.lower())
        if len(word) >= 3 and word not in STOPWORDS and word not in excluded
    )


@dataclass(frozen=True)
class Fact:
    """One gold fact: its wordings (any restated counts; none: only its turns can
    deliver it), the ids of the turns it rests on (none for an event) and its kind
    (``observation``, ``event``, or ``evidence``: a turn a LoCoMo question cites)."""

    wordings: tuple[str, ...]
    evidence: tuple[str, ...] = ()
    kind: str = "observation"


class Context:
    """A context prepared once for scoring many facts: its folded text and the
    content words of each of its sentences."""

    def __init__(self, text: str, names: Sequence[str]) -> None:
        self.folded = fold(text)
        self.names = tuple(names)
        self.sentences = [content_words(sentence, names) for sentence in split_sentences(text)]

    def restates(self, fact_words: frozenset[str]) -> bool:
        if len(fact_words) < RESTATED_MIN:
            return False
        need = max(RESTATED_MIN, RESTATED_SHARE * len(fact_words))
        return any(len(fact_words & sentence) >= need for sentence in self.sentences)


@dataclass(frozen=True)
class Coverage:
    """A question's scores: fact coverage, evidence recall, and how many facts were restated."""

    coverage: float
    evidence_recall: float | None
    restated: int


def score_context(context: str, facts: Sequence[Fact], utterances: dict[str, str], names: Sequence[str]) -> Coverage:
    """Fact coverage and evidence recall of ``context`` for ``facts``; ``utterances``
    maps a turn id to its raw utterance, ``names`` are the speakers' names."""
    if not facts:
        raise ValueError("a question needs at least one gold fact")
    prepared = Context(context, names)
    total, restated = 0.0, 0
    for fact in facts:
        delivered = _delivered(fact.evidence, utterances, prepared.folded)
        if delivered < 1.0 and any(prepared.restates(content_words(text, names)) for text in fact.wordings):
            restated += 1
            delivered = 1.0
        total += delivered
    turns = sorted({turn for fact in facts for turn in fact.evidence if turn in utterances})
    recall = sum(turn_recall(utterances[t], prepared.folded) for t in turns) / len(turns) if turns else None
    return Coverage(total / len(facts), recall, restated)


def _delivered(evidence: Sequence[str], utterances: dict[str, str], folded: str) -> float:
    turns = [turn for turn in evidence if turn in utterances]
    if not turns:
        return 0.0
    return sum(turn_recall(utterances[turn], folded) for turn in turns) / len(turns)
