"""Retrieval: rank nodes for a query, then pack them into a result list.

Ranking is either *collapsed* (score every node but the root at once, design.md
§1) or *traversal* (from the root keep the best ``beam`` children per level, as in
RAPTOR and HAT). Either is *hybrid* by default: a node's score mixes its cosine
similarity with ``lexical_weight`` times its BM25 score normalized by the best one,
because names, places and dates are what small embedding models blur
(benchmarks/results/locomo.md measures it). Collapsed hybrid ranking discounts
summaries (:data:`SUMMARY_WEIGHT`). Packing walks the ranking best first and applies
the caller's ``min_score`` (if any), ``k``, sentence de-duplication and the token budget.

Each result also carries its plain cosine with the query (``similarity``), computed
once for the ``k`` results: the hybrid ``score`` is on another scale, and callers
that port a cut-off tuned on a vector store (LlamaIndex's ``similarity_cutoff``)
need the cosine.

A retrieval fills what was asked: ``k`` results, or the token budget, whenever
enough nodes pass the filters (:func:`retrieve`). Nothing is cut by score unless
the caller sets a ``min_score``. Traversal lists the nodes its beam kept, then the
best leaves below them, then (if still short) every other node by collapsed rank.

Packing (:mod:`memtree.packing`) and the newer-first order
(:mod:`memtree.recency`) have modules of their own.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, TypedDict

import numpy as np
import numpy.typing as npt

from memtree.config import RETRIEVAL_MODES, MemTreeConfig
from memtree.embed import check_query_embedding
from memtree.feedback import NAME_WEIGHT, Feedback, boosted, context_feedback, passes_floor
from memtree.index import Mask, VectorIndex
from memtree.inputs import TimeLike, to_min_score, to_time_range
from memtree.intent import routed_overview
from memtree.lexical import LexicalIndex, LexicalQuery
from memtree.node import ROOT_ID, RetrievedNode, Vector
from memtree.packing import Packing, pack
from memtree.recency import SIBLINGS as SIBLINGS  # where users imported it from before
from memtree.recency import newer_first
from memtree.redaction import unreadable
from memtree.replica import Replica
from memtree.spare_core import IN_TURN, SEARCHES, Overlap
from memtree.state import TreeState
from memtree.summary_hits import SUMMARY_HIT_WEIGHT, best_leaves_under, check_summary_hits
from memtree.text import require_text
from memtree.time_expressions import time_span
from memtree.where import Selection, Where, parse_where

Ranked = list[tuple[str, float]]
WordHits = dict[tuple[bytes, bytes, int, bool], tuple[Ranked, dict[str, float]]]
"""BM25 searches made during one retrieval, by query, with every BM25 score worked out
for that query since: context feedback's second ranking asks the same words again
unless it added names."""


@dataclass(frozen=True)
class Filters:
    """What a result may be: only leaves, leaves whose metadata pass ``where`` (see
    :mod:`memtree.where`), an event time inside ``time_range`` (inclusive; ``None``
    leaves a side open), none of ``hidden`` (expired leaves and summaries of
    nothing else: :meth:`~memtree.state.TreeState.hidden`)."""

    leaves_only: bool = False
    where: Where | None = None
    time_range: tuple[float | None, float | None] | None = None
    hidden: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if isinstance(self.where, Mapping):  # a where dict, not yet parsed
            object.__setattr__(self, "where", parse_where(self.where))

    @property
    def active(self) -> bool:
        return self.leaves_only or bool(self.where) or self.time_range is not None or bool(self.hidden)


@dataclass(frozen=True)
class LexicalShare:
    """The query's words and the weight BM25 gets beside cosine similarity; ``names``
    (context feedback, :mod:`memtree.feedback`) count as words of the query at
    ``name_weight``."""

    text: str
    weight: float
    names: tuple[str, ...] = ()
    name_weight: float = NAME_WEIGHT


def prepared_words(words: LexicalIndex, lexical: LexicalShare) -> LexicalQuery:
    """``lexical``'s words as the BM25 index weighs them, its names at their weight."""
    prepared = words.prepare(lexical.text)
    if not lexical.names:
        return prepared
    extra = words.prepare(" ".join(lexical.names))
    new = ~np.isin(extra.terms, prepared.terms)
    if not new.any():
        return prepared
    return LexicalQuery(
        np.concatenate([prepared.terms, extra.terms[new]]),
        np.concatenate([prepared.weights, extra.weights[new] * lexical.name_weight]),
        prepared.average_length,
    )


def first_limit(k: int) -> int:
    """How many ranked nodes a collapsed retrieval of ``k`` results asks for first:
    de-duplication skips some, so a few more than ``k`` (``MemTree.retrieve`` asks
    again for four times as many when these run out)."""
    return k * 4 + 16


