"""What a query asks for: an overview of part of the memory, or a lookup.

"What do you know about Caroline?", "Summarise my trip to Japan", "Recap our chat
on 9 June", "What happened in July?" and "What did Caroline and Melanie talk about
on 8 May 2023?" name a part of the memory (a person, a topic, a time span), not a
fact; ``retrieve`` answers them with :meth:`MemTree.overview
<memtree.tree.MemTree.overview>` when ``route_overviews`` is on (the default). Every
other query is a lookup, ranked as before.

The request's subject becomes ``about`` (the words after "about", "summarise",
"recap", "happened to/with"; "we", "you", "me" and "our chat" mean everything), and
its time expression the time range (:mod:`memtree.time_expressions`). Only English
phrasings are recognised; a query in another language is a lookup.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from memtree.config import MemTreeConfig
from memtree.inputs import TimeLike
from memtree.state import TreeState
from memtree.time_expressions import TimeSpan, time_span

_POLITE = (
    r"(?:(?:hey|hi|ok|okay|so|please|now)[,!]?\s+)*"
    r"(?:(?:can|could|would|will) you\s+(?:please\s+)?)?(?:please\s+)?"
)
_PATTERNS = tuple(
    re.compile(_POLITE + pattern, re.IGNORECASE | re.DOTALL)
    for pattern in (
        r"what\s+(?:else\s+)?(?:do|did|does)\s+(?:you|we|i)\s+(?:know|remember|recall|have)\s+(?:about|on|of)\s+(?P<about>.+)",
        r"what\s+(?:is|'s)\s+(?:known|remembered)\s+about\s+(?P<about>.+)",
        r"tell\s+me\s+(?:(?:everything|all|what\s+you\s+know|what\s+you\s+remember|more)\s+)?about\s+(?P<about>.+)",
        r"(?:give\s+me\s+|write\s+|make\s+)?(?:an?\s+)?(?:summary|recap|overview|rundown)\s+of\s+(?P<about>.+)",
        r"(?:summari[sz]e|recap|review|go\s+over)\s+(?P<about>.+)",
        r"what\s+(?:has\s+)?(?:happened|went\s+on|was\s+going\s+on)\s*(?P<about>.*)",
        r"what\s+(?:did|have|do)\s+(?P<who>.+?)\s+(?:talked|talk|chatted|chat|spoken|speak|discussed|discuss)\b(?:\s+about\b)?(?P<about>.*)",
    )
)
_GENERIC = re.compile(
    r"^(?:(?:to|with|for|in|on|during|about|of|at|from|between)\s+)*"
    r"(?:(?:we|us|you|me|i|our|my|the|everything|all|it|that|this|so\s+far|"
    r"(?:our|the|my|this|that|last|latest|previous|recent)\s+(?:chats?|conversations?|sessions?|talks?|discussions?|"
    r"messages?|memor(?:y|ies)))\s*)*$",
    re.IGNORECASE,
)
_LATEST = re.compile(
    r"\b(?:last|latest|previous|most\s+recent|recent)\s+(?:chat|conversation|session|talk|discussion)s?\b",
    re.IGNORECASE,
)
_EDGE = re.compile(
    r"^(?:(?:to|with|for|in|on|during|about|of|at|from|and|between)\s+)+|^between$|[\s?.!,;:]+$"
    r"|\s+(?:in|on|during|of|at|from|since|before|after|by|until|between|and|the)$",
    re.IGNORECASE,
)
_PEOPLE = re.compile(r"^(?:we|you|i|you\s+and\s+i|i\s+and\s+you|you\s+and\s+me|us)$", re.IGNORECASE)


@dataclass(frozen=True)
class OverviewRequest:
    """An overview request: what it is ``about`` (``None``: everything) and the time
    range it names (``None``: all time)."""

    about: str | None
    span: TimeSpan | None
    latest: bool = False
    """It asks for the latest conversation ("recap our last chat"): the latest day
    with memories, when it names no time."""


def overview_request(query: str, now: TimeLike | None = None) -> OverviewRequest | None:
    """The overview ``query`` asks for, or ``None`` when it is a lookup. Relative
    times ("last week") count back from ``now`` (default: the current time)."""
    text = query.strip()
    for pattern in _PATTERNS:
        match = pattern.fullmatch(text)
        if match is None:
            continue
        span = time_span(text, now)
        about = match.group("about") or ""
        who = match.groupdict().get("who")
        if who is not None and not _PEOPLE.match(who.strip()):
            if _subject(about, span) is not None:
                return None  # "What did Calvin discuss with the artist he met?" asks a fact
            about = who  # "What did Caroline and Melanie talk about on 8 May?": the two, that day
        return OverviewRequest(_subject(about, span), span, _LATEST.search(text) is not None)
    return None


def _subject(about: str, span: TimeSpan | None) -> str | None:
    """``about`` without the time expression, the edge prepositions and the words
    that mean everything ("our chat", "we", "me")."""
    if span is not None:
        for piece in span.text.split(" … "):
            about = re.sub(re.escape(piece), " ", about, flags=re.IGNORECASE)
    about = re.sub(r"\s+", " ", about).strip()
    previous = None
    while previous != about:
        previous, about = about, _EDGE.sub("", about).strip()
    if not about or _GENERIC.match(about):
        return None
    return about


ALWAYS = "always"
"""``route_overviews="always"``: every query is answered by an overview of it (a
question that is no overview request is its own ``about``), the adapters'
overview mode."""


def routed_overview(
    config: MemTreeConfig, query: str, options: Mapping[str, Any], state: TreeState | None = None
) -> dict[str, Any] | None:
    """``MemTree.overview``'s arguments for a ``retrieve`` call (its ``options``) whose
    query is an overview request, when routing is on (``route_overviews``, default
    ``config.route_overviews``; ``"always"``: every query); else ``None``. A
    ``time_range`` the caller gives wins over the query's own, and a request for the
    latest conversation reads the latest day of ``state``'s memories; ``k`` caps the
    parts only when no token budget is given (an overview's parts are as many as its
    budget holds)."""
    route = options.get("route_overviews")
    enabled = config.route_overviews if route is None else route
    if not isinstance(enabled, bool) and enabled != ALWAYS:
        raise TypeError(f"route_overviews must be True, False, 'always' or None (the config's), got {route!r}")
    now = options.get("now")
    request = overview_request(query, now) if enabled else None
    if request is None and enabled == ALWAYS:
        request = OverviewRequest(query, time_span(query, now))
    if request is None:
        return None
    given = options.get("time_range")
    since, until = given if given is not None else (request.span.as_range if request.span else (None, None))
    if request.latest and given is None and request.span is None and state is not None:
        since, until = _latest_day(state)
    budget = options.get("token_budget") or config.token_budget
    return {
        "about": request.about,
        "since": since,
        "until": until,
        "token_budget": budget,
        "k": None if budget is not None else options.get("k"),
        "where": options.get("where"),
    }


def _latest_day(state: TreeState) -> tuple[float | None, float | None]:
    """The first and last second (UTC) of the calendar day of the latest dated leaf."""
    stamps = [node.timestamp for node in state.nodes.values() if node.is_leaf and node.timestamp is not None]
    if not stamps:
        return None, None
    day = datetime.fromtimestamp(max(stamps), tz=UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return day.timestamp(), day.timestamp() + 86400 - 0.001
