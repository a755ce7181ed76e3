"""The retrieval methods the LoCoMo benchmark compares, behind one small interface.

A method ingests a conversation's turns one by one (timed per insert) and, for a
question, returns texts in rank order: what it would put into a prompt. The
harness cuts them at each word budget, so every method is charged for length.
"""

from __future__ import annotations

import re
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from memtree.aggregate import Aggregator, LLMAggregator
from memtree.config import MemTreeConfig
from memtree.embed import Embedder, Matrix
from memtree.packing import DeliveredSentences
from memtree.text import count_words
from memtree_bench.locomo import Turn
from memtree_bench.saved_trees import SavedTrees, TreeRecipe
from memtree_bench.summary_quality import summary_quality

_WORD = re.compile(r"\w+")


class CachedEmbedder(Embedder):
    """An embedder that remembers every text it embedded, so the methods of one run
    share leaf and query embeddings. ``calls`` counts the calls made *to it*, cache
    hits included, which is what a method would pay without the cache."""

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner
        self._cache: dict[str, np.ndarray] = {}

    @property
    def name(self) -> str:
        return self.inner.name

    def embed(self, texts: Sequence[str]) -> Matrix:
        missing = list(dict.fromkeys(text for text in texts if text not in self._cache))
        if missing:
            vectors = self.inner.embed(missing)
            self._cache.update(zip(missing, np.asarray(vectors, dtype=np.float32), strict=True))
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        return np.stack([self._cache[text] for text in texts])

    @property
    def pools_parts(self) -> bool:  # type: ignore[override]
        return self.inner.pools_parts

    def embed_parts(self, texts: Sequence[str], parts: Sequence[Sequence[str]]) -> tuple[Matrix, list[Matrix]]:
        """The inner model's pooled parts (never cached: a part's vector depends on
        the text around it), its text vectors cached as :meth:`embed` caches them."""
        if not self.inner.pools_parts:
            return super().embed_parts(texts, parts)
        vectors, part_vectors = self.inner.embed_parts(texts, parts)
        self._cache.update(zip(texts, np.asarray(vectors, dtype=np.float32), strict=True))
        return vectors, part_vectors


@dataclass
class IngestCost:
    """What ingesting one conversation cost a method."""

    insert_seconds: list[float] = field(default_factory=list)
    insert_cpu_seconds: float | None = None
    """Process CPU time (all threads) of the whole ingest: on a machine shared with
    other jobs a steadier measure than the wall-clock latencies. The tree builder sets
    it for the trees it builds or reads (a saved tree keeps its build's; NaN for one
    saved before this was recorded), the harness for every other method."""
    embedding_calls: int = 0
    aggregation_calls: int = 0
    shape: dict[str, float] = field(default_factory=dict)
    saved_tree: dict[str, str] = field(default_factory=dict)
    """The saved tree this cost came from or went to (``file``, ``sha256``); empty when none."""
    quality: dict[str, float] = field(default_factory=dict)
    """What a tree's summaries are like (:func:`~memtree_bench.summary_quality.summary_quality`),
    and how many model summaries the guards checked and replaced; empty without summaries."""


class Method(ABC):
    """One row of the report (``variant``: a tuning variant, not one of the report's main rows)."""

    name: str
    variant: bool = False

    @abstractmethod
    def ingest(self, turns: Sequence[Turn], conversation: str | None = None) -> IngestCost:
        """Take a whole conversation, turn by turn (or all at once for offline methods).
        ``conversation`` names it (a saved tree is found by that name)."""

    @abstractmethod
    def ranked_texts(self, question: str, words: int) -> list[str]:
        """Texts best first, at least ``words`` words of them when the memory has that many."""

    def close(self) -> None:  # noqa: B027 - an optional hook; most methods hold nothing to release
        """Release what :meth:`ingest` built."""


class FlatDense(Method):
    """Dense retrieval over raw turns: the MemoryStream baseline."""

    name = "flat dense"

    def __init__(self, embedder: Embedder) -> None:
        self.embedder = embedder
        self._texts: list[str] = []
        self._matrix: np.ndarray = np.zeros((0, 0), dtype=np.float32)

    def ingest(self, turns: Sequence[Turn], conversation: str | None = None) -> IngestCost:
        cost = IngestCost()
        rows = []
        for turn in turns:
            start = time.perf_counter()
            rows.append(self.embedder.embed([turn.text])[0])
            cost.insert_seconds.append(time.perf_counter() - start)
        self._texts = [turn.text for turn in turns]
        self._matrix = np.stack(rows)
        cost.embedding_calls = len(turns)
        cost.shape = flat_shape(len(turns))
        return cost

    def ranked_texts(self, question: str, words: int) -> list[str]:
        scores = self._matrix @ np.asarray(self.embedder.embed_query(question), dtype=np.float32).reshape(-1)
        return [self._texts[i] for i in np.argsort(-scores, kind="stable")]


