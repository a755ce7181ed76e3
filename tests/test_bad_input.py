"""Bad input gets a clear error and nothing stored is lost or changed."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import numpy as np
import pytest

from memtree import HashingEmbedder, MemTree, MemTreeConfig
from memtree.embed import Embedder, Matrix


class ScriptedEmbedder(Embedder):
    """Hashing embeddings, until told to return something broken."""

    def __init__(self) -> None:
        self.inner = HashingEmbedder(32)
        self.broken: str | None = None

    def embed(self, texts: Sequence[str]) -> Matrix:
        good = self.inner.embed(texts)
        if self.broken == "shape":
            return good[:, :, None]
        if self.broken == "count":
            return good[:-1]
        if self.broken == "dimension":
            return np.ones((len(texts), 48), dtype=np.float32)
        if self.broken == "nan":
            good[0, 0] = np.nan
        if self.broken == "inf":
            good[0, 1] = np.inf
        if self.broken == "zero":
            good[0] = 0
        return good


@pytest.fixture
def memory() -> MemTree:
    memory = MemTree(embedder=ScriptedEmbedder(), config=MemTreeConfig(theta0=0.1))
    for text in ["apples are red", "bananas are yellow", "apples grow on trees"]:
        memory.add(text)
    return memory


def snapshot(memory: MemTree) -> list[tuple[str, str, int, str | None]]:
    return sorted((n.id, n.text, n.depth, n.parent) for n in memory.walk())


@pytest.mark.parametrize("text", ["", "   ", "\n\t"])
def test_empty_text_is_a_value_error(memory: MemTree, text: str) -> None:
    before = snapshot(memory)
    with pytest.raises(ValueError, match="empty or whitespace-only"):
        memory.add(text)
    assert snapshot(memory) == before


@pytest.mark.parametrize("value", [None, 42, b"bytes", ["a list"]])
def test_non_str_text_is_a_type_error(memory: MemTree, value: object) -> None:
    with pytest.raises(TypeError, match="text must be a str"):
        memory.add(value)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("broken", "message"),
    [
        ("shape", "shape"),
        ("count", "shape"),
        ("dimension", "embedding dimension 48 does not match this memory's 32"),
        ("nan", "NaN or infinite"),
        ("inf", "NaN or infinite"),
        ("zero", "all-zero"),
    ],
)
def test_broken_embeddings_are_rejected_and_nothing_is_stored(memory: MemTree, broken: str, message: str) -> None:
    before = snapshot(memory)
    memory.embedder.broken = broken  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match=message):
        memory.add("cherries are dark red")
    with pytest.raises(ValueError, match=message):
        memory.add_many(["plums", "pears"])
    assert snapshot(memory) == before
    assert memory.check_integrity() == []
    memory.embedder.broken = None  # type: ignore[attr-defined]
    memory.add("cherries are dark red")
    assert len(memory) == 4


def test_one_bad_item_in_add_many_stores_nothing(memory: MemTree) -> None:
    before = snapshot(memory)
    with pytest.raises(ValueError, match="empty"):
        memory.add_many(["fine text", "  "])
    with pytest.raises(TypeError):
        memory.add_many("not a list")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="metadata has 1 entries for 2 texts"):
        memory.add_many(["a", "b"], metadata=[{}])
    assert snapshot(memory) == before


def test_bad_retrieval_arguments(memory: MemTree) -> None:
    for k in (0, -3):
        with pytest.raises(ValueError, match="k must be a positive integer"):
            memory.retrieve("apples", k=k)
    with pytest.raises(ValueError, match="unknown mode 'tree'; choose one of: collapsed, traversal"):
        memory.retrieve("apples", mode="tree")
    with pytest.raises(ValueError, match="token_budget"):
        memory.retrieve("apples", token_budget=0)
    with pytest.raises(ValueError, match="query is empty"):
        memory.retrieve("  ")
    with pytest.raises(ValueError, match="starts after it ends"):
        memory.retrieve("apples", time_range=("2024-02-01", "2024-01-01"))
    with pytest.raises(ValueError, match="ISO 8601"):
        memory.retrieve("apples", time_range=("last tuesday", None))


def test_delete_unknown_id_is_a_key_error_naming_it(memory: MemTree) -> None:
    with pytest.raises(KeyError, match="no-such-id"):
        memory.delete("no-such-id")
    with pytest.raises(KeyError, match="no-such-id"):
        memory.get("no-such-id")


def test_deleting_a_summary_is_refused(memory: MemTree) -> None:
    summary = next(n for n in memory.walk() if not n.is_leaf and n.parent is not None)
    with pytest.raises(ValueError, match="is a summary, not a leaf"):
        memory.delete(summary.id)


def test_bad_metadata_timestamp_and_source_id(memory: MemTree) -> None:
    before = snapshot(memory)
    with pytest.raises(TypeError, match="JSON-serializable"):
        memory.add("x y z", metadata={"when": object()})
    with pytest.raises(TypeError, match="metadata keys must be str"):
        memory.add("x y z", metadata={1: "a"})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="ISO 8601"):
        memory.add("x y z", timestamp="yesterday")
    with pytest.raises(ValueError, match="finite"):
        memory.add("x y z", timestamp=float("nan"))
    with pytest.raises(TypeError, match="source_id must be a str"):
        memory.add("x y z", source_id=12)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="NUL"):
        memory.add("nul \x00 inside")
    assert snapshot(memory) == before


def test_bad_config_values_name_the_field() -> None:
    with pytest.raises(ValueError, match="theta0 must be between"):
        MemTreeConfig(theta0=1.5)
    with pytest.raises(TypeError, match="theta0 must be a number or 'auto'"):
        MemTreeConfig(theta0="high")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="depth_cap"):
        MemTreeConfig(depth_cap=1)
    with pytest.raises(ValueError, match="parent_embedding"):
        MemTreeConfig(parent_embedding="max")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown mode"):
        MemTreeConfig(mode="flat")  # type: ignore[arg-type]


def test_wrong_component_types_are_type_errors() -> None:
    with pytest.raises(TypeError, match="embedder must be a memtree Embedder"):
        MemTree(embedder="all-MiniLM-L6-v2")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="either aggregator or llm"):
        MemTree(embedder=HashingEmbedder(), llm=lambda p: p, aggregator=object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="namespace"):
        MemTree(embedder=HashingEmbedder(), namespace="")


@pytest.mark.parametrize("answer", [None, "not a vector", 3.0, [[0.1, 0.2]] * 2, np.ones(48)])
def test_a_query_embedding_of_the_wrong_kind_is_a_clear_value_error(memory: MemTree, answer: object) -> None:
    class BrokenQueries(Embedder):
        @property
        def name(self) -> str:
            return memory.embedder.name  # the model that built the memory, with a broken query path

        def embed(self, texts: Sequence[str]) -> Matrix:
            return memory.embedder.embed(texts)

        def embed_query(self, text: str) -> Matrix:
            return answer  # type: ignore[return-value]

        async def aembed_query(self, text: str) -> Matrix:
            return answer  # type: ignore[return-value]

    broken = MemTree(embedder=BrokenQueries(), store=memory.store, namespace=memory.namespace)
    for call in (lambda: broken.retrieve("apples"), lambda: asyncio.run(broken.aretrieve("apples"))):
        with pytest.raises(ValueError, match=r"BrokenQueries returned|embedding dimension 48"):
            call()
