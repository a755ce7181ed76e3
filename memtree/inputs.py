"""Checks and conversions for what callers hand a memory (besides text, see ``text.py``)."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

from memtree.node import JSONDict
from memtree.text import require_text, unstorable

TimeLike = datetime | date | float | int | str
TTLLike = float | int | timedelta
"""A time to live: seconds, or a ``timedelta``."""


def to_timestamp(value: TimeLike | None, what: str = "timestamp") -> float | None:
    """POSIX seconds from a datetime (naive means UTC), a date, a number or an ISO 8601 string."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise TypeError(f"{what} must be a datetime, date, number or ISO 8601 string, got bool")
    if isinstance(value, datetime):
        moment = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
        return check_seconds(moment.timestamp(), what, value)
    if isinstance(value, date):
        return datetime(value.year, value.month, value.day, tzinfo=UTC).timestamp()
    if isinstance(value, (int, float)):
        if not math.isfinite(value):
            raise ValueError(f"{what} must be finite, got {value}")
        return check_seconds(float(value), what, value)
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(f"{what} {value!r} is not an ISO 8601 date or datetime") from None
        return to_timestamp(parsed, what)
    raise TypeError(f"{what} must be a datetime, date, number or ISO 8601 string, got {type(value).__name__}")


_EARLIEST = datetime.min.replace(tzinfo=UTC).timestamp()
_LATEST = datetime.max.replace(tzinfo=UTC).timestamp()


def check_seconds(seconds: float, what: str = "timestamp", given: object = None) -> float:
    """``seconds`` if it is a time Python can show as a date (UTC years 1 to 9999),
    else a ``ValueError`` naming it (and saying when it looks like milliseconds).

    A stored time outside that range could never be shown as a date, so it is
    refused where it comes in, not found later by every reader.
    """
    if _EARLIEST <= seconds <= _LATEST:
        return seconds
    shown = seconds if given is None else given
    hint = ""
    if _EARLIEST <= seconds / 1000 <= _LATEST:
        hint = "; it looks like milliseconds since the epoch: divide it by 1000 (POSIX seconds are expected)"
    raise ValueError(f"{what} {shown!r} is outside the dates Python can represent (years 1 to 9999 UTC){hint}")


def to_time_range(
    time_range: tuple[TimeLike | None, TimeLike | None] | None,
) -> tuple[float | None, float | None] | None:
    """Normalize ``(start, end)``; either side may be ``None`` (open)."""
    if time_range is None:
        return None
    if not isinstance(time_range, (tuple, list)) or len(time_range) != 2:
        raise TypeError("time_range must be a (start, end) pair; use None for an open side")
    start = to_timestamp(time_range[0], "time_range start")
    end = to_timestamp(time_range[1], "time_range end")
    if start is not None and end is not None and start > end:
        raise ValueError(f"time_range starts after it ends ({time_range[0]!r} > {time_range[1]!r})")
    return start, end


MAX_METADATA_DEPTH = 64
"""How deeply metadata may nest: JSON readers recurse, so deeper is refused up front."""


