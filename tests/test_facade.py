"""The MemTree facade: one entry point per operation with keyword options, its
sync/async twins written once, the handles it keeps, and summary vectors that do
not depend on what the process happened to embed before."""

from __future__ import annotations

import asyncio
import warnings
from pathlib import Path

import numpy as np
import pytest

import memtree.tree
from memtree import HashingEmbedder, MemTree, MemTreeConfig, viz

ROOT = Path(__file__).resolve().parents[1]

TEXTS = [
    "Maya adopted a rescue greyhound called Pepper.",
    "Pepper the greyhound is scared of bicycles.",
    "Maya walks Pepper the greyhound by the river.",
    "Leo ate chicken ramen in Kyoto.",
    "Leo tried yuzu ramen in Kyoto the next day.",
    "Pepper the greyhound sleeps on the sofa.",
]


def make(**config: object) -> MemTree:
    return MemTree(embedder=HashingEmbedder(64), config=MemTreeConfig(theta0=0.1, **config))  # type: ignore[arg-type]


def test_the_facade_stays_thin() -> None:
    lines = (ROOT / "memtree" / "tree.py").read_text(encoding="utf-8").count("\n")
    assert lines <= 500, f"memtree/tree.py has {lines} lines; move logic to a module of its own"


def test_retrieve_and_aretrieve_take_the_same_options_and_refuse_unknown_ones() -> None:
    memory = make()
    memory.add_many(TEXTS)
    options = {"k": 2, "leaves_only": True, "lexical_weight": 0.0, "min_similarity": None}
    sync = [hit.id for hit in memory.retrieve("greyhound bicycles", **options)]  # type: ignore[arg-type]
    assert sync == [hit.id for hit in asyncio.run(memory.aretrieve("greyhound bicycles", **options))]  # type: ignore[arg-type]
    for call in (memory.retrieve, memory.aretrieve):
        with pytest.raises(TypeError, match=r"unknown option.*bogus.*it takes: k, token_budget"):
            result = call("greyhound", bogus=1)  # type: ignore[call-arg]
            if asyncio.iscoroutine(result):
                asyncio.run(result)
    with pytest.raises(TypeError, match=r"add\(\) got unknown option.*metdata"):
        memory.add("A typo in a keyword.", metdata={"a": 1})  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"add_many\(\) got unknown option.*timestamp"):
        memory.add_many(["One.", "Two."], timestamp="2024-01-01")  # type: ignore[call-arg]


def test_pictures_are_functions_of_the_memory_and_the_old_methods_warn() -> None:
    memory = make()
    memory.add_many(TEXTS)
    assert viz.to_mermaid(memory).startswith("flowchart LR")
    assert viz.to_dict(memory)["leaf_count"] == len(TEXTS)
    assert "<html" in viz.to_html(memory, queries=["greyhound"]).lower()
    with pytest.warns(DeprecationWarning, match=r"MemTree\.to_mermaid is deprecated; use memtree\.viz\.to_mermaid"):
        assert memory.to_mermaid(max_depth=1) == viz.to_mermaid(memory, max_depth=1)
    with pytest.warns(DeprecationWarning, match="to_dict is deprecated"):
        assert memory.to_dict() == viz.to_dict(memory)


def test_a_summary_vector_depends_on_its_text_not_on_what_the_process_embedded_before() -> None:
    """A fresh process (or a cache that dropped a sentence) must give a summary the
    vector a long-running one gives it: before, it got its whole text embedded
    instead of the mean of its sentences' vectors."""
    warm, cold = make(), make()
    for text in TEXTS:
        warm.add(text)
        cold.aggregator._cache.clear()  # type: ignore[attr-defined]  # what a new process starts with
        cold.add(text)
    warm_summaries = {node.text: node.embedding for node in warm.walk() if not node.is_leaf and not node.is_root}
    cold_summaries = {node.text: node.embedding for node in cold.walk() if not node.is_leaf and not node.is_root}
    assert warm_summaries.keys() == cold_summaries.keys() and warm_summaries
    for text, vector in warm_summaries.items():
        assert np.allclose(vector, cold_summaries[text], atol=1e-6), text


def test_a_sibling_pushed_out_of_the_cache_is_closed_with_its_summaries_written(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(memtree.tree, "SIBLING_CACHE_SIZE", 2)
    memory = make(aggregation="deferred")
    first = memory.sibling(("users", "maya"))
    first.add_many(TEXTS[:3])  # deferred: the summaries wait for a flush
    assert any(node.stale for node in first.walk())
    memory.sibling(("users", "leo"))
    memory.sibling(("users", "ana"))  # pushes maya's handle out: it is closed, not dropped
    reopened = memory.sibling(("users", "maya"))
    assert reopened is not first
    assert not any(node.stale for node in reopened.walk())  # closing wrote them
    assert len(reopened) == 3 and reopened.check_integrity() == []
    memory.close()


def test_delete_takes_one_id_or_many() -> None:
    memory = make()
    ids = memory.add_many(TEXTS)
    assert memory.delete(ids[0]) == 1
    assert memory.delete(ids[1:3]) == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert asyncio.run(memory.adelete([ids[3]])) == 1  # the new names do not warn
    assert len(memory) == 2
