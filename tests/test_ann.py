"""Approximate (IVF) search: filters always hold, results match exact search where
every list is read, and the lists stay in step with adds, updates and removals."""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memtree import HashingEmbedder, MemTree, MemTreeConfig
from memtree.ann import IvfIndex, train_centroids
from memtree.index import AnnSettings, VectorIndex

DIMENSION = 16


def clustered(rng: np.random.Generator, n: int, centres: int = 12) -> np.ndarray:
    """Unit vectors around a few centres (as embeddings of a few subjects are)."""
    middle = rng.standard_normal((centres, DIMENSION)).astype(np.float32)
    x = middle[rng.integers(0, centres, n)] + 0.4 * rng.standard_normal((n, DIMENSION)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def ivf_index(rng: np.random.Generator, n: int, *, probe_share: float = 0.25) -> tuple[VectorIndex, np.ndarray]:
    vectors = clustered(rng, n)
    index = VectorIndex(DIMENSION, ann=AnnSettings(min_rows=1, probe_share=probe_share, min_probes=1))
    index.upsert(
        [f"n{i}" for i in range(n)],
        vectors,
        [i % 3 != 0 for i in range(n)],
        [float(i) if i % 4 else None for i in range(n)],
    )
    index.watch()
    ivf = IvfIndex(train_centroids(vectors, 8), n)
    index.install_ivf(ivf, ivf.assign(vectors))
    return index, vectors


def lists_hold_every_row_once(index: VectorIndex) -> None:
    """The IVF's invariant: each row of the index is in exactly one list."""
    ivf = index.ivf
    assert ivf is not None
    seen: list[int] = []
    for listed in range(ivf.lists):
        start, end = int(ivf._starts[listed]), min(int(ivf._ends[listed]), len(index))
        seen += [slot for slot in range(start, end) if ivf._list_of[slot] == listed]
        extras = ivf._extras[listed]
        seen += [] if extras is None else extras[: int(ivf._extra_count[listed])].tolist()
    assert sorted(seen) == list(range(len(index)))


@settings(max_examples=40, deadline=None)
@given(
    st.integers(0, 10_000),
    st.booleans(),
    st.one_of(st.none(), st.tuples(st.floats(0, 300), st.floats(0, 300))),
    st.sets(st.integers(0, 299), max_size=40),
    st.sets(st.integers(0, 299), max_size=40),
)
def test_no_ivf_result_violates_a_filter(
    seed: int,
    leaves_only: bool,
    time_range: tuple[float, float] | None,
    subset: set[int],
    excluded: set[int],
) -> None:
    rng = np.random.default_rng(seed)
    index, vectors = ivf_index(rng, 300, probe_share=0.1)
    ids = [f"n{i}" for i in sorted(subset)] if subset else None
    mask = index.mask(leaves_only=leaves_only, time_range=time_range, ids=ids, excluded=[f"n{i}" for i in excluded])
    assert mask is not None
    query = clustered(rng, 1)[0]
    got = index.search(query, 10, mask)
    allowed = {f"n{i}" for i in range(300) if mask[index._slot_of(f"n{i}")]}
    assert {node_id for node_id, _ in got} <= allowed
    assert len(got) == min(10, len(allowed))  # filled whenever enough rows pass
    exact = index.search(query, 10, mask, exact=True)
    assert [node_id for node_id, _ in exact] == [
        f"n{i}" for i in sorted((i for i in range(300) if f"n{i}" in allowed), key=lambda i: -float(vectors[i] @ query))
    ][: len(exact)]


def test_reading_every_list_is_exact_search() -> None:
    rng = np.random.default_rng(3)
    index, _ = ivf_index(rng, 500, probe_share=1.0)
    assert index.approximate
    for query in clustered(rng, 20):
        approximate = index.search(query, 10)
        exact = index.search(query, 10, exact=True)
        assert [node_id for node_id, _ in approximate] == [node_id for node_id, _ in exact]


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["put", "remove"]), st.integers(0, 399)), max_size=200), st.integers(0, 99))
def test_lists_follow_adds_updates_and_removals(ops: list[tuple[str, int]], seed: int) -> None:
    rng = np.random.default_rng(seed)
    index, _ = ivf_index(rng, 200)
    truth = {f"n{i}": index.vectors([f"n{i}"])[0] for i in range(200)}
    for op, key in ops:
        node_id = f"n{key}"
        if op == "put":
            vector = clustered(rng, 1)
            index.upsert([node_id], vector, [True], [None])
            truth[node_id] = vector[0]
        else:
            index.remove([node_id])
            truth.pop(node_id, None)
    lists_hold_every_row_once(index)
    assert set(index.ids) == set(truth)
    everything = AnnSettings(min_rows=1, probe_share=1.0, min_probes=1)
    index.ann = everything
    query = clustered(rng, 1)[0]
    expected = sorted(truth, key=lambda node_id: -float(truth[node_id] @ query))[:5]
    assert [node_id for node_id, _ in index.search(query, 5)] == expected


def notes(count: int) -> list[tuple[str, dict[str, object], float]]:
    topics = ["garden", "violin", "passport", "river", "coffee", "bicycle"]
    return [
        (
            f"note {i} about the {topics[i % 6]} and the {topics[(i * 7) % 6]} near day {i % 13}",
            {"speaker": ["Ann", "Bo", "Cy"][i % 3], "day": i % 13},
            1_700_000_000.0 + 3600 * i,
        )
        for i in range(count)
    ]


