"""``MemTree.overview``: what the memory holds about a person, a topic or a time span.

``retrieve`` ranks memories against a question's words and meaning, which is right
for a lookup ("What is Maya's dog called?") and wrong for an overview ("What do
you know about Maya?", "What did we talk about on 9 June?"): such a request names a
part of the memory, not a fact, and the memories that share its words are the
least informative ones ("Maya: thanks!"). An overview covers that part instead:

1. **Scope.** The live leaves inside the time range (``since``/``until``) that pass
   ``where``. When ``about`` names speakers of the memory (a leaf written
   ``Name: ...``, as chat turns are), only what they said. Other words of ``about``
   are a **topic**: the leaves sharing a word with it or over the embedder's
   relevance floor, each with its relevance as ``retrieve`` ranks the topic
   (context feedback included), those under half the best's left out.
2. **Worth.** A leaf is worth its information: the idf-weighted count of its
   distinct content words (a long, specific turn holds more facts than "Wow, so
   cool!"). Without a topic it is also weighed by what the speaker says of
   themselves (``(1 + first-person words) / (1 + second-person words)``: "I moved
   to Porto" holds a fact about the speaker, "How was your trip?" none); with one, by
   its relevance to the power :data:`RELEVANCE_POWER`.
3. **Choice, breadth first.** The scope is cut into one segment per calendar day
   (undated leaves: per subtree below the root). Parts are taken best first by
   worth per token (to the power 0.5 without a topic, 1 with one), each part a day
   has given discounting that day's next by :data:`REPEAT_DISCOUNT` (without a topic;
   a topic takes its most relevant parts wherever they are), until ``token_budget``
   or ``k``. A part costs the tokens it is delivered in (its date said). Without a
   topic, a content word a chosen part already said no longer counts in the worth
   of the next (a second turn about the adoption tells less that is new).
4. **Summaries.** A summary stands in for its leaves when all of them lie in the
   scope and its text is not made of their own sentences: a model's prose restates
   several of their facts in fewer words, an extractive summary only repeats some of
   their sentences. It is worth the information of its own text.
5. **Order.** The parts come in time order, each dated: a text that does not start
   with a date gets ``YYYY-MM-DD: `` (a summary its first and last day), said once
   per day; a transcript turn's own date and time (``1:56 pm on 8 May, 2023 Maya:``)
   is said as that day (``2023-05-08: Maya:``), in one word instead of six. A part's
   ``score`` is its worth over the best part's, its ``similarity`` its cosine with
   the topic (``None`` without one), ``answered_by`` is ``"overview"``.

No model is called; the topic, when there is one, is embedded once. Each mechanism
was kept for what it measured on LoCoMo conversations 0-4 with extractive trees
(``benchmarks/results/overview.md`` reports the held-out conversations).
"""

from __future__ import annotations

import heapq
import math
import re
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypedDict

import numpy as np

from memtree.config import MemTreeConfig
from memtree.digest import STOPWORDS, speaker_of
from memtree.index import VectorIndex
from memtree.inputs import TimeLike, to_timestamp
from memtree.node import ROOT_ID, Node, RetrievedNode, Vector, to_datetime
from memtree.packing import DeliveredSentences, cut_to_budget
from memtree.redaction import unreadable
from memtree.replica import Replica
from memtree.state import TreeState
from memtree.text import date_of, fold, split_sentences
from memtree.where import Where, parse_where

DEFAULT_TOKEN_BUDGET = 1000
"""The overview's size when neither the call nor the config gives a token budget."""

RELEVANCE_POWER = 5.0
"""How much a leaf's relevance to ``about`` (beyond speaker names) weighs against its
information: its worth is ``information * relevance ** RELEVANCE_POWER``. 0 would
ignore the topic; tuned on LoCoMo conversations 0-4 (benchmarks/results/overview.md)."""

REPEAT_DISCOUNT = 0.5
"""What each part a time segment has already given multiplies the worth of its next
by: 0 takes one part per segment before any second, 1 ignores segments."""

