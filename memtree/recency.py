"""Newer first: among the results, a newer memory about the same subject goes just
above an older one ("I moved to Porto" before "I live in Lisbon").

``MemTree.retrieve(same_subject=...)`` turns it on; only the order of the results
that packing chose changes (benchmarks/results/knowledge_updates.md measures it).
"""

from __future__ import annotations

from memtree.index import VectorIndex
from memtree.node import ROOT_ID, RetrievedNode
from memtree.state import TreeState
from memtree.text import fold, split_sentences

SIBLINGS = 1.0
"""``same_subject`` that links only siblings (and identical texts): the tree's own
grouping, which costs LoCoMo the least (benchmarks/results/knowledge_updates.md)."""

SIBLING_SIMILARITY = 0.4
"""The least cosine similarity a sibling (or a summary above a leaf) needs to count
as about the leaf's subject: routing groups by a threshold learnt from the
embedder, and a small or young tree can group loosely. 0.4 is below the similarity
of 33 of the 34 pairs of benchmarks/data/knowledge_updates.json (all-MiniLM-L6-v2)."""

RECENCY_MARGIN = 0.3
"""How far below an older memory's score a newer one about the same subject may
score and still be put above it (:func:`newer_first`): a tie-break, not a re-sort."""


def newer_first(
    index: VectorIndex,
    state: TreeState,
    results: list[RetrievedNode],
    same_subject: float,
    margin: float = RECENCY_MARGIN,
) -> None:
    """Put (in place) a newer memory about the same subject just above an older one.

    For each leaf among the results, best first, the best-ranked result below it
    that is newer, scores at most ``margin`` below it and is about the same subject
    moves to just above it. About the same subject: a leaf that is its sibling under
    one summary (routing put them together: each was the other's closest match) or
    whose own cosine similarity with it reaches ``same_subject``; or a summary above
    it whose ``context`` quotes a newer leaf of its subtree (an LLM summary quotes
    none and never moves); a sibling or summary must also have a cosine of at least
    :data:`SIBLING_SIMILARITY` with the leaf. So "I moved to Porto" comes before the older "I live in
    Lisbon" when the question's words favour Lisbon. A leaf that a summary hit brought
    in (``found_by``, the default packing) whose summary also holds the older leaf is
    about its subject too, and the margin does not apply to it: it was delivered for
    the summary's match, and its own score can be far lower.

    Only the order changes: the results are those packing chose (a newer fact
    outside them is not pulled in), each keeps its own ``score`` and ``context``,
    and a result moves once at most.
    """
    if len(results) < 2:
        return
    leaves = [i for i, result in enumerate(results) if result.is_leaf]
    if not leaves:
        return
    vectors = index.vectors([result.id for result in results])
    cosines = vectors @ vectors.T
    when = {i: _when(state, results[i].id) for i in leaves}
    quoted: dict[int, list[str]] = {}
    below: dict[str, frozenset[str]] = {}
    order = list(range(len(results)))
    moved: set[int] = set()
    for older in leaves:
        parent = state.nodes[results[older].id].parent
        for newer in range(older + 1, len(results)):
            if newer in moved:
                continue
            candidate = results[newer]
            # A leaf that a summary above the older one brought in was delivered for
            # that summary's match, not its own score: the margin does not apply.
            via = candidate.found_by
            covered = via is not None and results[older].id in _leaf_set(state, via, below)
            if not covered and candidate.score < results[older].score - margin:
                continue
            cosine = float(cosines[older, newer])
            time: float | None
            if candidate.is_leaf:
                sibling = parent != ROOT_ID and state.nodes[candidate.id].parent == parent
                same = cosine >= same_subject or ((sibling or covered) and cosine >= SIBLING_SIMILARITY)
                time = when[newer]
            else:  # a summary stands for the newest leaf it quotes about this one's subject
                same = results[older].id in candidate.leaf_ids
                if same and newer not in quoted:
                    quoted[newer] = _quoted_leaves(state, candidate)
                close = [leaf for leaf in quoted.get(newer, []) if leaf != results[older].id]
                if close:
                    near = (index.vectors(close) @ vectors[older]).tolist()
                    close = [leaf for leaf, c in zip(close, near, strict=True) if c >= SIBLING_SIMILARITY]
                time = max((_when(state, leaf) for leaf in close), default=None)
            if same and time is not None and time > when[older]:
                order.remove(newer)
                order.insert(order.index(older), newer)
                moved.add(newer)
                break
    results[:] = [results[i] for i in order]


def _leaf_set(state: TreeState, summary_id: str, known: dict[str, frozenset[str]]) -> frozenset[str]:
    """The leaves below a summary, each summary's looked up once per call (``known``)."""
    if summary_id not in known:
        known[summary_id] = frozenset(state.leaf_ids_under(summary_id)) if summary_id in state.nodes else frozenset()
    return known[summary_id]


def _when(state: TreeState, node_id: str) -> float:
    """When a leaf's memory happened: its event time, else when it was stored."""
    node = state.nodes[node_id]
    return node.timestamp if node.timestamp is not None else node.created_at


def _quoted_leaves(state: TreeState, result: RetrievedNode) -> list[str]:
    """The leaves below a summary whose sentences its ``context`` quotes."""
    quoted = {fold(sentence) for sentence in split_sentences(result.context)}
    return [
        leaf_id
        for leaf_id in result.leaf_ids
        if any(fold(sentence) in quoted for sentence in split_sentences(state.nodes[leaf_id].text))
    ]
