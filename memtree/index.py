"""The incremental vector index over a namespace's nodes (exact inner product).

Vectors live in one FAISS ``IndexFlatIP`` whose rows are slots; a slot table maps
node ids to rows. Updating a node overwrites its row in place, adding appends a row,
removing moves the last row into the hole and shrinks the matrix by one. So an
insert that changes ``depth + 2`` nodes writes ``depth + 2`` rows and nothing else:
the upkeep cost does not grow with the number of nodes, and the matrix stays dense,
so a query is exactly FAISS brute force over it.

The index also keeps per-row ``is_leaf`` flags and event timestamps so filters become
vectorized masks, applied without copying the matrix (see ``search``).

Not thread-safe on its own: the memory wraps it in a readers-writer lock.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import faiss
import numpy as np
import numpy.typing as npt

from memtree.embed import Matrix
from memtree.node import Vector

Mask = npt.NDArray[np.bool_]

_LOAD_HEADROOM = 8
"""A bulk load reserves 1/8 more rows than it fills, for the inserts that follow."""

_SELECTIVE_SHARE = 8
"""A filter allowing at most 1/8 of the rows is searched by scoring just those rows."""
_POST_FILTER_MARGIN = 2.0
"""An unfiltered search fetches about twice the rows the allowed share should need."""
_POST_FILTER_LIMIT = 512
"""Beyond this many fetched rows the unfiltered search stops paying off: score every row."""


class VectorIndex:
    """Exact cosine search over unit vectors keyed by node id."""

    def __init__(self, dimension: int) -> None:
        if dimension <= 0:
            raise ValueError(f"dimension must be positive, got {dimension}")
        self.dimension = dimension
        self._faiss = faiss.IndexFlatIP(dimension)
        self._ids: list[str] = []
        self._slot: dict[str, int] = {}
        self._is_leaf = _Column(bool)
        self._time = _Column(np.float64)

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._slot

    @property
    def ids(self) -> Sequence[str]:
        """Node ids in row order."""
        return self._ids

    def _rows(self) -> Matrix:
        """A writable NumPy view of the FAISS storage (valid until the next append)."""
        n = self._faiss.ntotal
        if n == 0:
            return np.zeros((0, self.dimension), dtype=np.float32)
        flat = faiss.rev_swig_ptr(self._faiss.get_xb(), n * self.dimension)
        return flat.reshape(n, self.dimension)

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
        if not self._ids and len(ids) > 1 and len(set(ids)) == len(ids):
            self._load(ids, vectors, leaf_flags, times)
            return
        if not isinstance(vectors, np.ndarray):
            vectors = np.stack(vectors) if len(vectors) else np.zeros((0, self.dimension), dtype=np.float32)
        vectors = np.ascontiguousarray(vectors, dtype=np.float32).reshape(len(ids), self.dimension)
        found = np.fromiter((self._slot.get(node_id, -1) for node_id in ids), dtype=np.int64, count=len(ids))
        present = np.flatnonzero(found >= 0)
        if present.size:
            targets = found[present]
            if len(set(targets.tolist())) != targets.size:  # an id twice: its last vector wins
                last = {int(slot): int(i) for i, slot in zip(present, targets, strict=True)}
                present = np.fromiter(last.values(), dtype=np.int64, count=len(last))
                targets = found[present]
            self._rows()[targets] = vectors[present]  # one vectorized write per column, not one per row
            self._is_leaf.values[targets] = leaf_flags[present]
            self._time.values[targets] = times[present]
        new_rows = np.flatnonzero(found < 0)
        if new_rows.size:
            start = len(self._ids)
            fresh = [ids[int(i)] for i in new_rows]
            if len(set(fresh)) != len(fresh):
                raise ValueError("upsert got the same new id twice")
            self._faiss.add(vectors[new_rows])
            for offset, node_id in enumerate(fresh):
                self._slot[node_id] = start + offset
            self._ids.extend(fresh)
            self._is_leaf.extend(leaf_flags[new_rows])
            self._time.extend(times[new_rows])

    def _load(
        self, ids: Sequence[str], vectors: Matrix | Sequence[Vector], leaf_flags: Mask, times: np.ndarray
    ) -> None:
        """Fill an empty index (a reopen): vectors are copied once, straight into
        FAISS's storage, and the slot table is built in one go."""
        count = len(ids)
        row_bytes = self.dimension * 4
        # Growing then shrinking leaves spare capacity behind (a vector never gives it
        # back on a shrink), so the first inserts after a reopen append in place instead
        # of copying the whole matrix into a new allocation (1.5 s at a million rows).
        self._faiss.codes.resize((count + count // _LOAD_HEADROOM + 1) * row_bytes)
        self._faiss.codes.resize(count * row_bytes)
        self._faiss.ntotal = count
        rows = self._rows()
        try:
            if isinstance(vectors, np.ndarray):
                rows[:] = vectors.reshape(count, self.dimension)
            else:
                np.stack(vectors, out=rows)
        except (ValueError, TypeError):
            self._faiss.reset()
            raise ValueError(f"upsert needs {count} vectors of dimension {self.dimension}") from None
        self._ids = list(ids)
        self._slot = dict(zip(self._ids, range(count), strict=True))
        self._is_leaf.extend(leaf_flags)
        self._time.extend(times)

    def remove(self, ids: Iterable[str]) -> None:
        """Remove rows by moving the last row into each hole (O(d) per id)."""
        for node_id in ids:
            slot = self._slot.pop(node_id, None)
            if slot is None:
                continue
            last = len(self._ids) - 1
            if slot != last:
                rows = self._rows()
                rows[slot] = rows[last]
                moved = self._ids[last]
                self._ids[slot] = moved
                self._slot[moved] = slot
                self._is_leaf.move(last, slot)
                self._time.move(last, slot)
            self._ids.pop()
            self._is_leaf.pop()
            self._time.pop()
            self._faiss.codes.resize(last * self.dimension * 4)
            self._faiss.ntotal = last

    def vectors(self, ids: Sequence[str]) -> Matrix:
        """The stored vectors of these ids, as a new ``(len(ids), d)`` array."""
        rows = self._rows()
        return np.array([rows[self._slot[node_id]] for node_id in ids], dtype=np.float32).reshape(
            len(ids), self.dimension
        )

    def score(self, query: Vector, ids: Sequence[str]) -> npt.NDArray[np.float32]:
        """Inner products of ``query`` with the vectors of ``ids`` (routing's scores)."""
        if not ids:
            return np.zeros(0, dtype=np.float32)
        rows = self._rows()
        slots = np.fromiter(map(self._slot.__getitem__, ids), dtype=np.int64, count=len(ids))
        return rows[slots] @ np.asarray(query, dtype=np.float32)

    def leaf_flags(self, ids: Sequence[str]) -> npt.NDArray[np.bool_]:
        """Whether each of these ids is a leaf (as its last upsert said)."""
        slots = np.fromiter(map(self._slot.__getitem__, ids), dtype=np.int64, count=len(ids))
        return np.asarray(self._is_leaf.values[slots], dtype=bool)

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
            slots = [self._slot[node_id] for node_id in ids if node_id in self._slot]
            subset[slots] = True
            allowed &= subset
        if excluded is not None:
            slots = [self._slot[node_id] for node_id in excluded if node_id in self._slot]
            allowed[slots] = False
        return allowed

    def search(self, query: Vector, k: int, allowed: Mask | None = None) -> list[tuple[str, float]]:
        """The ``k`` best rows by inner product, best first, among ``allowed`` rows.

        A filter is applied without ever copying the matrix (a gathered copy costs as
        much memory traffic as the search itself):

        * most rows allowed (``leaves_only`` is about 60% of a tree): an unfiltered
          FAISS search for a few more rows than needed, then the mask; exact whenever
          at least ``k`` allowed rows come back, which is nearly always, else the
          full scoring below. So a filtered query costs about what an unfiltered one does.
        * few rows allowed (a time window, a ``where``): score just those rows by id.
        """
        n = len(self._ids)
        if n == 0 or k <= 0:
            return []
        q = np.ascontiguousarray(query, dtype=np.float32).reshape(1, self.dimension)
        if allowed is None:
            scores, slots = self._faiss.search(q, min(k, n))
            return self._pairs(scores[0], slots[0])
        count = int(np.count_nonzero(allowed))
        if count == 0:
            return []
        take = min(k, count)
        if take == count or count * _SELECTIVE_SHARE <= n:
            return self._search_rows(q[0], np.flatnonzero(allowed), take)
        fetch = take + math.ceil(_POST_FILTER_MARGIN * take * n / count)
        if fetch <= _POST_FILTER_LIMIT:
            scores, slots = self._faiss.search(q, min(fetch, n))
            found = slots[0] >= 0
            kept = found.copy()
            kept[found] = allowed[slots[0][found]]
            if np.count_nonzero(kept) >= take:
                return self._pairs(scores[0][kept][:take], slots[0][kept][:take])
        return self._search_all(q[0], allowed, take)

    def _search_rows(self, query: Vector, slots: npt.NDArray[np.int64], take: int) -> list[tuple[str, float]]:
        """Top ``take`` among these rows, scored in place by FAISS (no gathered copy)."""
        slots = np.ascontiguousarray(slots, dtype=np.int64)
        scores = np.empty(slots.size, dtype=np.float32)
        faiss.fvec_inner_products_by_idx(  # type: ignore[attr-defined]
            faiss.swig_ptr(scores),
            faiss.swig_ptr(query),
            faiss.swig_ptr(self._rows()),
            faiss.swig_ptr(slots),
            self.dimension,
            1,
            slots.size,
        )
        top = _top(scores, take)
        return self._pairs(scores[top], slots[top])

    def _search_all(self, query: Vector, allowed: Mask, take: int) -> list[tuple[str, float]]:
        """Score every row in one pass, then rank the allowed ones."""
        n = len(self._ids)
        scores = np.empty(n, dtype=np.float32)
        faiss.fvec_inner_products_ny(  # type: ignore[attr-defined]
            faiss.swig_ptr(scores), faiss.swig_ptr(query), faiss.swig_ptr(self._rows()), self.dimension, n
        )
        scores[~allowed] = -np.inf
        top = _top(scores, take)
        return self._pairs(scores[top], top)

    def _pairs(self, scores: np.ndarray, slots: np.ndarray) -> list[tuple[str, float]]:
        ids = self._ids
        return [(ids[s], v) for v, s in zip(scores.tolist(), slots.tolist(), strict=True) if s >= 0]

    def all_vectors(self) -> Matrix:
        """A copy of the whole matrix in row order (for checks and exports)."""
        return np.array(self._rows(), dtype=np.float32)


def _top(scores: npt.NDArray[np.float32], take: int) -> npt.NDArray[np.intp]:
    """Positions of the ``take`` highest scores, highest first (ties in position order)."""
    top = np.argpartition(-scores, take - 1)[:take] if take < scores.size else np.arange(scores.size)
    return top[np.lexsort((top, -scores[top]))]


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