RANKED_LIMIT = 1000
"""How many of a topic's best leaves the ranking scores (the rest count as unrelated)."""

OVERVIEW = "overview"
"""``RetrievedNode.answered_by`` of an overview's parts."""

_WORD = re.compile(r"[^\W\d_][\w'’-]*", re.UNICODE)
_POSSESSIVE = re.compile(r"['’]s$")
_TRANSCRIPT_DATE = re.compile(
    r"^(?:\d{1,2}:\d{2}\s*[apAP]\.?[mM]\.?\s+on\s+)?"
    r"(?:\d{1,2} [A-Z][a-z]+,? \d{4}|[A-Z][a-z]+ \d{1,2},? \d{4}|\d{4}-\d{2}-\d{2})"
    r"(?=\s+[A-Z][\w'’-]*(?: [A-Z][\w'’-]*)?:\s)"
)
"""A transcript turn's date, before its speaker: ``1:56 pm on 8 May, 2023`` of
``1:56 pm on 8 May, 2023 Caroline: ...``."""
_SPEAKER_LABEL = re.compile(r"^.{0,60}?[A-Z][\w'’-]*(?: [A-Z][\w'’-]*)?:\s")
_REQUEST_TEXT = """what who whom whose which when where why how know knows remember remembers tell talk talked
    discuss discussed happened happen happens summarise summarize summary recap overview everything anything all
    about did does do me us we our you your i my"""
_REQUEST_WORDS = frozenset(_REQUEST_TEXT.split())


@dataclass(frozen=True)
class OverviewQuery:
    """One ``overview`` call's options, checked."""

    about: str | None
    time_range: tuple[float | None, float | None] | None
    token_budget: int
    k: int | None
    where: Where | None
    count_tokens: Callable[[str], int]
    lexical_weight: float
    relevance_floor: float | None = None
    """The embedder's calibrated relevance floor (a cosine): a topic's leaves are those
    sharing a word with it or at least this similar to it (``None``: those sharing a word)."""
    feedback: float = 0.0
    """The memory's ``context_feedback``: a topic is ranked as ``retrieve`` ranks it."""

    @property
    def topic(self) -> str | None:
        """``about`` if it holds any word to rank by (else ``None``)."""
        return self.about if self.about and terms_of(self.about) else None


class OverviewOptions(TypedDict, total=False):
    """The keyword options of ``MemTree.overview`` / ``aoverview``; one left out takes
    its default, an unknown one raises ``TypeError``."""

    since: TimeLike | None
    """The earliest event time to cover (a datetime, date, POSIX seconds or ISO 8601)."""
    until: TimeLike | None
    """The latest event time to cover."""
    token_budget: int | None
    """The most tokens the parts' ``context`` may hold together (``None``: the
    config's ``token_budget``, else :data:`DEFAULT_TOKEN_BUDGET`)."""
    k: int | None
    """The most parts (``None``: as many as the budget holds)."""
    where: Mapping[str, Any] | None
    """A leaf metadata filter, as ``retrieve``'s (:mod:`memtree.where`)."""


OVERVIEW_OPTIONS: tuple[str, ...] = tuple(OverviewOptions.__annotations__)


