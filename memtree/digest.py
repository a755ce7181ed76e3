"""Digest summaries: an offline summary that says who, when and what.

An extractive summary of dated chat turns reads as glued fragments
(``14 January 2024 Maya: For now. 22 February 2024 Maya: I got the job!``): a
person scanning the tree, or a reader given a summary hit, cannot tell which
stretch of the conversation a node stands for. A digest puts a heading first:

    14 January 2024 – 22 February 2024 · Maya, Leo · marathon, coach, job
    22 February 2024 Maya: I got the job!

* the **date span** of the texts below the node (the earliest and latest date
  found at the start of a text, as the text writes it);
* the **people**: the speakers (``Name:`` after the date), most frequent first;
* the **distinctive terms**: words frequent in this node's texts and rare across
  every text this aggregator has seen (tf-idf against the tree as it grows);
* then the **most central sentences**, chosen as :class:`ExtractiveAggregator`
  chooses them, within what is left of the word budget.

Every word of a digest still comes from a leaf (dates, names and terms are copied
from leaf texts; only the separators ``–`` and ``·`` are added), so the offline
promise "nothing invented" holds. The terms' idf comes from the texts seen by
this aggregator object, so a memory reopened in a new process weighs terms by
what it has seen since; the heading of a node rebuilt from its leaves
(``aggregate("", leaves, 0)``) depends only on those leaves and that count.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from memtree.aggregate import ExtractiveAggregator, _select_mmr, _unique_sentences
from memtree.embed import Embedder, Matrix
from memtree.node import Vector
from memtree.text import count_words, date_of, fold

SPAN = " – "
SEPARATOR = " · "
EMPTY = "-"

_SPEAKER = re.compile(r"^(?P<head>.{0,60}?)(?P<speaker>[A-Z][\w'’-]*(?: [A-Z][\w'’-]*)?):\s")
_WORD = re.compile(r"[A-Za-z][A-Za-z'’-]{2,}")
_DATE_FORMATS = ("%d %B %Y", "%d %B, %Y", "%B %d %Y", "%B %d, %Y", "%Y-%m-%d", "%d %b %Y", "%d %b, %Y")

_STOPWORDS = """
    about above after again against all also and any are aren because been before being below between both but
    can cannot could did didn does doesn doing don down during each few for from further had hadn has hasn have
    haven having her here hers herself him himself his how into isn its itself just let like more most much must
    mustn myself nor not now off once only other ought our ours ourselves out over own really same shan she
    should shouldn some such than that the their theirs them themselves then there these they this those through
    too under until very was wasn were weren what when where which while who whom why will with won would
    wouldn you your yours yourself yourselves yeah yes okay sure thanks thank great good awesome wow well gonna
    get got know think going one way lot things thing something see feel make made time day really pretty
    love glad hey hope totally definitely amazing cool nice keep sounds sound much many even still always
    last anything everything nothing getting come coming went going want wanted looking look looks looked
    lots means mean kind sort maybe anyway right though since ever never every another next around back
    tell told said says saying share sharing thought thinking happy excited wonderful super fun best better
    take took taking give gave giving need needs trying tried try doing done used able first year years
    today week weeks month months recently lately soon long little big new old hear heard glad appreciate
"""
STOPWORDS = frozenset(_STOPWORDS.split())
"""Words never chosen as a digest's terms: function words and chat filler."""


@dataclass(frozen=True)
class Heading:
    """A digest's first line, parsed: dates as written, people, terms."""

    first_date: str | None
    last_date: str | None
    people: tuple[str, ...]
    terms: tuple[str, ...]

    def render(self) -> str:
        """``dates · people · terms``; an empty field is written ``-`` so the line
        always has three fields and parses back; no heading when all are empty."""
        dates = ""
        if self.first_date is not None:
            same = self.last_date is None or self.last_date == self.first_date
            dates = self.first_date if same else f"{self.first_date}{SPAN}{self.last_date}"
        fields = [dates, ", ".join(self.people), ", ".join(self.terms)]
        if not any(fields):
            return ""
        return SEPARATOR.join(field or EMPTY for field in fields)

    def phrase(self) -> str:
        """The heading said as a phrase a person reads at a glance: who and when
        (``Maya and Leo, 14 January 2024 – 22 February 2024``); the terms, a keyword
        list that serves retrieval, are left out. Empty when neither is known."""
        people = list(self.people)
        who = " and ".join([", ".join(people[:-1]), people[-1]]) if len(people) > 1 else "".join(people)
        when = ""
        if self.first_date is not None:
            same = self.last_date is None or self.last_date == self.first_date
            when = self.first_date if same else f"{self.first_date}{SPAN}{self.last_date}"
        return ", ".join(part for part in (who, when) if part)


