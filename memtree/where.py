"""``where``: the metadata filter of :meth:`MemTree.retrieve <memtree.MemTree.retrieve>`.

A ``where`` is a dict in the Mongo style that LangGraph, Chroma and most vector
stores share, so adapters translate their frameworks' filters into it one to one:

* ``{"speaker": "Leo"}``: the leaf's metadata has ``speaker`` equal to ``"Leo"``
  (JSON equality: ``1 == 1.0``, but ``1 != True`` and ``1 != "1"``; a dict or list
  value must equal as a whole);
* ``{"age": {"$gte": 30, "$lt": 40}}``: operators on one key, all must hold:
  ``$eq``, ``$ne``, ``$gt``, ``$gte``, ``$lt``, ``$lte``, ``$in``, ``$nin``;
* ``{"tags": {"$contains": "dog"}}``: operators on what a value holds
  (:data:`CONTAINMENT`): a list value holds the operand (``$contains``), one of the
  operand's values (``$any``) or all of them (``$all``); a string value holds the
  operand string (``$text_match``, or ``$text_match_insensitive`` ignoring case);
  ``{"$empty": True}``: the key is missing, ``None``, ``""`` or ``[]``
  (``False``: it has any other value). These are the operators LlamaIndex's
  ``FilterOperator`` has beyond the comparisons, with its simple vector store's
  meaning;
* ``{"$and": [...]}``, ``{"$or": [...]}``, ``{"$not": {...}}``: conditions
  combined; several keys in one dict are joined by AND.

Only leaves carry the caller's metadata, so a ``where`` only ever matches leaves.
A leaf without the key fails every operator but ``$ne``, ``$nin`` and ``$empty: True``
(as in LlamaIndex, LangGraph and MongoDB). Order operators compare numbers with numbers
and strings with strings (ISO 8601 dates order correctly as strings); a value of
another type (a bool, a list, a missing key) never satisfies them. An infinite
bound is a number like any other (``{"$lt": float("inf")}`` holds for every
number, as in LangGraph's stores); NaN, which orders with nothing, is refused.

:class:`MetadataIndex` answers a ``where`` from per-key lookups (exact values in
hash maps, ranges by bisection in sorted value lists, containment by a pass over
the key's distinct values), so a filtered query costs what its matches cost, not a
pass over every leaf. :func:`matches` is the same
rule for one leaf's metadata, the definition the index is tested against.
"""

from __future__ import annotations

import bisect
import json
import math
import operator
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

COMPARISONS = ("$eq", "$ne", "$gt", "$gte", "$lt", "$lte", "$in", "$nin")
"""Operators on one metadata key."""

CONTAINMENT = ("$contains", "$any", "$all", "$text_match", "$text_match_insensitive", "$empty")
"""Operators on what one metadata value holds (list elements, a substring) or
whether it is empty; the LangGraph store's filters do not take them."""

COMBINATIONS = ("$and", "$or", "$not")
"""Operators that combine conditions."""

_KEY_OPERATORS = ", ".join((*COMPARISONS, *CONTAINMENT))

_ORDER: dict[str, Callable[[Any, Any], bool]] = {
    "$gt": operator.gt,
    "$gte": operator.ge,
    "$lt": operator.lt,
    "$lte": operator.le,
}


def metadata_key(value: Any) -> Hashable:
    """A dict key for a metadata value: equal JSON values get equal keys, others not.

    Strings are their own key; numbers, booleans and null a tagged tuple (so ``1`` and
    ``1.0`` meet, ``1``, ``True`` and ``"1"`` do not); anything else its canonical JSON
    text. Reopening a memory computes one key per leaf and metadata field, so the
    common scalar cases skip ``json.dumps``.
    """
    kind = type(value)
    if kind is str:
        return value
    if kind is bool or value is None:
        return ("literal", value)
    if kind is int:
        return ("number", value)
    if kind is float and math.isfinite(value):
        return ("number", int(value) if value.is_integer() else value)
    return ("json", json.dumps(value, sort_keys=True, ensure_ascii=False))


# -- the parsed form ---------------------------------------------------------------------


@dataclass(frozen=True)
class Compare:
    """``key`` satisfies ``op`` with ``operand`` (one of :data:`COMPARISONS`)."""

    key: str
    op: str
    operand: Any


@dataclass(frozen=True)
class AllOf:
    """Every part holds."""

    parts: tuple[Where, ...]


@dataclass(frozen=True)
class AnyOf:
    """At least one part holds."""

    parts: tuple[Where, ...]


@dataclass(frozen=True)
class NoneOf:
    """The part does not hold (``$not``)."""

    part: Where


Where: TypeAlias = Compare | AllOf | AnyOf | NoneOf