def check_overview(
    config: MemTreeConfig, about: object, options: Mapping[str, Any], relevance_floor: float | None = None
) -> OverviewQuery:
    """``MemTree.overview``'s arguments checked, the config's defaults filled in; a
    bad value (or an unknown option) raises naming it and what it accepts."""
    unknown = sorted(set(options) - set(OVERVIEW_OPTIONS))
    if unknown:
        raise TypeError(
            f"overview() got unknown option(s) {', '.join(unknown)}; it takes: {', '.join(OVERVIEW_OPTIONS)}"
        )
    if about is not None and not isinstance(about, str):
        raise TypeError(f"about must be a str or None, got {type(about).__name__}")
    topic = about if about is not None and about.strip() else None
    token_budget, k = options.get("token_budget"), options.get("k")
    budget = token_budget if token_budget is not None else (config.token_budget or DEFAULT_TOKEN_BUDGET)
    if isinstance(budget, bool) or not isinstance(budget, int) or budget <= 0:
        raise ValueError(f"token_budget must be a positive integer or None, got {token_budget!r}")
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k <= 0):
        raise ValueError(f"k must be a positive integer or None (as many parts as the budget holds), got {k!r}")
    since, until = options.get("since"), options.get("until")
    start, end = to_timestamp(since, "since"), to_timestamp(until, "until")
    if start is not None and end is not None and start > end:
        raise ValueError(f"since ({since!r}) is after until ({until!r})")
    span = (start, end) if start is not None or end is not None else None
    return OverviewQuery(
        topic,
        span,
        budget,
        k,
        parse_where(options.get("where")),
        config.token_counter,
        float(config.lexical_weight),
        relevance_floor,
        float(config.context_feedback),
    )


def terms_of(text: str) -> list[str]:
    """The content words of ``about`` (lower-cased; request and function words such
    as "what", "know", "about", "we" left out), in order, once each."""
    words = (_POSSESSIVE.sub("", word.lower()).strip("'’-") for word in _WORD.findall(text))
    return list(dict.fromkeys(w for w in words if len(w) > 1 and w not in STOPWORDS and w not in _REQUEST_WORDS))


@dataclass(frozen=True)
class Choice:
    """How parts are chosen (the module doc says why each matters)."""

    repeat_discount: float
    """What each part a time segment has already given multiplies the worth of its
    next by: 0 takes one part per segment before any second, 1 ignores segments."""
    cost_power: float
    """A part's priority is its worth over its cost in tokens to this power: 0 takes
    the most informative first, 1 the most informative per token."""
    self_weight: float
    """A leaf's information times ``((1 + first-person words) / (1 + second-person
    words)) ** self_weight``: what a speaker says of themselves ("I moved to Porto")
    holds the facts about them; a reply about the listener, or a question, little."""
    novelty: float = 0.0
    """How much a content word already said by a chosen part stops counting in the
    information of the next: 0 counts it again, 1 not at all (a second turn about the
    adoption says less that is new than a first turn about the move)."""


SCOPE = Choice(repeat_discount=REPEAT_DISCOUNT, cost_power=0.5, self_weight=1.0, novelty=1.0)
"""An overview of a person, a span or everything: coverage first."""

TOPIC = Choice(repeat_discount=1.0, cost_power=1.0, self_weight=0.0)
"""An overview of a topic (words beyond speaker names): relevance first."""


@dataclass(frozen=True)
class Settings:
    """The overview's knobs; the benchmark tries others."""

    scope: Choice = SCOPE
    topic: Choice = TOPIC
    relevance_power: float = RELEVANCE_POWER
    segments: str = "day"
    """``"day"``: one segment per calendar day; ``"subtree"``: per subtree below the
    root; ``"none"``: no segments."""
    topic_only: bool = True
    """Whether a topic keeps only the leaves about it (:meth:`_Overview._about_topic`)."""
    summary_share: float | None = 1.0
    """A summary of model prose may stand in for its leaves when at least this share
    of them lies in the scope (``None``: never)."""
    date_once: bool = True
    """Whether a date is said once for the parts of one day, not at each part."""
    relative_cut: float = 0.5
    """A topic keeps the leaves whose relevance is at least this share of the best's."""
    summary_sentences: bool = False
    """Whether the sentences of model prose about the scope may be parts (a summary
    only partly in the scope)."""
    ranked_relevance: bool = True
    """A leaf's relevance to a topic: its score in retrieval's ranking with context
    feedback (:mod:`memtree.feedback`), not the plain hybrid score."""


