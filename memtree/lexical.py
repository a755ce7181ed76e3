"""``LexicalIndex``: an incremental BM25 index over node texts, beside the vector index.

Dense embeddings of a small sentence model blur exactly what memory questions hinge
on: names, places, objects, dates ("When did Caroline go to the LGBTQ support
group?"). On LoCoMo, mixing BM25 into the cosine score raised memtree's evidence
recall at 500 words from 0.56 to 0.70 (benchmarks/results/locomo.md). The index is
kept current per change, like the vector index: writing a node re-indexes only its
text, nothing is rebuilt.

Scoring is Okapi BM25 (k1 = 1.5, b = 0.75) with the always-positive idf
``log(1 + (N - df + 0.5) / (df + 0.5))``. Tokens are lower-cased words; a short
list of English function words is left out, which keeps posting lists of common
words from dominating query time in large memories.
"""

from __future__ import annotations

import heapq
import math
import re
from collections import Counter
from collections.abc import Callable

_WORD = re.compile(r"\w+", re.UNICODE)

_STOPWORD_TEXT = """a about above after again against all am an and any are as at be because been before being below
    between both but by can could did do does doing down during each few for from further had has have
    having he her here hers herself him himself his how i if in into is it its itself just me more most my
    myself no nor not now of off on once only or other our ours ourselves out over own same she should so
    some such than that the their theirs them themselves then there these they this those through to too
    under until up very was we were what when where which while who whom why will with would you your
    yours yourself yourselves s t d ll m re ve"""
STOPWORDS: frozenset[str] = frozenset(_STOPWORD_TEXT.split())


def lexical_tokens(text: str) -> list[str]:
    """The terms BM25 counts: lower-cased words without English function words."""
    return [word for word in _WORD.findall(text.casefold()) if word not in STOPWORDS]


class LexicalIndex:
    """BM25 over a changing set of documents keyed by node id."""

    k1 = 1.5
    b = 0.75

    def __init__(self) -> None:
        self._postings: dict[str, dict[str, int]] = {}
        self._lengths: dict[str, int] = {}
        self._terms: dict[str, tuple[str, ...]] = {}
        self._total_length = 0

    def __len__(self) -> int:
        return len(self._lengths)

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._lengths

    def upsert(self, node_id: str, text: str) -> None:
        """Index ``text`` under ``node_id``, replacing what was there."""
        self.remove(node_id)
        counts = Counter(lexical_tokens(text))
        for term, count in counts.items():
            self._postings.setdefault(term, {})[node_id] = count
        length = sum(counts.values())
        self._lengths[node_id] = length
        self._terms[node_id] = tuple(counts)
        self._total_length += length

    def remove(self, node_id: str) -> None:
        """Forget ``node_id`` (no-op when absent)."""
        terms = self._terms.pop(node_id, None)
        if terms is None:
            return
        self._total_length -= self._lengths.pop(node_id)
        for term in terms:
            posting = self._postings[term]
            del posting[node_id]
            if not posting:
                del self._postings[term]

    def scores(self, query: str, allowed: Callable[[str], bool] | None = None) -> dict[str, float]:
        """BM25 score of every document sharing a term with ``query`` (and ``allowed``)."""
        count = len(self._lengths)
        if not count:
            return {}
        average = self._total_length / count or 1.0
        totals: dict[str, float] = {}
        for term, query_count in Counter(lexical_tokens(query)).items():
            posting = self._postings.get(term)
            if not posting:
                continue
            idf = math.log(1.0 + (count - len(posting) + 0.5) / (len(posting) + 0.5)) * query_count
            k1, b, lengths = self.k1, self.b, self._lengths
            for node_id, tf in posting.items():
                norm = k1 * (1.0 - b + b * lengths[node_id] / average)
                totals[node_id] = totals.get(node_id, 0.0) + idf * tf * (k1 + 1.0) / (tf + norm)
        if allowed is not None:
            totals = {node_id: score for node_id, score in totals.items() if allowed(node_id)}
        return totals


def top(scores: dict[str, float], limit: int) -> list[tuple[str, float]]:
    """The ``limit`` best (id, score) pairs, best first, ties by id."""
    return heapq.nsmallest(limit, scores.items(), key=lambda pair: (-pair[1], pair[0]))
