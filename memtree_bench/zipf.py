"""Synthetic texts for the scale benchmark: words drawn from a Zipf law, seeded.

Hybrid retrieval's lexical half costs what the posting lists of the query's words
cost, so the texts must have the skew of real text: a few words in most documents,
most words in few. Word ``r`` (``w1``, ``w2``, …, by rank) is drawn with
probability proportional to ``r ** -exponent`` from a fixed vocabulary; no word is a
function word, so every drawn word is counted. With the defaults the most common
word is in 91% of 10-26-word texts and the fifth in 34% (LoCoMo's turns: "pm" and
"2023", from the date prefix, in 75%, the fifth word in 19%), so queries drawn from
the same law reach more postings than LoCoMo's questions do, whose words are mostly
rarer (names, objects): a harder case for the lexical index, not an easier one.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import cached_property

import numpy as np


@dataclass(frozen=True)
class ZipfWords:
    """A vocabulary of ``size`` words whose frequencies follow ``rank ** -exponent``."""

    size: int = 100_000
    exponent: float = 1.1

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"the vocabulary needs at least one word, got size={self.size}")
        if self.exponent <= 0:
            raise ValueError(f"the Zipf exponent must be positive, got {self.exponent}")

    def texts(self, rng: np.random.Generator, count: int, shortest: int, longest: int) -> list[str]:
        """``count`` texts of ``shortest`` to ``longest`` words (uniform), words drawn
        independently from the law."""
        if not 0 <= shortest <= longest:
            raise ValueError(f"need 0 <= shortest <= longest, got {shortest} and {longest}")
        lengths = rng.integers(shortest, longest + 1, size=count)
        ranks = np.searchsorted(self._cumulative, rng.random(int(lengths.sum())), side="right")
        words = self._words[np.minimum(ranks, self.size - 1)]
        bounds = np.concatenate(([0], np.cumsum(lengths))).tolist()
        return [" ".join(words[start:end]) for start, end in itertools.pairwise(bounds)]

    @cached_property
    def _cumulative(self) -> np.ndarray:
        weights = np.arange(1, self.size + 1, dtype=np.float64) ** -self.exponent
        cumulative = np.cumsum(weights)
        return cumulative / cumulative[-1]  # type: ignore[no-any-return]

    @cached_property
    def _words(self) -> np.ndarray:
        return np.array([f"w{rank}" for rank in range(1, self.size + 1)], dtype=object)
