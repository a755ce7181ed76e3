"""Time expressions in a query ("in May 2023", "last week", "on 9 June", "3 days
ago"), resolved to a time range against a reference time.

Every leaf has the time its event happened (``timestamp``), but a question's own
words say nothing to a ranking by meaning and words: "What did we talk about on
9 June?" shares no word with the turns of that day. LongMemEval narrows retrieval to
the range a question names and gains 6.8-11.3% recall on temporal questions; here
``retrieve`` ranks the leaves inside the range higher (:mod:`memtree.retrieval`),
and ``overview`` reads only them.

**Finding** the expressions is a handful of regular expressions for what dates look
like in English questions: a day, month and year in either order, an ISO date, a
month and year, a day and month, a month after a preposition ("in May": "may" alone
is a verb), a weekday after "on", "N days/weeks/months/years ago", "last/this/next
week" and "yesterday"/"today". dateparser's own search (``search_dates``) was tried
first and read "we" as Wednesday and "before August 3, 2023" as three dates.
**Resolving** each is `dateparser <https://dateparser.readthedocs.io>`_'s (English
only, offline, no downloads; imported on first use): its date and how wide it is
(a day, a week, a month, a year) give the range: "in July 2023" is all of July, "last
week" the Monday-to-Sunday week seven days before the reference, "yesterday" that
day. A word before an expression opens one side: "before 9 June" ends with that day,
"since May" starts with May. Several expressions give the range covering them all;
a relative one beside a date ("last Friday on 23 January, 2022") counts from the
date, so the dates alone say when.

A query with no digit, month, weekday or relative time word is not parsed at all
(:func:`might_name_a_time`): it costs nothing and ranks exactly as without this
module. The first query that is parsed loads dateparser (about 0.6 s).
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from memtree.inputs import TimeLike, to_timestamp

_MONTH = (
    r"(?:january|february|march|april|may|june|july|august|september|october|november|december"
    r"|jan|feb|mar|apr|jun|jul|aug|sept|sep|oct|nov|dec)\.?"
)
_WEEKDAY = r"(?:monday|tuesday|wednesday|thursday|friday|saturday|sunday)"
_DAY = r"\d{1,2}(?:st|nd|rd|th)?"
_YEAR = r"(?:1[89]|2\d)\d{2}"
_COUNT = r"(?:\d+|an?|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|a few|a couple of|several)"
_UNIT = r"(?:day|week|weekend|month|year)s?"
_PREPOSITION = r"(?:in|on|during|since|until|till|before|after|by|of|from|early|late|mid|around|throughout|between)"
_EXPRESSIONS = (
    rf"(?:{_PREPOSITION}\s+)?{_DAY}\s+(?:of\s+)?{_MONTH},?\s+{_YEAR}",  # (on) 8 May, 2023
    rf"(?:{_PREPOSITION}\s+)?{_MONTH}\s+{_DAY},?\s+{_YEAR}",  # (on) May 8, 2023
    r"\d{4}-\d{2}-\d{2}",  # 2023-05-08
    rf"(?:{_PREPOSITION}\s+)?(?:the\s+)?{_MONTH},?\s+{_YEAR}",  # (in) May 2023
    rf"(?:{_PREPOSITION}\s+)?{_DAY}\s+(?:of\s+)?{_MONTH}\b",  # (on) 8 May
    rf"(?:{_PREPOSITION}\s+)?{_MONTH}\s+{_DAY}\b(?!\s*[,:]?\s*\d)",  # (on) May 8
    rf"{_COUNT}\s+{_UNIT}\s+ago",  # 3 weeks ago
    rf"(?:last|past|previous|this|next)\s+(?:{_UNIT}|{_WEEKDAY})\b",  # last week, last Friday
    r"yesterday|today|tonight|tomorrow",
    rf"{_PREPOSITION}\s+(?:the\s+)?{_MONTH}\b(?![,.]?\s*\d)",  # in May (not "in May 2023": that is above)
    rf"on\s+{_WEEKDAY}\b",  # on Friday
    rf"(?:{_PREPOSITION}\s+)?{_YEAR}\b",  # (in) 2023
)
_FINDER = re.compile(r"\b(?:" + "|".join(_EXPRESSIONS) + r")", re.IGNORECASE)
_MAYBE = re.compile(
    rf"\d|\b(?:{_MONTH}|{_WEEKDAY}|yesterday|today|tonight|tomorrow|ago|last|past|previous|this|next)\b",
    re.IGNORECASE,
)
_ABSOLUTE = re.compile(rf"\b(?:{_MONTH}|{_YEAR})\b|\d{{4}}-\d{{2}}", re.IGNORECASE)
_OPEN_BEFORE = re.compile(r"\b(?:before|until|till|by|prior to|up to)\s*$", re.IGNORECASE)
_OPEN_AFTER = re.compile(r"\b(?:after|since|from)\s*$", re.IGNORECASE)
_LEADING = re.compile(rf"^(?:{_PREPOSITION}\s+)?(?:the\s+)?", re.IGNORECASE)


@dataclass(frozen=True)
class TimeSpan:
    """A range of event times a query names: POSIX seconds, both ends inclusive,
    ``None`` for an open side; ``text`` is what the query wrote."""

    start: float | None
    end: float | None
    text: str

    @property
    def as_range(self) -> tuple[float | None, float | None]:
        """``(start, end)`` as ``retrieve(time_range=...)`` takes it."""
        return (self.start, self.end)


def might_name_a_time(query: str) -> bool:
    """Whether ``query`` has anything a time expression is made of (a digit, a month
    or weekday name, a relative word); ``False`` means it names no time."""
    return _MAYBE.search(query) is not None


def time_span(query: str, now: TimeLike | None = None) -> TimeSpan | None:
    """The time range ``query`` names, resolved against ``now`` (default: the
    current time; relative expressions such as "last week" count back from it), or
    ``None`` when it names none. Example::

        time_span("What did we talk about in May 2023?")  # 1 May 2023 to 31 May 2023, 23:59:59
    """
    if not might_name_a_time(query):
        return None
    reference = _reference(now)
    found = [span for span in _spans(query, reference) if span is not None]
    # "last Friday on 23 January, 2022": a relative expression beside a date counts from
    # that date, not from now; the dates alone say when.
    spans = [span for span, absolute in found if absolute] or [span for span, _ in found]
    if not spans:
        return None
    starts = [span.start for span in spans]
    ends = [span.end for span in spans]
    return TimeSpan(
        None if any(s is None for s in starts) else min(s for s in starts if s is not None),
        None if any(e is None for e in ends) else max(e for e in ends if e is not None),
        " … ".join(span.text for span in spans),
    )


def _reference(now: TimeLike | None) -> datetime:
    seconds = to_timestamp(now, "now") if now is not None else datetime.now(UTC).timestamp()
    assert seconds is not None
    return datetime.fromtimestamp(seconds, tz=UTC).replace(tzinfo=None)


def _spans(query: str, reference: datetime) -> list[tuple[TimeSpan, bool] | None]:
    """Each expression's span, and whether it is absolute (names a month or a year)."""
    spans: list[tuple[TimeSpan, bool] | None] = []
    for match in _FINDER.finditer(query):
        text = match.group(0)
        lead = _LEADING.match(text)
        cut = lead.end() if lead else 0  # "since March": "since" opens a side, "March" is the time
        span = _span_of(text[cut:], query[: match.start()] + text[:cut], reference)
        spans.append(None if span is None else (span, bool(_ABSOLUTE.search(text[cut:]))))
    return spans


