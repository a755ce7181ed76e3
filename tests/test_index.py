"""The incremental index: in-place updates, swap-removal, filters, exactness."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memtree.index import VectorIndex


def unit_rows(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    x = rng.standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["put", "remove"]), st.integers(0, 40)), max_size=120), st.integers(0, 99))
def test_incremental_index_matches_a_fresh_brute_force(ops: list[tuple[str, int]], seed: int) -> None:
    rng = np.random.default_rng(seed)
    index = VectorIndex(8)
    truth: dict[str, np.ndarray] = {}
    for op, key in ops:
        node_id = f"n{key}"
        if op == "put":
            vector = unit_rows(rng, 1, 8)
            index.upsert([node_id], vector, [key % 2 == 0], [float(key)])
            truth[node_id] = vector[0]
        else:
            index.remove([node_id])
            truth.pop(node_id, None)
    assert set(index.ids) == set(truth) and len(index) == len(truth)
    for node_id in truth:
        np.testing.assert_array_equal(index.vectors([node_id])[0], truth[node_id])
    query = unit_rows(rng, 1, 8)[0]
    got = index.search(query, 5)
    ids = list(truth)
    if ids:
        scores = np.array([truth[i] @ query for i in ids])
        expected = sorted(scores, reverse=True)[:5]
        np.testing.assert_allclose([s for _, s in got], expected, atol=1e-5)


def test_filters_become_masks() -> None:
    rng = np.random.default_rng(0)
    index = VectorIndex(16)
    vectors = unit_rows(rng, 100, 16)
    index.upsert(
        [f"n{i}" for i in range(100)],
        vectors,
        [i % 3 == 0 for i in range(100)],
        [float(i) if i % 5 else None for i in range(100)],
    )
    query = vectors[7]
    leaves = index.search(query, 200, index.mask(leaves_only=True))
    assert {node_id for node_id, _ in leaves} == {f"n{i}" for i in range(0, 100, 3)}
    timed = index.search(query, 200, index.mask(time_range=(10.0, 20.0)))
    assert {node_id for node_id, _ in timed} == {f"n{i}" for i in range(10, 21) if i % 5}
    subset = index.search(query, 3, index.mask(ids=["n1", "n2", "missing"]))
    assert {node_id for node_id, _ in subset} == {"n1", "n2"}
    assert index.mask() is None


def test_large_filtered_search_stays_exact() -> None:
    rng = np.random.default_rng(1)
    n = 60_000
    index = VectorIndex(8)
    vectors = unit_rows(rng, n, 8)
    index.upsert([str(i) for i in range(n)], vectors, [i % 2 == 0 for i in range(n)], [None] * n)
    query = unit_rows(rng, 1, 8)[0]
    got = index.search(query, 10, index.mask(leaves_only=True))
    even = vectors[::2] @ query
    np.testing.assert_allclose([s for _, s in got], np.sort(even)[::-1][:10], atol=1e-5)
    assert all(int(node_id) % 2 == 0 for node_id, _ in got)


def test_dimension_must_be_positive() -> None:
    with pytest.raises(ValueError):
        VectorIndex(0)


def test_a_bulk_load_equals_row_by_row_inserts_and_stays_updatable() -> None:
    rng = np.random.default_rng(2)
    vectors = unit_rows(rng, 50, 8)
    ids = [f"n{i}" for i in range(50)]
    bulk, single = VectorIndex(8), VectorIndex(8)
    bulk.upsert(ids, list(vectors), [i % 2 == 0 for i in range(50)], [float(i) for i in range(50)])
    for i, node_id in enumerate(ids):
        single.upsert([node_id], vectors[i : i + 1], [i % 2 == 0], [float(i)])
    assert list(bulk.ids) == ids
    np.testing.assert_array_equal(bulk.all_vectors(), single.all_vectors())
    query = vectors[3]
    window = (10.0, 30.0)
    assert bulk.search(query, 5, bulk.mask(leaves_only=True, time_range=window)) == single.search(
        query, 5, single.mask(leaves_only=True, time_range=window)
    )
    bulk.remove(["n0", "n10"])
    bulk.upsert(["n1", "new"], unit_rows(rng, 2, 8), [True, True], [None, None])
    assert len(bulk) == 49 and "new" in bulk and "n10" not in bulk
    with pytest.raises(ValueError, match="2 vectors of dimension 8"):
        VectorIndex(8).upsert(["a", "b"], [np.ones(8, np.float32), np.ones(4, np.float32)], [True, True], [None, None])


def _brute_force(vectors: np.ndarray, query: np.ndarray, allowed: np.ndarray, k: int) -> list[tuple[str, float]]:
    scores = vectors @ query
    order = sorted(np.flatnonzero(allowed), key=lambda i: (-scores[i], i))[:k]
    return [(f"n{i}", float(scores[i])) for i in order]


@pytest.mark.parametrize("share", [1.0, 0.6, 0.2, 0.05, 0.001])
def test_filtered_search_equals_brute_force_at_every_selectivity(share: float) -> None:
    rng = np.random.default_rng(3)
    n = 5_000
    vectors = unit_rows(rng, n, 16)
    allowed = rng.random(n) < share
    index = VectorIndex(16)
    index.upsert([f"n{i}" for i in range(n)], vectors, allowed.tolist(), [None] * n)
    for query in unit_rows(rng, 5, 16):
        got = index.search(query, 10, index.mask(leaves_only=True))
        expected = _brute_force(vectors, query, allowed, 10)
        assert [node_id for node_id, _ in got] == [node_id for node_id, _ in expected]
        np.testing.assert_allclose([s for _, s in got], [s for _, s in expected], atol=1e-5)


def test_filtered_search_is_exact_when_the_nearest_rows_are_all_filtered_out() -> None:
    """The query sits among many disallowed rows, so fetching a few extra rows and
    masking them finds too few: the search must fall back to scoring every row."""
    rng = np.random.default_rng(4)
    n = 4_000
    vectors = unit_rows(rng, n, 16)
    query = vectors[0]
    near = vectors[0] + 0.05 * unit_rows(rng, 1_000, 16)
    vectors[:1_000] = near / np.linalg.norm(near, axis=1, keepdims=True)
    allowed = np.ones(n, dtype=bool)
    allowed[:1_000] = False
    index = VectorIndex(16)
    index.upsert([f"n{i}" for i in range(n)], vectors, allowed.tolist(), [None] * n)
    got = index.search(query, 10, index.mask(leaves_only=True))
    assert [node_id for node_id, _ in got] == [node_id for node_id, _ in _brute_force(vectors, query, allowed, 10)]


def test_an_upsert_naming_a_present_id_twice_keeps_its_last_vector() -> None:
    rng = np.random.default_rng(5)
    index = VectorIndex(8)
    index.upsert(["a", "b"], unit_rows(rng, 2, 8), [True, True], [1.0, 2.0])
    first, last = unit_rows(rng, 2, 8)
    index.upsert(["a", "b", "a"], [first, first, last], [True, False, False], [None, 5.0, 7.0])
    np.testing.assert_array_equal(index.vectors(["a", "b"]), np.stack([last, first]))
    assert index.search(last, 1, index.mask(time_range=(7.0, 7.0))) == [("a", pytest.approx(1.0, abs=1e-5))]
    assert [node_id for node_id, _ in index.search(last, 5, index.mask(leaves_only=True))] == []


def test_inserts_after_a_bulk_load_append_in_place() -> None:
    """A reopen fills the index in one go; the inserts that follow must not copy the
    whole matrix into a new allocation (a latency spike of seconds at a million rows)."""
    rng = np.random.default_rng(6)
    index = VectorIndex(8)
    index.upsert([f"n{i}" for i in range(800)], unit_rows(rng, 800, 8), [True] * 800, [None] * 800)
    storage = index._matrix._tail.ctypes.data
    for i in range(100):
        index.upsert([f"new{i}"], unit_rows(rng, 1, 8), [True], [None])
    assert index._matrix._tail.ctypes.data == storage and len(index) == 900


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["put", "remove", "adopt", "drop", "score"]), st.integers(0, 40)),
        max_size=150,
    ),
    st.integers(0, 99),
)
def test_scoring_a_wide_parents_children_matches_scoring_them_by_id(ops: list[tuple[str, int]], seed: int) -> None:
    """Routing scores a parent's children with ``score_children``, which remembers a
    wide parent's slots: after any mix of writes, removals (rows move) and changes
    to the children list it must give exactly what ``score`` gives, and fail the same
    way for a child with no row."""
    rng = np.random.default_rng(seed)
    index = VectorIndex(8)
    index.upsert([f"n{i}" for i in range(20)], unit_rows(rng, 20, 8), [True] * 20, [None] * 20)
    children = [f"n{i}" for i in range(20)]  # wide enough to be remembered
    query = unit_rows(rng, 1, 8)[0]
    for op, key in ops:
        node_id = f"n{key}"
        if op == "put":
            index.upsert([node_id], unit_rows(rng, 1, 8), [True], [None])
        elif op == "remove":
            index.remove([node_id])
        elif op == "adopt" and node_id not in children:
            children.append(node_id)  # the parent's own list, changed in place as TreeState does
        elif op == "drop" and node_id in children:
            children.remove(node_id)
        present = [child for child in children if child in index]
        if len(present) != len(children):
            with pytest.raises(KeyError):
                index.score_children(query, "parent", children)
        else:
            np.testing.assert_array_equal(index.score_children(query, "parent", children), index.score(query, present))


def test_rows_read_from_a_mapped_base_and_the_rows_after_it_are_the_rows_written() -> None:
    """An index over a segment keeps the segment's rows as its base and appends after
    them: reading rows from the base only, the appended part only or both gives the
    vectors written, in the order asked."""
    rng = np.random.default_rng(7)
    base = unit_rows(rng, 6, 8)
    base_ids = [f"b{i}" for i in range(6)]
    index = VectorIndex.mapped(
        8, base.copy(), np.ones(6, dtype=bool), np.zeros(6), base_ids.__getitem__, lambda i: int(i[1:]), None
    )
    extra = unit_rows(rng, 3, 8)
    index.upsert(["t0", "t1", "t2"], extra, [True] * 3, [None] * 3)
    truth = dict(zip([*base_ids, "t0", "t1", "t2"], [*base, *extra], strict=True))
    query = unit_rows(rng, 1, 8)[0]
    for ids in (["b4", "b1"], ["t2", "t0"], ["t1", "b5", "t0", "b0"]):
        np.testing.assert_array_equal(index.vectors(ids), np.stack([truth[i] for i in ids]))
        np.testing.assert_allclose(index.score(query, ids), [truth[i] @ query for i in ids], atol=1e-6)
