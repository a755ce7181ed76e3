"""``LexicalIndex``: an incremental BM25 index over node texts, beside the vector index.

Dense embeddings of a small sentence model blur exactly what memory questions hinge
on: names, places, objects, dates ("When did Caroline go to the LGBTQ support
group?"). On LoCoMo, mixing BM25 into the cosine score raised memtree's evidence
recall at 500 words from 0.56 to 0.70 (benchmarks/results/locomo.md).

Scoring is Okapi BM25 (k1 = 1.5, b = 0.75) with the always-positive idf
``log(1 + (N - df + 0.5) / (df + 0.5))``. Tokens are lower-cased words; a short
list of English function words is left out, which keeps posting lists of common
words from dominating query time in large memories.

How it stays fast as a memory grows to millions of nodes:

* **Integer slots and NumPy postings.** Documents live in integer slots; each term
  has one growable ``int32`` array of ``(slot, tf, epoch)`` triples (an
  ``array.array``, so appending a batch's entries to a term is one C call). A query
  reads a posting list as a NumPy view and scores it with a handful of NumPy
  operations, never a Python loop per entry.
* **Incremental updates with tombstones.** Re-indexing a document bumps its slot's
  *epoch*: its old entries stay in the posting arrays but no longer match the slot's
  epoch, so they count as dead, and new entries are appended. A term's array is
  compacted when more than half of it is dead (work proportional to what died since
  the last compaction), so an update costs the same at any size and nothing is
  ever rebuilt on the write path.
* **Bulk build.** Indexing many documents at once (a reopen, a catch-up) tokenizes
  them together (ASCII text through one ``bytes.translate``), looks each distinct
  word up once and counts with NumPy; each term's postings start as a view into one
  array.
* **Top-k without scoring everything (MaxScore).** Retrieval needs the best
  ``limit`` documents and a few exact scores, not every score. Terms are read rarest
  first; once the ``limit``-th best partial score exceeds what the unread (common,
  low-idf) terms could still add to any document, only the documents that can still
  reach it are kept and scored exactly from their own term lists (a forward index).
  Common words then cost little more than their upper bound.

* **Approximate candidates at scale.** Where the vector search is approximate
  (memories past ``ann_min_nodes``, without ``exact=True``), the BM25 side may be
  too: candidates come from the query's rarest words only, up to
  :data:`APPROXIMATE_ENTRIES` posting entries, and are then scored exactly. At 1M
  nodes this reads a few thousand entries a query instead of the hundreds of
  thousands a common word holds; recall@10 of the hybrid ranking against exact
  search stays at 0.98 (benchmarks/results/scale.md).

Scores are exactly those of the textbook computation: each document's terms are
summed in query order with the same floating-point operations.
"""

from __future__ import annotations

import heapq
import itertools
import math
import re
import threading
from array import array
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from collections.abc import Iterator

_WORD = re.compile(r"\w+", re.UNICODE)
_WORD_OR_SEPARATOR = re.compile(r"\w+|\x00", re.UNICODE)

_STOPWORD_TEXT = """a about above after again against all am an and any are as at be because been before being below
    between both but by can could did do does doing down during each few for from further had has have
    having he her here hers herself him himself his how i if in into is it its itself just me more most my
    myself no nor not now of off on once only or other our ours ourselves out over own same she should so
    some such than that the their theirs them themselves then there these they this those through to too
    under until up very was we were what when where which while who whom why will with would you your
    yours yourself yourselves s t d ll m re ve"""
STOPWORDS: frozenset[str] = frozenset(_STOPWORD_TEXT.split())

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

_SEPARATOR = b"\x00"
"""Joins ASCII texts for bulk tokenizing: not a word character, so never inside a token."""


def _ascii_fold_table() -> bytes:
    """``bytes.translate`` table: ASCII word characters (what ``\\w`` matches in ASCII:
    letters, digits, underscore) case-folded, every other byte a space, NUL kept."""
    table = bytearray(b" " * 256)
    for code in range(128):
        char = chr(code)
        if _WORD.fullmatch(char):
            table[code] = ord(char.casefold())
    table[0] = 0
    return bytes(table)


_ASCII_FOLD = _ascii_fold_table()

_STOP_ID = -1
_SEPARATOR_ID = -2
_UNKNOWN_ID = -3
_TERM_SHIFT = 32
_TF_MASK = (1 << _TERM_SHIFT) - 1

_FORWARD_COST = 150
"""Scoring one document from its term list costs about as much as reading this many
posting entries; MaxScore stops reading posting lists once the documents left to
check are cheaper to score that way than the lists left to read."""
_SLACK = 1e-9
"""Relative margin on pruning bounds, so floating-point rounding never prunes a
document that could tie."""
_MIN_COMPACT = 8
"""A term's array is compacted once more than half of it, and at least this many
entries, are dead (so a rare word's few dead entries wait: a Python call per
compaction would cost more than they do)."""

_SCORE_ALL_ENTRIES = 30_000
"""Up to this many posting entries over the query's terms, score them all in one
vectorized pass: cheaper than MaxScore's bookkeeping, which pays off on longer lists."""
APPROXIMATE_ENTRIES = 5000
"""An approximate search (:meth:`LexicalIndex.search_and_score`) reads the posting
lists of a query's rarest words up to this many entries in all."""
APPROXIMATE_POOL = 4
"""An approximate search scores exactly this many times ``limit`` candidates."""
_TEXTS_PER_CHUNK = 20_000
"""Bulk tokenizing handles this many texts at a time."""
_DENSE_SCORES = 8
"""A one-pass query scores into a new array over all slots while there are at most this
many slots per posting entry read; beyond, into a reused one, touching only its entries."""
_KNOWN_WORDS = 4096
_BULK_TOKENS = 4096
"""While the index knows fewer than ``_KNOWN_WORDS`` words, a batch of more than
``_BULK_TOKENS`` tokens finds its new words among its distinct tokens rather than
token by token."""

_EMPTY_FORWARD = np.zeros(0, dtype=np.int64)
_NO_SLOTS = _EMPTY_FORWARD
_INT32 = "i"
assert array(_INT32).itemsize == 4, "array('i') must hold 32-bit integers"


def lexical_tokens(text: str) -> list[str]:
    """The terms BM25 counts: lower-cased words without English function words."""
    return [word for word in _WORD.findall(text.casefold()) if word not in STOPWORDS]


@dataclass(frozen=True)
class LexicalQuery:
    """A query's known terms with their weights (idf times how often the query says
    them), in the order the query first says them; made by :meth:`LexicalIndex.prepare`
    and valid until the index changes."""

    terms: IntArray
    weights: FloatArray
    average_length: float

    def __len__(self) -> int:
        return int(self.terms.size)


