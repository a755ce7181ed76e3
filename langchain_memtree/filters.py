"""LangGraph's matching rules: item ``filter`` dictionaries and namespace conditions.

``filter`` follows LangGraph's stores: each key names a field of the item's value;
a plain value must equal it (nested dicts match field by field, lists element by
element), and a dict of operators compares it. The operators are the engine's
(:mod:`memtree.where`, the same rules as ``MemTree.retrieve(where=...)``): ``$eq``,
``$ne``, ``$gt``, ``$gte``, ``$lt``, ``$lte`` as in LangGraph, plus ``$in`` and
``$nin``. A missing field counts as ``None``, as LangGraph has it. A dotted key
(``"user.access-level"``) names a nested field, as in LangGraph's SQLite and
PostgreSQL stores, unless the value has a top-level key spelled exactly so (which
LangGraph's ``InMemoryStore`` reads). Infinite bounds (``{"$lt": float("inf")}``)
hold for every number. Namespace
conditions match a path from the start (``prefix``) or the end (``suffix``) with
``"*"`` matching any one label.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from langgraph.store.base import MatchCondition

from memtree.where import COMPARISONS, satisfies

OPERATORS = COMPARISONS


def check_filter(filter: Mapping[str, Any] | None) -> None:
    """Raise ``ValueError`` for an unknown ``$`` operator anywhere in ``filter``, or an
    operand of the wrong kind (``$in`` without a list, ``$gt`` with a list), and
    ``TypeError`` for a key that is not text."""
    if filter is None:
        return
    if not isinstance(filter, Mapping):
        raise TypeError(f"filter must be a dict of field values, got {type(filter).__name__}")
    for field, value in filter.items():
        _check_key(field)
        if isinstance(value, Mapping):
            for key, operand in value.items():
                _check_key(key)
                if key.startswith("$"):
                    _check_operator(field, key, operand)
            check_filter({k: v for k, v in value.items() if not k.startswith("$")})


def _check_key(key: object) -> None:
    if not isinstance(key, str):
        raise TypeError(f"filter keys must be str, got {key!r} ({type(key).__name__}); keys name fields of the value")


def _check_operator(field: str, op: str, operand: Any) -> None:
    if op not in OPERATORS:
        raise ValueError(f"unsupported filter operator {op!r}; use one of: {', '.join(OPERATORS)}")
    if op in ("$in", "$nin") and (isinstance(operand, (str, bytes, Mapping)) or not isinstance(operand, list | tuple)):
        raise ValueError(f"filter {field!r}: {op} takes a list of values, got {operand!r}")
    if op in ("$gt", "$gte", "$lt", "$lte") and isinstance(operand, (list, tuple, Mapping)):
        raise ValueError(f"filter {field!r}: {op} compares with one value, got {operand!r}")


def matches(value: Mapping[str, Any], filter: Mapping[str, Any] | None) -> bool:
    """Whether an item's value satisfies ``filter`` (``None``: everything does)."""
    return not filter or all(_compare(field_at(value, key), wanted) for key, wanted in filter.items())


def field_at(value: Mapping[str, Any], key: str) -> Any:
    """The field a filter key names: the top-level key itself if present, else a
    dotted path through nested dicts; ``None`` when nothing is there."""
    if key in value or "." not in key:
        return value.get(key)
    current: Any = value
    for part in key.split("."):
        if not isinstance(current, Mapping) or part not in current:
            return None
        current = current[part]
    return current


def _compare(actual: Any, wanted: Any) -> bool:
    if isinstance(wanted, Mapping):
        if any(key.startswith("$") for key in wanted):
            return all(_apply(actual, op, operand) for op, operand in wanted.items())
        return isinstance(actual, Mapping) and all(_compare(actual.get(k), v) for k, v in wanted.items())
    if isinstance(wanted, (list, tuple)):
        return (
            isinstance(actual, (list, tuple))
            and len(actual) == len(wanted)
            and all(_compare(a, w) for a, w in zip(actual, wanted, strict=True))
        )
    return bool(actual == wanted)


def _apply(actual: Any, op: str, operand: Any) -> bool:
    if op not in OPERATORS:
        raise ValueError(f"unsupported filter operator {op!r}; use one of: {', '.join(OPERATORS)}")
    return satisfies(actual, op, operand)


def namespace_matches(condition: MatchCondition, namespace: tuple[str, ...]) -> bool:
    """Whether ``namespace`` starts (``prefix``) or ends (``suffix``) with the path."""
    path = tuple(condition.path)
    if len(namespace) < len(path):
        return False
    if condition.match_type == "prefix":
        part = namespace[: len(path)]
    elif condition.match_type == "suffix":
        part = namespace[len(namespace) - len(path) :]
    else:
        raise ValueError(f"unsupported match type {condition.match_type!r}; use 'prefix' or 'suffix'")
    return all(want in ("*", have) for have, want in zip(part, path, strict=True))