def flat_shape(turns: int) -> dict[str, float]:
    """The shape of a flat list of turns, on the terms of ``TreeStats``: every turn a
    leaf at depth 1 under the root, no summaries, so branching (children per summary,
    the root excluded) is 0, as memtree's own tree reports it without summaries."""
    return {"nodes": float(turns), "max_depth": 1.0, "mean_depth": 1.0, "branching": 0.0}


def bm25_tokens(text: str) -> list[str]:
    """Lower-cased word tokens, what the BM25 baseline indexes."""
    return _WORD.findall(text.lower())


class BM25Baseline(Method):
    """Okapi BM25 over raw turns (``rank-bm25``)."""

    name = "BM25"

    def __init__(self) -> None:
        self._texts: list[str] = []
        self._bm25: Any = None

    def ingest(self, turns: Sequence[Turn], conversation: str | None = None) -> IngestCost:
        from rank_bm25 import BM25Okapi

        start = time.perf_counter()
        self._texts = [turn.text for turn in turns]
        self._bm25 = BM25Okapi([bm25_tokens(text) for text in self._texts])
        per_insert = (time.perf_counter() - start) / max(1, len(turns))
        cost = IngestCost(insert_seconds=[per_insert] * len(turns))
        cost.shape = flat_shape(len(turns))
        return cost

    def ranked_texts(self, question: str, words: int) -> list[str]:
        scores = self._bm25.get_scores(bm25_tokens(question))
        return [self._texts[i] for i in np.argsort(-scores, kind="stable")]