RELEVANCE_FLOOR = 0.3
"""The relevance gate's floor for all-MiniLM-L6-v2 (the offline default embedder):
the cosine similarity to the query below which a result is not relevant
(``retrieve(min_similarity=...)``; :func:`relevance_floor` hands it out).

It is a cosine, not a hybrid score: the hybrid score's BM25 part is relative to the
query's best word match, which gets the full share however unrelated the query.
Calibrated by benchmarks/relevance_gate.py (benchmarks/results/relevance_gate.md):
the highest floor that keeps the evidence of 95% of the LoCoMo questions (of
conversations 0-4) that get some with the agent middleware's retrieval."""

CALIBRATED_FLOORS: dict[str, float] = {"all-minilm-l6-v2": RELEVANCE_FLOOR}
"""Relevance floors measured per embedding model (lower-case model name). Another
model scores on another scale; add it here after running benchmarks/relevance_gate.py
with it."""


def relevance_floor(embedder_name: str) -> float | None:
    """The calibrated relevance floor of the embedder called ``embedder_name`` (its
    ``Embedder.name``, e.g. ``LocalEmbedder(sentence-transformers/all-MiniLM-L6-v2)``),
    or ``None`` when none was measured for that model: no gate is better than a
    floor on the wrong scale, which could drop every relevant memory."""
    name = embedder_name.lower()
    return next((floor for model, floor in CALIBRATED_FLOORS.items() if model in name), None)


TIME_PREFERENCE = 0.2
"""What a node inside the time range a query names (:mod:`memtree.time_expressions`)
adds to its score. A boost rather than a filter: an event is often told of after
its day ("last week I..."), and a range that misses it must not hide it. On the 100
LoCoMo questions of conversations 0-4 that name a time, it raised evidence recall by
+2.2 / +7.6 / +6.1 / +2.1 points at 250 / 500 / 1000 / 2000 words, where filtering
by the range lost 1.1-11.7 points and ranking the range first then the rest gained
-0.4 / +5.8 / +4.1 / +1.9 (0.1 gave +0.7 / +6.6 / +6.1 / +3.1)."""


@dataclass(frozen=True)
class Preference:
    """Nodes whose event time lies in ``time_range`` (inclusive; ``None`` leaves a
    side open) rank ``boost`` higher."""

    time_range: tuple[float | None, float | None]
    boost: float = TIME_PREFERENCE


OVERLAP_MIN_NODES = 8192
"""From this many nodes up, hybrid ranking runs its BM25 search beside the vector
scan by default; on smaller memories the scan is too short for the thread handoff
to pay (at 4,000 synthetic nodes it cost more than it saved). Not beside an
approximate (IVF) search either: it takes about what the BM25 search takes, and on a
busy machine waiting for the helper thread to be scheduled cost a 100k-node query
20 ms against 3.5 ms in turn (benchmarks/results/scale.md)."""

SUMMARY_WEIGHT = 0.85
"""What hybrid collapsed ranking multiplies a summary's score by (leaves keep theirs).

Offline summaries are made of their leaves' sentences, so a summary that outranks
the leaf it quotes only spends budget on what the leaf would give; discounted, a
summary comes first only when it is clearly more relevant than each of its leaves
alone (it matches words spread over several of them). On LoCoMo this is what makes
the summaries add evidence recall over the same ranking of leaves alone, at every
budget; 1.0 (no discount) loses to it, and 0.7-0.9 all measure alike
(benchmarks/results/locomo_variants.md). Dense-only ranking (``lexical_weight=0``)
stays the paper's: no discount."""