def readable(text: str) -> str:
    """A summary's text as a person reads it: a digest's heading said as a phrase
    (:meth:`Heading.phrase`), then its turns as ``Name: words``; any other text as
    it is (``Maya and Leo, 28 April 2024 – 16 June 2024 — Maya: We adopted a dog!``)."""
    first, _, rest = text.partition("\n")
    heading = parse_heading(first)
    if heading is None:
        return text
    said = heading.phrase()
    body = " ".join(_without_date(line.strip()) for line in rest.splitlines() if line.strip())
    return f"{said} — {body}" if said and body else said or body


def _without_date(line: str) -> str:
    """A chat turn as ``Name: words`` (the heading already gives the dates)."""
    speaker = speaker_of(line)
    return f"{speaker}: {words_said(line)}" if speaker else line


def words_said(text: str) -> str:
    """A chat turn's own words: the text after its date and ``Name:`` label, if any."""
    match = _SPEAKER.match(text)
    return text[match.end() :] if match else text


def speaker_of(text: str) -> str | None:
    """The ``Name:`` a chat turn is attributed to, if the text has one near its start."""
    match = _SPEAKER.match(text)
    return match.group("speaker") if match else None


def _parsed_date(text: str) -> datetime | None:
    for layout in _DATE_FORMATS:
        try:
            return datetime.strptime(text, layout)
        except ValueError:
            continue
    return None


def _content_words(text: str) -> list[str]:
    """Lower-case words of a text's content: the date and the speaker label dropped."""
    match = _SPEAKER.match(text)
    body = text[match.end() :] if match else text
    words = (m.group(0).lower().strip("'’-") for m in _WORD.finditer(body))
    return [w for w in words if len(w) > 2 and w not in STOPWORDS and "'" not in w and "’" not in w]


def parse_heading(line: str) -> Heading | None:
    """The heading a digest starts with, or ``None`` if ``line`` is not one."""
    fields = line.split(SEPARATOR)
    if len(fields) != 3:
        return None
    dates, people, terms = (("" if field == EMPTY else field) for field in fields)
    span = dates.split(SPAN) if dates else []
    if len(span) > 2 or any(_parsed_date(d) is None for d in span):
        return None
    return Heading(
        span[0] if span else None,
        span[-1] if span else None,
        tuple(people.split(", ")) if people else (),
        tuple(terms.split(", ")) if terms else (),
    )