def to_metadata(metadata: Mapping[str, Any] | None) -> JSONDict:
    """A detached JSON-safe copy of caller metadata (``TypeError`` if it is not JSON)."""
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        raise TypeError(f"metadata must be a dict, got {type(metadata).__name__}")
    for key in metadata:
        if not isinstance(key, str):
            raise TypeError(f"metadata keys must be str, got {type(key).__name__} {key!r}")
    if _too_deep(metadata):
        raise ValueError(f"metadata nests more than {MAX_METADATA_DEPTH} levels of dicts and lists; flatten it")
    try:
        encoded = json.dumps(dict(metadata), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise TypeError(f"metadata must be JSON-serializable: {error}") from None
    problem = unstorable(metadata)
    if problem:
        raise ValueError(f"metadata {problem}; remove it before storing")
    return json.loads(encoded)  # type: ignore[no-any-return]


def _too_deep(value: object) -> bool:
    """Whether ``value`` nests dicts and lists more than ``MAX_METADATA_DEPTH`` deep
    (measured without recursion, so any depth, or a cycle, is caught)."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (Mapping, list, tuple)):
            if depth > MAX_METADATA_DEPTH:
                return True
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, Mapping) else item))
    return False


def to_min_score(value: object, name: str = "min_score") -> float:
    """A caller's ``min_score`` (or another score floor, ``name``) as a float; NaN
    would silently keep everything."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    if math.isnan(value):
        raise ValueError(f"{name} is NaN, which no score can be compared with; pass a number or None")
    return float(value)


MIN_TTL_SECONDS = 0.001
"""The shortest time to live accepted. A shorter one stores a memory that has
expired before its write commits (``1e-300`` added to the clock does not even move
it), so it is refused like zero."""


def ttl_seconds(
    value: object,
    what: str = "ttl",
    *,
    unit: str = "seconds",
    seconds_per_unit: float = 1.0,
    shortest: float = MIN_TTL_SECONDS,
    longest: float | None = None,
) -> float:
    """A time to live, checked, in seconds: every TTL memtree accepts goes through
    here (``add``, ``add_many``, ``replace_source``, ``set_expiry``,
    ``MemTreeConfig(default_ttl=)``, the LangGraph store's ``ttl`` and ``TTLConfig``,
    which count in minutes: ``unit="minutes", seconds_per_unit=60``).

    ``value`` is a number of ``unit`` or a ``timedelta``. Refused, naming ``what``
    and what is allowed: anything else, NaN, infinity, zero or less, less than
    ``shortest`` seconds (a memory expired before it is stored) and more than
    ``longest`` seconds (default: what is left until the end of the year 9999 UTC,
    the bound of ``expires_at``: a later expiry cannot be stored as a date, and a
    backup holding one could not be restored)."""
    if longest is None:
        longest = _LATEST - time.time()
    allowed = (
        f"a number of {unit} from {_amount(shortest / seconds_per_unit)} to "
        f"{_amount(longest / seconds_per_unit)} (or None: never expire)"
    )
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, bool) or not isinstance(value, (int, float)):
        kinds = f"a number of {unit}" + (" or a datetime.timedelta" if unit == "seconds" else "")
        raise TypeError(f"{what} must be {kinds}, got {type(value).__name__} {value!r}")
    else:
        try:
            seconds = float(value) * seconds_per_unit
        except OverflowError:  # an int beyond float range (10**400): far too long
            seconds = math.inf if value > 0 else -math.inf
    if math.isnan(seconds):
        raise ValueError(f"{what} is NaN; pass {allowed}")
    if isinstance(value, float) and math.isinf(value) and value > 0:
        raise ValueError(f"{what} is infinite; pass None for a memory that never expires")
    if seconds <= 0:
        raise ValueError(f"{what} must be a positive number of {unit}, got {value!r}; pass {allowed}")
    if seconds < shortest:
        raise ValueError(f"{what} {value!r} is too short: the memory would expire before it is stored; pass {allowed}")
    if seconds > longest:
        raise ValueError(f"{what} {_shown(value)} is too long: it would expire after the year 9999; pass {allowed}")
    return seconds


def _amount(number: float) -> str:
    return f"{number:g}" if number < 1e6 else f"{number:.3g}"


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:20] + "…"


def to_ttl(value: object, what: str = "ttl") -> float:
    """A time to live in seconds (a number of seconds or a ``timedelta``), checked by
    :func:`ttl_seconds`: an expiry nobody meant must not be stored."""
    return ttl_seconds(value, what)


def expiry_of(
    ttl: object = None, expires_at: TimeLike | None = None, default_ttl: TTLLike | None = None
) -> float | None:
    """When a new memory expires (POSIX seconds), from a caller's ``ttl`` or
    ``expires_at`` (at most one of them), else the config's ``default_ttl``;
    ``None``: never. An ``expires_at`` already past is refused, like a zero ``ttl``."""
    if ttl is not None and expires_at is not None:
        raise ValueError("pass ttl (seconds from now) or expires_at (a moment), not both")
    now = time.time()
    if expires_at is not None:
        moment = to_timestamp(expires_at, "expires_at")
        assert moment is not None
        if moment <= now:
            raise ValueError(f"expires_at {expires_at!r} has already passed; pass a future moment")
        return moment
    if ttl is not None:
        return now + to_ttl(ttl)
    if default_ttl is not None:
        return now + to_ttl(default_ttl, "default_ttl")
    return None


@dataclass(frozen=True)
class Item:
    """One text to remember, checked. ``expires_at``: when it expires (``None``: never)."""

    text: str
    metadata: JSONDict
    timestamp: float | None
    source_id: str | None
    expires_at: float | None = None


def make_item(
    text: object,
    metadata: Mapping[str, Any] | None = None,
    timestamp: TimeLike | None = None,
    source_id: object = None,
    expires_at: float | None = None,
) -> Item:
    if source_id is not None and not isinstance(source_id, str):
        raise TypeError(f"source_id must be a str, got {type(source_id).__name__}")
    if isinstance(source_id, str):
        problem = unstorable(source_id)
        if problem:
            raise ValueError(f"source_id {problem}; remove it before storing")
    return Item(require_text(text), to_metadata(metadata), to_timestamp(timestamp), source_id, expires_at)