def _span_of(text: str, before: str, reference: datetime) -> TimeSpan | None:
    wording = re.sub(r"weekend", "week", text.strip(), flags=re.IGNORECASE)
    parsed = _parser(reference).get_date_data(wording)
    moment, period = parsed.date_obj, parsed.period
    if moment is None:
        return None
    start, end = _bounds(moment.replace(tzinfo=None), period or "day")
    first = start.replace(tzinfo=UTC).timestamp()
    last = end.replace(tzinfo=UTC).timestamp() - 0.001
    if _OPEN_BEFORE.search(before):
        return TimeSpan(None, last, f"{before.split()[-1]} {text}")  # the day named is inside
    if _OPEN_AFTER.search(before):
        return TimeSpan(first, None, f"{before.split()[-1]} {text}")
    return TimeSpan(first, last, text)


def _bounds(moment: datetime, period: str) -> tuple[datetime, datetime]:
    """The calendar day, week (Monday first), month or year holding ``moment``."""
    day = moment.replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "week":
        start = day - timedelta(days=day.weekday())
        return start, start + timedelta(days=7)
    if period == "month":
        start = day.replace(day=1)
        return start, (start + timedelta(days=32)).replace(day=1)
    if period == "year":
        start = day.replace(month=1, day=1)
        return start, start.replace(year=start.year + 1)
    return day, day + timedelta(days=1)


_LOCK = threading.Lock()
_PARSERS: dict[datetime, Any] = {}


def _settings(reference: datetime) -> dict[str, Any]:
    return {"RELATIVE_BASE": reference, "PREFER_DATES_FROM": "past", "RETURN_AS_TIMEZONE_AWARE": False}


def _parser(reference: datetime) -> Any:
    """A dateparser ``DateDataParser`` for English, resolving against ``reference``
    (imported on first use: most queries never need it)."""
    from dateparser.date import DateDataParser

    with _LOCK:
        parser = _PARSERS.get(reference)
        if parser is None:
            if len(_PARSERS) > 64:
                _PARSERS.clear()
            parser = _PARSERS[reference] = DateDataParser(languages=["en"], settings=_settings(reference))
        return parser
