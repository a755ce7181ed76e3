"""MemTreeStore refuses bad input by name, on every backend, and stores nothing then
(issue 25 rows 7 and 8)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from langgraph.store.base import InvalidNamespaceError, PutOp
from lc_fakes import hashing_memory

from langchain_memtree import MemTreeStore
from memtree import HashingEmbedder, MemTree, MemTreeConfig

BACKENDS = ["memory", "sqlite", "postgres"]


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MemTreeStore]:
    if request.param == "memory":
        memory = hashing_memory()
    else:
        location = str(tmp_path / "m.db") if request.param == "sqlite" else request.getfixturevalue("postgres_dsn")
        memory = MemTree.open(location, embedder=HashingEmbedder(64), config=MemTreeConfig(theta0=0.2))
    with memory:
        yield MemTreeStore(memory, index={"fields": ["text"]})


def nothing_stored(store: MemTreeStore) -> bool:
    return store.list_namespaces() == [] and store.search((), limit=10) == []


@pytest.mark.parametrize(
    ("namespace", "key"),
    [(("a\ud800",), "k"), (("n",), "k\ud800"), (("n",), "k\x00"), (("a\x00",), "k")],
)
def test_a_lone_surrogate_or_nul_in_a_namespace_or_key_is_named_and_nothing_is_stored(
    store: MemTreeStore, namespace: tuple[str, ...], key: str
) -> None:
    with pytest.raises(ValueError, match=r"(NUL|not valid Unicode)"):
        store.put(namespace, key, {"text": "hello"})
    assert nothing_stored(store)
    with pytest.raises(ValueError, match=r"(NUL|not valid Unicode)"):
        store.get(namespace, key)
    with pytest.raises(ValueError, match=r"(NUL|not valid Unicode)"):
        store.delete(namespace, key)


def test_a_str_namespace_is_refused_not_split_into_letters(store: MemTreeStore) -> None:
    with pytest.raises(InvalidNamespaceError, match=r"tuple of labels.*\('alice',\)"):
        store.put("alice", "k", {"text": "x"})  # type: ignore[arg-type]
    with pytest.raises(InvalidNamespaceError, match="tuple of labels"):
        store.search("alice")  # type: ignore[arg-type]
    assert nothing_stored(store)


def test_filters_with_bad_keys_or_operands_are_named(store: MemTreeStore) -> None:
    store.put(("n",), "k", {"text": "x", "n": 1})
    with pytest.raises(TypeError, match=r"filter keys must be str, got 1 \(int\)"):
        store.search(("n",), filter={"n": {1: 2}})
    with pytest.raises(ValueError, match=r"filter 'n': \$gt compares with one value, got \[1\]"):
        store.search(("n",), filter={"n": {"$gt": [1]}})


@pytest.mark.parametrize("option", [{"limit": -1}, {"offset": -1}, {"max_depth": -1}])
def test_list_namespaces_refuses_negative_numbers(store: MemTreeStore, option: dict[str, int]) -> None:
    with pytest.raises(ValueError, match=f"{next(iter(option))} must be >= 0"):
        store.list_namespaces(**option)


def test_a_batch_with_a_bad_put_applies_nothing(store: MemTreeStore) -> None:
    with pytest.raises(TypeError, match="must be dicts"):
        store.batch([PutOp(("n",), "good", {"text": "kept?"}), PutOp(("n",), "bad", ["no"])])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not valid Unicode"):
        store.batch([PutOp(("n",), "good", {"text": "kept?"}), PutOp(("n\udc80",), "bad", {"text": "x"})])
    assert nothing_stored(store)


def test_a_value_nested_too_deeply_is_a_named_error(store: MemTreeStore) -> None:
    value: dict[str, object] = {"text": "deep"}
    for _ in range(5000):
        value = {"a": value}
    with pytest.raises(ValueError, match="nested too deeply"):
        store.put(("n",), "k", value)
    assert nothing_stored(store)


# -- issue 39 row 9: raw errors named ----------------------------------------------------


@pytest.mark.parametrize("index", [5, "text", True])
def test_a_put_index_that_is_not_a_list_of_paths_is_named(store: MemTreeStore, index: object) -> None:
    with pytest.raises(TypeError, match=r"put: index must be a list of JSON paths \(str\) such as \['text'\]"):
        store.put(("n",), "k", {"text": "x"}, index=index)  # type: ignore[arg-type]
    assert nothing_stored(store)


@pytest.mark.parametrize("fields", [5, "text", [5]])
def test_index_fields_that_are_not_a_list_of_paths_are_named(fields: object) -> None:
    with pytest.raises(TypeError, match=r"index fields must be a list of JSON paths \(str\)"):
        MemTreeStore(hashing_memory(), index={"fields": fields})  # type: ignore[typeddict-item]


@pytest.mark.parametrize(("name", "value"), [("limit", "5"), ("limit", 2.5), ("offset", "1"), ("limit", True)])
def test_a_search_limit_or_offset_that_is_not_an_int_is_named(store: MemTreeStore, name: str, value: object) -> None:
    store.put(("n",), "k", {"text": "x"})
    with pytest.raises(TypeError, match=f"search: {name} must be an int >= 0, got {type(value).__name__}"):
        store.search(("n",), **{name: value})  # type: ignore[arg-type]


@pytest.mark.parametrize("namespace", [5, 2.5, None, b"users"])
def test_a_memory_namespace_of_the_wrong_type_is_named(namespace: object) -> None:
    with pytest.raises(TypeError, match=r"namespace must be a str or a tuple of str such as \('users', 'alice'\)"):
        MemTree(embedder=HashingEmbedder(64), namespace=namespace)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="namespace must be a str or a tuple of str"):
        MemTreeStore(hashing_memory(), prefix=namespace)  # type: ignore[arg-type]