@dataclass
class LexicalBase:
    """A BM25 index as a segment stores it (:mod:`memtree.segment`), for
    :meth:`LexicalIndex.mapped`: the arrays are memory-mapped and never written.

    ``postings`` holds ``(slot, tf, 0)`` triples grouped by term (term ``t``'s are rows
    ``posting_offsets[t]`` to ``posting_offsets[t + 1]``), ``forward`` each slot's
    ``term << 32 | tf`` entries by term. ``terms_of`` finds words' term ids (-1: none)
    without building a table of the whole vocabulary. Slots are the segment's rows:
    ``row_of`` and ``id_at`` translate node ids."""

    terms: int
    terms_of: Callable[[Sequence[str]], IntArray]
    postings: npt.NDArray[np.int32]
    posting_offsets: IntArray
    forward: IntArray
    forward_offsets: IntArray
    lengths: FloatArray
    tf_max: IntArray
    length_min: FloatArray
    total_length: int
    documents: int
    row_of: Callable[[str], int]
    id_at: Callable[[int], str]

    @staticmethod
    def of(node_ids: Sequence[str], texts: Sequence[str]) -> LexicalBase:
        """The stored form of these documents, held in memory (what a segment would
        store for them; for tests)."""
        counted = count_terms(texts)
        words = [word if isinstance(word, str) else word.decode("ascii") for word in counted.words]
        term_of = {word: term for term, word in enumerate(words)}
        row_of = {node_id: row for row, node_id in enumerate(node_ids)}
        return LexicalBase(
            terms=len(words),
            terms_of=lambda words: np.asarray([term_of.get(word, -1) for word in words], dtype=np.int64),
            postings=counted.postings,
            posting_offsets=counted.posting_offsets,
            forward=counted.forward,
            forward_offsets=counted.forward_offsets,
            lengths=counted.lengths,
            tf_max=counted.tf_max,
            length_min=counted.length_min,
            total_length=int(counted.lengths.sum()),
            documents=len(texts),
            row_of=lambda node_id: row_of.get(node_id, -1),
            id_at=lambda row: node_ids[row],
        )


@dataclass
class CountedTerms:
    """Texts counted as a segment stores them (see :class:`LexicalBase`)."""

    words: list[bytes | str]
    postings: npt.NDArray[np.int32]
    posting_offsets: IntArray
    forward: IntArray
    forward_offsets: IntArray
    lengths: FloatArray
    tf_max: IntArray
    length_min: FloatArray


def count_terms(texts: Sequence[str]) -> CountedTerms:
    """The BM25 arrays of ``texts`` (document ``i`` is text ``i``), built as a bulk
    load of a fresh index builds them."""
    scratch = LexicalIndex()
    scratch.upsert_many([str(i) for i in range(len(texts))], list(texts))
    terms = scratch._terms
    words: list[bytes | str] = [b""] * terms
    for word, term in scratch._term_of.items():
        if term >= 0:
            words[term] = word
    parts = [_triples(scratch._postings[term]) for term in range(terms)]
    sizes = np.fromiter((part.shape[0] for part in parts), dtype=np.int64, count=terms)
    postings = np.concatenate([*parts, np.zeros((0, 3), np.int32)]).astype(np.int32)
    forward_parts = [scratch._forward_of(slot) for slot in range(len(texts))]
    forward_sizes = np.fromiter(map(len, forward_parts), dtype=np.int64, count=len(texts))
    return CountedTerms(
        words=words,
        postings=postings,
        posting_offsets=np.concatenate(([0], np.cumsum(sizes))).astype(np.int64),
        forward=np.concatenate([*forward_parts, _EMPTY_FORWARD]).astype(np.int64),
        forward_offsets=np.concatenate(([0], np.cumsum(forward_sizes))).astype(np.int64),
        lengths=np.asarray(scratch._length[: len(texts)], dtype=np.float64).copy(),
        tf_max=scratch._tf_max[:terms].copy(),
        length_min=scratch._length_min[:terms].copy(),
    )