class TreeBuilder:
    """Builds memtree's tree for a conversation once, for every row that only
    retrieves differently from it (defaults, traversal, the paper's dense ranking):
    they then share the tree, its costs and its shape.

    With ``saved`` (a folder of :class:`~memtree_bench.saved_trees.SavedTrees`) and
    the tree's ``recipe``, a tree already saved there is read instead of built, and
    one that is built is saved; ``reuse_only`` makes a missing tree an error
    instead of a build (``--trees``: score saved trees, never spend a model's hour)."""

    def __init__(
        self,
        embedder: Embedder,
        *,
        config: MemTreeConfig | None = None,
        aggregator_factory: Callable[[], Aggregator] | None = None,
        deferred: bool = False,
        saved: SavedTrees | None = None,
        recipe: TreeRecipe | None = None,
        reuse_only: bool = False,
        facts: dict[str, Any] | None = None,
    ) -> None:
        if saved is not None and recipe is None:
            raise ValueError("a TreeBuilder that saves or reads saved trees needs the trees' recipe")
        self.embedder = embedder
        self.config = config or (recipe.config if recipe else MemTreeConfig())
        self.aggregator_factory = aggregator_factory
        self.deferred = deferred
        self.saved = saved
        self.recipe = recipe
        self.reuse_only = reuse_only
        self.facts = facts or {}
        self.memory: Any = None
        self.cost = IngestCost()
        self._turns: Sequence[Turn] | None = None

    def build(self, turns: Sequence[Turn], conversation: str | None = None) -> tuple[Any, IngestCost]:
        """The memory of these turns, built (or read from the saved trees) on first request."""
        if self._turns is turns and self.memory is not None:
            return self.memory, self.cost
        from memtree.tree import MemTree

        self.close()
        saved, recipe = self.saved, self.recipe
        if (
            saved is not None
            and recipe is not None
            and conversation is not None
            and (self.reuse_only or saved.has(conversation, recipe))
        ):
            return self._read_saved(turns, conversation)
        build = saved.in_progress(conversation, recipe) if saved and recipe and conversation else None
        checkpoint = build.resume_from(len(turns)) if build else None
        progress: dict[str, Any] = checkpoint[1] if checkpoint else {}
        aggregator = self.aggregator_factory() if self.aggregator_factory else None
        if isinstance(aggregator, LLMAggregator) and build:
            aggregator.on_reply = build.reply_logger(keep=progress.get("replies", 0))
        self.memory = MemTree(embedder=self.embedder, aggregator=aggregator, config=self.config)
        cpu_started = time.process_time() - float(progress.get("insert_cpu_seconds", 0.0))
        self.cost = IngestCost(insert_seconds=list(progress.get("insert_seconds", [])))
        if checkpoint:
            self.memory.import_jsonl(checkpoint[0])
        earlier: dict[str, float] = progress.get("counters", {})
        sessions: dict[int, list[Turn]] = {}
        for turn in turns:
            sessions.setdefault(turn.session, []).append(turn)
        for number, session in enumerate(sessions.values()):
            if number < progress.get("sessions_done", 0):
                continue
            if self.deferred:
                self._ingest_deferred(session)
            else:
                for turn in session:
                    start = time.perf_counter()
                    self.memory.add(turn.text, timestamp=turn.timestamp, source_id=turn.dia_id)
                    self.cost.insert_seconds.append(time.perf_counter() - start)
            if build and number + 1 < len(sessions):
                counters = _counters(self.memory, earlier)
                build.checkpoint(
                    self.memory,
                    {
                        "turns": len(turns),
                        "sessions_done": number + 1,
                        "insert_seconds": self.cost.insert_seconds,
                        "insert_cpu_seconds": time.process_time() - cpu_started,
                        "counters": counters,
                        "replies": int(counters["summaries_checked"]),
                    },
                )
        if self.memory.stats().stale:
            self.memory.repair()  # a summary whose model call failed gets one more try
        self.cost.insert_cpu_seconds = time.process_time() - cpu_started
        counters = _counters(self.memory, earlier)
        stats = self.memory.stats()
        self.cost.embedding_calls = int(counters["embedding_calls"])
        self.cost.aggregation_calls = int(counters["aggregation_calls"])
        self.cost.shape = {
            "nodes": stats.nodes,
            "max_depth": stats.max_depth,
            "mean_depth": stats.mean_leaf_depth,
            "branching": stats.branching,
        }
        self.cost.quality = {
            **summary_quality(self.memory),
            **{name: counters[name] for name in _GUARD_COUNTERS},
            "stale_summaries": float(stats.stale),
        }
        self._turns = turns
        if self.saved is not None and self.recipe is not None and conversation is not None:
            sidecar = self.saved.save(self.memory, conversation, len(turns), self.recipe, self._facts_of_build())
            self.cost.saved_tree = {"file": sidecar["file"], "sha256": sidecar["tree_sha256"]}
            if build:
                build.finish()
        return self.memory, self.cost

    def _facts_of_build(self) -> dict[str, Any]:
        return {
            **self.facts,
            "insert_seconds": self.cost.insert_seconds,
            "insert_cpu_seconds": self.cost.insert_cpu_seconds,
            "embedding_calls": self.cost.embedding_calls,
            "aggregation_calls": self.cost.aggregation_calls,
            "shape": self.cost.shape,
            "quality": self.cost.quality,
        }

    def _read_saved(self, turns: Sequence[Turn], conversation: str) -> tuple[Any, IngestCost]:
        assert self.saved is not None and self.recipe is not None
        facts = self.saved.load_sidecar(conversation, self.recipe, len(turns))
        self.memory = self.saved.open(conversation, self.recipe, self.embedder)
        self.cost = IngestCost(
            insert_seconds=list(facts["insert_seconds"]),
            embedding_calls=int(facts["embedding_calls"]),
            aggregation_calls=int(facts["aggregation_calls"]),
            shape=dict(facts["shape"]),
            quality=dict(facts["quality"]),
            saved_tree={"file": facts["file"], "sha256": facts["tree_sha256"]},
            insert_cpu_seconds=float(facts.get("insert_cpu_seconds", "nan")),
        )
        self._turns = turns
        return self.memory, self.cost

    def _ingest_deferred(self, session: Sequence[Turn]) -> None:
        """Deferred aggregation of one session: its summaries are rewritten once, at
        its end; each insert is charged the session's mean."""
        start = time.perf_counter()
        with self.memory.deferred():
            for turn in session:
                self.memory.add(turn.text, timestamp=turn.timestamp, source_id=turn.dia_id)
        self.cost.insert_seconds.extend([(time.perf_counter() - start) / len(session)] * len(session))

    def close(self) -> None:
        if self.memory is not None:
            self.memory.close()
            self.memory = None
            self._turns = None


