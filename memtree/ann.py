"""Approximate search: an inverted-file (IVF) index over the vector index's rows.

The rows are clustered by k-means into ``nlist`` lists (centroids trained by FAISS's
``Kmeans`` on a sample). A query scores the centroids, reads the rows of the
``probes`` nearest lists and ranks them exactly; filters apply to every row read, so
no result ever violates one. IVF rather than HNSW, by measurement
(benchmarks/results/scale.md): HNSW cannot update or remove a vector, so every
re-aggregated summary (``depth`` per insert) would leave a tombstone and its graph
would need rebuilding, which took a minute at 100k rows on this machine against two
seconds for the IVF's k-means; at equal recall the IVF also answered faster on
embeddings that cluster, as sentence embeddings do.

A list is not a copy of its vectors, as in FAISS's ``IndexIVFFlat``: it is a set of
row numbers of the vector index's own matrix, so the embeddings are held once (and
memory-mapped from a segment, :mod:`memtree.segment`). A segment stores its rows
sorted by list, so each list starts as a contiguous *range* of rows, scanned as fast
as FAISS scans its own lists. Rows written after the segment, or moved to another
list since, are the list's *extras*, scored by row number. So the index is kept
current in place, with no tombstones: a new or changed vector is assigned to its
nearest centroid (one small FAISS search for an insert's ``depth + 2`` rows), a
removed row leaves its list. Only the centroids age as the tree grows; the next
segment retrains them once the tree has doubled since (:mod:`memtree.checkpoint`).

Not thread-safe on its own: the vector index calls it under the memory's lock.
"""

from __future__ import annotations

import math
from typing import Protocol

import faiss
import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float32]

KMEANS_ITERATIONS = 12
SAMPLE_PER_LIST = 64
"""k-means is trained on at most this many rows per list (FAISS's own advice is 39-256)."""


class Rows(Protocol):
    """What the IVF reads of the vector index's matrix."""

    def score_range(self, query: FloatArray, start: int, end: int) -> FloatArray: ...

    def score_rows(self, query: FloatArray, slots: IntArray) -> FloatArray: ...


def train_centroids(sample: FloatArray, lists: int, *, seed: int = 1234) -> FloatArray:
    """``lists`` unit centroids by spherical k-means over ``sample``."""
    sample = np.ascontiguousarray(sample, dtype=np.float32)
    lists = max(1, min(lists, sample.shape[0]))
    if lists == 1:
        centroid = sample.mean(axis=0, keepdims=True)
        norm = float(np.linalg.norm(centroid)) or 1.0
        return (centroid / norm).astype(np.float32)
    kmeans = faiss.Kmeans(
        sample.shape[1],
        lists,
        niter=KMEANS_ITERATIONS,
        spherical=True,
        seed=seed,
        max_points_per_centroid=SAMPLE_PER_LIST * 4,
        min_points_per_centroid=1,  # small trees train on few rows per list: no warning for that
        verbose=False,
    )
    kmeans.train(sample)
    return np.ascontiguousarray(kmeans.centroids, dtype=np.float32)


ASSIGN_CHUNK = 8192
"""Vectors assigned per NumPy product. (Not FAISS's search: it opens an OpenMP region
per call, which on a busy machine waits for its threads far longer than an insert's
few products take.)"""


def assign_lists(centroids: FloatArray, vectors: FloatArray) -> IntArray:
    """The nearest centroid (largest inner product) of each vector."""
    out = np.empty(len(vectors), dtype=np.int64)
    for start in range(0, len(vectors), ASSIGN_CHUNK):
        chunk = np.asarray(vectors[start : start + ASSIGN_CHUNK], dtype=np.float32)
        out[start : start + len(chunk)] = np.argmax(chunk @ centroids.T, axis=1)
    return out


