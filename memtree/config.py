"""``MemTreeConfig``: every tuning knob of a memory in one validated object."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Literal

from memtree.inputs import to_ttl
from memtree.text import count_tokens

RetrievalMode = Literal["collapsed", "traversal"]
RETRIEVAL_MODES: tuple[str, ...] = ("collapsed", "traversal")
ParentEmbedding = Literal["text", "mean", "sentences"]
SummaryHits = Literal["leaves", "text"]
Aggregation = Literal["eager", "deferred", "background"]
AGGREGATION_MODES: tuple[str, ...] = ("eager", "deferred", "background")


@dataclass(frozen=True)
class MemTreeConfig:
    """How a memory routes, aggregates and retrieves.

    The defaults follow ``design.md``: the paper's depth-adaptive threshold
    ``θ(d) = θ0 · exp(λ · d / D)`` clamped to ``max_threshold``, where ``D`` is
    ``threshold_depth`` or, when that is ``None``, the tree's current depth.

    ``parent_embedding`` says where a summary's vector comes from. ``"sentences"``
    (the default): an extractive summary's is the word-weighted mean of its
    sentences' vectors, which the memory made when their texts came in, so writing
    it costs no embedding; a model's summary (new prose) is embedded. ``"text"``:
    every summary's text is embedded, as in the paper. ``"mean"``: the mean of its
    leaves' vectors. On LoCoMo "sentences" left evidence recall where "text" had it
    (paired difference at 500 words -0.0001 over 760 questions) and took a chat
    turn's insert from 4.4× flat dense's CPU to 1.1× (docs/benchmarks.md).

    ``theta0="auto"`` calibrates θ0 from the embedder's own similarity scale: over the
    first ``calibration_samples`` inserts it records how similar each new text is to
    its nearest stored leaf and takes the ``calibration_quantile`` of those scores.
    Until then it uses ``auto_theta0_start``. The calibrated value is stored with the
    namespace, so a reopened memory routes exactly as before.

    ``max_concurrency`` bounds the aggregation calls in flight at once (the
    summaries on one insert's path are written concurrently, so an insert costs one
    model round-trip; ``1`` runs them one after another, as the paper did).
    ``aggregation_max_words`` bounds the new text a deferred rewrite puts in one
    model call; a summary with more new text is folded over several calls.
    ``summary_max_chars`` caps every summary an aggregator writes, whatever the
    model: a longer one is cut after its last sentence end within the cap, or, with
    none there, rejected as a failed aggregation (the node stays stale). Both are
    counted (``stats().extra``: ``summaries_cut``, ``summaries_rejected``).

    ``lexical_weight`` (w) mixes BM25 into retrieval scores: a node scores
    ``(cosine + w * BM25 / best BM25) / (1 + w)``, on the scale of cosine, and in
    collapsed ranking a summary's score is then multiplied by
    :data:`memtree.retrieval.SUMMARY_WEIGHT` (0.85), so a summary is delivered only
    when it beats its leaves clearly. ``0`` gives the paper's pure dense retrieval
    (no discount) and keeps no lexical index. 0.3 is what measured best on LoCoMo
    (benchmarks/results/locomo.md, locomo_variants.md).

    ``aggregation`` says when an insert's summaries are written (``add`` and
    ``add_many`` can override it per call). ``"eager"`` writes them inside the
    insert, as the paper does: the caller waits for the model. ``"deferred"``
    stores the leaf and leaves the summaries stale until :meth:`MemTree.flush`,
    :meth:`MemTree.close` or interpreter exit (one rewrite per summary for many
    inserts: the fewest model calls, but summaries lag until then).
    ``"background"`` stores the leaf the same way and has a worker thread write the
    summaries soon after (see :mod:`memtree.background`): the caller never waits
    for the model, and summaries lag by about one model call.
    ``background_queue_size`` bounds that worker's queue of notifications; a full
    queue loses nothing (the work itself is kept, coalesced, per summary).

    ``summary_hits`` says what a summary that ranks among the results delivers:
    ``"leaves"`` (the default), its best leaves not delivered yet, by their own
    scores, up to the tokens its own text costs (the summary finds, its leaves
    answer); ``"text"``, the summary's own text, as in the paper
    (:mod:`memtree.summary_hits`; ``retrieve(summary_hits=...)`` per call).

    ``min_similarity`` is the relevance floor: a result whose cosine similarity to
    the query is below it is left out, so a query nothing stored is about gets
    nothing. ``"auto"`` (the default) is the floor calibrated for the memory's
    embedder (:func:`memtree.retrieval.relevance_floor`: 0.3 for the offline
    all-MiniLM-L6-v2; no floor for a model none was measured for); ``None`` turns it
    off, a number sets it. ``retrieve(min_similarity=...)`` sets it per call; every
    adapter (middleware, retrievers, store) applies the same value.

    ``min_score`` is the lowest hybrid ``score`` a result may have; ``None`` (the
    default) cuts nothing. That score is relative to the query's best word match, so
    it is no measure of relevance by itself: the floor above is.

    ``ann_min_nodes``: from this many nodes on, collapsed retrieval searches an IVF
    index (:mod:`memtree.ann`) instead of every vector: a few milliseconds at a
    million nodes, with recall@10 measured in benchmarks/results/scale.md; below it,
    and whenever ``retrieve(exact=True)`` asks, results are exact. ``None``: always
    exact. ``ann_probe_share`` and ``ann_min_probes``: the share of the IVF's lists a
    query reads (at least that many lists), the knob between speed and recall.
    ``segment_min_nodes``: from this many nodes on, where the store keeps files
    (SQLite; PostgreSQL with ``index_dir``), the tree is also written to
    memory-mapped index files beside it, so a reopen maps them instead of reading
    every row (:mod:`memtree.checkpoint`); ``segment_share``: the share of a
    segment's nodes that must change before the next one is written (in the
    background). ``None``: no files.

    ``parse_times`` (default on) reads a time expression in a query ("in May 2023",
    "last week", :mod:`memtree.time_expressions`) and ranks the memories inside the
    range it names higher (``retrieve(parse_times=False)`` per call; a query with
    none ranks exactly as without it). ``route_overviews`` (default on) answers an
    overview request ("what do you know about...", "recap...", "what happened
    in...") with :meth:`MemTree.overview` (:mod:`memtree.intent`).
    ``context_feedback`` (0.3; 0: off) lets the best first match's tree context move
    the query before the ranking that is delivered (:mod:`memtree.feedback`): a leaf
    whose own words miss the question is found through the memory it hangs with.

    ``default_ttl`` is how long a memory added without ``ttl`` or ``expires_at`` is
    kept, in seconds (or a ``timedelta``); ``None`` (the default): for ever. Give each
    namespace with its own retention its own config (``MemTree.with_namespace(ns,
    config=...)``). Expired memories are never returned and are swept by writes
    and :meth:`MemTree.sweep_expired`.

    Example::

        MemTreeConfig(theta0=0.4, depth_cap=12, parent_embedding="mean")
    """

    theta0: float | Literal["auto"] = "auto"
    decay: float = 0.5
    threshold_depth: int | None = None
    max_threshold: float = 0.99
    depth_cap: int = 24
    near_duplicate: float = 0.99
    deduplicate: bool = True
    parent_embedding: ParentEmbedding = "sentences"
    calibration_samples: int = 32
    calibration_quantile: float = 0.5
    auto_theta0_start: float = 0.4
    k: int = 10
    token_budget: int | None = None
    min_score: float | None = None
    min_similarity: float | Literal["auto"] | None = "auto"
    same_subject: float | None = None
    lexical_weight: float = 0.3
    mode: RetrievalMode = "collapsed"
    beam: int = 3
    drop_repeated_sentences: bool = True
    summary_hits: SummaryHits = "leaves"
    max_concurrency: int = 8
    aggregation_max_words: int = 2000
    summary_max_chars: int = 4000
    aggregation: Aggregation = "eager"
    background_queue_size: int = 1024
    default_ttl: float | timedelta | None = None
    ann_min_nodes: int | None = 20_000
    ann_probe_share: float = 0.01
    ann_min_probes: int = 8
    segment_min_nodes: int | None = 20_000
    segment_share: float = 0.1
    parse_times: bool = True
    route_overviews: bool = True
    context_feedback: float = 0.3
    token_counter: Callable[[str], int] = field(default=count_tokens, compare=False)

    def __post_init__(self) -> None:
        if self.theta0 != "auto":
            if isinstance(self.theta0, bool) or not isinstance(self.theta0, (int, float)):
                raise TypeError(f"theta0 must be a number or 'auto', got {self.theta0!r}")
            _check_range("theta0", float(self.theta0), -1.0, 1.0)
        _check_range("auto_theta0_start", self.auto_theta0_start, -1.0, 1.0)
        _check_range("max_threshold", self.max_threshold, -1.0, 1.0)
        _check_range("near_duplicate", self.near_duplicate, -1.0, 1.0)
        if self.min_score is not None:
            _check_range("min_score", self.min_score, -1.0, 1.0)
        if self.min_similarity is not None and self.min_similarity != "auto":
            if isinstance(self.min_similarity, bool) or not isinstance(self.min_similarity, (int, float)):
                raise TypeError(f"min_similarity must be a number, 'auto' or None, got {self.min_similarity!r}")
            _check_range("min_similarity", self.min_similarity, -1.0, 1.0)
        if self.same_subject is not None:
            _check_range("same_subject", self.same_subject, -1.0, 1.0)
        _check_range("lexical_weight", self.lexical_weight, 0.0, 10.0)
        _check_range("context_feedback", self.context_feedback, 0.0, 10.0)
        _check_range("calibration_quantile", self.calibration_quantile, 0.0, 1.0)
        if not math.isfinite(self.decay):
            raise ValueError(f"decay must be a finite number, got {self.decay}")
        _check_positive("depth_cap", self.depth_cap, minimum=2)
        _check_positive("calibration_samples", self.calibration_samples)
        _check_positive("k", self.k)
        _check_positive("beam", self.beam)
        _check_positive("max_concurrency", self.max_concurrency)
        _check_positive("aggregation_max_words", self.aggregation_max_words)
        _check_positive("summary_max_chars", self.summary_max_chars, minimum=16)
        _check_positive("background_queue_size", self.background_queue_size)
        if self.aggregation not in AGGREGATION_MODES:
            raise ValueError(f"aggregation must be one of: {', '.join(AGGREGATION_MODES)}; got {self.aggregation!r}")
        if self.default_ttl is not None:
            to_ttl(self.default_ttl, "default_ttl")
        for name in ("ann_min_nodes", "segment_min_nodes"):
            if getattr(self, name) is not None:
                _check_positive(name, getattr(self, name))
        _check_positive("ann_min_probes", self.ann_min_probes)
        if isinstance(self.ann_probe_share, bool) or not 0.0 < self.ann_probe_share <= 1.0:
            raise ValueError(f"ann_probe_share must be a share of the lists in (0, 1], got {self.ann_probe_share!r}")
        if isinstance(self.segment_share, bool) or not 0.0 < self.segment_share <= 1.0:
            raise ValueError(f"segment_share must be a share in (0, 1], got {self.segment_share!r}")
        if self.threshold_depth is not None:
            _check_positive("threshold_depth", self.threshold_depth)
        if self.token_budget is not None:
            _check_positive("token_budget", self.token_budget)
        if self.parent_embedding not in ("text", "mean", "sentences"):
            raise ValueError(f"parent_embedding must be 'text', 'mean' or 'sentences', got {self.parent_embedding!r}")
        if self.mode not in RETRIEVAL_MODES:
            raise ValueError(f"unknown mode {self.mode!r}; choose one of {', '.join(RETRIEVAL_MODES)}")
        for name in ("parse_times", "route_overviews"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.summary_hits not in ("leaves", "text"):
            raise ValueError(f"summary_hits must be 'leaves' or 'text', got {self.summary_hits!r}")

    def with_options(self, **changes: object) -> MemTreeConfig:
        """A copy with some fields changed (validated again)."""
        return replace(self, **changes)  # type: ignore[arg-type]


def _check_range(name: str, value: float, low: float, high: float) -> None:
    if not (low <= value <= high):
        raise ValueError(f"{name} must be between {low} and {high}, got {value}")


def _check_positive(name: str, value: int, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