def rank_collapsed(
    index: VectorIndex,
    state: TreeState,
    query: Vector,
    limit: int,
    filters: Filters,
    lexical: LexicalShare | None = None,
    overlap: Overlap | None = None,
    summary_weight: float = SUMMARY_WEIGHT,
    prefer: Preference | None = None,
    exact: bool = False,
    among: Sequence[str] | None = None,
    memo: WordHits | None = None,
) -> Ranked:
    """The best nodes among those the filters allow, by cosine similarity or, when
    ``lexical`` is given, by ``(cosine + weight * BM25 / best BM25) / (1 + weight)``:
    the same ranking as the plain sum, on the scale of cosine (an exact match of
    text and words scores 1), so thresholds keep their meaning. Hybrid ranking then
    multiplies each summary's score by ``summary_weight`` (:data:`SUMMARY_WEIGHT`, or
    :data:`memtree.summary_hits.SUMMARY_HIT_WEIGHT` when a summary hit delivers leaves).

    Hybrid ranking fuses two candidate lists, as hybrid search engines do: the
    ``limit`` best nodes by cosine (one vector search) and the ``limit`` best
    by BM25 (one top-k search, which does not score every node sharing a word with
    the query, see :mod:`memtree.lexical`); their union is scored by the formula
    and ranked. A node in neither list is not ranked: it would need a middling
    cosine and a middling BM25 score at once to beat them, and ``MemTree.retrieve``
    asks again for four times as many when packing runs out. An exhaustive check
    would cost a vector scan per widening: on uncorrelated synthetic data at 100k
    nodes, three to four scans per query (benchmarks/results/scale.md).

    The BM25 search runs on a spare core during the vector scan (``overlap``; by
    default :data:`memtree.spare_core.SEARCHES` on memories of :data:`OVERLAP_MIN_NODES`
    nodes or more whose vector search scans every row, else the calling thread does
    both in turn).

    The vector search is approximate on memories past ``ann_min_nodes`` unless
    ``exact`` (:meth:`memtree.index.VectorIndex.search`); the filters hold either way.

    With ``prefer``, the best nodes inside its time range are ranked as well and every
    node of either list is rescored on one scale (:func:`_preferring`).

    ``among``: the vector side scores these nodes (which the filters allowed in an
    earlier ranking) instead of searching: context feedback's second ranking on an
    approximate memory (:func:`_feedback_among`). ``memo``: BM25 searches already
    made for this retrieval, by query (the filters are the same for all of them)."""
    if prefer is not None:
        return _preferring(index, state, query, limit, filters, lexical, overlap, summary_weight, prefer, exact)
    selection = state.leaves_matching(filters.where) if filters.where else None
    ids = selection.ids if selection is not None and not selection.negated else None
    excluded = selection.ids if selection is not None and selection.negated else None
    if filters.hidden:
        if ids is not None:
            ids = ids - filters.hidden
        else:
            excluded = filters.hidden if excluded is None else excluded | filters.hidden
    mask = index.mask(
        leaves_only=filters.leaves_only or (selection is not None and selection.negated),
        time_range=filters.time_range,
        ids=ids,
        excluded=excluded,
    )
    if lexical is None or lexical.weight <= 0 or state.lexical is None:
        return (
            _scored_among(index, query, among, limit)
            if among is not None
            else index.search(query, limit, mask, exact=exact)
        )
    allowed: Callable[[str], bool] | None = None
    if mask is not None:  # the same rows the mask lets through, asked per id by the BM25 search
        rows = mask
        allowed = lambda node_id: index.allows(node_id, rows)  # noqa: E731
    if overlap is None:  # a spare core pays only beside a full scan (see OVERLAP_MIN_NODES)
        scans = exact or not index.approximate
        overlap = SEARCHES if scans and len(index) >= OVERLAP_MIN_NODES else IN_TURN
    return _rank_hybrid(index, state, query, limit, mask, allowed, lexical, overlap, summary_weight, exact, among, memo)


def _scored_among(index: VectorIndex, query: Vector, among: Sequence[str], limit: int) -> Ranked:
    """The ``limit`` best of ``among`` by cosine, best first (ties by id)."""
    ids = list(among)
    ranked = sorted(zip(ids, index.score(query, ids).tolist(), strict=True), key=lambda pair: (-pair[1], pair[0]))
    return ranked[:limit]


def _feedback_among(
    index: VectorIndex, first: Ranked | None, exact: bool, prefer: Preference | None
) -> list[str] | None:
    """What context feedback's second ranking re-scores instead of searching again:
    the first ranking's nodes, on a memory searched approximately (past
    ``ann_min_nodes``, without ``exact``). The moved query is the first one nudged
    towards one context, so its nearest nodes are mostly the first ranking's; a second
    approximate search would cost as much as the first (at 1M nodes, half of a query's
    time) and, by recall@10 against exact search, finds little more
    (benchmarks/results/scale.md). The BM25 side still searches: names the
    feedback adds find leaves the first ranking had no reason to reach ("Pepper").
    Exact memories (all below ``ann_min_nodes``) search twice, as before."""
    if first is None or exact or prefer is not None or not index.approximate:
        return None
    return [node_id for node_id, _ in first]


def _rank_hybrid(
    index: VectorIndex,
    state: TreeState,
    query: Vector,
    limit: int,
    mask: Mask | None,
    allowed: Callable[[str], bool] | None,
    lexical: LexicalShare,
    overlap: Overlap,
    summary_weight: float = SUMMARY_WEIGHT,
    exact: bool = False,
    among: Sequence[str] | None = None,
    memo: WordHits | None = None,
) -> Ranked:
    """The union of the ``limit`` best nodes by cosine and by BM25, scored and
    discounted as :func:`rank_collapsed` says, best first (ties by id).

    The BM25 search does not need the vector search, so ``overlap`` runs it beside
    the scan; the ranking is the same either way. The BM25 hits the vector search did
    not return are scored by cosine after both."""
    words = state.lexical
    assert words is not None

    def vector_search() -> Ranked:
        if among is not None:
            return _scored_among(index, query, among, limit)
        return index.search(query, limit, mask, exact=exact)

    def word_search() -> tuple[LexicalQuery, Ranked, dict[str, float]]:
        prepared = prepared_words(words, lexical)
        approximate = not exact and index.approximate  # then the words' search may be approximate too
        key = (prepared.terms.tobytes(), prepared.weights.tobytes(), limit, approximate)
        found = memo.get(key) if memo is not None else None
        if found is None:
            hits = words.search_and_score(prepared, limit, allowed, approximate=approximate)[0] if len(prepared) else []
            found = (hits, dict(hits))
            if memo is not None:
                memo[key] = found
        return prepared, found[0], found[1]

    dense, (prepared, hits, known) = overlap.run(vector_search, word_search)
    if not hits or hits[0][1] <= 0:  # no node shares a word with the query
        return _discounted(index, dense, summary_weight)
    similarities = dict(dense)  # where both found a node, the vector search's own cosine
    unseen = [node_id for node_id, _ in hits if node_id not in similarities]
    similarities.update(zip(unseen, index.score(query, unseen).tolist(), strict=True))
    unscored = [node_id for node_id, _ in dense if node_id not in known]
    known.update(zip(unscored, words.score_of(prepared, unscored).tolist(), strict=True))
    lexical_scores = known
    peak, weight = hits[0][1], lexical.weight
    scale = 1.0 / (1.0 + weight)
    fused = [
        (node_id, (similarity + weight * (lexical_scores[node_id] / peak)) * scale)
        for node_id, similarity in similarities.items()
    ]
    return _discounted(index, fused, summary_weight)


