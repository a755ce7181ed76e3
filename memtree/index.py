"""The incremental vector index over a namespace's nodes: exact below a size, IVF above.

Vectors live in one float32 matrix whose rows are slots; a slot table maps node ids
to rows. Updating a node overwrites its row in place, adding appends a row, removing
moves the last row into the hole. So an insert that changes ``depth + 2`` nodes
writes ``depth + 2`` rows and nothing else: the upkeep cost does not grow with the
number of nodes, and the matrix stays dense.

The matrix may start as a segment's memory-mapped embeddings (:mod:`memtree.segment`):
mapped copy-on-write, so rows this process overwrites become private pages while the
file stays as written, and rows added after it go to an ordinary growable array
behind it. Nothing is read from the file until a search touches it.

Search is exact (FAISS brute force over the matrix) until the index holds
``ann_min_rows`` rows; from there an IVF index (:mod:`memtree.ann`) reads only the
rows of the lists nearest the query, unless the caller asks for ``exact=True``. The
index also keeps per-row ``is_leaf`` flags and event timestamps, so filters become
row masks, applied to every row either search reads: no result violates a filter.

Not thread-safe on its own: the memory wraps it in a readers-writer lock.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import faiss
import numpy as np
import numpy.typing as npt

from memtree.ann import IvfIndex, probes_for
from memtree.embed import Matrix
from memtree.node import Vector

Mask = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.int64]

_LOAD_HEADROOM = 8
"""A bulk load reserves 1/8 more rows than it fills, for the inserts that follow."""

_SELECTIVE_SHARE = 8
"""A filter allowing at most 1/8 of the rows is searched by scoring just those rows."""
_POST_FILTER_MARGIN = 2.0
"""An unfiltered search fetches about twice the rows the allowed share should need."""
_POST_FILTER_LIMIT = 512
"""Beyond this many fetched rows the unfiltered search stops paying off: score every row."""
_WIDER = 4
"""An IVF search that found too few allowed rows asks again with this many times the lists."""
_GATHER_ROWS = 4096
"""Rows gathered at a time when rows are scored by number."""
_REMEMBERED_FANOUT = 16
"""A parent with at least this many children keeps its children's slots for routing
(:meth:`VectorIndex.score_children`); a narrower one is looked up each time."""


@dataclass(frozen=True)
class AnnSettings:
    """When and how widely the index searches approximately.

    ``min_rows``: rows from which an IVF index is used (``None``: always exact).
    ``probe_share`` and ``min_probes``: the share of the IVF lists a query reads, and
    at least how many (:func:`memtree.ann.probes_for`)."""

    min_rows: int | None = 20_000
    probe_share: float = 0.01
    min_probes: int = 8


class VectorIndex:
    """Cosine search over unit vectors keyed by node id: exact, or IVF from a size on."""

    def __init__(self, dimension: int, *, ann: AnnSettings | None = None) -> None:
        if dimension <= 0:
            raise ValueError(f"dimension must be positive, got {dimension}")
        self.dimension = dimension
        self.ann = ann or AnnSettings(min_rows=None)
        self._matrix = _Matrix(dimension)
        self._ids = _SlotIds()
        self._slot: dict[str, int] = {}
        """Node id -> slot; with a base, only ids whose slot differs from the base's
        (-1: removed), the others are found by ``_base_slot``."""
        self._base_slot: Callable[[str], int] | None = None
        self._is_leaf = _Column(bool)
        self._time = _Column(np.float64)
        self.ivf: IvfIndex | None = None
        self._watch: set[int] | None = None
        """Slots written while an IVF is being built beside the index (see :meth:`watch`)."""
        self._child_slots: dict[str, tuple[list[str], IntArray]] = {}
        """Parent id -> (its children when looked up, their slots): see :meth:`score_children`.
        Emptied whenever a row is removed (rows move); appends and overwrites keep every slot."""

    @classmethod
    def mapped(
        cls,
        dimension: int,
        vectors: Matrix,
        is_leaf: npt.NDArray[np.bool_],
        timestamps: npt.NDArray[np.float64],
        id_at: Callable[[int], str],
        slot_of: Callable[[str], int],
        ivf: IvfIndex | None,
        *,
        ann: AnnSettings | None = None,
    ) -> VectorIndex:
        """An index over a segment's rows: ``vectors`` mapped copy-on-write (nothing is
        copied), flags and timestamps as stored, ids looked up through the segment."""
        index = cls(dimension, ann=ann)
        count = int(vectors.shape[0])
        index._matrix = _Matrix(dimension, base=vectors)
        index._ids = _SlotIds(count, id_at)
        index._base_slot = slot_of
        index._is_leaf.extend(np.asarray(is_leaf, dtype=bool))
        index._time.extend(np.asarray(timestamps, dtype=np.float64))
        index.ivf = ivf
        return index

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, node_id: object) -> bool:
        return isinstance(node_id, str) and self._slot_of(node_id) >= 0

    @property
    def ids(self) -> Sequence[str]:
        """Node ids in row order."""
        return self._ids

    def _slot_of(self, node_id: str) -> int:
        slot = self._slot.get(node_id)
        if slot is not None:
            return slot
        if self._base_slot is None:
            return -1
        slot = self._base_slot(node_id)
        if not 0 <= slot < len(self._ids) or self._ids[slot] != node_id:
            return -1
        self._slot[node_id] = slot  # remembered: routing asks for the same top nodes on every insert
        return slot

    def _slots(self, ids: Sequence[str]) -> IntArray:
        return np.fromiter(map(self._slot_of, ids), dtype=np.int64, count=len(ids))

    def _require(self, ids: Sequence[str]) -> IntArray:
        slots = self._slots(ids)
        if slots.size and slots.min() < 0:
            missing = ids[int(np.flatnonzero(slots < 0)[0])]
            raise KeyError(missing)
        return slots

    # -- writing -------------------------------------------------------------------------------

    def upsert(
        self,
        ids: Sequence[str],
        vectors: Matrix | Sequence[Vector],
        is_leaf: Sequence[bool],
        timestamps: Sequence[float | None],
    ) -> None:
        """Write these rows: overwrite the ids already present, append the others.

        ``vectors`` is an ``(n, d)`` matrix or a sequence of ``n`` vectors.
        """
        times = np.array([np.nan if t is None else t for t in timestamps], dtype=np.float64)
        leaf_flags = np.asarray(is_leaf, dtype=bool)
        if not len(self._ids) and len(ids) > 1 and len(set(ids)) == len(ids):
            self._load(ids, vectors, leaf_flags, times)
            return
        if not isinstance(vectors, np.ndarray):
            vectors = np.stack(vectors) if len(vectors) else np.zeros((0, self.dimension), dtype=np.float32)
        vectors = np.ascontiguousarray(vectors, dtype=np.float32).reshape(len(ids), self.dimension)
        found = self._slots(ids)
        present = np.flatnonzero(found >= 0)
        written: list[IntArray] = []
        written_rows: list[IntArray] = []
        if present.size:
            targets = found[present]
            if len(set(targets.tolist())) != targets.size:  # an id twice: its last vector wins
                last = {int(slot): int(i) for i, slot in zip(present, targets, strict=True)}
                present = np.fromiter(last.values(), dtype=np.int64, count=len(last))
                targets = found[present]
            self._matrix.write(targets, vectors[present])  # one vectorized write per column, not one per row
            self._is_leaf.values[targets] = leaf_flags[present]
            self._time.values[targets] = times[present]
            written.append(targets)
            written_rows.append(present)
        new_rows = np.flatnonzero(found < 0)
        if new_rows.size:
            start = len(self._ids)
            fresh = [ids[int(i)] for i in new_rows]
            if len(set(fresh)) != len(fresh):
                raise ValueError("upsert got the same new id twice")
            self._matrix.append(vectors[new_rows])
            for offset, node_id in enumerate(fresh):
                self._slot[node_id] = start + offset
                self._ids.append(node_id)
            self._is_leaf.extend(leaf_flags[new_rows])
            self._time.extend(times[new_rows])
            written.append(np.arange(start, start + new_rows.size, dtype=np.int64))
            written_rows.append(new_rows)
        if written and (self.ivf is not None or self._watch is not None):
            slots = np.concatenate(written)
            if self._watch is not None:
                self._watch.update(slots.tolist())
            if self.ivf is not None:
                self.ivf.place(slots, vectors[np.concatenate(written_rows)])

    def _load(
        self, ids: Sequence[str], vectors: Matrix | Sequence[Vector], leaf_flags: Mask, times: np.ndarray
    ) -> None:
        """Fill an empty index (a reopen): vectors are copied once, straight into the
        matrix, and the slot table is built in one go."""
        count = len(ids)
        try:
            self._matrix.load(vectors, count, count + count // _LOAD_HEADROOM + 1)
        except (ValueError, TypeError):
            self._matrix = _Matrix(self.dimension)
            raise ValueError(f"upsert needs {count} vectors of dimension {self.dimension}") from None
        self._ids = _SlotIds()
        self._ids.extend(ids)
        self._slot = dict(zip(ids, range(count), strict=True))
        self._base_slot = None
        self._child_slots.clear()
        self._is_leaf.extend(leaf_flags)
        self._time.extend(times)

    def remove(self, ids: Iterable[str]) -> None:
        """Remove rows by moving the last row into each hole (O(d) per id)."""
        for node_id in ids:
            slot = self._slot_of(node_id)
            if slot < 0:
                continue
            self._child_slots.clear()
            if self._base_slot is not None:
                self._slot[node_id] = -1
            else:
                del self._slot[node_id]
            last = len(self._ids) - 1
            if self.ivf is not None:
                self.ivf.remove(slot)
            if slot != last:
                self._matrix.move(last, slot)
                moved = self._ids[last]
                self._ids[slot] = moved
                self._slot[moved] = slot
                self._is_leaf.move(last, slot)
                self._time.move(last, slot)
                if self.ivf is not None:
                    self.ivf.move(last, slot)
                if self._watch is not None:
                    self._watch.add(slot)
            self._ids.pop()
            self._is_leaf.pop()
            self._time.pop()
            self._matrix.pop()

    # -- the IVF index -----------------------------------------------------------------------------

    @property
    def approximate(self) -> bool:
        """Whether searches (without ``exact=True``) use the IVF index now."""
        return self.ivf is not None and self.ann.min_rows is not None and len(self._ids) >= self.ann.min_rows

    def watch(self) -> None:
        """Start recording the slots written from now on (an IVF is being built from a
        copy of the rows; :meth:`install_ivf` re-files those)."""
        self._watch = set()

    def install_ivf(self, ivf: IvfIndex | None, lists: IntArray | None = None) -> None:
        """Use ``ivf``; ``lists`` (one per row at the time :meth:`watch` was called)
        places the rows, and the rows written since are placed afresh."""
        watched, self._watch = self._watch or set(), None
        if ivf is not None and lists is not None:
            count = min(lists.size, len(self._ids))
            ivf.fill(np.asarray(lists[:count], dtype=np.int64))
            changed = np.asarray(sorted(slot for slot in watched if slot < len(self._ids)), dtype=np.int64)
            tail = np.arange(count, len(self._ids), dtype=np.int64)
            replace = np.union1d(changed, tail)
            if replace.size:
                for slot in changed.tolist():
                    if slot < count:
                        ivf.remove(slot)
                ivf.place(replace, self._matrix.read(replace))
        self.ivf = ivf

    def sample(self, count: int, seed: int = 0) -> Matrix:
        """A copy of ``count`` rows drawn at random (what k-means trains on)."""
        n = len(self._ids)
        rng = np.random.default_rng(seed)
        picked = np.sort(rng.choice(n, size=min(count, n), replace=False)) if n else np.zeros(0, np.int64)
        return self._matrix.read(picked.astype(np.int64))

    def rows_copy(self, start: int, end: int) -> Matrix:
        """A copy of rows ``start`` to ``end`` (clipped to the index's size)."""
        end = min(end, len(self._ids))
        return self._matrix.read(np.arange(start, max(start, end), dtype=np.int64))

    # -- reading -------------------------------------------------------------------------------------

    def vectors(self, ids: Sequence[str]) -> Matrix:
        """The stored vectors of these ids, as a new ``(len(ids), d)`` array."""
        return self._matrix.read(self._require(ids))

    def score(self, query: Vector, ids: Sequence[str]) -> npt.NDArray[np.float32]:
        """Inner products of ``query`` with the vectors of ``ids`` (routing's scores)."""
        if not ids:
            return np.zeros(0, dtype=np.float32)
        return self._matrix.read(self._require(ids)) @ np.asarray(query, dtype=np.float32)

    def score_children(self, query: Vector, parent_id: str, children: Sequence[str]) -> npt.NDArray[np.float32]:
        """:meth:`score` of a parent's children (routing's step down), the same numbers.

        Every insert scores the children of the nodes on its path, and the root's
        grow with the tree (hundreds at 20k nodes): looking each id up was most of an
        insert's routing. So a wide parent keeps its children's slots, used while
        its children list is unchanged (compared whole: cheap, the ids are the same
        objects) and no row was removed since; the product is computed as
        :meth:`score` computes it, so routing decides exactly as before.
        """
        if len(children) < _REMEMBERED_FANOUT:
            return self.score(query, children)
        known = self._child_slots.get(parent_id)
        if known is not None and known[0] == children:
            slots = known[1]
        else:
            slots = self._require(children)
            self._child_slots[parent_id] = (list(children), slots)
        return self._matrix.read(slots) @ np.asarray(query, dtype=np.float32)

    def leaf_flags(self, ids: Sequence[str]) -> npt.NDArray[np.bool_]:
        """Whether each of these ids is a leaf (as its last upsert said)."""
        return np.asarray(self._is_leaf.values[self._require(ids)], dtype=bool)

    def allows(self, node_id: str, allowed: Mask) -> bool:
        """Whether ``allowed`` (a :meth:`mask`) lets ``node_id`` through."""
        slot = self._slot_of(node_id)
        return slot >= 0 and bool(allowed[slot])

    def mask(
        self,
        *,
        leaves_only: bool = False,
        time_range: tuple[float | None, float | None] | None = None,
        ids: Iterable[str] | None = None,
        excluded: Iterable[str] | None = None,
    ) -> Mask | None:
        """A row mask for these filters, or ``None`` when nothing is filtered: rows
        of leaves (``leaves_only``), with an event time in ``time_range``, among
        ``ids`` (when given) and not among ``excluded``."""
        if not leaves_only and time_range is None and ids is None and excluded is None:
            return None
        allowed = np.ones(len(self._ids), dtype=bool)
        if leaves_only:
            allowed &= self._is_leaf.values
        if time_range is not None:
            start, end = time_range
            times = self._time.values
            known = ~np.isnan(times)
            allowed &= known
            if start is not None:
                allowed &= np.where(known, times >= start, False)
            if end is not None:
                allowed &= np.where(known, times <= end, False)
        if ids is not None:
            subset = np.zeros(len(self._ids), dtype=bool)
            slots = [slot for slot in map(self._slot_of, ids) if slot >= 0]
            subset[slots] = True
            allowed &= subset
        if excluded is not None:
            slots = [slot for slot in map(self._slot_of, excluded) if slot >= 0]
            allowed[slots] = False
        return allowed

    def search(
        self, query: Vector, k: int, allowed: Mask | None = None, *, exact: bool = False
    ) -> list[tuple[str, float]]:
        """The ``k`` best rows by inner product, best first, among ``allowed`` rows.

        Approximate (the IVF lists nearest the query) once the index is large enough
        (:attr:`approximate`) and ``exact`` is not asked for; every returned row is
        allowed either way. A filter is applied without ever copying the matrix:

        * most rows allowed (``leaves_only`` is about 60% of a tree): an unfiltered
          search for a few more rows than needed, then the mask (exact search), or
          the mask applied to every row the IVF lists hold;
        * few rows allowed (a time window, a ``where``): score just those rows by id,
          exactly, whatever the size.
        """
        n = len(self._ids)
        if n == 0 or k <= 0:
            return []
        q = np.ascontiguousarray(query, dtype=np.float32).reshape(self.dimension)
        count = n if allowed is None else int(np.count_nonzero(allowed))
        if count == 0:
            return []
        take = min(k, count)
        if allowed is not None and (take == count or count * _SELECTIVE_SHARE <= n):
            return self._search_rows(q, np.flatnonzero(allowed), take)
        if not exact and self.approximate:
            return self._search_ivf(q, take, allowed)
        if allowed is None:
            scores, slots = self._matrix.knn(q, take)
            return self._pairs(scores, slots)
        fetch = take + math.ceil(_POST_FILTER_MARGIN * take * n / count)
        if fetch <= _POST_FILTER_LIMIT:
            scores, slots = self._matrix.knn(q, min(fetch, n))
            found = slots >= 0
            kept = found.copy()
            kept[found] = allowed[slots[found]]
            if np.count_nonzero(kept) >= take:
                return self._pairs(scores[kept][:take], slots[kept][:take])
        return self._search_all(q, allowed, take)

    def _search_ivf(self, query: Vector, take: int, allowed: Mask | None) -> list[tuple[str, float]]:
        """The IVF lists nearest the query, read wider until ``take`` allowed rows come."""
        ivf = self.ivf
        assert ivf is not None
        probes = probes_for(ivf.lists, self.ann.probe_share, self.ann.min_probes)
        while True:
            scores, slots, complete = ivf.search(self._matrix, len(self._ids), query, take, probes, allowed)
            if slots.size >= take or complete:
                return self._pairs(scores[:take], slots[:take])
            probes *= _WIDER

    def _search_rows(self, query: Vector, slots: IntArray, take: int) -> list[tuple[str, float]]:
        """Top ``take`` among these rows, scored in place (no gathered copy)."""
        scores = self._matrix.score_rows(query, np.ascontiguousarray(slots, dtype=np.int64))
        top = _top(scores, take)
        return self._pairs(scores[top], slots[top])

    def _search_all(self, query: Vector, allowed: Mask, take: int) -> list[tuple[str, float]]:
        """Score every row in one pass, then rank the allowed ones."""
        scores = self._matrix.score_range(query, 0, len(self._ids))
        scores[~allowed] = -np.inf
        top = _top(scores, take)
        return self._pairs(scores[top], top)

    def _pairs(self, scores: np.ndarray, slots: np.ndarray) -> list[tuple[str, float]]:
        ids = self._ids
        return [(ids[s], v) for v, s in zip(scores.tolist(), slots.tolist(), strict=True) if s >= 0]

    def all_vectors(self) -> Matrix:
        """A copy of the whole matrix in row order (for checks and exports)."""
        return self._matrix.read(np.arange(len(self._ids), dtype=np.int64))

    def footprint(self) -> dict[str, int]:
        """Rows, rows in private memory (added or overwritten since the segment) and
        rows the IVF scores by number."""
        return {
            "rows": len(self._ids),
            "mapped_rows": self._matrix.base_rows,
            "ivf_lists": self.ivf.lists if self.ivf is not None else 0,
            "ivf_extra_rows": self.ivf.extra_rows if self.ivf is not None else 0,
        }


def _top(scores: npt.NDArray[np.float32], take: int) -> npt.NDArray[np.intp]:
    """Positions of the ``take`` highest scores, highest first (ties in position order)."""
    top = np.argpartition(-scores, take - 1)[:take] if take < scores.size else np.arange(scores.size)
    return top[np.lexsort((top, -scores[top]))]


class _Matrix:
    """The rows: a base (a segment's map, copy-on-write) followed by a growable array.

    Slot ``s`` is row ``s`` of the base while ``s`` is below the base's length, else
    row ``s - base rows`` of the growable part. Removing rows can leave the base's
    last rows unused; the next appends write there again."""

    def __init__(self, dimension: int, base: Matrix | None = None) -> None:
        self.dimension = dimension
        self._base: Matrix = base if base is not None else np.zeros((0, dimension), dtype=np.float32)
        self.base_rows = int(self._base.shape[0])
        self._tail = np.zeros((0, dimension), dtype=np.float32)
        self.size = self.base_rows
        self._local = threading.local()

    def load(self, vectors: Matrix | Sequence[Vector], count: int, capacity: int) -> None:
        """Fill an empty matrix with ``count`` rows, reserving ``capacity``."""
        tail = np.empty((capacity, self.dimension), dtype=np.float32)
        if isinstance(vectors, np.ndarray):
            tail[:count] = vectors.reshape(count, self.dimension)
        else:
            np.stack(vectors, out=tail[:count])
        self._base = np.zeros((0, self.dimension), dtype=np.float32)
        self.base_rows = 0
        self._tail = tail
        self.size = count

    def _parts(self, start: int, end: int) -> Iterator[tuple[int, Matrix]]:
        """(first slot, rows) of the parts holding slots ``start`` to ``end``."""
        split = self.base_rows
        if start < min(end, split):
            yield start, self._base[start : min(end, split)]
        if end > split:
            first = max(start, split)
            yield first, self._tail[first - split : end - split]

    def read(self, slots: IntArray) -> Matrix:
        """A copy of these rows. Rows all in one part are gathered in one ``take``
        (routing reads a wide parent's children on every insert: the masked copies
        cost more than the product that follows)."""
        if not self.base_rows:
            return np.take(self._tail, slots, axis=0)
        out = np.empty((slots.size, self.dimension), dtype=np.float32)
        in_base = slots < self.base_rows
        if in_base.all():
            out[:] = self._base[slots]
        elif not in_base.any():
            np.take(self._tail, slots - self.base_rows, axis=0, out=out)
        else:
            out[in_base] = self._base[slots[in_base]]
            out[~in_base] = self._tail[slots[~in_base] - self.base_rows]
        return out

    def write(self, slots: IntArray, vectors: Matrix) -> None:
        in_base = slots < self.base_rows
        if in_base.any():
            self._base[slots[in_base]] = vectors[in_base]
        if not in_base.all():
            self._tail[slots[~in_base] - self.base_rows] = vectors[~in_base]

    def append(self, vectors: Matrix) -> None:
        """Rows after the last (in the base's unused rows first, then the growable part)."""
        slots = np.arange(self.size, self.size + len(vectors), dtype=np.int64)
        needed = self.size + len(vectors) - self.base_rows
        if needed > self._tail.shape[0]:
            grown = np.empty((max(needed, 2 * self._tail.shape[0], 16), self.dimension), dtype=np.float32)
            used = max(0, self.size - self.base_rows)
            grown[:used] = self._tail[:used]
            self._tail = grown
        self.size += len(vectors)
        self.write(slots, vectors)

    def move(self, source: int, target: int) -> None:
        self.write(np.asarray([target], dtype=np.int64), self.read(np.asarray([source], dtype=np.int64)))

    def pop(self) -> None:
        self.size -= 1

    def knn(self, query: Vector, k: int) -> tuple[npt.NDArray[np.float32], IntArray]:
        """FAISS brute force over every row: (scores, slots), best first."""
        best_scores: list[np.ndarray] = []
        best_slots: list[np.ndarray] = []
        for first, rows in self._parts(0, self.size):
            take = min(k, rows.shape[0])
            scores, slots = faiss.knn(query.reshape(1, -1), rows, take, metric=faiss.METRIC_INNER_PRODUCT)
            best_scores.append(scores[0])
            best_slots.append(np.where(slots[0] >= 0, slots[0] + first, -1))
        if len(best_scores) == 1:
            return best_scores[0], best_slots[0]
        scores = np.concatenate(best_scores)
        slots = np.concatenate(best_slots)
        order = np.lexsort((slots, -scores))[:k]
        return scores[order], slots[order]

    def score_range(self, query: Vector, start: int, end: int) -> npt.NDArray[np.float32]:
        """Inner products of ``query`` with rows ``start`` to ``end``."""
        out = np.empty(end - start, dtype=np.float32)
        for first, rows in self._parts(start, end):
            count = rows.shape[0]
            if count:
                part = out[first - start : first - start + count]
                faiss.fvec_inner_products_ny(  # type: ignore[attr-defined]
                    faiss.swig_ptr(part),
                    faiss.swig_ptr(query),
                    faiss.swig_ptr(np.ascontiguousarray(rows)),
                    self.dimension,
                    count,
                )
        return out

    def score_rows(self, query: Vector, slots: IntArray) -> npt.NDArray[np.float32]:
        """Inner products of ``query`` with these rows: gathered a chunk at a time into
        a reused buffer, then scored by FAISS. (FAISS's own ``fvec_inner_products_by_idx``
        opens an OpenMP region per call, which on a busy machine waits tens of
        milliseconds for its threads to be scheduled.)"""
        out = np.empty(slots.size, dtype=np.float32)
        buffer = self._buffer()
        split = self.base_rows
        for first in range(0, slots.size, _GATHER_ROWS):
            chunk = slots[first : first + _GATHER_ROWS]
            rows = buffer[: chunk.size]
            in_base = chunk < split
            if in_base.all():
                np.take(self._base, chunk, axis=0, out=rows)
            else:
                rows[in_base] = self._base[chunk[in_base]]
                rows[~in_base] = self._tail[chunk[~in_base] - split]
            faiss.fvec_inner_products_ny(  # type: ignore[attr-defined]
                faiss.swig_ptr(out[first : first + chunk.size]),
                faiss.swig_ptr(query),
                faiss.swig_ptr(rows),
                self.dimension,
                chunk.size,
            )
        return out

    def _buffer(self) -> Matrix:
        """This thread's gathering buffer (readers run concurrently)."""
        buffer: Matrix | None = getattr(self._local, "buffer", None)
        if buffer is None or buffer.shape[1] != self.dimension:
            buffer = self._local.buffer = np.empty((_GATHER_ROWS, self.dimension), dtype=np.float32)
        return buffer


class _SlotIds(Sequence[str]):
    """Node ids by slot: a base's (looked up when asked, through ``id_at``) where no
    other id took the slot, then the ids appended after it."""

    def __init__(self, base_count: int = 0, id_at: Callable[[int], str] | None = None) -> None:
        self._base_count = base_count
        self._id_at = id_at
        self._changed: dict[int, str] = {}
        self._tail: list[str] = []
        self._size = base_count

    def __len__(self) -> int:
        return self._size

    def __getitem__(self, slot: int) -> str:  # type: ignore[override]
        if slot < self._base_count:
            node_id = self._changed.get(slot)
            if node_id is not None:
                return node_id
            assert self._id_at is not None
            return self._id_at(slot)
        return self._tail[slot - self._base_count]

    def __setitem__(self, slot: int, node_id: str) -> None:
        if slot < self._base_count:
            self._changed[slot] = node_id
        else:
            self._tail[slot - self._base_count] = node_id

    def __iter__(self) -> Iterator[str]:
        for slot in range(self._size):
            yield self[slot]

    def append(self, node_id: str) -> None:
        if self._size < self._base_count:
            self._changed[self._size] = node_id
        else:
            self._tail.append(node_id)
        self._size += 1

    def extend(self, ids: Iterable[str]) -> None:
        for node_id in ids:
            self.append(node_id)

    def pop(self) -> None:
        self._size -= 1
        if self._size >= self._base_count:
            self._tail.pop()
        else:
            self._changed.pop(self._size, None)


class _Column:
    """A 1-D NumPy array with amortized O(1) append and pop (capacity doubling)."""

    def __init__(self, dtype: type) -> None:
        self._data: np.ndarray = np.zeros(16, dtype=dtype)
        self._size = 0

    @property
    def values(self) -> np.ndarray:
        """A view of the live part (writable)."""
        return self._data[: self._size]

    def extend(self, items: np.ndarray) -> None:
        needed = self._size + len(items)
        if needed > len(self._data):
            grown = np.zeros(max(needed + needed // _LOAD_HEADROOM, 2 * len(self._data)), dtype=self._data.dtype)
            grown[: self._size] = self._data[: self._size]
            self._data = grown
        self._data[self._size : needed] = items
        self._size = needed

    def move(self, source: int, target: int) -> None:
        self._data[target] = self._data[source]

    def pop(self) -> None:
        self._size -= 1
