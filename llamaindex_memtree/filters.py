"""LlamaIndex ``MetadataFilters`` as the engine's filters.

Conditions become the engine's ``where`` (:mod:`memtree.where`) one to one:
every ``FilterOperator`` LlamaIndex has (``==``, ``!=``, ``>``, ``>=``, ``<``,
``<=``, ``in``, ``nin``, ``any``, ``all``, ``contains``, ``text_match``,
``text_match_insensitive``, ``is_empty``) on a metadata key, joined by ``AND``,
``OR`` or ``NOT`` (none of them), nested as deep as LlamaIndex nests them, with
the meaning LlamaIndex's own ``SimpleVectorStore`` gives them. The engine
evaluates them on its metadata index; nothing is filtered here. An operator a
later LlamaIndex adds raises :class:`UnsupportedFilterError` naming those.

Conditions on the index's ``timestamp_key`` mean the event time, not the raw
metadata value: at the top level of an ``AND`` they become the engine's
``time_range`` (which also keeps summaries, whose event time is their latest
leaf's), compared as times, whatever the format of the values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from llama_index.core.vector_stores.types import FilterCondition, FilterOperator, MetadataFilter, MetadataFilters

from memtree.inputs import to_timestamp
from memtree.where import parse_where

OPERATORS: dict[FilterOperator, str] = {
    FilterOperator.EQ: "$eq",
    FilterOperator.NE: "$ne",
    FilterOperator.GT: "$gt",
    FilterOperator.GTE: "$gte",
    FilterOperator.LT: "$lt",
    FilterOperator.LTE: "$lte",
    FilterOperator.IN: "$in",
    FilterOperator.NIN: "$nin",
    FilterOperator.ANY: "$any",
    FilterOperator.ALL: "$all",
    FilterOperator.CONTAINS: "$contains",
    FilterOperator.TEXT_MATCH: "$text_match",
    FilterOperator.TEXT_MATCH_INSENSITIVE: "$text_match_insensitive",
    FilterOperator.IS_EMPTY: "$empty",
}
"""LlamaIndex's operators the engine applies, and their ``where`` names."""


class UnsupportedFilterError(ValueError):
    """A ``MetadataFilter`` operator memtree does not apply (one added to LlamaIndex
    after this adapter); the message lists those it does."""


_TIME_OPERATORS = (FilterOperator.EQ, FilterOperator.GT, FilterOperator.GTE, FilterOperator.LT, FilterOperator.LTE)

TimeRange = tuple[float | None, float | None]


@dataclass(frozen=True)
class EngineFilters:
    """What ``MemTree.retrieve`` takes for one ``MetadataFilters``: ``where`` (``None``:
    no metadata condition), ``time_range`` (``None``: any time) and ``empty`` when
    the time conditions contradict each other (nothing can match)."""

    where: dict[str, Any] | None = None
    time_range: TimeRange | None = None
    empty: bool = False


def translate_filters(filters: MetadataFilters | None, timestamp_key: str | None = None) -> EngineFilters:
    """The engine's filters for LlamaIndex ``filters``.

    Raises :class:`UnsupportedFilterError` naming an operator the engine does not
    apply (none of LlamaIndex's today), ``ValueError`` for a value of the wrong kind, or a
    condition on ``timestamp_key`` that cannot become a time range (under ``OR`` /
    ``NOT`` or a nested group, or with ``!=`` / ``in`` / ``nin``).

    Example::

        translate_filters(MetadataFilters(filters=[
            MetadataFilter(key="age", value=30, operator=FilterOperator.GTE),
            MetadataFilter(key="tag", value=["a", "b"], operator=FilterOperator.IN),
        ]))  # EngineFilters(where={"$and": [{"age": {"$gte": 30}}, {"tag": {"$in": ["a", "b"]}}]})
    """
    if filters is None:
        return EngineFilters()
    if not isinstance(filters, MetadataFilters):
        raise TypeError(f"filters must be llama_index MetadataFilters, got {type(filters).__name__}")
    start: float | None = None
    end: float | None = None
    conditions = list(filters.filters)
    if _condition(filters) == FilterCondition.AND and timestamp_key is not None:
        timed = [f for f in conditions if isinstance(f, MetadataFilter) and f.key == timestamp_key]
        conditions = [f for f in conditions if not (isinstance(f, MetadataFilter) and f.key == timestamp_key)]
        for condition in timed:
            start, end = _narrowed(start, end, condition)
    rest = MetadataFilters(filters=conditions, condition=filters.condition)
    where = _where(rest, timestamp_key) if conditions else None
    if where is not None:
        try:
            parse_where(where)
        except (TypeError, ValueError) as error:
            raise ValueError(f"metadata filters: {error}") from None
    time_range = (start, end) if start is not None or end is not None else None
    return EngineFilters(where, time_range, empty=start is not None and end is not None and start > end)