def _preferring(
    index: VectorIndex,
    state: TreeState,
    query: Vector,
    limit: int,
    filters: Filters,
    lexical: LexicalShare | None,
    overlap: Overlap | None,
    summary_weight: float,
    prefer: Preference,
    exact: bool = False,
) -> Ranked:
    """The ``limit`` best nodes the filters allow and the ``limit`` best of them inside
    the preferred range, each scored as :func:`_node_scorer` scores (BM25 over the
    best BM25 of the whole memory, so a node scores the same in both lists), the
    summaries discounted, the nodes inside the range raised by ``prefer.boost``."""
    inside = replace(filters, time_range=_narrowed(filters.time_range, prefer.time_range))
    ranked = rank_collapsed(index, state, query, limit, filters, lexical, overlap, summary_weight, exact=exact)
    preferred = rank_collapsed(index, state, query, limit, inside, lexical, overlap, summary_weight, exact=exact)
    ids = list(dict.fromkeys([node_id for node_id, _ in ranked] + [node_id for node_id, _ in preferred]))
    if not ids:
        return []
    weighted = lexical is not None and lexical.weight > 0 and state.lexical is not None
    scores = _node_scorer(index, state, query, lexical)(ids).tolist()
    leaves = index.leaf_flags(ids).tolist()
    start, end = prefer.time_range
    fused = []
    for node_id, score, leaf in zip(ids, scores, leaves, strict=True):
        if weighted and not leaf:
            score *= summary_weight
        stamp = state.nodes[node_id].timestamp
        if stamp is not None and (start is None or stamp >= start) and (end is None or stamp <= end):
            score += prefer.boost
        fused.append((node_id, float(score)))
    fused.sort(key=lambda pair: (-pair[1], pair[0]))
    return fused


def _narrowed(
    given: tuple[float | None, float | None] | None, preferred: tuple[float | None, float | None]
) -> tuple[float | None, float | None]:
    """The part of ``preferred`` inside ``given`` (an empty range when they miss)."""
    if given is None:
        return preferred
    starts = [side for side in (given[0], preferred[0]) if side is not None]
    ends = [side for side in (given[1], preferred[1]) if side is not None]
    return (max(starts) if starts else None, min(ends) if ends else None)


def _discounted(index: VectorIndex, ranked: Ranked, summary_weight: float = SUMMARY_WEIGHT) -> Ranked:
    """Summaries' scores times ``summary_weight``, best first (ties by id)."""
    leaves = index.leaf_flags([node_id for node_id, _ in ranked])
    weights = np.where(leaves, 1.0, summary_weight).tolist()
    weighed = [(node_id, score * weight) for (node_id, score), weight in zip(ranked, weights, strict=True)]
    weighed.sort(key=lambda pair: (-pair[1], pair[0]))
    return weighed


def rank_traversal(
    index: VectorIndex,
    state: TreeState,
    query: Vector,
    beam: int,
    filters: Filters,
    lexical: LexicalShare | None = None,
) -> Ranked:
    """Beam descent: at each level keep the ``beam`` best children of the kept nodes
    (scored as in :func:`rank_collapsed`, without the summary discount), best first;
    then the leaves below the kept summaries, best first.

    The descent alone keeps about ``beam`` nodes per level (some 27 on a LoCoMo
    conversation), so a larger ``k`` or budget could not be filled; the leaves
    below what the beam chose are the details of the themes it chose."""
    score = _node_scorer(index, state, query, lexical)
    kept: Ranked = []
    frontier = [ROOT_ID]
    while frontier:
        children = [child for node_id in frontier for child in state.nodes[node_id].children]
        if not children:
            break
        scores = score(children)
        order = np.argsort(-scores, kind="stable")[:beam]
        level = [(children[i], float(scores[i])) for i in order]
        kept.extend(level)
        frontier = [node_id for node_id, _ in level if not state.nodes[node_id].is_leaf]
    kept.sort(key=lambda pair: -pair[1])
    reached = {node_id for node_id, _ in kept}
    tops = [  # kept summaries whose parent was not kept: their leaves cover all the others'
        node_id
        for node_id, _ in kept
        if not state.nodes[node_id].is_leaf and state.nodes[node_id].parent not in reached
    ]
    below = [leaf for node_id in tops for leaf in state.leaf_ids_under(node_id) if leaf not in reached]
    if below:
        below_scores = score(below).tolist()
        fill = sorted(zip(below, below_scores, strict=True), key=lambda pair: (-pair[1], pair[0]))
        kept.extend((node_id, float(value)) for node_id, value in fill)
    selection = state.leaves_matching(filters.where) if filters.where else None
    return [pair for pair in kept if _allowed(state, pair[0], filters, selection)]