class LexicalIndex:
    """BM25 over a changing set of documents keyed by node id.

    Example::

        index = LexicalIndex()
        index.upsert_many(["a", "b"], ["pottery class on Monday", "dance studio"])
        index.search("pottery", limit=5)   # [("a", 0.63...)]
    """

    k1 = 1.5
    b = 0.75

    def __init__(self) -> None:
        self._term_of: dict[bytes | str, int] = {word.encode("ascii"): _STOP_ID for word in STOPWORDS}
        """Word -> term id; an ASCII word as bytes (what bulk tokenizing yields), any
        other as str. Function words map to -1, the text separator to -2."""
        self._term_of[_SEPARATOR] = _SEPARATOR_ID
        self._base: LexicalBase | None = None
        """The segment this index was mapped from (see :meth:`mapped`), if any."""
        self._base_terms = 0
        self._base_gone = np.zeros(0, dtype=bool)
        """Per base term: its stored run was folded into its own array (by a compaction)."""
        self._terms = 0
        self._postings: list[array[int] | None] = []
        """Per term id: ``slot, tf, epoch`` triples, one per document version indexed."""
        self._size = np.zeros(16, dtype=np.int64)
        """Per term id: entries in use, live and dead."""
        self._dead = np.zeros(16, dtype=np.int64)
        """Per term id: entries whose document was re-indexed or removed since."""
        self._tf_max = np.zeros(16, dtype=np.int64)
        """Per term id: at least the largest tf among live entries (for upper bounds)."""
        self._length_min = np.zeros(16, dtype=np.float64)
        """Per term id: at most the length of the shortest live document holding it."""
        self._slot_of: dict[str, int] = {}
        """Node id -> slot; with a base, only ids not (or no longer) at their base row (-1: gone)."""
        self._ids = _DocIds()
        self._free: list[int] = []
        self._length = np.zeros(16, dtype=np.float64)
        """Per slot: the document's length in counted tokens (0 for a free slot)."""
        self._epoch = np.zeros(16, dtype=np.int32)
        self._forward: list[IntArray | None] = []
        """Per slot: ``term << 32 | tf`` for each distinct term of the document, by term
        (``None``: as the base stores it)."""
        self._total_length = 0
        self._count = 0
        self._scratch = threading.local()

    @classmethod
    def mapped(cls, base: LexicalBase) -> LexicalIndex:
        """An index over a segment's stored arrays: nothing is copied but the per-term
        and per-document numbers; posting lists and term lists are read in place until
        a write changes them."""
        index = cls()
        index._base = base
        index._base_terms = index._terms = base.terms
        index._base_gone = np.zeros(base.terms, dtype=bool)
        index._postings = [None] * base.terms
        sizes = np.diff(np.asarray(base.posting_offsets)).astype(np.int64)
        index._size = _grown(sizes, max(16, base.terms))
        index._dead = np.zeros(index._size.size, dtype=np.int64)
        index._tf_max = np.zeros(index._size.size, dtype=np.int64)
        index._tf_max[: base.terms] = base.tf_max
        index._length_min = np.zeros(index._size.size, dtype=np.float64)
        index._length_min[: base.terms] = base.length_min
        documents = int(np.asarray(base.lengths).size)
        index._ids = _DocIds(documents, base.id_at)
        index._forward = [None] * documents
        index._length = _grown(np.asarray(base.lengths, dtype=np.float64), max(16, documents))
        index._epoch = np.zeros(index._length.size, dtype=np.int32)
        index._total_length = base.total_length
        index._count = base.documents
        return index

    def __len__(self) -> int:
        return self._count

    def __contains__(self, node_id: object) -> bool:
        return isinstance(node_id, str) and self._slot(node_id) >= 0

    def _slot(self, node_id: str) -> int:
        """The slot of ``node_id`` (-1: not indexed)."""
        slot = self._slot_of.get(node_id)
        if slot is not None:
            return slot
        if self._base is None:
            return -1
        row = self._base.row_of(node_id)
        return row if row >= 0 and not self._ids.replaced(row) else -1

    def _forward_of(self, slot: int) -> IntArray:
        forward = self._forward[slot]
        if forward is not None:
            return forward
        base = self._base
        assert base is not None
        return np.asarray(base.forward[base.forward_offsets[slot] : base.forward_offsets[slot + 1]])

    def _parts_of(self, term: int) -> list[npt.NDArray[np.int32]]:
        """A term's postings as ``(n, 3)`` arrays: the base's stored run (read in place,
        never copied: a common word's runs hundreds of thousands of entries), then the
        entries added since."""
        own = _triples(self._postings[term])
        if term >= self._base_terms or self._base_gone[term]:
            return [own]
        base = self._base
        assert base is not None
        stored = np.asarray(base.postings[base.posting_offsets[term] : base.posting_offsets[term + 1]])
        return [stored, own] if own.shape[0] else [stored]

    def _triples_of(self, term: int) -> npt.NDArray[np.int32]:
        """A term's postings as one ``(n, 3)`` array (a copy when it has two parts)."""
        parts = self._parts_of(term)
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def _term_id(self, key: bytes | str) -> int | None:
        """A word's term id (negative for function words), ``None`` if unknown."""
        term = self._term_of.get(key)
        if term is None and self._base is not None:
            self._from_base([key])
            term = self._term_of.get(key)
        return term

    def _from_base(self, keys: list[bytes | str]) -> list[bytes | str]:
        """Put the words of ``keys`` the base has into the table (remembered: the next
        text with them finds them at once); return the others."""
        assert self._base is not None
        found = self._base.terms_of([key if isinstance(key, str) else key.decode("ascii") for key in keys])
        missing = []
        for key, term in zip(keys, found.tolist(), strict=True):
            if term >= 0:
                self._term_of[key] = term
            else:
                missing.append(key)
        return missing

    def _resolve(self, keys: Iterable[bytes | str]) -> None:
        """Give each of these words not in the table its term id: the base's, where the
        base has the word, else the next new one. (A mapped index fills its table as
        words come, never the whole vocabulary at once.)"""
        lookup = self._term_of
        unknown = [key for key in dict.fromkeys(keys) if key not in lookup]
        if self._base is not None and unknown:
            unknown = self._from_base(unknown)
        self._learn(unknown)

    def postings(self, query: str) -> int:
        """How many documents the query's words occur in, counted once per word (the
        work an exhaustive BM25 query does)."""
        terms = self.prepare(query).terms
        return int((self._size[terms] - self._dead[terms]).sum())

    def footprint(self) -> dict[str, int]:
        """Sizes for reports: documents, distinct words, posting entries (live and
        dead) and forward-index entries, and the bytes of the arrays holding them."""
        entries = int(self._size[: self._terms].sum())
        forward = sum(len(self._forward_of(slot)) for slot in range(len(self._ids)))
        return {
            "documents": self._count,
            "words": self._terms,
            "posting_entries": entries,
            "dead_entries": int(self._dead[: self._terms].sum()),
            "forward_entries": forward,
            "bytes": entries * 12 + forward * 8 + len(self._ids) * 12,
        }

    # -- writing ---------------------------------------------------------------------------

    def upsert(self, node_id: str, text: str) -> None:
        """Index ``text`` under ``node_id``, replacing what was there."""
        self.upsert_many([node_id], [text])

    def upsert_many(self, node_ids: Sequence[str], texts: Sequence[str]) -> None:
        """Index many documents at once, replacing the ids already present (of an id
        given twice, the last text wins). The cost follows the texts given, not the
        size of the index."""
        if len(node_ids) != len(texts):
            raise ValueError(f"upsert_many got {len(node_ids)} ids but {len(texts)} texts; give one text per id")
        if not node_ids:
            return
        if len(set(node_ids)) != len(node_ids):
            last = dict(zip(node_ids, texts, strict=True))
            node_ids, texts = list(last), list(last.values())
        present = [slot for slot in map(self._slot, node_ids) if slot >= 0]
        retired = self._retire(np.asarray(present, dtype=np.int64)) if present else _EMPTY_FORWARD
        if not present and not self._free:  # all new (a reopen): append them in one go
            start = len(self._ids)
            slots = np.arange(start, start + len(node_ids), dtype=np.int64)
            self._slot_of.update(zip(node_ids, range(start, start + len(node_ids)), strict=True))
            self._ids.extend(node_ids)
            self._forward.extend([_EMPTY_FORWARD] * len(node_ids))
            if len(self._ids) > self._length.size:
                self._length = _grown(self._length, len(self._ids))
                self._epoch = _grown(self._epoch, len(self._ids))
        else:
            slots = np.fromiter(map(self._claim, node_ids), dtype=np.int64, count=len(node_ids))
        terms, owners = self._term_ids(texts)
        self._add(slots, terms, owners)
        self._compact(retired)

    def remove(self, node_id: str) -> None:
        """Forget ``node_id`` (no-op when absent)."""
        self.remove_many([node_id])

    def remove_many(self, node_ids: Iterable[str]) -> None:
        """Forget these ids (absent ones are skipped)."""
        slots = []
        for node_id in dict.fromkeys(node_ids):
            slot = self._slot(node_id)
            if slot >= 0:
                slots.append(slot)
                if self._base is not None:
                    self._slot_of[node_id] = -1
                else:
                    del self._slot_of[node_id]
        if not slots:
            return
        retired = self._retire(np.asarray(slots, dtype=np.int64))
        for slot in slots:
            self._ids[slot] = None
            self._free.append(slot)
        self._compact(retired)

    def _claim(self, node_id: str) -> int:
        """The slot of ``node_id``: its own, a free one or a new one."""
        slot = self._slot(node_id)
        if slot >= 0:
            return slot
        if self._free:
            slot = self._free.pop()
            self._ids[slot] = node_id
        else:
            slot = len(self._ids)
            self._ids.append(node_id)
            self._forward.append(_EMPTY_FORWARD)
            if slot >= self._length.size:
                self._length = _grown(self._length, slot + 1)
                self._epoch = _grown(self._epoch, slot + 1)
        self._slot_of[node_id] = slot
        return slot

    def _retire(self, slots: IntArray) -> IntArray:
        """Invalidate the documents in ``slots`` (their entries die); return the ids of
        the terms they held."""
        forward = [self._forward_of(slot) for slot in slots.tolist()]
        terms = np.concatenate(forward) >> _TERM_SHIFT if forward else _EMPTY_FORWARD
        if terms.size:
            np.add.at(self._dead, terms, 1)
        self._total_length -= int(self._length[slots].sum())
        self._count -= int(slots.size)
        self._length[slots] = 0.0
        self._epoch[slots] += 1
        for slot in slots.tolist():
            self._forward[slot] = _EMPTY_FORWARD
        return terms

    def _term_ids(self, texts: Sequence[str]) -> tuple[IntArray, IntArray]:
        """Every counted token of ``texts`` as a term id, with the position of its text.

        ASCII texts (most texts) are tokenized together, a chunk at a time: joined
        with NUL, folded and split by one ``bytes.translate``. Other texts go one by one
        through the regex. New words get term ids.
        """
        batches: list[tuple[IntArray, IntArray]] = []
        plain = [i for i, text in enumerate(texts) if text.isascii()]
        others = [i for i, text in enumerate(texts) if not text.isascii()]
        for start in range(0, len(plain), _TEXTS_PER_CHUNK):  # chunks bound the list of tokens held at once
            chunk = plain[start : start + _TEXTS_PER_CHUNK]
            joined = " \x00 ".join([texts[i] for i in chunk]).encode("ascii")
            if joined.count(_SEPARATOR) != len(chunk) - 1:  # a text holds NUL itself: the slow way
                others.extend(chunk)
                continue
            tokens: list[bytes] = joined.translate(_ASCII_FOLD).split()
            batches.append(self._map_tokens(tokens, np.asarray(chunk, dtype=np.int64)))
        if others:
            others.sort()
            joined_text = "\x00".join([texts[i] for i in others]).casefold()
            if joined_text.count("\x00") == len(others) - 1:
                words: list[str] = _WORD_OR_SEPARATOR.findall(joined_text)
            else:  # a text holds NUL itself: one at a time
                words = []
                for number, position in enumerate(others):
                    if number:
                        words.append("\x00")
                    words.extend(_WORD.findall(texts[position].casefold()))
            batches.append(self._map_words(words, np.asarray(others, dtype=np.int64)))
        if not batches:
            return _EMPTY_FORWARD, _EMPTY_FORWARD
        if len(batches) == 1:
            return batches[0]
        return np.concatenate([terms for terms, _ in batches]), np.concatenate([owners for _, owners in batches])

    def _map_words(self, words: list[str], positions: IntArray) -> tuple[IntArray, IntArray]:
        """:meth:`_map_tokens` for words as str: each distinct word is keyed once."""
        distinct = list(dict.fromkeys(words))
        keys = [_key(word) for word in distinct]
        lookup = self._term_of
        self._resolve(keys)
        local = dict(zip(distinct, map(lookup.__getitem__, keys), strict=True))
        return self._numbered(np.fromiter(map(local.__getitem__, words), dtype=np.int32, count=len(words)), positions)

    def _map_tokens(self, tokens: Sequence[bytes | str], positions: IntArray) -> tuple[IntArray, IntArray]:
        """Tokens of several texts, separated by NUL tokens -> (term ids, text positions).
        New words get the next term ids."""
        lookup = self._term_of
        if self._terms < _KNOWN_WORDS and len(tokens) > _BULK_TOKENS:
            # Nearly every word is new (a reopen starts here): find them among the distinct ones.
            self._resolve(tokens)
            ids = np.fromiter(map(lookup.__getitem__, tokens), dtype=np.int32, count=len(tokens))
        else:  # most words are known: one lookup per token, then the few new ones
            ids = np.fromiter(map(lookup.get, tokens, repeat(_UNKNOWN_ID)), dtype=np.int32, count=len(tokens))
            unknown = np.flatnonzero(ids == _UNKNOWN_ID).tolist()
            if unknown:
                words = [tokens[position] for position in unknown]
                self._resolve(words)
                ids[unknown] = list(map(lookup.__getitem__, words))
        return self._numbered(ids, positions)

    def _learn(self, new: list[bytes | str]) -> None:
        """Give new words the next term ids."""
        if new:
            self._term_of.update(zip(new, range(self._terms, self._terms + len(new)), strict=True))
            self._terms += len(new)
            self._reserve_terms(self._terms)

    @staticmethod
    def _numbered(ids: npt.NDArray[np.int32], positions: IntArray) -> tuple[IntArray, IntArray]:
        """Term ids with separators (-2) between texts -> (counted term ids, text positions)."""
        text_number = np.cumsum(ids == _SEPARATOR_ID, dtype=np.int32)
        counted = ids >= 0
        return ids[counted].astype(np.int64), positions[text_number[counted]]

    def _reserve_terms(self, count: int) -> None:
        if count > self._size.size:
            self._size = _grown(self._size, count)
            self._dead = _grown(self._dead, count)
            self._tf_max = _grown(self._tf_max, count)
            self._length_min = _grown(self._length_min, count)
        missing = count - len(self._postings)
        if missing > 0:
            self._postings.extend([None] * missing)

    def _add(self, slots: IntArray, terms: IntArray, owners: IntArray) -> None:
        """Index documents: ``terms[i]`` is a token of the document in ``slots[owners[i]]``."""
        lengths = np.bincount(owners, minlength=slots.size).astype(np.float64)
        self._length[slots] = lengths
        self._total_length += int(lengths.sum())
        self._count += int(slots.size)
        if not terms.size:
            return
        shift = max(self._terms, 1).bit_length()
        # Sorted by document, then term. The stable sort (timsort) is the fast one here:
        # tokens arrive document by document, so it only sorts within documents.
        keys = np.sort((owners << shift) | terms, kind="stable")
        first = np.flatnonzero(np.concatenate(([True], keys[1:] != keys[:-1])))
        pairs = keys[first]
        tf = np.diff(np.append(first, keys.size))
        owner = pairs >> shift
        term = pairs & ((1 << shift) - 1)
        # Forward index: per document a view into one array of term << 32 | tf.
        packed = (term << _TERM_SHIFT) | tf
        bounds = np.searchsorted(owner, np.arange(slots.size + 1)).tolist()
        forward = self._forward
        for number, slot in enumerate(slots.tolist()):
            forward[slot] = packed[bounds[number] : bounds[number + 1]]
        # Postings: entries grouped by term (documents keep their order within a term).
        order = stable_order(term)
        entries = np.empty((term.size, 3), dtype=np.int32)
        entries[:, 0] = slots[owner[order]]
        entries[:, 1] = tf[order]
        entries[:, 2] = self._epoch[entries[:, 0]]
        if term.size * _DENSE_SCORES >= self._terms:  # a bulk build: count per word of the vocabulary
            per_term = np.bincount(term, minlength=self._terms)
            distinct = np.flatnonzero(per_term)
            ends = np.cumsum(per_term[distinct])
            starts = ends - per_term[distinct]
        else:  # an insert's few texts: nothing here may cost in proportion to the vocabulary
            grouped = term[order]
            starts = np.flatnonzero(np.diff(grouped, prepend=-1))
            distinct = grouped[starts]
            ends = np.append(starts[1:], grouped.size)
        # Bounds for pruning: a term that had no entries starts afresh, others only widen.
        empty = self._size[distinct] == 0
        new_max = np.maximum.reduceat(entries[:, 1], starts)
        new_min = np.minimum.reduceat(self._length[entries[:, 0]], starts)
        self._tf_max[distinct] = np.where(empty, new_max, np.maximum(self._tf_max[distinct], new_max))
        self._length_min[distinct] = np.where(empty, new_min, np.minimum(self._length_min[distinct], new_min))
        self._size[distinct] += ends - starts
        raw = entries.data.cast("B")
        postings = self._postings
        for t, start, end in zip(distinct.tolist(), (starts * 12).tolist(), (ends * 12).tolist(), strict=True):
            posting = postings[t]
            if posting is None:  # the entries added since the base (its stored run stays where it is)
                posting = postings[t] = array(_INT32)
            try:
                posting.frombytes(raw[start:end])
            except BufferError:  # a view of it outlived a query (a kept traceback): copy it
                posting = postings[t] = array(_INT32, posting)
                posting.frombytes(raw[start:end])

    def _compact(self, terms: IntArray) -> None:
        """Drop the dead entries of those of ``terms`` that are mostly dead."""
        if not terms.size:
            return
        distinct = np.unique(terms, return_counts=True)[0]  # the sorting unique (the hashing one is slow)
        size, dead = self._size[distinct], self._dead[distinct]
        for t in distinct[(2 * dead > size) & (dead >= _MIN_COMPACT)].tolist():
            triples = self._triples_of(t)
            kept = triples[self._epoch[triples[:, 0]] == triples[:, 2]]
            alive = kept.shape[0]
            fresh = array(_INT32)
            fresh.frombytes(kept.tobytes())
            self._postings[t] = fresh
            if t < self._base_terms:
                self._base_gone[t] = True  # its stored run is folded in
            self._size[t] = alive
            self._dead[t] = 0
            self._tf_max[t] = int(kept[:, 1].max()) if alive else 0
            self._length_min[t] = float(self._length[kept[:, 0]].min()) if alive else 0.0

    # -- reading ---------------------------------------------------------------------------

    def prepare(self, query: str) -> LexicalQuery:
        """Tokenize ``query`` and weigh its known terms by idf (document frequencies now)."""
        count = self._count
        terms: list[int] = []
        weights: list[float] = []
        if count:
            for word, query_count in Counter(lexical_tokens(query)).items():
                term = self._term_id(_key(word))
                if term is None or term < 0:
                    continue
                df = int(self._size[term] - self._dead[term])
                if df <= 0:
                    continue
                terms.append(term)
                weights.append(math.log(1.0 + (count - df + 0.5) / (df + 0.5)) * query_count)
        average = (self._total_length / count if count else 0.0) or 1.0
        return LexicalQuery(np.asarray(terms, dtype=np.int64), np.asarray(weights, dtype=np.float64), average)

    def scores(self, query: str | LexicalQuery, allowed: Callable[[str], bool] | None = None) -> dict[str, float]:
        """BM25 score of every document sharing a term with ``query`` (and ``allowed``).

        Reads every posting list of the query's terms; retrieval uses :meth:`search`."""
        prepared = self.prepare(query) if isinstance(query, str) else query
        if not len(prepared):
            return {}
        slots, values = self._score_all(prepared, _NO_SLOTS)[:2]
        ids = self._ids
        result = {ids[slot] or "": value for slot, value in zip(slots.tolist(), values.tolist(), strict=True)}
        if allowed is not None:
            result = {node_id: value for node_id, value in result.items() if allowed(node_id)}
        return result

    def search(
        self, query: str | LexicalQuery, limit: int, allowed: Callable[[str], bool] | None = None
    ) -> list[tuple[str, float]]:
        """The ``limit`` best documents among ``allowed`` by BM25, best first (ties by
        id): the same list as ``top(scores(query, allowed), limit)``, without scoring
        every document that shares a word with the query when that would cost more
        (see the module docstring)."""
        return self.search_and_score(query, limit, allowed)[0]

    def search_and_score(
        self,
        query: str | LexicalQuery,
        limit: int,
        allowed: Callable[[str], bool] | None = None,
        also: Sequence[str] = (),
        *,
        approximate: bool = False,
    ) -> tuple[list[tuple[str, float]], FloatArray]:
        """:meth:`search`, and in the same pass the scores of the ids in ``also``
        (whatever ``allowed`` says; 0 for an absent id), as :meth:`score_of` gives them.
        Hybrid retrieval asks for the BM25 scores of the vector search's hits this way.

        ``approximate``: candidates come from the query's rarest terms only, up to
        :data:`APPROXIMATE_ENTRIES` posting entries (:meth:`_rare_candidates`); the
        scores returned are still exact. Retrieval asks for it where its vector search
        is approximate too (memories past ``ann_min_nodes``, without ``exact=True``)."""
        prepared = self.prepare(query) if isinstance(query, str) else query
        extra = np.fromiter(map(self._slot, also), dtype=np.int64, count=len(also))
        if not len(prepared):
            return [], np.zeros(len(also), dtype=np.float64)
        check = _Allowed(self._ids, allowed)
        entries = int(self._size[prepared.terms].sum())
        if entries <= _SCORE_ALL_ENTRIES:
            touched, values, extra_scores = self._score_all(prepared, extra)
            candidates, exact = check.best(touched, values, limit)
        else:
            with _Scratch(self._scratch, len(self._ids)) as accumulator:
                found = None
                if approximate and entries > APPROXIMATE_ENTRIES:
                    found = self._rare_candidates(accumulator, prepared, limit, check)
                candidates = found if found is not None else self._candidates(accumulator, prepared, limit, check)
            known = extra[extra >= 0]
            scored = self._exact(prepared, np.concatenate([candidates, known]))
            exact = scored[: candidates.size]
            extra_scores = np.zeros(extra.size, dtype=np.float64)
            extra_scores[extra >= 0] = scored[candidates.size :]
        return self._ranked(candidates, exact, limit), extra_scores

    def score_of(self, query: str | LexicalQuery, node_ids: Sequence[str]) -> FloatArray:
        """The BM25 scores of these ids (0 for an id absent or sharing no term)."""
        prepared = self.prepare(query) if isinstance(query, str) else query
        out = np.zeros(len(node_ids), dtype=np.float64)
        if not len(prepared) or not node_ids:
            return out
        slots = np.fromiter(map(self._slot, node_ids), dtype=np.int64, count=len(node_ids))
        known = slots >= 0
        out[known] = self._exact(prepared, slots[known])
        return out

    def _ranked(self, slots: IntArray, exact: FloatArray, limit: int) -> list[tuple[str, float]]:
        """The ``limit`` best of these scored slots, best first, ties by id."""
        if limit <= 0 or not slots.size:
            return []
        if slots.size > limit:  # keep the best `limit` and everything tied with the last
            cut = np.partition(exact, exact.size - limit)[exact.size - limit]
            keep = exact >= cut
            slots, exact = slots[keep], exact[keep]
        ids = self._ids
        ranked = sorted((-value, ids[slot] or "") for slot, value in zip(slots.tolist(), exact.tolist(), strict=True))
        return [(node_id, -negative) for negative, node_id in ranked[:limit]]

    def _score_all(self, query: LexicalQuery, extra: IntArray) -> tuple[IntArray, FloatArray, FloatArray]:
        """Every document sharing a term with the query, scored in one pass over the
        posting lists: (slots, scores, scores of the ``extra`` slots, 0 for -1).

        The entries of all terms, in query order, go through one vectorized formula
        and one ``np.bincount`` (over a few slots) or ``np.add.at`` (over many), both of
        which add in input order: each document's score is summed in query order,
        exactly as :meth:`_exact` and the textbook loop do."""
        slot_parts: list[npt.NDArray[np.int32]] = []
        tf_parts: list[npt.NDArray[np.int32]] = []
        counts: list[int] = []
        for term in query.terms.tolist():
            count = 0
            for triples in self._parts_of(term):  # a term's parts stay together: weights repeat per term
                term_slots, tf = triples[:, 0], triples[:, 1]
                if self._dead[term]:
                    live = self._epoch[term_slots] == triples[:, 2]
                    term_slots, tf = term_slots[live], tf[live]
                slot_parts.append(term_slots)
                tf_parts.append(tf)
                count += term_slots.size
            counts.append(count)
        slots: IntArray = np.concatenate(slot_parts).astype(np.int64)
        weights = np.repeat(query.weights, counts)
        contributions = self._contributions(weights, np.concatenate(tf_parts), slots, query.average_length)
        found = extra >= 0
        if len(self._ids) <= _DENSE_SCORES * slots.size:  # a score per slot is cheap: three calls
            dense = np.bincount(slots, weights=contributions, minlength=len(self._ids)).astype(np.float64, copy=False)
            nonzero: IntArray = np.flatnonzero(dense)
            return nonzero, dense[nonzero], np.where(found, dense[np.where(found, extra, 0)], 0.0)
        with _Scratch(self._scratch, len(self._ids)) as accumulator:
            np.add.at(accumulator, slots, contributions)
            touched = _distinct(slots, self._marks(accumulator.size))
            values = accumulator[touched]
            extra_scores = np.where(found, accumulator[np.where(found, extra, 0)], 0.0)
            accumulator[touched] = 0.0
        return touched, values, extra_scores

    def _candidates(self, accumulator: FloatArray, query: LexicalQuery, limit: int, allowed: _Allowed) -> IntArray:
        """Slots holding the ``limit`` best allowed documents (MaxScore, term at a time).

        Terms are read rarest first into ``accumulator``. Before the next one: if at
        least ``limit`` allowed documents have a partial score above the most the
        unread terms can add to any document (their idf-weighted upper bounds), no
        unseen document can reach the top, and of the seen ones only those within
        that margin of the ``limit``-th partial score can. When scoring those from
        their term lists is cheaper than reading the remaining lists, stop there.
        """
        sizes = self._size[query.terms]
        order = np.argsort(sizes, kind="stable").tolist()
        bounds = query.weights * self._upper_bounds(query)
        remaining_bound = [*np.cumsum(bounds[order][::-1])[::-1].tolist(), 0.0]
        remaining_size = [*np.cumsum(sizes[order][::-1])[::-1].tolist(), 0]
        seen: list[IntArray] = []
        try:
            for step, position in enumerate(order):
                if step:
                    slots = np.concatenate(seen) if len(seen) > 1 else seen[0]
                    partial = accumulator[slots]
                    threshold = allowed.kth_best(slots, partial, limit)
                    margin = remaining_bound[step] * (1.0 + _SLACK) + abs(threshold) * _SLACK
                    if threshold > margin:
                        left = allowed.filter(slots[partial >= threshold - margin])
                        if left.size * _FORWARD_COST <= remaining_size[step]:
                            return left
                seen.append(self._accumulate(accumulator, query, position))
            slots = np.concatenate(seen)
            partial = accumulator[slots]
            threshold = allowed.kth_best(slots, partial, limit)
            if threshold == -math.inf:
                return allowed.filter(slots)
            return allowed.filter(slots[partial >= threshold - abs(threshold) * _SLACK])
        finally:
            for slots in seen:
                accumulator[slots] = 0.0

    def _rare_candidates(
        self, accumulator: FloatArray, query: LexicalQuery, limit: int, allowed: _Allowed
    ) -> IntArray | None:
        """Slots likely to hold the ``limit`` best allowed documents: the
        ``APPROXIMATE_POOL * limit`` best by the partial score of the query's rarest
        terms, read rarest first while they hold at most :data:`APPROXIMATE_ENTRIES`
        posting entries (the rarest is always read). A document missed is one whose
        score comes from common words alone, which weigh least (idf); the caller scores
        the candidates exactly, so every score it returns is the true one. ``None``
        when the rare words found fewer than ``limit`` allowed documents (a filter that
        keeps few of them): then the exact search reads on."""
        sizes = self._size[query.terms]
        order = np.argsort(sizes, kind="stable").tolist()
        seen: list[IntArray] = []
        read = 0
        try:
            for step, position in enumerate(order):
                size = int(sizes[position])
                if step and read + size > APPROXIMATE_ENTRIES:
                    break
                seen.append(self._accumulate(accumulator, query, position))
                read += size
            slots = np.concatenate(seen) if len(seen) > 1 else seen[0]
            partial = accumulator[slots]
            threshold = allowed.kth_best(slots, partial, APPROXIMATE_POOL * limit)
            if threshold > -math.inf:
                return allowed.filter(slots[partial >= threshold])
            kept = allowed.filter(slots)
            return kept if kept.size >= limit or len(seen) == len(order) else None
        finally:
            for slots in seen:
                accumulator[slots] = 0.0

    def _marks(self, size: int) -> IntArray:
        """This thread's scratch integers, one per slot (contents undefined)."""
        marks: IntArray | None = getattr(self._scratch, "marks", None)
        if marks is None or marks.size < size:
            marks = self._scratch.marks = np.empty(size, dtype=np.int64)
        return marks

    def _upper_bounds(self, query: LexicalQuery) -> FloatArray:
        """Per query term, at least the largest tf part of its score over live entries."""
        tf = self._tf_max[query.terms].astype(np.float64)
        shortest = self._length_min[query.terms]
        k1, b = self.k1, self.b
        return tf * (k1 + 1.0) / (tf + k1 * (1.0 - b + b * shortest / query.average_length))  # type: ignore[no-any-return]

    def _accumulate(self, accumulator: FloatArray, query: LexicalQuery, position: int) -> IntArray:
        """Add one query term's contributions; return the slots it touched first."""
        term = int(query.terms[position])
        first: list[IntArray] = []
        for triples in self._parts_of(term):  # a document's live entry is in one part only
            slots = triples[:, 0]
            tf_column = triples[:, 1]
            if self._dead[term]:
                live = self._epoch[slots] == triples[:, 2]
                slots, tf_column = slots[live], tf_column[live]
            contributions = self._contributions(query.weights[position], tf_column, slots, query.average_length)
            before = accumulator[slots]
            accumulator[slots] = before + contributions
            first.append(slots[before == 0.0].astype(np.int64))
        return first[0] if len(first) == 1 else np.concatenate(first)

    def _contributions(
        self,
        weight: float | FloatArray,
        tf_column: npt.NDArray[np.integer],
        slots: npt.NDArray[np.integer],
        average: float,
    ) -> FloatArray:
        # The same operations, in the same order, as the textbook formula on Python floats.
        k1, b = self.k1, self.b
        tf = tf_column.astype(np.float64)
        norm = k1 * (1.0 - b + b * self._length[slots] / average)
        return weight * tf * (k1 + 1.0) / (tf + norm)  # type: ignore[no-any-return]

    def _forward_many(self, slots: IntArray) -> tuple[IntArray, IntArray]:
        """The term lists of these slots, concatenated in their order, and each one's
        length. A base's rows are gathered from its stored array in one vectorized
        step (MaxScore scores a thousand candidates a query this way)."""
        if self._base is None:
            lists = [self._forward_of(slot) for slot in slots.tolist()]
            sizes = np.fromiter(map(len, lists), dtype=np.int64, count=len(lists))
            return (np.concatenate(lists) if lists else _EMPTY_FORWARD), sizes
        forward = self._forward
        own = np.fromiter((forward[slot] is not None for slot in slots.tolist()), dtype=bool, count=slots.size)
        stored = self._base.forward_offsets
        sizes = np.zeros(slots.size, dtype=np.int64)
        starts = np.zeros(slots.size, dtype=np.int64)
        from_base = ~own
        base_slots = slots[from_base]
        starts[from_base] = stored[base_slots]
        sizes[from_base] = stored[base_slots + 1] - starts[from_base]
        owned = [self._forward_of(slot) for slot in slots[own].tolist()]
        sizes[own] = [len(entries) for entries in owned]
        offsets = np.cumsum(sizes) - sizes
        out = np.empty(int(sizes.sum()), dtype=np.int64)
        run = sizes[from_base]
        total = int(run.sum())
        if total:
            within = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(run) - run, run)
            out[np.repeat(offsets[from_base], run) + within] = self._base.forward[
                np.repeat(starts[from_base], run) + within
            ]
        for at, entries in zip(offsets[own].tolist(), owned, strict=True):
            out[at : at + len(entries)] = entries
        return out, sizes

    def _exact(self, query: LexicalQuery, slots: IntArray) -> FloatArray:
        """Exact scores of these slots from their term lists, summed in query order."""
        out = np.zeros(slots.size, dtype=np.float64)
        if not slots.size:
            return out
        entries, sizes = self._forward_many(slots)
        owner = np.repeat(np.arange(slots.size), sizes)
        terms = entries >> _TERM_SHIFT
        ordered = np.argsort(query.terms, kind="stable")
        sorted_terms = query.terms[ordered]
        found = np.minimum(np.searchsorted(sorted_terms, terms), sorted_terms.size - 1)
        hit = sorted_terms[found] == terms
        position = ordered[found[hit]]
        by_position = np.argsort(position, kind="stable")  # query order, for the order of the sums
        owner = owner[hit][by_position]
        position = position[by_position]
        tf = (entries[hit] & _TF_MASK)[by_position]
        contributions = self._contributions(query.weights[position], tf, slots[owner], query.average_length)
        bounds = np.searchsorted(position, np.arange(len(query) + 1)).tolist()
        for start, end in itertools.pairwise(bounds):  # one term at a time: no document twice in a step
            if end > start:
                out[owner[start:end]] += contributions[start:end]
        return out


