"""Tagged JSON: Python values plain JSON lacks, stored so they come back exactly.

A chat message may carry bytes (an image or audio block), datetimes or tuples
(in ``additional_kwargs``) and other values JSON has no type for; ``json`` would
refuse them and pydantic's JSON mode would turn them into strings for good. Here
each such value becomes a small object naming its type, ``{"$memtree": "bytes",
"value": "<base64>"}``, which :func:`untag` turns back into the value. The result
is plain JSON (no pickle: loading it never runs code). A dict whose keys JSON
cannot hold as they are (not all ``str``, or one named ``"$memtree"``) is tagged
too, as its list of pairs, so tags and user data can never be confused. Other
values (an enum, a path) are stored in pydantic's JSON form, as pydantic would
store them; only a value with no JSON form at all is refused.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Callable
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any
from uuid import UUID
from zoneinfo import ZoneInfo

from pydantic_core import PydanticSerializationError, to_jsonable_python

TAG = "$memtree"


def _b64(data: bytes | bytearray) -> str:
    return base64.b64encode(data).decode("ascii")


def _moment(value: datetime | time) -> str | list[Any]:
    """ISO text, plus the fold and time zone name when ISO text loses them."""
    zone = getattr(value.tzinfo, "key", None)  # a zoneinfo.ZoneInfo keeps its name, not just an offset
    if not value.fold and zone is None:
        return value.isoformat()
    return [value.isoformat(), value.fold, zone]


def _from_moment(kind: type[datetime] | type[time]) -> Callable[[Any], Any]:
    def decode(data: str | list[Any]) -> Any:
        if isinstance(data, str):
            return kind.fromisoformat(data)
        text, fold, zone = data
        value = kind.fromisoformat(text)
        return value.replace(fold=fold, tzinfo=ZoneInfo(zone) if zone is not None else value.tzinfo)

    return decode


# type name -> (type, to JSON, from JSON); order matters: datetime before date
_CODECS: dict[str, tuple[type, Callable[[Any], Any], Callable[[Any], Any]]] = {
    "bytes": (bytes, _b64, base64.b64decode),
    "bytearray": (bytearray, _b64, lambda text: bytearray(base64.b64decode(text))),
    "datetime": (datetime, _moment, _from_moment(datetime)),
    "date": (date, date.isoformat, date.fromisoformat),
    "time": (time, _moment, _from_moment(time)),
    "timedelta": (timedelta, lambda span: [span.days, span.seconds, span.microseconds], lambda v: timedelta(*v)),
    "uuid": (UUID, str, UUID),
    "decimal": (Decimal, str, Decimal),
    "float": (float, repr, float),  # only the non-finite ones: JSON has no nan or inf
}


class UntaggableError(TypeError):
    """A value that has no JSON form and no tag."""


def tag(value: Any) -> tuple[Any, bool]:
    """``value`` as plain JSON data, and whether any part of it needed a tag.

    Raises :class:`UntaggableError` naming the first value it cannot store."""
    tagged = False

    def walk(item: Any, where: str) -> Any:
        nonlocal tagged
        if item is None or isinstance(item, (str, bool, int)):
            return item
        if isinstance(item, float) and math.isfinite(item):
            return item
        if isinstance(item, dict):
            if all(isinstance(key, str) and key != TAG for key in item):
                return {key: walk(member, f"{where}.{key}") for key, member in item.items()}
            tagged = True
            pairs = [[walk(key, f"{where} key"), walk(member, f"{where}[{key!r}]")] for key, member in item.items()]
            return {TAG: "dict", "value": pairs}
        if isinstance(item, list):
            return [walk(member, f"{where}[{i}]") for i, member in enumerate(item)]
        if isinstance(item, (tuple, set, frozenset)):
            tagged = True
            members = [walk(member, f"{where}[{i}]") for i, member in enumerate(item)]
            name = "frozenset" if isinstance(item, frozenset) else "set" if isinstance(item, set) else "tuple"
            return {TAG: name, "value": members}
        for name, (kind, encode, _) in _CODECS.items():
            if isinstance(item, kind):
                tagged = True
                return {TAG: name, "value": encode(item)}
        try:  # an enum, a path...: stored as pydantic's JSON form of it, as it would be anyway
            return walk(to_jsonable_python(item), where)
        except PydanticSerializationError:
            raise UntaggableError(f"{type(item).__name__} at {where.lstrip('.') or 'top level'}") from None

    return walk(value, ""), tagged


def untag(value: Any) -> Any:
    """The values :func:`tag` was given, from its JSON data."""
    if isinstance(value, list):
        return [untag(member) for member in value]
    if not isinstance(value, dict):
        return value
    name = value.get(TAG)
    if name is None:
        return {key: untag(member) for key, member in value.items()}
    data = value["value"]
    if name == "dict":
        return {untag(key): untag(member) for key, member in data}
    if name in ("tuple", "set", "frozenset"):
        members = [untag(member) for member in data]
        return tuple(members) if name == "tuple" else set(members) if name == "set" else frozenset(members)
    return _CODECS[name][2](data)
