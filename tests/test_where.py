"""``where`` filters: every operator keeps exactly the leaves it names, through
``retrieve`` in both ranking modes, and the metadata index answers as the one-leaf
rule (:func:`memtree.where.matches`) does, however the tree changed."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memtree import HashingEmbedder, MemTree, MemTreeConfig
from memtree.where import MetadataIndex, matches, parse_where

PEOPLE = [
    # name, age, city, tags (a list value: compared as a whole)
    ("Ana", 31, "Lisbon", ["art"]),
    ("Ben", 25, "Porto", ["sport", "art"]),
    ("Caro", 40, "Lisbon", ["food"]),
    ("Dan", 25.0, "Braga", ["sport"]),
    ("Eve", 52, "Porto", []),
]


def build(beam: int = 3) -> MemTree:
    memory = MemTree(embedder=HashingEmbedder(64), config=MemTreeConfig(theta0=0.2, beam=beam))
    for name, age, city, tags in PEOPLE:
        memory.add(
            f"{name} is {age} and lives in {city}.", metadata={"name": name, "age": age, "city": city, "tags": tags}
        )
    memory.add("A note with no metadata at all about Lisbon.")
    memory.add("Fay moved abroad.", metadata={"name": "Fay", "age": True, "city": None})  # age True is no number
    return memory


def names(memory: MemTree, where: dict[str, Any], **options: Any) -> set[str]:
    hits = memory.retrieve("who lives where", k=100, min_score=-1.0, where=where, **options)
    assert all(hit.is_leaf for hit in hits)
    return {hit.metadata.get("name", "?") for hit in hits}


@pytest.fixture(scope="module")
def memory() -> MemTree:
    return build()


@pytest.mark.parametrize(
    ("where", "expected"),
    [
        ({"city": "Lisbon"}, {"Ana", "Caro"}),
        ({"age": 25}, {"Ben", "Dan"}),  # 25 and 25.0 are one JSON number
        ({"age": {"$eq": 25.0}}, {"Ben", "Dan"}),
        ({"tags": ["sport", "art"]}, {"Ben"}),  # a list is compared whole, in order
        ({"city": {"$ne": "Lisbon"}}, {"Ben", "Dan", "Eve", "Fay", "?"}),  # no key: $ne holds
        ({"age": {"$gt": 31}}, {"Caro", "Eve"}),
        ({"age": {"$gte": 31}}, {"Ana", "Caro", "Eve"}),
        ({"age": {"$lt": 31}}, {"Ben", "Dan"}),  # True is no number
        ({"age": {"$lte": 31}}, {"Ana", "Ben", "Dan"}),
        ({"age": {"$gte": 25, "$lt": 40}}, {"Ana", "Ben", "Dan"}),
        ({"age": {"$gt": 25.5, "$lte": 40.0}}, {"Ana", "Caro"}),
        ({"city": {"$gte": "M", "$lt": "Q"}}, {"Ben", "Eve"}),  # strings order as strings
        ({"city": {"$gt": 3}}, set()),  # strings never order against numbers
        ({"city": {"$in": ["Porto", "Braga"]}}, {"Ben", "Dan", "Eve"}),
        ({"city": {"$in": [None]}}, {"Fay"}),
        ({"city": {"$nin": ["Porto", "Braga"]}}, {"Ana", "Caro", "Fay", "?"}),
        ({"city": "Lisbon", "age": {"$gt": 35}}, {"Caro"}),
        ({"$or": [{"city": "Braga"}, {"age": {"$gte": 50}}]}, {"Dan", "Eve"}),
        ({"$and": [{"city": {"$ne": "Porto"}}, {"age": {"$lt": 35}}]}, {"Ana", "Dan"}),
        ({"$not": {"city": "Porto"}}, {"Ana", "Caro", "Dan", "Fay", "?"}),
        ({"$or": [{"city": {"$ne": "Lisbon"}}, {"name": "Ana"}]}, {"Ana", "Ben", "Dan", "Eve", "Fay", "?"}),
        ({"$not": {"$or": [{"city": {"$nin": ["Porto"]}}, {"age": 52}]}}, {"Ben"}),
        ({"age": {"$in": []}}, set()),
        ({"age": {"$nin": []}}, {"Ana", "Ben", "Caro", "Dan", "Eve", "Fay", "?"}),
    ],
)
def test_each_operator_keeps_exactly_the_leaves_it_names(
    memory: MemTree, where: dict[str, Any], expected: set[str]
) -> None:
    assert names(memory, where) == expected
    assert names(memory, where, lexical_weight=0) == expected  # the dense-only path filters alike
    assert names(memory, where, leaves_only=True) == expected


def test_traversal_applies_the_same_filters() -> None:
    wide = build(beam=100)  # the beam keeps every node
    assert names(wide, {"age": {"$gte": 31}}, mode="traversal") == {"Ana", "Caro", "Eve"}
    assert names(wide, {"$not": {"city": "Porto"}}, mode="traversal") == {"Ana", "Caro", "Dan", "Fay", "?"}


def test_range_filters_follow_inserts_and_deletes_after_their_first_use() -> None:
    memory = build()
    assert names(memory, {"age": {"$gt": 45}}) == {"Eve"}  # builds the sorted values of "age"
    memory.add("Gus is 47 and lives in Faro.", metadata={"name": "Gus", "age": 47, "city": "Faro"})
    assert names(memory, {"age": {"$gt": 45}}) == {"Eve", "Gus"}
    eve = next(leaf.id for leaf in memory.leaves() if leaf.metadata.get("name") == "Eve")
    memory.delete(eve)
    assert names(memory, {"age": {"$gt": 45}}) == {"Gus"}
    assert names(memory, {"city": {"$lt": "C"}}) == {"Dan"}
    memory.add("Hal is 19 and lives in Aveiro.", metadata={"name": "Hal", "age": 19, "city": "Aveiro"})
    assert names(memory, {"city": {"$lt": "C"}}) == {"Dan", "Hal"}
    assert names(memory, {"age": {"$lte": 25}}) == {"Ben", "Dan", "Hal"}


def test_a_negation_is_kept_as_a_complement_not_a_list_of_every_leaf() -> None:
    index = MetadataIndex()
    for i in range(1000):
        index.add(f"leaf{i}", {"kind": "rare" if i == 7 else "common"})
    selection = index.select(parse_where({"kind": {"$ne": "rare"}}))  # type: ignore[arg-type]
    assert selection.negated and selection.ids == {"leaf7"}
    assert "leaf8" in selection and "leaf7" not in selection


@pytest.mark.parametrize(
    ("where", "message"),
    [
        ({"age": {"$gtt": 3}}, "where['age']['$gtt']: unknown operator '$gtt'; compare a key with $eq, $ne, $gt,"),
        ({"$nor": [{"a": 1}]}, "where['$nor']: unknown operator '$nor'; combine conditions with $and, $or, $not"),
        ({"age": {"$in": "abc"}}, "where['age']['$in']: $in takes a list of values, got 'abc'"),
        ({"age": {"$gt": [1]}}, "where['age']['$gt']: $gt compares with a finite number or a string, got [1]"),
        ({"age": {"$gt": True}}, "$gt compares with a finite number or a string, got True"),
        ({"age": {"$gt": 1, "x": 2}}, "where['age']: mixes operators with plain keys ('x'); use only operators"),
        ({"$or": []}, "where['$or']: $or takes a non-empty list of non-empty where dicts, got []"),
        ({"$or": {"a": 1}}, "where['$or']: $or takes a list of where dicts"),
        ({"$not": [{"a": 1}]}, "where['$not']: $not takes one non-empty where dict"),
    ],
)
def test_a_bad_where_raises_a_value_error_naming_the_place(where: dict[str, Any], message: str) -> None:
    memory = build()
    with pytest.raises(ValueError) as caught:
        memory.retrieve("anything", where=where)
    assert message in str(caught.value)


def test_a_where_that_is_not_a_dict_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="where must be a dict of metadata conditions, got list"):
        build().retrieve("anything", where=[("a", 1)])  # type: ignore[arg-type]


def test_a_dict_value_without_operators_is_compared_whole() -> None:
    memory = MemTree(embedder=HashingEmbedder(64))
    memory.add("one", metadata={"place": {"city": "Lisbon", "zip": 1000}})
    memory.add("two", metadata={"place": {"city": "Lisbon"}})
    hits = memory.retrieve("one", k=5, min_score=-1, where={"place": {"zip": 1000, "city": "Lisbon"}})
    assert [hit.text for hit in hits] == ["one"]
    hits = memory.retrieve("one", k=5, min_score=-1, where={"place": {"$eq": {"city": "Lisbon"}}})
    assert [hit.text for hit in hits] == ["two"]


# -- the index agrees with the one-leaf rule --------------------------------------------------

VALUES = st.one_of(
    st.integers(-3, 3),
    st.sampled_from([0.5, 2.0, -1.5, float("nan")]),
    st.sampled_from(["a", "b", "c", ""]),
    st.booleans(),
    st.none(),
    st.lists(st.integers(0, 2), max_size=2),
)
KEYS = st.sampled_from(["x", "y", "z"])
ORDERABLE = st.one_of(st.integers(-3, 3), st.sampled_from([0.5, -1.5, 2.0]), st.sampled_from(["a", "b", "c", ""]))
COMPARISON = st.one_of(
    st.builds(lambda k, op, v: {k: {op: v}}, KEYS, st.sampled_from(["$eq", "$ne"]), VALUES),
    st.builds(lambda k, op, v: {k: {op: v}}, KEYS, st.sampled_from(["$gt", "$gte", "$lt", "$lte"]), ORDERABLE),
    st.builds(lambda k, op, v: {k: {op: v}}, KEYS, st.sampled_from(["$in", "$nin"]), st.lists(VALUES, max_size=3)),
    st.builds(lambda k, v: {k: v}, KEYS, VALUES),
)
WHERES = st.recursive(
    COMPARISON,
    lambda inner: st.one_of(
        st.builds(lambda parts: {"$and": parts}, st.lists(inner, min_size=1, max_size=3)),
        st.builds(lambda parts: {"$or": parts}, st.lists(inner, min_size=1, max_size=3)),
        st.builds(lambda part: {"$not": part}, inner),
    ),
    max_leaves=6,
)
METADATA = st.dictionaries(KEYS, VALUES, max_size=3)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(leaves=st.lists(METADATA, min_size=1, max_size=12), removed=st.sets(st.integers(0, 11)), where=WHERES)
def test_the_index_selects_what_the_one_leaf_rule_keeps(
    leaves: list[dict[str, Any]], removed: set[int], where: dict[str, Any]
) -> None:
    index = MetadataIndex()
    parsed = parse_where(where)
    assert parsed is not None
    for i, metadata in enumerate(leaves):
        index.add(f"n{i}", metadata)
    index.select(parsed)  # makes the sorted values, which the changes below must keep current
    for i in sorted(removed):
        if i < len(leaves):
            index.remove(f"n{i}", leaves[i])
    for i, metadata in enumerate(leaves[:4]):
        index.add(f"m{i}", {**metadata, "x": i})
    live = {f"n{i}": m for i, m in enumerate(leaves) if i not in removed}
    live.update({f"m{i}": {**m, "x": i} for i, m in enumerate(leaves[:4])})
    selection = index.select(parsed)
    assert {leaf for leaf in live if leaf in selection} == {leaf for leaf, m in live.items() if matches(m, parsed)}


@pytest.mark.parametrize("mode", ["collapsed", "traversal"])
def test_an_infinite_bound_keeps_every_number_and_nan_is_refused(mode: str) -> None:
    memory = build()
    everyone = {"Ana", "Ben", "Caro", "Dan", "Eve"}
    assert names(memory, {"age": {"$lt": float("inf")}}, mode=mode) == everyone
    assert names(memory, {"age": {"$gt": float("-inf")}}, mode=mode) == everyone
    assert names(memory, {"age": {"$gt": float("inf")}}, mode=mode) == set()
    assert names(memory, {"city": {"$lt": float("inf")}}, mode=mode) == set()  # strings are not numbers
    assert matches({"age": 3}, parse_where({"age": {"$lte": float("inf"), "$gte": float("-inf")}}))
    with pytest.raises(ValueError, match="NaN is not"):
        memory.retrieve("anything", where={"age": {"$lt": float("nan")}})
