"""The tree state's lookups (metadata filters, duplicate and source lookups, the BM25
index) answer the same whether the state grew insert by insert, was loaded in one
batch by a reopen, or has its metadata index made late by the first ``where`` filter."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from memtree import HashingEmbedder, MemTree, MemTreeConfig
from memtree.state import metadata_key

CONFIG = MemTreeConfig(theta0=0.2)
PEOPLE = ["Caroline", "Melanie", "Jon", "Gina"]


def notes(start: int, count: int) -> list[tuple[str, dict[str, Any]]]:
    return [
        (
            f"Note {i}: {PEOPLE[i % 4]} talked about {['art', 'hiking', 'dance', 'pottery'][i % 3]} on day {i}.",
            {"person": PEOPLE[i % 4], "day": i % 5 if i % 2 else float(i % 5), "flag": i % 3 == 0},
        )
        for i in range(start, start + count)
    ]


def matching(memory: MemTree, where: dict[str, Any]) -> set[str]:
    """Leaf ids whose metadata has every item of ``where``, by looking at each leaf."""
    return {
        node.id
        for node in memory.walk()
        if node.is_leaf
        and not node.is_root
        and all(
            key in node.metadata and metadata_key(node.metadata[key]) == metadata_key(value)
            for key, value in where.items()
        )
    }


def filtered(memory: MemTree, where: dict[str, Any]) -> set[str]:
    return {hit.id for hit in memory.retrieve("a note", k=1000, where=where, min_score=-1.0)}


FILTERS: list[dict[str, Any]] = [
    {"person": "Jon"},
    {"day": 2},  # stored as 2 and as 2.0: both match
    {"flag": True},
    {"flag": 1},  # 1 is not True in JSON
    {"person": "Gina", "day": 3.0},
]


def test_metadata_filters_match_before_and_after_the_index_is_made_and_after_a_reopen(tmp_path: Path) -> None:
    path = tmp_path / "memory.db"
    with MemTree.open(path, embedder=HashingEmbedder(64), config=CONFIG) as memory:
        for text, metadata in notes(0, 30):
            memory.add(text, metadata=metadata)
        for where in FILTERS:  # the first filter makes the metadata index
            assert filtered(memory, where) == matching(memory, where), where
        for text, metadata in notes(30, 20):  # kept current from then on
            memory.add(text, metadata=metadata)
        memory.delete([leaf.id for leaf in memory.leaves()[:7]])
        for where in FILTERS:
            assert filtered(memory, where) == matching(memory, where), where
        before = {str(where): filtered(memory, where) for where in FILTERS}
        hits = [(hit.id, hit.score) for hit in memory.retrieve("Jon dance day", k=8)]
        stored = dict(notes(35, 3))
        duplicates = {text: memory.add(text, metadata=meta) for text, meta in stored.items()}  # the content lookup
    with MemTree.open(path, embedder=HashingEmbedder(64), config=CONFIG) as memory:  # loaded in one batch
        assert {str(where): filtered(memory, where) for where in FILTERS} == before
        assert [(hit.id, hit.score) for hit in memory.retrieve("Jon dance day", k=8)] == hits
        assert {text: memory.add(text, metadata=stored[text]) for text in duplicates} == duplicates
        assert memory.check_integrity() == []


def test_metadata_keys_are_equal_exactly_when_the_json_values_are() -> None:
    assert metadata_key(1) == metadata_key(1.0) != metadata_key(1.5)
    assert len({metadata_key(value) for value in (1, True, "1", None, "null", "true", 0, False, "")}) == 9
    assert metadata_key({"a": 1, "b": [1, 2]}) == metadata_key({"b": [1, 2], "a": 1})
    assert metadata_key(["x"]) != metadata_key("x")
    assert metadata_key(math.nan) == metadata_key(float("nan"))
    assert metadata_key(10**30) == metadata_key(10**30) != metadata_key(float(10**30) + 1e16)


@pytest.mark.parametrize("lexical_weight", [0.0, 0.3])
def test_a_reopened_state_equals_the_one_built_insert_by_insert(tmp_path: Path, lexical_weight: float) -> None:
    config = MemTreeConfig(theta0=0.2, lexical_weight=lexical_weight)
    path = tmp_path / "memory.db"
    with MemTree.open(path, embedder=HashingEmbedder(64), config=config) as memory:
        for number, (text, metadata) in enumerate(notes(0, 40)):
            memory.add(text, metadata=metadata, source_id=f"message-{number % 7}")
        live = memory._state
        expected = (
            {node.id: list(node.children) for node in live.nodes.values()},
            {key: list(ids) for key, ids in live.leaves_by_text.items()},
            {key: list(ids) for key, ids in live.leaves_by_source.items()},
            live.depth_histogram(),
            live.leaf_total,
            None if live.lexical is None else live.lexical.scores("Jon dance pottery day"),
        )
    with MemTree.open(path, embedder=HashingEmbedder(64), config=config) as memory:
        loaded = memory._state
        assert (
            {node.id: list(node.children) for node in loaded.nodes.values()},
            {key: list(ids) for key, ids in loaded.leaves_by_text.items()},
            {key: list(ids) for key, ids in loaded.leaves_by_source.items()},
            loaded.depth_histogram(),
            loaded.leaf_total,
            None if loaded.lexical is None else loaded.lexical.scores("Jon dance pottery day"),
        ) == expected