_GUARD_COUNTERS = ("summaries_checked", "summary_retries", "summary_dates_restored", "summary_fallbacks")
"""What a guarded model's ``stats().extra`` counts, as a build reports it."""
_COUNTERS = ("embedding_calls", "aggregation_calls", *_GUARD_COUNTERS)


def _counters(memory: Any, earlier: dict[str, float]) -> dict[str, float]:
    """The build's costs so far: this memory's counts plus those of the runs before a
    resumed checkpoint (a memory restored from a backup counts from zero)."""
    stats = memory.stats()
    now = {
        "embedding_calls": float(stats.embedding_calls),
        "aggregation_calls": float(stats.aggregation_calls),
        **{name: float(stats.extra.get(name, 0)) for name in _GUARD_COUNTERS},
    }
    return {name: now[name] + float(earlier.get(name, 0)) for name in _COUNTERS}


class MemTreeMethod(Method):
    """A memtree row: a tree from ``builder`` and a way to retrieve from it. The
    context is each result's de-duplicated ``context``, as an application uses it."""

    def __init__(
        self,
        name: str,
        builder: TreeBuilder,
        *,
        mode: str = "collapsed",
        retrieve_options: dict[str, Any] | None = None,
        variant: bool = False,
    ) -> None:
        self.name = name
        self.variant = variant
        self.builder = builder
        self.mode = mode
        self.retrieve_options = retrieve_options or {}
        self.memory: Any = None
        self.now: float | None = None

    def ingest(self, turns: Sequence[Turn], conversation: str | None = None) -> IngestCost:
        self.memory, cost = self.builder.build(turns, conversation)
        stamps = [turn.timestamp for turn in turns if turn.timestamp is not None]
        self.now = max(stamps) if stamps else None
        return cost

    def ranked_texts(self, question: str, words: int) -> list[str]:
        k = max(10, words // 8)
        # Evidence recall compares rankings at a word budget, so the relevance floor
        # that MemTree.retrieve applies by default is off unless a row turns it on:
        # it would only stop some rows from filling the budget (docs/benchmarks.md).
        # Relative times in questions ("last year") count back from the latest turn,
        # the moment the questions are asked in, not from the day the benchmark runs.
        options = {"min_similarity": None, "now": self.now, **self.retrieve_options}
        results = self.memory.retrieve(question, k=k, mode=self.mode, **options)
        return [result.context for result in results]


class RaptorMethod(Method):
    """An offline RAPTOR-style tree (:mod:`memtree_bench.raptor`) built once with the
    whole conversation in view, searched collapsed and packed like memtree's rows
    (repeated sentences dropped); its build time is spread over the turns as the
    per-insert cost."""

    name = "RAPTOR-style (offline)"

    def __init__(self, embedder: Embedder, aggregator_factory: Callable[[], Aggregator]) -> None:
        self.embedder = embedder
        self.aggregator_factory = aggregator_factory
        self.tree: Any = None

    def ingest(self, turns: Sequence[Turn], conversation: str | None = None) -> IngestCost:
        from memtree_bench.raptor import RaptorTree

        start = time.perf_counter()
        self.tree = RaptorTree.build([turn.text for turn in turns], self.embedder, self.aggregator_factory())
        per_insert = (time.perf_counter() - start) / max(1, len(turns))
        cost = IngestCost(insert_seconds=[per_insert] * len(turns))
        cost.embedding_calls = self.tree.embedding_calls
        cost.aggregation_calls = self.tree.aggregation_calls
        cost.shape = self.tree.shape()
        return cost

    def ranked_texts(self, question: str, words: int) -> list[str]:
        """The collapsed ranking packed as memtree packs its own: each hit gives only
        the sentences no better hit gave (:class:`~memtree.packing.DeliveredSentences`);
        the search widens until that holds ``words`` words or every node is in."""
        query = np.asarray(self.embedder.embed_query(question), dtype=np.float32).reshape(-1)
        searchable = int(self.tree.shape()["searchable"])
        limit = max(10, words // 8)
        while True:
            texts = deduplicated(hit.text for hit in self.tree.search(query, min(limit, searchable)))
            if limit >= searchable or sum(count_words(text) for text in texts) >= words:
                return texts
            limit *= 2


def deduplicated(texts: Iterable[str]) -> list[str]:
    """``texts`` in order, each without the sentences an earlier one gave, those with
    nothing new left out: the packing every tree method of the benchmark shares."""
    delivered = DeliveredSentences()
    return [part for part in map(delivered.new_part, texts) if part is not None]