def answer_overview(
    replica: Replica, query: OverviewQuery, embed: Callable[[str], Vector], settings: Settings = Settings()
) -> list[RetrievedNode]:
    """The overview's parts for ``query`` (its topic embedded by ``embed``, one call,
    when it has one), after catching up with other writers, under the read lock."""
    replica.maybe_refresh()
    vector = embed(query.topic) if query.topic is not None else None
    with replica.lock.read():
        index, state = replica.index, replica.state
        if index is None or len(index) == 0:
            return []
        return _Overview(index, state, query, vector, settings, unreadable(state, time.time())).parts()


class _Overview:
    """One overview being chosen: the scope, each leaf's worth, the segments."""

    def __init__(
        self,
        index: VectorIndex,
        state: TreeState,
        query: OverviewQuery,
        vector: Vector | None,
        settings: Settings,
        hidden: frozenset[str],
    ) -> None:
        self.index, self.state, self.query, self.settings, self.hidden = index, state, query, settings, hidden
        leaves = self._in_range()
        named = self._named_speakers(leaves)
        self._named = sorted(named)
        if named:
            leaves = [leaf for leaf in leaves if (self._speaker(leaf) or "").lower() in named]
        self.leaves = leaves
        rest = [term for term in terms_of(query.about or "") if term not in named]
        self._terms, self._vector = rest, (vector if rest else None)
        self._peak: float | None = None
        if self._vector is not None and settings.topic_only:
            self.leaves = leaves = self._about_topic(leaves)
        self.choice = settings.topic if self._vector is not None else settings.scope
        self.relevance = None
        if self._vector is not None:
            ranked = settings.ranked_relevance and query.feedback > 0
            self.relevance = self._ranked_relevance(leaves) if ranked else self._relevance_of(leaves)
            if settings.relative_cut > 0 and self.relevance:
                cut = settings.relative_cut * max(self.relevance.values())
                self.leaves = leaves = [leaf for leaf in leaves if self.relevance[leaf] >= cut]
        self.information = self._information()

    # -- scope --------------------------------------------------------------------------

    def _in_range(self) -> list[str]:
        state, query = self.state, self.query
        selection = state.leaves_matching(query.where) if query.where else None
        start, end = query.time_range or (None, None)
        leaves = []
        for node in state.nodes.values():
            if not node.is_leaf or node.is_root or node.id in self.hidden:
                continue
            if selection is not None and node.id not in selection:
                continue
            if start is not None and (node.timestamp is None or node.timestamp < start):
                continue
            if end is not None and (node.timestamp is None or node.timestamp > end):
                continue
            leaves.append(node.id)
        return leaves

    def _speaker(self, leaf: str) -> str | None:
        return speaker_of(self.state.nodes[leaf].text)

    def _named_speakers(self, leaves: list[str]) -> set[str]:
        """The speakers of the scope (``Name:`` at a leaf's start) that ``about`` names."""
        wanted = set(terms_of(self.query.about or ""))
        if not wanted:
            return set()
        speakers = {(self._speaker(leaf) or "").lower() for leaf in leaves}
        return {name for name in speakers if name and all(part in wanted for part in name.split())}

    # -- worth ----------------------------------------------------------------------------

    def _scores(self, node_ids: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Nodes' cosines with the topic, and their BM25 scores for its words over the
        best BM25 score among the scope's leaves (zeros without a lexical index)."""
        assert self._vector is not None
        cosine = self.index.score(self._vector, node_ids).astype(np.float64)
        lexical = np.zeros(len(node_ids))
        words = self.state.lexical
        if self.query.lexical_weight > 0 and words is not None:
            prepared = words.prepare(" ".join(self._terms))
            if len(prepared):
                if self._peak is None:
                    scope = words.score_of(prepared, self.leaves) if self.leaves else np.zeros(0)
                    self._peak = float(scope.max()) if len(scope) else 0.0
                if self._peak > 0:
                    lexical = words.score_of(prepared, node_ids).astype(np.float64) / self._peak
        return cosine, lexical

    def _relevance_of(self, node_ids: list[str]) -> dict[str, float]:
        """Nodes' hybrid scores against the topic, as retrieval scores them."""
        if not node_ids:
            return {}
        cosine, lexical = self._scores(node_ids)
        weight = self.query.lexical_weight
        score = (cosine + weight * lexical) / (1.0 + weight)
        return dict(zip(node_ids, np.clip(score, 1e-6, None).tolist(), strict=True))

    def _ranked_relevance(self, leaves: list[str]) -> dict[str, float]:
        """Leaves' scores in retrieval's ranking of the topic, context feedback included."""
        from memtree.feedback import boosted, context_feedback
        from memtree.retrieval import Filters, LexicalShare, rank_collapsed

        assert self._vector is not None
        if not leaves:
            return {}
        text = " ".join(self._terms)
        lexical = (
            LexicalShare(self.query.about or text, self.query.lexical_weight) if self.query.lexical_weight > 0 else None
        )
        filters = Filters(leaves_only=True, time_range=self.query.time_range, hidden=self.hidden)
        limit = min(len(leaves), RANKED_LIMIT)
        first = rank_collapsed(self.index, self.state, self._vector, limit, filters, lexical)
        feedback = context_feedback(
            self.index, self.state, self._vector, self.query.about or text, first, self.query.feedback
        )
        if feedback is not None:
            moved = LexicalShare(lexical.text, lexical.weight, names=feedback.names) if lexical is not None else None
            first = boosted(
                self.index,
                self.state,
                rank_collapsed(self.index, self.state, feedback.vector, limit, filters, moved),
                feedback.speaker,
            )
        scores = dict(first)
        return {leaf: max(scores.get(leaf, 0.0), 1e-6) for leaf in leaves}

    def _about_topic(self, leaves: list[str]) -> list[str]:
        """The leaves about the topic: sharing a word with it, or at least as similar to
        it as the relevance floor (the embedder's calibrated one; an embedder without one
        counts words only). None of them: all, ranked by relevance alone."""
        if not leaves:
            return leaves
        floor = self.query.relevance_floor
        cosine, lexical = self._scores(leaves)
        kept = [
            leaf
            for leaf, c, w in zip(leaves, cosine, lexical, strict=True)
            if w > 0 or (floor is not None and c >= floor)
        ]
        return kept or leaves

    def _information(self) -> dict[str, float]:
        """Each scope leaf's distinct content words, weighted by their rarity in the scope."""
        words = {leaf: set(_content_words(self.state.nodes[leaf].text)) for leaf in self.leaves}
        self._frequency = Counter(word for found in words.values() for word in found)
        weight = self.choice.self_weight
        return {
            leaf: self._rarity(found) * _self_share(self.state.nodes[leaf].text) ** weight
            for leaf, found in words.items()
        }

    def _rarity(self, words: set[str]) -> float:
        total = max(1, len(self.leaves))
        return sum(math.log(1.0 + total / max(1, self._frequency[word])) for word in words)

    def worth(self, leaf: str) -> float:
        value = self.information[leaf]
        if self.relevance is not None:
            value *= self.relevance[leaf] ** self.settings.relevance_power
        return value

    def _summary_worth(self, summary: str, share: float) -> float:
        """A summary's information (as a leaf's, from its own text) times the share of
        its leaves in the scope, and its relevance as a leaf's."""
        value = self._rarity(set(_content_words(self.state.nodes[summary].text))) * share
        if self.relevance is not None and self._vector is not None:
            value *= self._relevance_of([summary])[summary] ** self.settings.relevance_power
        return value

    # -- segments and choice ----------------------------------------------------------------

    def _segment(self, node: Node) -> object:
        kind = self.settings.segments
        if kind == "none":
            return None
        if kind == "day" and node.timestamp is not None:
            moment = to_datetime(node.timestamp)
            return moment.date() if moment is not None else node.timestamp
        return self._top(node.id)

    def _top(self, node_id: str) -> str:
        """The subtree below the root that holds ``node_id``."""
        node = self.state.nodes[node_id]
        while node.parent is not None and node.parent != ROOT_ID:
            node = self.state.nodes[node.parent]
        return node.id

    def _candidates(self) -> list[_Part]:
        """Every scope leaf; each summary of model prose with at least ``summary_share``
        of its live leaves in the scope; with ``summary_sentences``, the sentences of
        model prose about the scope (:meth:`_sentences`)."""
        nodes = self.state.nodes
        candidates = [_Part(self.worth(leaf), leaf, nodes[leaf].text, (leaf,)) for leaf in self.leaves]
        share_needed = self.settings.summary_share
        if (share_needed is None and not self.settings.summary_sentences) or not self.leaves:
            return candidates
        scope = set(self.leaves)
        for summary in self._summaries_over(scope):
            if summary in self.hidden:  # it still holds an expired leaf's text
                continue
            below = [leaf for leaf in self.state.leaf_ids_under(summary) if leaf not in self.hidden]
            inside = tuple(leaf for leaf in below if leaf in scope)
            share = len(inside) / len(below) if below else 0.0
            if not inside or _quotes_leaves(self.state, summary, below):
                continue
            if share_needed is not None and share >= share_needed:
                candidates.append(_Part(self._summary_worth(summary, share), summary, nodes[summary].text, inside))
            elif self.settings.summary_sentences and self._vector is None:
                candidates += self._sentences(summary, inside, share)
        return candidates

    def _sentences(self, summary: str, inside: tuple[str, ...], share: float) -> list[_Part]:
        """The sentences of a model's summary that are about the scope: naming a speaker
        the overview is about (when it is about speakers), dated inside the time range
        (or, undated, from a summary at least half of whose leaves are in the scope)."""
        parts = []
        for sentence in split_sentences(self.state.nodes[summary].text):
            if self._named and not any(re.search(rf"\b{re.escape(name)}\b", sentence, re.I) for name in self._named):
                continue
            stamps = _dates_in(sentence)
            start, end = self.query.time_range or (None, None)
            if stamps:
                if any((start is not None and t < start) or (end is not None and t > end + 86400) for t in stamps):
                    continue
            elif share < 0.5:
                continue
            worth = self._rarity(set(_content_words(sentence)))
            parts.append(_Part(worth, summary, sentence, inside, sentence=True))
        return parts

    def _summaries_over(self, scope: set[str]) -> list[str]:
        found: set[str] = set()
        for leaf in scope:
            node = self.state.nodes[leaf]
            while node.parent is not None and node.parent != ROOT_ID and node.parent not in found:
                found.add(node.parent)
                node = self.state.nodes[node.parent]
        return sorted(found)

    def parts(self) -> list[RetrievedNode]:
        query = self.query
        heaps: dict[object, list[tuple[float, int, _Part]]] = {}
        power = self.choice.cost_power
        candidates = self._candidates()
        costs = [self._cost(part) for part in candidates]
        for number, part in enumerate(candidates):
            key = self._segment(self.state.nodes[part.leaves[0]])
            heaps.setdefault(key, []).append((-part.worth / costs[number] ** power, number, part))
        for heap in heaps.values():
            heapq.heapify(heap)
        taken: Counter[object] = Counter()
        covered: set[str] = set()
        chosen: list[_Part] = []
        spent = 0
        discount = self.choice.repeat_discount
        novelty = self.choice.novelty
        said: set[str] = set()
        while heaps and spent < query.token_budget and (query.k is None or len(chosen) < query.k):
            key = min(heaps, key=lambda seg: heaps[seg][0][0] * discount ** taken[seg])
            priority, number, part = heapq.heappop(heaps[key])
            if novelty > 0 and said:
                fresh = -self._new_worth(part, said, novelty) / costs[number] ** power
                if fresh > priority + 1e-12:  # worth less now: back in line (lazy greedy)
                    heapq.heappush(heaps[key], (fresh, number, part))
                    continue
            if not heaps[key]:
                del heaps[key]
            if not part.sentence and any(leaf in covered for leaf in part.leaves):
                continue  # a summary and one of its leaves: the first chosen stands
            if not part.sentence:
                covered.update(part.leaves)
            chosen.append(part)
            taken[key] += 1
            spent += costs[number]
            if novelty > 0:
                said.update(_content_words(part.text))
        return self._packed(chosen)

    def _cost(self, part: _Part) -> int:
        """What a part costs as delivered, its date said (at least 1 token): a
        transcript turn's own date is delivered shorter (:func:`_dated`), and a budget
        counted on the stored text would end the choice with room left."""
        stamps = [self.state.nodes[leaf].timestamp for leaf in part.leaves]
        return max(1, self.query.count_tokens(_dated(part.text, stamps)[0]))

    def _new_worth(self, part: _Part, said: set[str], novelty: float) -> float:
        """A part's worth with the content words already said counting ``1 - novelty``
        of their information: the same share of its worth as of its information."""
        words = set(_content_words(part.text))
        full = self._rarity(words)
        if full <= 0:
            return part.worth
        repeated = self._rarity(words & said)
        return part.worth * (full - novelty * repeated) / full

    # -- delivery -------------------------------------------------------------------------

    def _packed(self, chosen: list[_Part]) -> list[RetrievedNode]:
        """The chosen parts in time order, dated, repeated sentences dropped, cut to the
        budget; the sentences chosen from one summary make one part, in their order."""
        nodes = self.state.nodes
        merged: dict[str, _Part] = {}
        for part in chosen:
            earlier = merged.get(part.node_id)
            if earlier is not None and part.sentence:
                order = split_sentences(nodes[part.node_id].text)
                texts = sorted(
                    {*split_sentences(earlier.text), part.text}, key=lambda t: order.index(t) if t in order else 0
                )
                part = _Part(earlier.worth + part.worth, part.node_id, " ".join(texts), part.leaves, sentence=True)
            merged[part.node_id] = part

        def when(part: _Part) -> tuple[float, float, str]:
            stamps = [stamp for stamp in (nodes[leaf].timestamp for leaf in part.leaves) if stamp is not None]
            return (min(stamps) if stamps else math.inf, nodes[part.node_id].created_at, part.node_id)

        best = max((part.worth for part in merged.values()), default=0.0) or 1.0
        ids = list(merged)
        similarity = (
            dict(zip(ids, self.index.score(self._vector, ids).tolist(), strict=True))
            if self._vector is not None and ids
            else {}
        )
        delivered = DeliveredSentences()
        results: list[RetrievedNode] = []
        used = 0
        day: str | None = None
        for part in sorted(merged.values(), key=when):
            node = nodes[part.node_id]
            fresh = delivered.new_part(part.text)
            if fresh is None:
                continue
            context, day = _dated(
                fresh, [nodes[leaf].timestamp for leaf in part.leaves], day if self.settings.date_once else None
            )
            cost = self.query.count_tokens(context)
            if used + cost > self.query.token_budget:
                context = cut_to_budget(context, self.query.token_budget - used, self.query.count_tokens)
                if not context:
                    break
                cost = self.query.count_tokens(context)
            used += cost
            results.append(
                RetrievedNode(
                    id=node.id,
                    text=node.text,
                    score=part.worth / best,
                    depth=node.depth,
                    is_leaf=node.is_leaf,
                    timestamp=node.timestamp,
                    metadata=dict(node.metadata),
                    leaf_ids=part.leaves,
                    source_id=node.source_id,
                    context=context,
                    similarity=similarity.get(part.node_id),
                    answered_by=OVERVIEW,
                )
            )
        return results


@dataclass(frozen=True)
class _Part:
    """A candidate part: what it is worth, the node it comes from, the text it
    delivers (the node's, or one sentence of a summary), the scope leaves it stands for."""

    worth: float
    node_id: str
    text: str
    leaves: tuple[str, ...]
    sentence: bool = False


_DATE_IN_TEXT = re.compile(r"\b(\d{1,2} [A-Z][a-z]+,? \d{4}|[A-Z][a-z]+ \d{1,2},? \d{4}|\d{4}-\d{2}-\d{2})\b")
_DATE_LAYOUTS = ("%d %B %Y", "%d %B, %Y", "%B %d %Y", "%B %d, %Y", "%Y-%m-%d", "%d %b %Y", "%d %b, %Y")


def _dates_in(text: str) -> list[float]:
    """The dates a text writes out (``24 May 2023``, ``May 24, 2023``, ``2023-05-24``),
    as POSIX seconds at midnight UTC."""
    found = []
    for written in _DATE_IN_TEXT.findall(text):
        for layout in _DATE_LAYOUTS:
            try:
                moment = datetime.strptime(written, layout).replace(tzinfo=UTC)
            except ValueError:
                continue
            found.append(moment.timestamp())
            break
    return found


def _content_words(text: str) -> list[str]:
    """A leaf's content words: its speaker label and function words left out."""
    label = _SPEAKER_LABEL.match(text)
    body = text[label.end() :] if label else text
    words = (word.lower().strip("'’-") for word in _WORD.findall(body))
    return [word for word in words if len(word) > 2 and word not in STOPWORDS and "'" not in word]


_FIRST_PERSON = re.compile(r"\b(?:I|I'm|I've|I'd|I'll|my|me|mine|we|our|us)\b")
_SECOND_PERSON = re.compile(r"\b(?:you|your|you're|you've|yours)\b", re.IGNORECASE)


def _self_share(text: str) -> float:
    """``(1 + first-person words) / (1 + second-person words)``, each counted up to 3:
    1 for a text in the third person."""
    label = _SPEAKER_LABEL.match(text)
    body = text[label.end() :] if label else text
    first = min(3, len(_FIRST_PERSON.findall(body)))
    second = min(3, len(_SECOND_PERSON.findall(body)))
    return (1 + first) / (1 + second)


def _quotes_leaves(state: TreeState, summary: str, leaves: list[str]) -> bool:
    """Whether a summary is made of its leaves' own sentences (an extractive or digest
    summary): delivering the leaves gives all it says, and more."""
    sentences = {fold(sentence) for leaf in leaves for sentence in split_sentences(state.nodes[leaf].text)}
    own = [fold(sentence) for sentence in split_sentences(state.nodes[summary].text)]
    quoted = sum(sentence in sentences for sentence in own)
    return quoted * 2 >= len(own)


def _dated(text: str, stamps: list[float | None], previous: str | None = None) -> tuple[str, str | None]:
    """``text`` with its date in front (``YYYY-MM-DD: ``, or a first and last date)
    unless it already starts with one, and the date it goes by. A transcript turn's
    own date of that day (``1:56 pm on 8 May, 2023 Caroline: ...``) gives way to the
    short one (``2023-05-08: Caroline: ...``): six words say what one does, and an
    overview is read by the day. When the part before went by the same single day
    (``previous``), the date is not said again, as packing leaves out a sentence
    already given."""
    days = sorted({moment.date() for moment in map(to_datetime, stamps) if moment is not None})
    day = days[0].isoformat() if len(days) == 1 else None
    transcript = _TRANSCRIPT_DATE.match(text)
    if transcript and day is not None and _transcript_day(transcript.group()) == day:
        text = text[transcript.end() :].lstrip()
    written = date_of(text) is not None
    if day is not None and day == previous:
        again = _TRANSCRIPT_DATE.match(text)
        return (text[again.end() :].lstrip() if again else text), day
    if written or not days:
        return text, day
    span = days[0].isoformat() if len(days) == 1 else f"{days[0].isoformat()} – {days[-1].isoformat()}"
    return f"{span}: {text}", day


def _transcript_day(written: str) -> str | None:
    """The day (``YYYY-MM-DD``) a transcript turn's date names, if it names one."""
    moments = [to_datetime(stamp) for stamp in _dates_in(written)]
    return moments[0].date().isoformat() if moments and moments[0] is not None else None