def parse_where(where: Mapping[str, Any] | None) -> Where | None:
    """The checked form of a ``where`` dict; ``None`` for no filter (``None`` or ``{}``).

    Raises ``TypeError`` for a ``where`` that is not a dict and ``ValueError`` naming
    the problem for an unknown operator or an operand of the wrong kind.

    Example::

        parse_where({"age": {"$gte": 30}, "tag": {"$in": ["a", "b"]}})
    """
    if where is None:
        return None
    if not isinstance(where, Mapping):
        raise TypeError(f"where must be a dict of metadata conditions, got {type(where).__name__}")
    if not where:
        return None
    return _parse_dict(where, "where")


def _parse_dict(where: Mapping[str, Any], at: str) -> Where:
    parts: list[Where] = []
    for key, value in where.items():
        if not isinstance(key, str):
            raise TypeError(f"{at}: metadata keys are strings, got {key!r}")
        if key.startswith("$"):
            parts.append(_parse_combination(key, value, f"{at}[{key!r}]"))
        else:
            parts.extend(_parse_field(key, value, f"{at}[{key!r}]"))
    return parts[0] if len(parts) == 1 else AllOf(tuple(parts))


def _parse_combination(op: str, value: Any, at: str) -> Where:
    if op == "$not":
        if not isinstance(value, Mapping) or not value:
            raise ValueError(f"{at}: $not takes one non-empty where dict, got {value!r}")
        return NoneOf(_parse_dict(value, at))
    if op in ("$and", "$or"):
        if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
            raise ValueError(f"{at}: {op} takes a list of where dicts, got {value!r}")
        items = list(value)
        if not items or not all(isinstance(item, Mapping) and item for item in items):
            raise ValueError(f"{at}: {op} takes a non-empty list of non-empty where dicts, got {value!r}")
        parts = tuple(_parse_dict(item, f"{at}[{i}]") for i, item in enumerate(items))
        return AllOf(parts) if op == "$and" else AnyOf(parts)
    raise ValueError(
        f"{at}: unknown operator {op!r}; combine conditions with {', '.join(COMBINATIONS)} "
        f"and compare a key with {', '.join(COMPARISONS)}"
    )


def _parse_field(key: str, value: Any, at: str) -> list[Where]:
    if not isinstance(value, Mapping) or not any(isinstance(name, str) and name.startswith("$") for name in value):
        return [Compare(key, "$eq", value)]  # a plain value, or a dict value compared as a whole
    plain = [name for name in value if not (isinstance(name, str) and name.startswith("$"))]
    if plain:
        raise ValueError(
            f"{at}: mixes operators with plain keys ({', '.join(map(repr, plain))}); "
            f"use only operators ({', '.join(COMPARISONS)}), or {{'$eq': {{...}}}} to compare a whole dict"
        )
    return [_parse_comparison(key, op, operand, f"{at}[{op!r}]") for op, operand in value.items()]


def _parse_comparison(key: str, op: str, operand: Any, at: str) -> Compare:
    if op in ("$eq", "$ne"):
        return Compare(key, op, operand)
    if op in ("$in", "$nin"):
        if isinstance(operand, (str, bytes, Mapping)) or not isinstance(operand, Iterable):
            raise ValueError(f"{at}: {op} takes a list of values, got {operand!r}")
        return Compare(key, op, tuple(operand))
    if op in _ORDER:
        if not _orderable(operand):
            raise ValueError(
                f"{at}: {op} compares with a finite number or a string, got {operand!r} "
                "(float('inf') and float('-inf') are accepted as open bounds; NaN is not)"
            )
        return Compare(key, op, operand)
    if op in CONTAINMENT:
        return _parse_containment(key, op, operand, at)
    raise ValueError(
        f"{at}: unknown operator {op!r}; compare a key with {_KEY_OPERATORS} "
        f"and combine conditions with {', '.join(COMBINATIONS)}"
    )


def _parse_containment(key: str, op: str, operand: Any, at: str) -> Compare:
    if op in ("$any", "$all"):
        if isinstance(operand, (str, bytes, Mapping)) or not isinstance(operand, Iterable):
            raise ValueError(f"{at}: {op} takes a list of values, got {operand!r}")
        return Compare(key, op, tuple(operand))
    if op in ("$text_match", "$text_match_insensitive") and not isinstance(operand, str):
        raise ValueError(f"{at}: {op} takes a string to find in the value, got {operand!r}")
    if op == "$empty" and not isinstance(operand, bool):
        raise ValueError(f"{at}: $empty takes True (missing or empty) or False (has a value), got {operand!r}")
    return Compare(key, op, operand)


def is_empty(value: Any) -> bool:
    """What ``$empty`` calls empty: ``None``, ``""`` or ``[]`` (a missing key too)."""
    return value is None or value == "" or (isinstance(value, (list, tuple)) and not value)