class IvfIndex:
    """IVF lists over row numbers: contiguous base ranges plus per-list extras."""

    def __init__(
        self,
        centroids: FloatArray,
        trained_rows: int,
        *,
        offsets: IntArray | None = None,
        rows: int = 0,
    ) -> None:
        """``offsets`` (``nlist + 1``): rows ``offsets[l]`` to ``offsets[l + 1]`` are list
        ``l``'s range, of a matrix of ``rows`` rows sorted by list (a segment's); without
        them every row is placed by :meth:`place`."""
        self.centroids = np.ascontiguousarray(centroids, dtype=np.float32)
        self.lists = self.centroids.shape[0]
        self.trained_rows = trained_rows
        self._starts = np.zeros(self.lists, dtype=np.int64)
        self._ends = np.zeros(self.lists, dtype=np.int64)
        self._list_of = np.full(max(16, rows), -1, dtype=np.int32)
        if offsets is not None:
            offsets = np.asarray(offsets, dtype=np.int64)
            self._starts[:] = offsets[:-1]
            self._ends[:] = offsets[1:]
            self._list_of[:rows] = np.repeat(np.arange(self.lists, dtype=np.int32), np.diff(offsets))
        self._extras: list[np.ndarray | None] = [None] * self.lists
        self._extra_count = np.zeros(self.lists, dtype=np.int64)
        self._extra_pos = np.full(self._list_of.size, -1, dtype=np.int64)
        """Per row: its position in its list's extras (-1: none, a range member or no list)."""

    # -- keeping it current ----------------------------------------------------------------

    def assign(self, vectors: FloatArray) -> IntArray:
        """The list each vector belongs to."""
        return assign_lists(self.centroids, vectors)

    def place(self, slots: IntArray, vectors: FloatArray) -> None:
        """Rows ``slots`` now hold ``vectors``: file each under its nearest list."""
        for slot, target in zip(slots.tolist(), self.assign(vectors).tolist(), strict=True):
            self._join(slot, target)

    def remove(self, slot: int) -> None:
        """Row ``slot`` holds no vector any more."""
        self._leave(slot)

    def move(self, source: int, target: int) -> None:
        """The vector in row ``source`` moved to row ``target`` (its old row goes)."""
        listed = int(self._list_of[source]) if source < self._list_of.size else -1
        self._leave(source)
        if listed >= 0:
            self._join(target, listed)

    def _join(self, slot: int, target: int) -> None:
        self._reserve(slot + 1)
        current = int(self._list_of[slot])
        if current == target:
            return
        if current >= 0:
            self._leave(slot)
        self._list_of[slot] = target
        if not self._starts[target] <= slot < self._ends[target]:
            extras = self._extras[target]
            count = int(self._extra_count[target])
            if extras is None or count == extras.size:
                grown = np.empty(max(8, 2 * count), dtype=np.int64)
                if extras is not None:
                    grown[:count] = extras[:count]
                extras = self._extras[target] = grown
            extras[count] = slot
            self._extra_pos[slot] = count
            self._extra_count[target] = count + 1

    def fill(self, lists: IntArray) -> None:
        """File rows ``0 .. len(lists) - 1`` under ``lists`` at once (a fresh index
        over a matrix not sorted by list: every row is an extra)."""
        count = lists.size
        self._reserve(count)
        self._list_of[:count] = lists
        order = np.argsort(lists, kind="stable")
        sizes = np.bincount(lists, minlength=self.lists)
        bounds = np.concatenate(([0], np.cumsum(sizes)))
        self._extra_pos[order] = np.arange(count) - np.repeat(bounds[:-1], sizes)
        for listed in np.flatnonzero(sizes).tolist():
            members = order[bounds[listed] : bounds[listed + 1]].astype(np.int64)
            self._extras[listed] = np.concatenate((members, np.empty(members.size, dtype=np.int64)))
            self._extra_count[listed] = members.size

    def _leave(self, slot: int) -> None:
        if slot >= self._list_of.size:
            return
        current = int(self._list_of[slot])
        if current < 0:
            return
        self._list_of[slot] = -1
        position = int(self._extra_pos[slot])
        if position < 0:
            return
        self._extra_pos[slot] = -1
        extras = self._extras[current]
        assert extras is not None
        last = int(self._extra_count[current]) - 1
        if position != last:
            moved = int(extras[last])
            extras[position] = moved
            self._extra_pos[moved] = position
        self._extra_count[current] = last

    def _reserve(self, size: int) -> None:
        if size > self._list_of.size:
            capacity = max(size, 2 * self._list_of.size)
            for name in ("_list_of", "_extra_pos"):
                old = getattr(self, name)
                grown = np.full(capacity, -1, dtype=old.dtype)
                grown[: old.size] = old
                setattr(self, name, grown)

    # -- reading --------------------------------------------------------------------------------

    @property
    def extra_rows(self) -> int:
        """Rows scored by number rather than by range (grows between segments)."""
        return int(self._extra_count.sum())

    def search(
        self,
        rows: Rows,
        size: int,
        query: FloatArray,
        take: int,
        probes: int,
        allowed: npt.NDArray[np.bool_] | None,
    ) -> tuple[FloatArray, IntArray, bool]:
        """The ``take`` best rows among the ``probes`` lists nearest to ``query`` (only
        ``allowed`` rows, when given): (scores, rows, whether every list was read).

        Returns fewer than ``take`` when the lists read hold fewer allowed rows; the
        caller then asks again with more probes."""
        probes = min(self.lists, max(1, probes))
        centroid_scores = self.centroids @ query
        if probes < self.lists:
            nearest = np.argpartition(-centroid_scores, probes - 1)[:probes]
        else:
            nearest = np.arange(self.lists)
        list_of = self._list_of
        score_parts: list[FloatArray] = []
        slot_parts: list[IntArray] = []
        for listed in nearest.tolist():
            start, end = int(self._starts[listed]), min(int(self._ends[listed]), size)
            if end > start:
                members = list_of[start:end] == listed
                if allowed is not None:
                    members &= allowed[start:end]
                if members.any():
                    scores = rows.score_range(query, start, end)
                    kept = np.flatnonzero(members)
                    score_parts.append(scores[kept])
                    slot_parts.append(kept + start)
            count = int(self._extra_count[listed])
            if count:
                extras = self._extras[listed]
                assert extras is not None
                slots = extras[:count]
                if allowed is not None:
                    slots = slots[allowed[slots]]
                if slots.size:
                    score_parts.append(rows.score_rows(query, slots))
                    slot_parts.append(slots)
        if not score_parts:
            return np.zeros(0, np.float32), np.zeros(0, np.int64), probes >= self.lists
        scores = np.concatenate(score_parts)
        slots = np.concatenate(slot_parts)
        if scores.size > take:
            top = np.argpartition(-scores, take - 1)[:take]
            scores, slots = scores[top], slots[top]
        order = np.lexsort((slots, -scores))
        return scores[order], slots[order], probes >= self.lists


def probes_for(lists: int, probe_share: float, minimum: int) -> int:
    """How many lists a query reads: ``probe_share`` of them, at least ``minimum``."""
    return max(1, min(lists, max(minimum, math.ceil(probe_share * lists))))