def _node_scorer(
    index: VectorIndex, state: TreeState, query: Vector, lexical: LexicalShare | None
) -> Callable[[list[str]], npt.NDArray[np.float32]]:
    """Scores of given nodes: cosine, or the hybrid score of :func:`rank_collapsed`
    (BM25 normalized by the best BM25 score of the whole memory)."""
    words = state.lexical if lexical is not None and lexical.weight > 0 else None
    prepared = prepared_words(words, lexical) if words is not None and lexical is not None else None
    hits = words.search(prepared, 1) if words is not None and prepared is not None and len(prepared) else []
    peak = hits[0][1] if hits else 0.0
    weight = lexical.weight if lexical is not None else 0.0

    def score(node_ids: list[str]) -> npt.NDArray[np.float32]:
        scores = index.score(query, node_ids)
        if peak > 0 and words is not None and prepared is not None:
            lexical_part = (words.score_of(prepared, node_ids) / peak).astype(np.float32)
            scores = ((scores + weight * lexical_part) / (1.0 + weight)).astype(np.float32)
        return scores

    return score


def retrieve(
    index: VectorIndex,
    state: TreeState,
    query: Vector,
    mode: str,
    beam: int,
    packing: Packing,
    filters: Filters,
    lexical: LexicalShare | None = None,
    prefer: Preference | None = None,
    feedback_weight: float = 0.0,
    *,
    exact: bool = False,
) -> list[RetrievedNode]:
    """Rank and pack until ``k`` results or the budget are reached, or every node
    that passes the filters (and ``min_score``, ``min_similarity``) was considered;
    then, with ``packing.same_subject``, put the newer of same-subject leaves first
    (:func:`newer_first`).

    Collapsed ranking asks for :func:`first_limit` nodes, then four times as many
    while de-duplication leaves the results short. Traversal packs its own ranking
    first (:func:`rank_traversal`) and, if that runs out, goes on with the other
    nodes in collapsed order. ``exact``: no approximate vector search (see
    :func:`rank_collapsed`)."""
    results = _ranked_and_packed(
        index, state, query, mode, beam, packing, filters, lexical, prefer, feedback_weight, exact
    )
    if packing.same_subject is not None:
        newer_first(index, state, results, packing.same_subject)
    return results


def _ranked_and_packed(
    index: VectorIndex,
    state: TreeState,
    query: Vector,
    mode: str,
    beam: int,
    packing: Packing,
    filters: Filters,
    lexical: LexicalShare | None,
    prefer: Preference | None = None,
    feedback_weight: float = 0.0,
    exact: bool = False,
) -> list[RetrievedNode]:
    lead: Ranked = []
    original = query
    feedback: Feedback | None = None
    first: Ranked | None = None  # a first ranking that gave no feedback is the one delivered
    among: list[str] | None = None
    memo: WordHits = {}  # the filters stay the same through this retrieval
    if mode != "traversal" and feedback_weight > 0:
        first = rank_collapsed(
            index,
            state,
            query,
            first_limit(packing.k),
            filters,
            lexical,
            summary_weight=_weight(packing),
            prefer=prefer,
            exact=exact,
            memo=memo,
        )
        text = lexical.text if lexical is not None else ""
        feedback = context_feedback(
            index, state, query, text, _gated(index, state, query, first, packing), feedback_weight
        )
        if feedback is not None:
            among = _feedback_among(index, first, exact, prefer)
            first, query = None, feedback.vector
            if lexical is not None:
                lexical = replace(lexical, names=feedback.names)
    leaves_of = _leaves_of(index, state, query, packing, filters, lexical, original, feedback)
    if mode == "traversal":
        lead = rank_traversal(index, state, query, beam, filters, lexical)
        gated = _gated(index, state, original, lead, packing, feedback)
        results, exhausted = pack(state, gated, packing, filters.hidden, leaves_of)
        if not exhausted:
            return with_similarities(index, original, results)
    taken = {node_id for node_id, _ in lead}
    limit = first_limit(packing.k)
    while True:
        if first is not None:
            ranked, first = first, None
        else:
            ranked = rank_collapsed(
                index,
                state,
                query,
                limit,
                filters,
                lexical,
                summary_weight=_weight(packing),
                prefer=prefer,
                exact=exact,
                among=among,
                memo=memo,
            )
            among = None  # a widened ranking searches
        if feedback is not None:
            ranked = boosted(index, state, ranked, feedback.speaker)
        combined = [*lead, *(pair for pair in ranked if pair[0] not in taken)] if lead else ranked
        gated = _gated(index, state, original, combined, packing, feedback)
        results, exhausted = pack(state, gated, packing, filters.hidden, leaves_of)
        closed = _gate_closed(ranked, packing, lexical) and (feedback is None or packing.min_similarity is None)
        if not exhausted or len(ranked) < limit or closed:
            return with_similarities(index, original, results)
        limit *= 4