def test_a_large_memory_answers_approximately_and_filters_hold() -> None:
    """Past ``ann_min_nodes`` the memory builds its IVF index in the background; then
    filtered queries never return a node the filter excludes, and ``exact=True`` gives
    what a memory that never goes approximate gives."""
    config = MemTreeConfig(ann_min_nodes=150, ann_probe_share=0.05, ann_min_probes=1)
    memory = MemTree(embedder=HashingEmbedder(32), config=config)
    exact_memory = MemTree(embedder=HashingEmbedder(32), config=MemTreeConfig(ann_min_nodes=None))
    rows = notes(260)
    for target in (memory, exact_memory):
        target.add_many(
            [text for text, _, _ in rows], metadata=[m for _, m, _ in rows], timestamps=[t for *_, t in rows]
        )
    memory._replica.wait()
    memory.add("one more note about the garden", metadata={"speaker": "Ann", "day": 1})
    exact_memory.add("one more note about the garden", metadata={"speaker": "Ann", "day": 1})
    memory._replica.wait()
    assert memory._replica.index is not None and memory._replica.index.approximate
    window = (1_700_000_000.0 + 3600 * 40, 1_700_000_000.0 + 3600 * 120)
    for query in ("garden on day 3", "violin and coffee", "the passport near the river"):
        for found in memory.retrieve(query, k=8, where={"speaker": "Bo"}):
            assert found.is_leaf and found.metadata["speaker"] == "Bo"
        for found in memory.retrieve(query, k=8, time_range=window):
            assert found.timestamp is not None and window[0] <= found.timestamp <= window[1]
        for found in memory.retrieve(query, k=8, leaves_only=True, where={"day": {"$gte": 5}}):
            assert found.is_leaf and found.metadata["day"] >= 5
        mine = [round(hit.score, 5) for hit in memory.retrieve(query, k=8, exact=True)]
        theirs = [round(hit.score, 5) for hit in exact_memory.retrieve(query, k=8)]
        assert mine == theirs  # the same ranking (which of two equal scores comes first goes by id)
    assert memory.check_integrity() == []


def test_exact_must_be_a_bool() -> None:
    memory = MemTree(embedder=HashingEmbedder(16))
    memory.add("a note")
    with pytest.raises(TypeError, match="exact"):
        memory.retrieve("note", exact="yes")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("ann_min_nodes", 0),
        ("ann_probe_share", 0.0),
        ("ann_probe_share", 1.5),
        ("segment_share", 0),
        ("ann_min_probes", 0),
    ],
)
def test_bad_ann_settings_are_refused(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        MemTreeConfig(**{field: value})  # type: ignore[arg-type]


def test_context_feedback_on_an_approximate_memory_searches_once() -> None:
    """Context feedback ranks twice. Past ``ann_min_nodes`` the second ranking re-scores
    the first one's nodes with the moved query instead of a second approximate vector
    search, and asks BM25 once when the feedback adds no words (the two searches cost
    half of a query at a million nodes); filters still hold; ``exact=True`` still
    searches exactly both times."""
    from memtree import feedback as feedback_module
    from memtree import retrieval as retrieval_module
    from memtree.lexical import LexicalIndex

    config = MemTreeConfig(ann_min_nodes=150, ann_probe_share=0.05, ann_min_probes=1)
    memory = MemTree(embedder=HashingEmbedder(32), config=config)
    rows = notes(260)
    memory.add_many([text for text, _, _ in rows], metadata=[m for _, m, _ in rows], timestamps=[t for *_, t in rows])
    memory._replica.wait()
    assert memory._replica.index is not None and memory._replica.index.approximate
    searches: list[bool] = []
    words: list[str] = []
    given: list[object] = []
    vector_search, word_search = VectorIndex.search, LexicalIndex.search_and_score
    moved = retrieval_module.context_feedback

    def spy_vectors(self: VectorIndex, *args: object, exact: bool = False, **kwargs: object) -> object:
        searches.append(exact)
        return vector_search(self, *args, exact=exact, **kwargs)  # type: ignore[arg-type]

    def spy_words(self: LexicalIndex, query: object, *args: object, **kwargs: object) -> object:
        words.append(repr(query))
        return word_search(self, query, *args, **kwargs)  # type: ignore[arg-type]

    def spy_feedback(*args: object, **kwargs: object) -> object:
        given.append(result := moved(*args, **kwargs))  # type: ignore[arg-type]
        return result

    with (
        mock.patch.object(VectorIndex, "search", spy_vectors),
        mock.patch.object(LexicalIndex, "search_and_score", spy_words),
        mock.patch.object(retrieval_module, "context_feedback", spy_feedback),
    ):
        hits = memory.retrieve("garden and coffee near day 3", k=6, where={"speaker": "Bo"})
        assert isinstance(given[-1], feedback_module.Feedback) and not given[-1].names
        assert searches == [False] and len(words) == 1
        assert hits and all(hit.is_leaf and hit.metadata["speaker"] == "Bo" for hit in hits)
        searches.clear()
        memory.retrieve("garden and coffee near day 3", k=6, exact=True)
        assert searches == [True, True]