class DigestAggregator(ExtractiveAggregator):
    """Offline summaries that read as topic headings: date span, people, distinctive
    terms, then the most central sentence(s) of the leaves (see the module doc).

    Example::

        memory = MemTree(aggregator=DigestAggregator())
        # a summary node's text:
        # 14 January 2024 – 22 February 2024 · Maya, Leo · marathon, coach, job
        # 22 February 2024 Maya: I got the job!
    """

    def __init__(
        self,
        embedder: Embedder | None = None,
        *,
        max_words: int = 40,
        min_words: int = 24,
        diversity: float = 0.3,
        cache_size: int = 100_000,
        people: int = 3,
        terms: int = 4,
    ) -> None:
        super().__init__(embedder, max_words=max_words, min_words=min_words, diversity=diversity, cache_size=cache_size)
        self.people = people
        self.terms = terms
        self._document_frequency: Counter[str] = Counter()
        self._seen: set[str] = set()

    def bound_to(self, embedder: Embedder) -> DigestAggregator:
        if self.embedder is not None:
            return self
        bound = DigestAggregator(
            embedder,
            max_words=self.max_words,
            min_words=self.min_words,
            diversity=self.diversity,
            cache_size=self._cache_size,
            people=self.people,
            terms=self.terms,
        )
        return bound

    def known_vector(self, summary: str) -> Vector | None:
        """``None``: a digest's heading is no sentence of any leaf, so the memory
        embeds the digest's whole text (its vector depends on that text alone)."""
        return None

    def missing_sentences(self, summary: str) -> list[str]:
        return []

    def _observe(self, texts: Sequence[str]) -> None:
        """Count each distinct text once in the document frequencies (the idf of terms)."""
        with self._lock:
            for text in texts:
                key = fold(text)
                if key not in self._seen:
                    self._seen.add(key)
                    self._document_frequency.update(set(_content_words(text)))

    def heading(self, previous: Heading | None, texts: Sequence[str]) -> Heading:
        """The heading of a node whose earlier heading was ``previous`` and which now
        also covers ``texts`` (their dates, speakers and words)."""
        dates = [d for d in ([previous.first_date, previous.last_date] if previous else []) if d]
        dates += [d for d in (date_of(t) for t in texts) if d]
        keyed = [(d, _parsed_date(d)) for d in dates]
        if keyed and all(p is not None for _, p in keyed):
            keyed.sort(key=lambda pair: pair[1] or datetime.min)
        first = keyed[0][0] if keyed else None
        last = keyed[-1][0] if keyed else None
        speakers: Counter[str] = Counter()
        for rank, person in enumerate(previous.people if previous else ()):
            speakers[person] += len(texts) + self.people - rank  # keep who the node was about
        speakers.update(s for s in (speaker_of(t) for t in texts) if s)
        people = tuple(name for name, _ in sorted(speakers.items(), key=lambda p: (-p[1], p[0]))[: self.people])
        frequency: Counter[str] = Counter()
        for term in previous.terms if previous else ():
            frequency[term] += 2
        for text in texts:
            frequency.update(_content_words(text))
        seen = max(1, len(self._seen))
        named = {p.lower() for p in people}
        weights = {
            word: count * math.log(1.0 + seen / (1 + self._document_frequency[word]))
            for word, count in frequency.items()
            if word not in named
        }
        terms = tuple(w for w, _ in sorted(weights.items(), key=lambda p: (-p[1], p[0]))[: self.terms])
        return Heading(first, last, people, terms)

    def summarize(self, texts: Sequence[str], vectors: Matrix, leaves: int, *, centroid: Vector | None = None) -> str:
        """A digest written afresh from its children (as a rebuild), its sentences
        chosen by their own embeddings: the heading reads every text below."""
        return self.aggregate("", texts, 0, centroid=centroid)

    def aggregate(self, summary: str, new_texts: Sequence[str], count: int, *, centroid: Vector | None = None) -> str:
        lines = summary.splitlines()
        previous = parse_heading(lines[0]) if lines else None
        body = "\n".join(lines[1:] if previous is not None else lines)
        # A summary without a heading is a leaf being split (or an older summary):
        # its own date, speaker and words count as one more text below the node.
        covered = [*new_texts] if previous is not None or not body.strip() else [body, *new_texts]
        self._observe(covered)
        heading = self.heading(previous, covered).render()
        candidates = _unique_sentences([body, *new_texts])
        if not candidates:
            return heading
        budget = max(1, self.word_budget(count + max(1, len(new_texts))) - count_words(heading))
        lengths = [count_words(sentence) for sentence in candidates]
        vectors = self._sentence_vectors(candidates)
        target = vectors.mean(axis=0) if centroid is None else centroid
        norm = float((target**2).sum() ** 0.5)
        relevance = vectors @ (target / norm) if norm > 0 else vectors[:, 0] * 0.0
        chosen = _select_mmr(vectors, relevance, lengths, budget, self.diversity)
        if not chosen:  # the most central sentence is longer than what is left: keep its start
            best = int(relevance.argmax())
            sentence = " ".join(candidates[best].split()[: max(budget, 8)]) + " …"
            return f"{heading}\n{sentence}" if heading else sentence
        picked = "\n".join(candidates[i] for i in sorted(chosen))
        return f"{heading}\n{picked}" if heading else picked