def _leaves_of(
    index: VectorIndex,
    state: TreeState,
    query: Vector,
    packing: Packing,
    filters: Filters,
    lexical: LexicalShare | None,
    original: Vector | None = None,
    feedback: Feedback | None = None,
) -> Callable[[str], Ranked] | None:
    """What a summary hit delivers in its place (``summary_hits="leaves"``), or
    ``None`` when summaries deliver their own text (or cannot rank at all)."""
    if packing.summary_hits != "leaves" or filters.leaves_only:
        return None
    scorer: Callable[[list[str]], npt.NDArray[np.float32]] | None = None

    def score(node_ids: list[str]) -> list[float]:
        # Made when a summary is first delivered: most retrievals deliver none, and
        # the scorer's BM25 peak costs a search.
        nonlocal scorer
        if scorer is None:
            scorer = _node_scorer(index, state, query, lexical)
        return scorer(node_ids).tolist()

    selection = state.leaves_matching(filters.where) if filters.where else None
    return best_leaves_under(
        index,
        state,
        query if original is None else original,
        score,
        lambda node_id: _allowed(state, node_id, filters, selection),
        packing.min_score,
        packing.min_similarity,
        feedback=feedback,
    )


def _gate_closed(ranked: Ranked, packing: Packing, lexical: LexicalShare | None) -> bool:
    """Whether no node ranked below ``ranked`` could pass ``min_score`` or
    ``min_similarity``, so asking for more is pointless (a gate that lets nothing
    through must not widen the search to the whole memory).

    A hybrid score ``s`` bounds the cosine: ``cosine <= s * (1 + w)`` for a leaf, and
    ``/`` the summary weight more for a summary, since the BM25 part is never negative."""
    if not ranked:
        return True
    last = ranked[-1][1]
    if packing.min_score is not None and last < packing.min_score:
        return True
    if packing.min_similarity is None:
        return False
    if lexical is None or lexical.weight <= 0:
        return last < packing.min_similarity
    widest = last * (1.0 + lexical.weight)
    return max(widest, widest / _weight(packing)) < packing.min_similarity


def _weight(packing: Packing) -> float:
    """What hybrid collapsed ranking multiplies a summary's score by for this packing."""
    return SUMMARY_HIT_WEIGHT if packing.summary_hits == "leaves" else SUMMARY_WEIGHT


def _gated(
    index: VectorIndex,
    state: TreeState,
    query: Vector,
    ranked: Ranked,
    packing: Packing,
    feedback: Feedback | None = None,
) -> Ranked:
    """``ranked`` without the nodes below ``min_score`` or the relevance floor
    (``min_similarity``; under context feedback a node may pass through its context:
    :func:`memtree.feedback.passes_floor`)."""
    if packing.min_score is not None:
        ranked = [pair for pair in ranked if pair[1] >= packing.min_score]
    if packing.min_similarity is not None and ranked:
        ids = [node_id for node_id, _ in ranked]
        passing = passes_floor(index, state, query, ids, packing.min_similarity, feedback)
        ranked = [pair for pair, keep in zip(ranked, passing, strict=True) if keep]
    return ranked


def with_similarities(index: VectorIndex, query: Vector, results: list[RetrievedNode]) -> list[RetrievedNode]:
    """The results with their ``similarity``: each node's cosine with the query, in
    one product over the ``k`` results (the ranking's ``score`` is hybrid, on
    another scale; callers porting a cut-off tuned on a vector store need this)."""
    cosines = index.score(query, [result.id for result in results]).tolist()
    return [replace(result, similarity=cosine) for result, cosine in zip(results, cosines, strict=True)]


def _allowed(state: TreeState, node_id: str, filters: Filters, selection: Selection | None) -> bool:
    """Whether a node passes the filters; ``selection`` is what ``filters.where`` keeps."""
    node = state.nodes[node_id]
    if node_id in filters.hidden or (filters.leaves_only and not node.is_leaf):
        return False
    if selection is not None and not (node.is_leaf and node_id in selection):
        return False
    if filters.time_range is not None:
        start, end = filters.time_range
        if node.timestamp is None:
            return False
        if (start is not None and node.timestamp < start) or (end is not None and node.timestamp > end):
            return False
    return True


# -- a query from the public API, checked and answered -------------------------------


