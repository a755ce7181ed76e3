"""LangGraph's matching rules: item ``filter`` dictionaries and namespace conditions.

``filter`` follows LangGraph's stores: each key names a field of the item's value;
a plain value must equal it (nested dicts match field by field, lists element by
element), and a dict of operators compares it: ``$eq``, ``$ne``, ``$gt``,
``$gte``, ``$lt``, ``$lte``. Namespace conditions match a path from the start
(``prefix``) or the end (``suffix``) with ``"*"`` matching any one label.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from typing import Any

from langgraph.store.base import MatchCondition

_ORDER: dict[str, Callable[[Any, Any], bool]] = {
    "$gt": operator.gt,
    "$gte": operator.ge,
    "$lt": operator.lt,
    "$lte": operator.le,
}
OPERATORS = ("$eq", "$ne", *_ORDER)


def check_filter(filter: Mapping[str, Any] | None) -> None:
    """Raise ``ValueError`` for an unknown ``$`` operator anywhere in ``filter``."""
    if filter is None:
        return
    if not isinstance(filter, Mapping):
        raise TypeError(f"filter must be a dict of field values, got {type(filter).__name__}")
    for value in filter.values():
        if isinstance(value, Mapping):
            for key in value:
                if key.startswith("$") and key not in OPERATORS:
                    raise ValueError(f"unsupported filter operator {key!r}; use one of: {', '.join(OPERATORS)}")
            check_filter({k: v for k, v in value.items() if not k.startswith("$")})


def matches(value: Mapping[str, Any], filter: Mapping[str, Any] | None) -> bool:
    """Whether an item's value satisfies ``filter`` (``None``: everything does)."""
    return not filter or all(_compare(value.get(key), wanted) for key, wanted in filter.items())


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
    if op == "$eq":
        return bool(actual == operand)
    if op == "$ne":
        return bool(actual != operand)
    compare = _ORDER.get(op)
    if compare is None:
        raise ValueError(f"unsupported filter operator {op!r}; use one of: {', '.join(OPERATORS)}")
    numbers = (int, float)
    if isinstance(actual, bool) or isinstance(operand, bool):
        return False
    if isinstance(actual, numbers) and isinstance(operand, numbers):
        return compare(actual, operand)
    if isinstance(actual, str) and isinstance(operand, str):
        return compare(actual, operand)
    return False  # a missing field or mismatched types never satisfy an order


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
