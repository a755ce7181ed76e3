"""Synthetic memories for the scale benchmark: texts and embeddings with topics, seeded.

Approximate search is only as good as the neighbours the data has. Uniform random
vectors (the scale benchmark's data before issue 38) have none: in 384 dimensions
every stored vector is about as far from a query as every other, so an IVF or HNSW
index must read most of the data to find the true top 10. Sentence embeddings are
not like that: texts about one subject sit together. So these memories have
subjects, and their vectors say so:

* a text is about one of ``topics`` topics (64 themes of 64 topics each); it names
  its topic (``t123``, as a memory names a person or a place) and has 10-26 other
  words drawn from a Zipf law (:mod:`memtree_bench.zipf`);
* :class:`TopicEmbedder` embeds it as its topic's centre plus the feature-hashed bag
  of its words (memtree's ``HashingEmbedder``), normalized: texts of one topic are
  near each other, texts that share words nearer still;
* a query names a topic and five Zipf words, embedded the same way.

With the defaults a query's nearest stored text has cosine about 0.55 and a random
pair about 0.02 (the report prints both), and of the nearest 10 texts most share
the query's topic, as a question's nearest memories mostly concern its subject.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from memtree.embed import Embedder, HashingEmbedder, Matrix
from memtree_bench.zipf import ZipfWords

SPEAKERS = ("Caroline", "Melanie", "Jon", "Gina")


@dataclass(frozen=True)
class TopicSpace:
    """Topic centres: ``themes`` random unit vectors, each with ``per_theme`` topics
    scattered around it."""

    dimension: int = 384
    themes: int = 64
    per_theme: int = 64
    spread: float = 0.9
    """How far a topic strays from its theme (the theme's weight is 1)."""
    seed: int = 0

    @property
    def topics(self) -> int:
        return self.themes * self.per_theme

    @cached_property
    def centres(self) -> Matrix:
        rng = np.random.default_rng(self.seed)
        themes = _unit(rng.standard_normal((self.themes, self.dimension)).astype(np.float32))
        offsets = _unit(rng.standard_normal((self.topics, self.dimension)).astype(np.float32))
        return _unit(np.repeat(themes, self.per_theme, axis=0) + self.spread * offsets)


class TopicEmbedder(Embedder):
    """Embeds a text as its topic's centre plus the hashed bag of its words.

    The topic is the text's first word of the form ``t<number>``; a text without one
    is embedded from its words alone. ``word_weight`` weighs the words against the
    topic (1: the two alike). Deterministic, no model: a benchmark's embedder.
    """

    call_timeout = None  # arithmetic on the caller's thread: it cannot hang

    def __init__(self, space: TopicSpace | None = None, word_weight: float = 1.1) -> None:
        self.space = space or TopicSpace()
        self.word_weight = word_weight
        self._words = HashingEmbedder(self.space.dimension)

    @property
    def name(self) -> str:
        return f"TopicEmbedder({self.space.dimension}, topics={self.space.topics}, words={self.word_weight})"

    def embed(self, texts: Sequence[str]) -> Matrix:
        words = self._words.embed(texts) * self.word_weight
        topics = np.fromiter((topic_of(text) for text in texts), dtype=np.int64, count=len(texts))
        named = topics >= 0
        words[named] += self.space.centres[topics[named] % self.space.topics]
        return _unit(words)


def topic_of(text: str) -> int:
    """The topic a text names (its first ``t<number>`` word), or -1."""
    for word in text.split(maxsplit=3)[:3]:
        if word[:1] == "t" and word[1:].isdigit():
            return int(word[1:])
    return -1


@dataclass(frozen=True)
class Memories:
    """A seeded stream of notes with topics, metadata and event times."""

    space: TopicSpace = field(default_factory=TopicSpace)
    words: ZipfWords = field(default_factory=ZipfWords)
    seed: int = 1

    def batch(self, start: int, count: int) -> tuple[list[str], list[dict[str, Any]], list[float]]:
        """Notes ``start`` to ``start + count`` (the same for every run): texts, metadata, times."""
        rng = np.random.default_rng([self.seed, start, count])
        topics = rng.integers(0, self.space.topics, size=count)
        bodies = self.words.texts(rng, count, 10, 26)
        texts = [f"t{topic} {body}" for topic, body in zip(topics.tolist(), bodies, strict=True)]
        metadata = [
            {"speaker": SPEAKERS[(start + i) % len(SPEAKERS)], "session": (start + i) // 500} for i in range(count)
        ]
        times = [1.6e9 + 60.0 * (start + i) for i in range(count)]
        return texts, metadata, times

    def queries(self, count: int, seed: int = 7) -> list[str]:
        """Questions: a topic and five Zipf words each."""
        rng = np.random.default_rng([self.seed, seed])
        topics = rng.integers(0, self.space.topics, size=count)
        bodies = self.words.texts(rng, count, 5, 5)
        return [f"t{topic} {body}" for topic, body in zip(topics.tolist(), bodies, strict=True)]


def _unit(matrix: Matrix) -> Matrix:
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return (matrix / norms).astype(np.float32)