class RetrieveOptions(TypedDict, total=False):
    """The keyword options of ``MemTree.retrieve`` / ``aretrieve``, written once for
    both (``**options: Unpack[RetrieveOptions]``); one left out takes the memory's
    config, and an unknown one raises ``TypeError``."""

    k: int | None
    """How many results at most."""
    token_budget: int | None
    """The most tokens the results' ``context`` may hold together."""
    mode: str | None
    """``"collapsed"`` (every node scored) or ``"traversal"`` (beam descent from the root)."""
    leaves_only: bool
    """Only leaves (the remembered texts), no summaries."""
    where: Mapping[str, Any] | None
    """A leaf metadata filter: ``{"speaker": "Leo"}``, ``{"age": {"$gte": 30}}``,
    ``$and`` / ``$or`` / ``$not`` (:mod:`memtree.where`)."""
    time_range: tuple[TimeLike | None, TimeLike | None] | None
    """``(start, end)`` on event time, inclusive; ``None`` leaves a side open."""
    min_score: float | None
    """The lowest hybrid ``score`` a result may have. That score is relative to the
    best word match, so no measure of relevance by itself: ``min_similarity`` is."""
    min_similarity: float | Literal["auto"] | None
    """The relevance floor, a cosine: a result less similar to the query is left
    out, so an unrelated query gets nothing. ``"auto"`` (left out): the memory's
    ``config.min_similarity``, by default the floor calibrated for its embedder
    (:func:`relevance_floor`); ``None``: no floor; a number: that floor."""
    query_embedding: Vector | Sequence[float] | None
    """The query's vector from this memory's embedder, if you have it (one embedding
    for a search over many namespaces: ``MemTree.embed_query``)."""
    lexical_weight: float | None
    """The BM25 share of the hybrid score (``0``: cosine alone)."""
    same_subject: float | None
    """A cosine (``memtree.recency.SIBLINGS``: siblings only) above which a newer
    memory about the same subject is put just above an older one
    (:func:`memtree.recency.newer_first`)."""
    summary_hits: str | None
    """What a summary that ranks delivers: ``"leaves"`` (its best leaves, marked
    ``found_by``) or ``"text"`` (its own text)."""
    exact: bool
    """``True``: rank by an exact scan of every vector even where an approximate
    (IVF) index serves searches (:mod:`memtree.ann`); ``False`` (left out): the index's way."""
    now: TimeLike | None
    """The reference time of relative expressions in the query ("last week"); left
    out: the current time."""
    parse_times: bool | None
    """Whether a time expression in the query ranks the memories of its range higher
    (:mod:`memtree.time_expressions`; ``None``: ``config.parse_times``). A ``time_range``
    given turns it off."""
    route_overviews: bool | Literal["always"] | None
    """Whether an overview request ("what do you know about...", "recap...") is
    answered by ``MemTree.overview`` (``None``: ``config.route_overviews``);
    ``"always"``: every query, as an overview of what it names."""
    context_feedback: float | None
    """How far the best first match's tree context moves the query
    (:mod:`memtree.feedback`; ``0``: not at all; ``None``: ``config.context_feedback``)."""


RETRIEVE_OPTIONS: tuple[str, ...] = tuple(RetrieveOptions.__annotations__)
"""The names :class:`RetrieveOptions` allows, in order (adapters check theirs against it)."""

_GIVEN_OR_CONFIG = (
    "k",
    "token_budget",
    "mode",
    "min_score",
    "lexical_weight",
    "same_subject",
    "summary_hits",
    "context_feedback",
)
"""Options whose ``None`` means "the config's" (for the others ``None`` is a value:
``min_similarity=None`` turns the relevance floor off)."""


@dataclass(frozen=True)
class Query:
    """One ``retrieve`` call's options, checked: what to rank and how to pack it
    (``vector``: the caller's query embedding, if given)."""

    text: str
    mode: str
    packing: Packing
    filters: Filters
    lexical_weight: float
    vector: Vector | None = None
    prefer: Preference | None = None
    """The time range the query names, ranked higher (``parse_times``)."""
    feedback: float = 0.0
    """How far the best leaf's context moves the query (``context_feedback``; 0: not at all)."""
    routed: dict[str, Any] | None = None
    """``MemTree.overview``'s arguments when the query is an overview request that
    ``route_overviews`` sends there (:func:`memtree.intent.routed_overview`)."""
    exact: bool = False
    """No approximate vector search (``retrieve(exact=True)``)."""