def _holds(value: Any, op: str, operand: Any) -> bool:
    """A containment operator on a present value (see :data:`CONTAINMENT`)."""
    if op == "$empty":
        return is_empty(value) == operand
    if op in ("$text_match", "$text_match_insensitive"):
        if not isinstance(value, str):
            return False
        return operand in value if op == "$text_match" else operand.casefold() in value.casefold()
    if not isinstance(value, (list, tuple)):
        return False
    elements = {metadata_key(element) for element in value}
    if op == "$contains":
        return metadata_key(operand) in elements
    wanted = [metadata_key(element) for element in operand]
    return any(w in elements for w in wanted) if op == "$any" else all(w in elements for w in wanted)


def _orderable(value: Any) -> bool:
    """Numbers but NaN (not bools; infinities bound everything) and strings: what
    order operators compare."""
    kind = type(value)
    return kind is str or kind is int or (kind is float and not math.isnan(value))


# -- one leaf ----------------------------------------------------------------------------------


def satisfies(value: Any, op: str, operand: Any) -> bool:
    """Whether a present metadata ``value`` satisfies ``op`` with ``operand``.

    The rule for one value: JSON equality for ``$eq`` / ``$ne`` / ``$in`` /
    ``$nin``; number with number or string with string for the order operators
    (anything else fails them). Adapters that match values outside the tree (the
    LangGraph store's items) use it too, so both places agree.
    """
    if op == "$eq":
        return metadata_key(value) == metadata_key(operand)
    if op == "$ne":
        return metadata_key(value) != metadata_key(operand)
    if op == "$in":
        return metadata_key(value) in {metadata_key(item) for item in operand}
    if op == "$nin":
        return metadata_key(value) not in {metadata_key(item) for item in operand}
    if op in CONTAINMENT:
        return _holds(value, op, operand)
    compare = _ORDER.get(op)
    if compare is None:
        raise ValueError(f"unknown operator {op!r}; use one of: {_KEY_OPERATORS}")
    if not (_orderable(value) and _orderable(operand)) or (type(value) is str) != (type(operand) is str):
        return False
    return compare(value, operand)


def matches(metadata: Mapping[str, Any], where: Where | None) -> bool:
    """Whether a leaf with this metadata passes ``where`` (``None`` passes all)."""
    if where is None:
        return True
    if isinstance(where, Compare):
        if where.key not in metadata:
            return where.op in ("$ne", "$nin") or (where.op == "$empty" and where.operand is True)
        return satisfies(metadata[where.key], where.op, where.operand)
    if isinstance(where, AllOf):
        return all(matches(metadata, part) for part in where.parts)
    if isinstance(where, AnyOf):
        return any(matches(metadata, part) for part in where.parts)
    return not matches(metadata, where.part)


# -- many leaves -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Selection:
    """Leaves a ``where`` keeps: ``ids``, or every leaf *but* ``ids`` when ``negated``
    (so ``$ne`` on a rare value never lists nearly every leaf)."""

    ids: frozenset[str]
    negated: bool = False

    def __contains__(self, leaf_id: object) -> bool:
        """Membership for a *leaf* id (callers check that the node is a leaf)."""
        return (leaf_id in self.ids) != self.negated

    def __and__(self, other: Selection) -> Selection:
        if not self.negated and not other.negated:
            return Selection(self.ids & other.ids)
        if self.negated and other.negated:
            return Selection(self.ids | other.ids, negated=True)
        kept, dropped = (other, self) if self.negated else (self, other)
        return Selection(kept.ids - dropped.ids)

    def __or__(self, other: Selection) -> Selection:
        if not self.negated and not other.negated:
            return Selection(self.ids | other.ids)
        if self.negated and other.negated:
            return Selection(self.ids & other.ids, negated=True)
        kept, dropped = (other, self) if self.negated else (self, other)
        return Selection(dropped.ids - kept.ids, negated=True)

    def __invert__(self) -> Selection:
        return Selection(self.ids, negated=not self.negated)


class _Ordered:
    """One key's distinct finite numbers and strings, each list sorted."""

    def __init__(self, value_keys: Iterable[Hashable]) -> None:
        self.numbers: list[int | float] = []
        self.strings: list[str] = []
        for value_key in value_keys:
            self.add(value_key, insort=False)
        self.numbers.sort()
        self.strings.sort()

    def _list_of(self, value_key: Hashable) -> tuple[list[Any] | None, Any]:
        if type(value_key) is str:
            return self.strings, value_key
        if isinstance(value_key, tuple) and value_key[0] == "number":
            return self.numbers, value_key[1]
        return None, None

    def add(self, value_key: Hashable, *, insort: bool = True) -> None:
        values, value = self._list_of(value_key)
        if values is None:
            return
        if insort:
            bisect.insort(values, value)
        else:
            values.append(value)

    def remove(self, value_key: Hashable) -> None:
        values, value = self._list_of(value_key)
        if values is None:
            return
        position = bisect.bisect_left(values, value)
        if position < len(values) and values[position] == value:
            del values[position]

    def value_keys(self, op: str, operand: Any) -> list[Hashable]:
        """The keys of the stored values satisfying ``op`` (an order operator)."""
        if type(operand) is str:
            values: list[Any] = self.strings
            wrap: Callable[[Any], Hashable] = lambda value: value  # noqa: E731
        else:
            values = self.numbers
            wrap = lambda value: ("number", value)  # noqa: E731
        if op == "$gt":
            chosen = values[bisect.bisect_right(values, operand) :]
        elif op == "$gte":
            chosen = values[bisect.bisect_left(values, operand) :]
        elif op == "$lt":
            chosen = values[: bisect.bisect_left(values, operand)]
        else:
            chosen = values[: bisect.bisect_right(values, operand)]
        return [wrap(value) for value in chosen]