def narrowed_time_range(first: TimeRange | None, second: TimeRange | None) -> TimeRange | None:
    """Both ranges at once (either may be ``None``: any time); may come back empty
    (start after end)."""
    if first is None or second is None:
        return first if second is None else second
    starts = [value for value in (first[0], second[0]) if value is not None]
    ends = [value for value in (first[1], second[1]) if value is not None]
    return (max(starts) if starts else None, min(ends) if ends else None)


def _condition(filters: MetadataFilters) -> FilterCondition:
    return filters.condition or FilterCondition.AND


def _where(filters: MetadataFilters, timestamp_key: str | None) -> dict[str, Any]:
    parts = [_part(item, timestamp_key) for item in filters.filters]
    condition = _condition(filters)
    if condition == FilterCondition.NOT:
        return {"$not": parts[0] if len(parts) == 1 else {"$or": parts}}
    if len(parts) == 1:
        return parts[0]
    return {"$or": parts} if condition == FilterCondition.OR else {"$and": parts}


def _part(item: MetadataFilter | MetadataFilters, timestamp_key: str | None) -> dict[str, Any]:
    if isinstance(item, MetadataFilters):
        if not item.filters:
            raise ValueError("metadata filters: an empty nested MetadataFilters matches nothing; remove it")
        return _where(item, timestamp_key)
    if timestamp_key is not None and item.key == timestamp_key:
        raise ValueError(
            f"a filter on the event time ({timestamp_key!r}) can only be a top-level condition joined by AND "
            "(it becomes the retriever's time_range); move it out of the OR / NOT group, or pass time_range="
        )
    op = OPERATORS.get(item.operator)
    if op is None:
        raise UnsupportedFilterError(
            f"memtree filters support the operators {', '.join(repr(known.value) for known in OPERATORS)}; "
            f"got {item.operator.value!r} for key {item.key!r}"
        )
    if item.operator == FilterOperator.IS_EMPTY:
        return {item.key: {op: True}}  # LlamaIndex's is_empty takes no value
    return {item.key: {op: item.value}}


def _narrowed(start: float | None, end: float | None, condition: MetadataFilter) -> tuple[float | None, float | None]:
    """``(start, end)`` narrowed by one condition on the event time (inclusive bounds:
    a strict one moves to the next representable time)."""
    if condition.operator not in _TIME_OPERATORS:
        names = ", ".join(repr(op.value) for op in _TIME_OPERATORS)
        raise ValueError(
            f"a filter on the event time ({condition.key!r}) takes {names}; got {condition.operator.value!r}"
        )
    moment = to_timestamp(condition.value, f"the filter on {condition.key!r}")  # type: ignore[arg-type]
    if moment is None:
        raise ValueError(f"the filter on {condition.key!r} needs a time, got None")
    low: float | None = None
    high: float | None = None
    if condition.operator in (FilterOperator.EQ, FilterOperator.GTE):
        low = moment
    if condition.operator in (FilterOperator.EQ, FilterOperator.LTE):
        high = moment
    if condition.operator == FilterOperator.GT:
        low = math.nextafter(moment, math.inf)
    if condition.operator == FilterOperator.LT:
        high = math.nextafter(moment, -math.inf)
    narrowed = narrowed_time_range((start, end), (low, high))
    assert narrowed is not None
    return narrowed