def check_query(
    config: MemTreeConfig,
    state: TreeState,
    query: str,
    options: Mapping[str, Any],
    calibrated_floor: float | None = None,
) -> Query:
    """``MemTree.retrieve``'s arguments with the config's defaults filled in; a bad
    value (or an unknown option) raises naming it and what it accepts.
    ``calibrated_floor`` is the memory's embedder's relevance floor, which
    ``min_similarity="auto"`` (the config's default) stands for. Unless a
    ``time_range`` is given or ``parse_times`` is off, a time expression in the query
    ("in May 2023", "last week", counted back from ``now``) becomes a :class:`Preference`."""
    require_text(query, "query")
    unknown = sorted(set(options) - set(RETRIEVE_OPTIONS))
    if unknown:
        allowed = ", ".join(RETRIEVE_OPTIONS)
        raise TypeError(f"retrieve() got unknown option(s) {', '.join(unknown)}; it takes: {allowed}")
    given = {name: options[name] for name in _GIVEN_OR_CONFIG if options.get(name) is not None}
    k = given.get("k", config.k)
    if isinstance(k, bool) or not isinstance(k, int) or k <= 0:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    budget = given.get("token_budget", config.token_budget)
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget <= 0):
        raise ValueError(f"token_budget must be a positive integer or None, got {budget!r}")
    mode = given.get("mode", config.mode)
    if mode not in RETRIEVAL_MODES:
        raise ValueError(f"unknown mode {mode!r}; choose one of: {', '.join(RETRIEVAL_MODES)}")
    threshold = to_min_score(given["min_score"]) if "min_score" in given else config.min_score  # None: no cut
    floor = options.get("min_similarity", "auto")
    same_subject = given.get("same_subject")
    summary_hits = given.get("summary_hits")
    packing = Packing(
        k,
        budget,
        threshold,
        config.drop_repeated_sentences,
        config.token_counter,
        min_similarity=resolve_floor(floor, config.min_similarity, calibrated_floor),
        same_subject=config.same_subject if same_subject is None else _checked_same_subject(same_subject),
        summary_hits=config.summary_hits if summary_hits is None else check_summary_hits(summary_hits),
    )
    where, time_range = parse_where(options.get("where")), to_time_range(options.get("time_range"))
    filters = Filters(bool(options.get("leaves_only", False)), where, time_range)
    weight = given.get("lexical_weight", config.lexical_weight)
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 <= weight <= 10:
        raise ValueError(f"lexical_weight must be a number between 0 and 10, got {weight!r}")
    if weight > 0 and state.lexical is None:
        raise ValueError(
            "this memory keeps no lexical index (its config has lexical_weight=0); "
            "open it with MemTreeConfig(lexical_weight=...) > 0 to use hybrid retrieval"
        )
    embedding = options.get("query_embedding")
    vector = None if embedding is None else check_query_embedding(embedding, state.info.dimension)
    exact = options.get("exact", False)
    if not isinstance(exact, bool):
        raise TypeError(f"exact must be True or False, got {exact!r}")
    parse = config.parse_times if options.get("parse_times") is None else options["parse_times"]
    if not isinstance(parse, bool):
        raise TypeError(f"parse_times must be True, False or None (the config's), got {parse!r}")
    span = time_span(query, options.get("now")) if parse and time_range is None else None
    prefer = Preference(span.as_range) if span is not None else None
    feedback = given.get("context_feedback", config.context_feedback)
    if isinstance(feedback, bool) or not isinstance(feedback, (int, float)) or not 0 <= feedback <= 10:
        raise ValueError(f"context_feedback must be a number between 0 (off) and 10, got {feedback!r}")
    routed = routed_overview(config, query, options, state)
    return Query(query, mode, packing, filters, float(weight), vector, prefer, float(feedback), routed, exact)


def resolve_floor(floor: object, configured: object, calibrated: float | None) -> float | None:
    """A ``min_similarity`` as the cosine floor to apply. ``"auto"`` is the memory's
    policy, ``configured`` (its ``config.min_similarity``), whose own ``"auto"`` is
    ``calibrated`` (the embedder's floor, :func:`relevance_floor`; ``None`` for a model
    with none measured). ``None`` turns the floor off; a number is the floor."""
    if floor == "auto":
        floor = calibrated if configured == "auto" else configured
    return None if floor is None else to_min_score(floor, "min_similarity")


def _checked_same_subject(value: object) -> float:
    similarity = to_min_score(value, "same_subject")
    if not -1.0 <= similarity <= 1.0:
        raise ValueError(f"same_subject is a cosine similarity between -1 and 1, got {similarity}")
    return similarity


def answer(replica: Replica, query: Query, vector: Vector, beam: int) -> list[RetrievedNode]:
    """Rank the replica's nodes for ``query`` (embedded as ``vector``) and pack the
    results (:func:`retrieve`), under the replica's read lock."""
    lexical = LexicalShare(query.text, query.lexical_weight) if query.lexical_weight > 0 else None
    with replica.lock.read():
        index, state = replica.index, replica.state
        if index is None or len(index) == 0:
            return []
        now = time.time()
        hidden = unreadable(state, now)  # expired memories are never returned, nor summaries still holding them
        filters = replace(query.filters, hidden=hidden) if hidden else query.filters
        return retrieve(
            index,
            state,
            vector,
            query.mode,
            beam,
            query.packing,
            filters,
            lexical,
            query.prefer,
            query.feedback,
            exact=query.exact,
        )
