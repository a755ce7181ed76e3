"""``where`` containment operators (``$contains``, ``$any``, ``$all``, ``$text_match``,
``$text_match_insensitive``, ``$empty``): each keeps exactly the leaves it names,
through ``retrieve``, and the metadata index answers as the one-leaf rule does."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memtree import HashingEmbedder, MemTree, MemTreeConfig
from memtree.where import MetadataIndex, matches, parse_where

PEOPLE: list[tuple[str, dict[str, Any]]] = [
    ("Ana", {"tags": ["art", "food"], "bio": "Painter in Lisbon", "ids": [1, 2]}),
    ("Ben", {"tags": ["sport", "art"], "bio": "Cyclist from Porto", "ids": [2.0]}),
    ("Caro", {"tags": ["food"], "bio": "", "ids": []}),
    ("Dan", {"tags": [], "bio": None}),
    ("Eve", {"tags": "art", "bio": ["Painter"]}),  # a string is no list, a list no string
    ("Fay", {}),
]


@pytest.fixture(scope="module")
def memory() -> MemTree:
    memory = MemTree(embedder=HashingEmbedder(64), config=MemTreeConfig(theta0=0.2))
    for name, metadata in PEOPLE:
        memory.add(f"{name} has a story to tell.", metadata={"name": name, **metadata})
    return memory


def names(memory: MemTree, where: dict[str, Any], **options: Any) -> set[str]:
    hits = memory.retrieve("story", k=100, min_score=-1.0, where=where, **options)
    return {hit.metadata["name"] for hit in hits}


@pytest.mark.parametrize(
    ("where", "expected"),
    [
        ({"tags": {"$contains": "art"}}, {"Ana", "Ben"}),  # Eve's "art" is a string, not a list holding it
        ({"ids": {"$contains": 2}}, {"Ana", "Ben"}),  # 2 and 2.0 are one JSON number
        ({"tags": {"$any": ["sport", "food"]}}, {"Ana", "Ben", "Caro"}),
        ({"tags": {"$all": ["art", "food"]}}, {"Ana"}),
        ({"tags": {"$all": []}}, {"Ana", "Ben", "Caro", "Dan"}),  # every list holds nothing at all
        ({"bio": {"$text_match": "Painter"}}, {"Ana"}),  # Eve's bio is a list
        ({"bio": {"$text_match": "painter"}}, set()),
        ({"bio": {"$text_match_insensitive": "PAINTER in"}}, {"Ana"}),
        ({"bio": {"$empty": True}}, {"Caro", "Dan", "Fay"}),  # "", None, and no key at all
        ({"ids": {"$empty": True}}, {"Caro", "Dan", "Eve", "Fay"}),
        ({"bio": {"$empty": False}}, {"Ana", "Ben", "Eve"}),
        ({"$not": {"tags": {"$contains": "art"}}}, {"Caro", "Dan", "Eve", "Fay"}),
        ({"$or": [{"tags": {"$contains": "sport"}}, {"bio": {"$empty": True}}]}, {"Ben", "Caro", "Dan", "Fay"}),
    ],
)
def test_each_containment_operator_keeps_exactly_the_leaves_it_names(
    memory: MemTree, where: dict[str, Any], expected: set[str]
) -> None:
    assert names(memory, where) == expected
    assert names(memory, where, lexical_weight=0) == expected
    assert names(memory, where, leaves_only=True) == expected


@pytest.mark.parametrize(
    ("where", "message"),
    [
        ({"tags": {"$any": "art"}}, "where['tags']['$any']: $any takes a list of values, got 'art'"),
        ({"tags": {"$all": 3}}, "where['tags']['$all']: $all takes a list of values, got 3"),
        ({"bio": {"$text_match": 3}}, "$text_match takes a string to find in the value, got 3"),
        ({"bio": {"$empty": "yes"}}, "$empty takes True (missing or empty) or False (has a value), got 'yes'"),
        (
            {"bio": {"$regex": "a"}},
            "unknown operator '$regex'; compare a key with $eq, $ne, $gt, $gte, $lt, $lte, "
            "$in, $nin, $contains, $any, $all, $text_match, $text_match_insensitive, $empty",
        ),
    ],
)
def test_a_bad_containment_operand_raises_naming_the_place(
    memory: MemTree, where: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError) as caught:
        memory.retrieve("anything", where=where)
    assert message in str(caught.value)


VALUES = st.one_of(
    st.integers(0, 2),
    st.sampled_from(["a", "ab", "Ab", "", "b"]),
    st.none(),
    st.lists(st.one_of(st.integers(0, 2), st.sampled_from(["a", "b"])), max_size=3),
)
KEYS = st.sampled_from(["x", "y"])
ELEMENTS = st.one_of(st.integers(0, 2), st.sampled_from(["a", "b", 1.0]))
CONTAINMENT = st.one_of(
    st.builds(lambda k, v: {k: {"$contains": v}}, KEYS, ELEMENTS),
    st.builds(lambda k, op, v: {k: {op: v}}, KEYS, st.sampled_from(["$any", "$all"]), st.lists(ELEMENTS, max_size=3)),
    st.builds(
        lambda k, op, v: {k: {op: v}},
        KEYS,
        st.sampled_from(["$text_match", "$text_match_insensitive"]),
        st.sampled_from(["a", "A", "b", ""]),
    ),
    st.builds(lambda k, v: {k: {"$empty": v}}, KEYS, st.booleans()),
)
WHERES = st.recursive(
    CONTAINMENT,
    lambda inner: st.one_of(
        st.builds(lambda parts: {"$or": parts}, st.lists(inner, min_size=1, max_size=3)),
        st.builds(lambda part: {"$not": part}, inner),
    ),
    max_leaves=4,
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(leaves=st.lists(st.dictionaries(KEYS, VALUES, max_size=2), min_size=1, max_size=10), where=WHERES)
def test_the_index_selects_what_the_one_leaf_rule_keeps(leaves: list[dict[str, Any]], where: dict[str, Any]) -> None:
    index = MetadataIndex()
    for i, metadata in enumerate(leaves):
        index.add(f"n{i}", metadata)
    parsed = parse_where(where)
    assert parsed is not None
    selection = index.select(parsed)
    assert {f"n{i}" for i in range(len(leaves)) if f"n{i}" in selection} == {
        f"n{i}" for i, m in enumerate(leaves) if matches(m, parsed)
    }