class _DocIds:
    """Node ids by slot (``None``: a free slot): a base's rows (looked up through
    ``id_at`` when asked) unless replaced, then the slots added after it."""

    def __init__(self, base_count: int = 0, id_at: Callable[[int], str] | None = None) -> None:
        self._base_count = base_count
        self._id_at = id_at
        self._replaced: dict[int, str | None] = {}
        self._tail: list[str | None] = []

    def __len__(self) -> int:
        return self._base_count + len(self._tail)

    def __getitem__(self, slot: int) -> str | None:
        if slot < self._base_count:
            if slot in self._replaced:
                return self._replaced[slot]
            assert self._id_at is not None
            return self._id_at(slot)
        return self._tail[slot - self._base_count]

    def __setitem__(self, slot: int, node_id: str | None) -> None:
        if slot < self._base_count:
            self._replaced[slot] = node_id
        else:
            self._tail[slot - self._base_count] = node_id

    def __iter__(self) -> Iterator[str | None]:
        return (self[slot] for slot in range(len(self)))

    def replaced(self, slot: int) -> bool:
        """Whether a base row's slot was freed or given to another id."""
        return slot in self._replaced

    def append(self, node_id: str) -> None:
        self._tail.append(node_id)

    def extend(self, node_ids: Sequence[str]) -> None:
        self._tail.extend(node_ids)


