"""Context feedback: leaves found through what surrounds the best match.

"What is Maya's dog afraid of?" shares no word and little meaning with "Pepper is
scared of bicycles.": only "Maya adopted a rescue greyhound called Pepper." ties the
dog to the fear. That memory ranks first, so its context tells the ranking what the
question is about (pseudo-relevance feedback, as LongMemEval expands an item's key
with what is known about it, here on the query side: nothing is re-indexed, no model
is called). A first ranking finds the best leaf; then, in the ranking that is
delivered:

* the query's vector moves towards the best leaf's **tree context**: its parent
  summary's vector (the theme it was grouped under; the leaf's own for a leaf of the
  root), ``query + w * context``, renormalized (``w``:
  ``MemTreeConfig.context_feedback``, 0.3; 0 turns the feedback off);
* the best leaf's **names** that the query lacks (capitalized words inside a
  sentence: "Pepper") join the query's words for BM25 at :data:`NAME_WEIGHT`;
* when the query names exactly one **speaker** of the candidates (a leaf written
  ``Name: ...``, as chat turns are), that speaker's leaves gain :data:`SPEAKER_BOOST`:
  "What activities does Melanie partake in?" is about what Melanie said, not the
  other speaker's replies that name her.

Measured on LoCoMo conversations 0-4 (the tuning half; benchmarks/results/overview.md
has the held-out numbers): +1.5 / +0.9 / +1.7 / +0.0 points of evidence recall at 250 /
500 / 1000 / 2000 words over the same ranking without it, multi-hop +3.7 at 500.
The context vector and names cost one extra ranking pass per query and no model call.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from memtree.digest import speaker_of
from memtree.index import VectorIndex
from memtree.node import ROOT_ID, Vector
from memtree.state import TreeState
from memtree.text import split_sentences

NAME_WEIGHT = 0.5
"""The BM25 weight of the best leaf's names next to the query's own words (1)."""

SPEAKER_BOOST = 0.1
"""What the leaves of the one speaker a query names add to their score."""

TIE = 1e-6
"""Two first scores this close are a tie: the question points at neither context."""

Ranked = list[tuple[str, float]]

_LABEL = re.compile(r"^.{0,60}?[A-Z][\w'’-]*(?: [A-Z][\w'’-]*)?:\s")
_TOKEN = re.compile(r"[\w'’-]+")
_POSSESSIVE = re.compile(r"['’]s$")


@dataclass(frozen=True)
class Feedback:
    """What the first ranking tells the second: the moved query vector, the names to
    add to its words, and the speaker it names (if one)."""

    vector: Vector
    names: tuple[str, ...]
    speaker: str | None


def context_feedback(
    index: VectorIndex, state: TreeState, query: Vector, text: str, ranked: Ranked, weight: float
) -> Feedback | None:
    """The feedback of a first ranking (``ranked``, best first) for the query ``text``
    embedded as ``query``, the context's vector added at ``weight``
    (``MemTreeConfig.context_feedback``); ``None`` when it found no leaf, or when its
    two best leaves score the same."""
    speakers = _leaf_speakers(index, state, ranked)
    speaker = _named(speakers, text)
    ranked = _raised(ranked, speakers, speaker, SPEAKER_BOOST)
    leaves = [(node_id, score) for node_id, score in ranked if node_id in speakers][:2]
    if not leaves or (len(leaves) == 2 and leaves[0][1] - leaves[1][1] <= TIE):
        return None  # no leaf, or two equally good: which context counts would be chance (ids are random)
    best = leaves[0][0]
    parent = state.nodes[best].parent
    context_id = parent if parent is not None and parent != ROOT_ID and parent in index else best
    context = index.vectors([context_id])[0]
    moved = query + weight * context / (float(np.linalg.norm(context)) or 1.0)
    moved = (moved / (float(np.linalg.norm(moved)) or 1.0)).astype(np.float32)
    return Feedback(moved, names_in(state.nodes[best].text, text, speaker), speaker)


def named_speaker(index: VectorIndex, state: TreeState, ranked: Ranked, text: str) -> str | None:
    """The one speaker among the ranked leaves (``Name:`` at a leaf's start) whose name
    ``text`` says, or ``None`` (none, or several)."""
    return _named(_leaf_speakers(index, state, ranked), text)


def boosted(
    index: VectorIndex, state: TreeState, ranked: Ranked, speaker: str | None, boost: float = SPEAKER_BOOST
) -> Ranked:
    """``ranked`` with the leaves of ``speaker`` raised by ``boost``, best first (ties by id)."""
    if speaker is None or boost == 0:
        return ranked
    return _raised(ranked, _leaf_speakers(index, state, ranked), speaker, boost)


def _leaf_speakers(index: VectorIndex, state: TreeState, ranked: Ranked) -> dict[str, str | None]:
    """The speaker of each ranked leaf (``None``: no ``Name:`` label), by id; summaries
    are absent. Read from the leaf flags and texts alone: building a node from a
    stored row for each of the dozens ranked would cost more than the search."""
    ids = [node_id for node_id, _ in ranked]
    if not ids:
        return {}
    texts = state.nodes.text_of
    return {
        node_id: speaker_of(texts(node_id))
        for node_id, leaf in zip(ids, index.leaf_flags(ids).tolist(), strict=True)
        if leaf
    }


def _named(speakers: dict[str, str | None], text: str) -> str | None:
    words = {_POSSESSIVE.sub("", word.lower()) for word in _TOKEN.findall(text)}
    named = {
        speaker
        for speaker in set(speakers.values())
        if speaker and all(part.lower() in words for part in speaker.split())
    }
    return next(iter(named)) if len(named) == 1 else None


def _raised(ranked: Ranked, speakers: dict[str, str | None], speaker: str | None, boost: float) -> Ranked:
    if speaker is None or boost == 0:
        return ranked
    raised = [(node_id, score + boost if speakers.get(node_id) == speaker else score) for node_id, score in ranked]
    raised.sort(key=lambda pair: (-pair[1], pair[0]))
    return raised


def names_in(leaf: str, query: str, speaker: str | None) -> tuple[str, ...]:
    """The names in a leaf's text that the query does not say: capitalized words that
    do not open a sentence, the speaker label and the speaker left out."""
    label = _LABEL.match(leaf)
    body = leaf[label.end() :] if label else leaf
    said = {_POSSESSIVE.sub("", word.lower()) for word in _TOKEN.findall(query)}
    if speaker:
        said.update(part.lower() for part in speaker.split())
    names: list[str] = []
    for sentence in split_sentences(body):
        for token in _TOKEN.findall(sentence)[1:]:
            word = _POSSESSIVE.sub("", token).strip("'’-")
            if len(word) > 1 and word[0].isupper() and "'" not in word and "’" not in word and word.lower() not in said:
                names.append(word)
    return tuple(dict.fromkeys(names))


def passes_floor(
    index: VectorIndex,
    state: TreeState,
    query: Vector,
    node_ids: list[str],
    floor: float,
    feedback: Feedback | None = None,
) -> list[bool]:
    """Whether each node passes the relevance floor (a cosine): by its cosine with the
    query, or, under context feedback, through its context: its cosine with the moved
    query, or a name of the best match in its text ("Pepper is scared of bicycles."
    for "What is Maya's dog afraid of?", whose best match names Pepper). Feedback only
    exists when that best match passed the floor itself, so a query nothing stored is
    about still gets nothing."""
    if not node_ids:
        return []
    passing = index.score(query, node_ids) >= floor
    if feedback is not None:
        passing |= index.score(feedback.vector, node_ids) >= floor
        if feedback.names:
            named = re.compile(r"\b(?:" + "|".join(map(re.escape, feedback.names)) + r")\b")
            texts = state.nodes.text_of
            passing |= np.array([named.search(texts(node_id)) is not None for node_id in node_ids])
    return [bool(value) for value in passing]