class MetadataIndex:
    """Leaf ids by metadata key and value, answering a :data:`Where` with set operations.

    Exact values (``$eq``, ``$in`` and their negations) are hash lookups; order
    operators bisect the key's sorted values, made on the first range query on that
    key and kept current from then on. Nothing scans every leaf.
    """

    def __init__(self) -> None:
        self._values: dict[str, dict[Hashable, set[str]]] = {}
        self._ordered: dict[str, _Ordered] = {}

    def add(self, leaf_id: str, metadata: Mapping[str, Any]) -> None:
        """File a leaf under each of its metadata (key, value) pairs."""
        for key, value in metadata.items():
            values = self._values.get(key)
            if values is None:
                values = self._values[key] = {}
            members = values.get(value_key := metadata_key(value))
            if members is None:
                values[value_key] = {leaf_id}
                ordered = self._ordered.get(key)
                if ordered is not None:
                    ordered.add(value_key)
            else:
                members.add(leaf_id)

    def remove(self, leaf_id: str, metadata: Mapping[str, Any]) -> None:
        """Take a leaf out (with the metadata it was filed under)."""
        for key, value in metadata.items():
            values = self._values.get(key, {})
            members = values.get(value_key := metadata_key(value))
            if members is None:
                continue
            members.discard(leaf_id)
            if not members:
                del values[value_key]
                ordered = self._ordered.get(key)
                if ordered is not None:
                    ordered.remove(value_key)

    def select(self, where: Where) -> Selection:
        """The leaves that pass ``where``."""
        if isinstance(where, AllOf):
            result = self.select(where.parts[0])
            for part in where.parts[1:]:
                if not result.negated and not result.ids:
                    break
                result = result & self.select(part)
            return result
        if isinstance(where, AnyOf):
            result = self.select(where.parts[0])
            for part in where.parts[1:]:
                result = result | self.select(part)
            return result
        if isinstance(where, NoneOf):
            return ~self.select(where.part)
        return self._compare(where)

    def _compare(self, where: Compare) -> Selection:
        values = self._values.get(where.key, {})
        op = where.op
        if op in ("$eq", "$ne"):
            found = frozenset(values.get(metadata_key(where.operand), ()))
            return Selection(found, negated=op == "$ne")
        if op in ("$in", "$nin"):
            return Selection(self._union(values, map(metadata_key, where.operand)), negated=op == "$nin")
        if op in CONTAINMENT:
            return self._containing(values, where)
        ordered = self._ordered.get(where.key)
        if ordered is None:
            ordered = _Ordered(values)
            self._ordered[where.key] = ordered  # one assignment: concurrent readers see all or nothing
        return Selection(self._union(values, ordered.value_keys(op, where.operand)))

    def _containing(self, values: Mapping[Hashable, set[str]], where: Compare) -> Selection:
        """A containment operator, by one pass over the key's distinct values.
        ``$empty: True`` also keeps leaves without the key: it is every leaf but
        those with a non-empty value."""
        if where.op == "$empty":
            filled = [value_key for value_key in values if not is_empty(_value_of(value_key))]
            return Selection(self._union(values, filled), negated=where.operand is True)
        chosen = [value_key for value_key in values if _holds(_value_of(value_key), where.op, where.operand)]
        return Selection(self._union(values, chosen))

    @staticmethod
    def _union(values: Mapping[Hashable, set[str]], value_keys: Iterable[Hashable]) -> frozenset[str]:
        groups = [values[value_key] for value_key in set(value_keys) if value_key in values]
        if len(groups) == 1:
            return frozenset(groups[0])
        return frozenset().union(*groups)


def _value_of(value_key: Hashable) -> Any:
    """The metadata value a :func:`metadata_key` stands for (equal values alike)."""
    if isinstance(value_key, str):
        return value_key
    assert isinstance(value_key, tuple)
    kind, payload = value_key
    return json.loads(payload) if kind == "json" else payload