class _Scratch:
    """Lends the calling thread a zeroed score array over the slots (readers run
    concurrently, so each thread has its own); the borrower zeroes what it touched."""

    def __init__(self, store: threading.local, slots: int) -> None:
        self._store = store
        self._slots = slots
        self._array: FloatArray | None = None

    def __enter__(self) -> FloatArray:
        array: FloatArray | None = getattr(self._store, "array", None)
        if array is None or array.size < self._slots:
            array = np.zeros(max(self._slots, 16) * 5 // 4, dtype=np.float64)
        self._store.array = None  # a nested borrower gets its own
        self._array = array
        return array

    def __exit__(self, *exc: object) -> None:
        self._store.array = self._array


class _Allowed:
    """The caller's filter over node ids (or none), asked at most once per slot."""

    def __init__(self, ids: _DocIds, allowed: Callable[[str], bool] | None) -> None:
        self._ids = ids
        self._allowed = allowed
        self._answers: dict[int, bool] = {}

    def _ok(self, slot: int) -> bool:
        answer = self._answers.get(slot)
        if answer is None:
            node_id = self._ids[slot]
            assert self._allowed is not None
            answer = self._answers[slot] = node_id is not None and self._allowed(node_id)
        return answer

    def filter(self, slots: IntArray) -> IntArray:
        if self._allowed is None:
            return slots
        return slots[np.fromiter(map(self._ok, slots.tolist()), dtype=bool, count=slots.size)]

    def best(self, slots: IntArray, scores: FloatArray, k: int) -> tuple[IntArray, FloatArray]:
        """The allowed slots (and scores) that can be among the ``k`` best: those
        scoring at least the ``k``-th best allowed score."""
        threshold = self.kth_best(slots, scores, k)
        keep = scores >= threshold
        slots, scores = slots[keep], scores[keep]
        if self._allowed is None:
            return slots, scores
        allowed = np.fromiter(map(self._ok, slots.tolist()), dtype=bool, count=slots.size)
        return slots[allowed], scores[allowed]

    def kth_best(self, slots: IntArray, scores: FloatArray, k: int) -> float:
        """The ``k``-th largest of ``scores`` (aligned with ``slots``) over allowed
        slots (-inf if fewer)."""
        if k <= 0:
            return math.inf
        if self._allowed is None:
            if scores.size < k:
                return -math.inf
            return float(np.partition(scores, scores.size - k)[scores.size - k])
        take = min(scores.size, 4 * k)
        while True:  # down the ranking in growing chunks, asking the filter on the way
            best = np.argpartition(-scores, take - 1)[:take] if take < scores.size else np.arange(scores.size)
            best = best[np.argsort(-scores[best], kind="stable")]
            found = 0
            for index in best.tolist():
                if self._ok(int(slots[index])):
                    found += 1
                    if found == k:
                        return float(scores[index])
            if take >= scores.size:
                return -math.inf
            take = min(scores.size, 4 * take)


def stable_order(values: IntArray) -> IntArray:
    """``np.argsort(values, kind="stable")`` for non-negative integers, mostly by one
    16-bit radix pass (NumPy radix-sorts 16-bit keys in linear time; it merge-sorts
    wider ones): values below 65536 (the words met first, so the common ones) are
    ordered that way, the few others by a merge sort of their own, after them."""
    small = values < 0x10000
    if small.all():
        return np.argsort(values.astype(np.uint16), kind="stable")
    low = np.flatnonzero(small)
    high = np.flatnonzero(~small)
    return np.concatenate(
        (low[np.argsort(values[low].astype(np.uint16), kind="stable")], high[np.argsort(values[high], kind="stable")])
    )


def _key(word: str) -> bytes | str:
    """A word as the index keys it: ASCII words as bytes (bulk tokenizing yields bytes)."""
    return word.encode("ascii") if word.isascii() else word


def _distinct(values: IntArray, marks: IntArray) -> IntArray:
    """The distinct values of ``values`` (non-negative, below ``marks.size``), in
    linear time: each value's mark is set to the position of its last occurrence."""
    positions = np.arange(values.size)
    marks[values] = positions
    return values[marks[values] == positions]


def _triples(posting: array[int] | None) -> npt.NDArray[np.int32]:
    """A posting list as an ``(n, 3)`` NumPy view (slot, tf, epoch); drop it before
    the list grows again (an array exporting its buffer cannot resize)."""
    if posting is None:
        return np.zeros((0, 3), dtype=np.int32)
    return np.frombuffer(posting, dtype=np.int32).reshape(-1, 3)


def _grown(values: np.ndarray, needed: int) -> np.ndarray:
    """``values`` copied into a zeroed array with room for at least ``needed`` items."""
    grown = np.zeros(max(needed, 2 * values.size), dtype=values.dtype)
    grown[: values.size] = values
    return grown


def top(scores: dict[str, float], limit: int) -> list[tuple[str, float]]:
    """The ``limit`` best (id, score) pairs, best first, ties by id."""
    return heapq.nsmallest(limit, scores.items(), key=lambda pair: (-pair[1], pair[0]))
