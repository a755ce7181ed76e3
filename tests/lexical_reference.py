"""The first, pure-Python BM25 index, kept as the reference the NumPy index must match.

Dict postings, a Python loop per posting entry: obviously right and slow. The tests
run random upserts, removes and queries against both (tests/test_lexical.py).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable

from memtree.lexical import lexical_tokens


class ReferenceLexicalIndex:
    """BM25 over a changing set of documents keyed by node id (the textbook loop)."""

    k1 = 1.5
    b = 0.75

    def __init__(self) -> None:
        self._postings: dict[str, dict[str, int]] = {}
        self._lengths: dict[str, int] = {}
        self._terms: dict[str, tuple[str, ...]] = {}
        self._total_length = 0

    def __len__(self) -> int:
        return len(self._lengths)

    def upsert(self, node_id: str, text: str) -> None:
        self.remove(node_id)
        counts = Counter(lexical_tokens(text))
        for term, count in counts.items():
            self._postings.setdefault(term, {})[node_id] = count
        length = sum(counts.values())
        self._lengths[node_id] = length
        self._terms[node_id] = tuple(counts)
        self._total_length += length

    def remove(self, node_id: str) -> None:
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
