"""The overview benchmark's questions, built without a model from LoCoMo's annotations.

LoCoMo ships three annotations the memory under test never sees: ``observation``
(facts per session and speaker, each with the turn it rests on), ``session_summary``
and ``event_summary`` (dated events per session and speaker). From them, four
families of questions whose gold is a set of facts (:class:`~memtree_bench.coverage.Fact`):

* ``person``: "What do you know about {speaker}?"; gold: every observation of that
  speaker.
* ``day``: "What did {a} and {b} talk about on {session date}?"; gold: the
  observations and events of the sessions held that day.
* ``month``: "What happened to {speaker} in {month}?"; gold: that speaker's
  observations and events in the sessions of that month.
* ``multi-hop``: LoCoMo's own category 1 questions; gold: one fact per evidence
  turn, worded as the observations that cite the turn (so a summary that restates
  one counts, by the rule of :mod:`memtree_bench.coverage`).

Every builder works from any file in LoCoMo's schema: a conversation without
observations or events gets no question of the families that need them, and
evidence ids are read as :mod:`memtree_bench.locomo` reads them (``D\\d+:\\d+``,
leading zeros dropped, ids of no turn dropped).

Each question also names its **scope** (a speaker, a time span) for the floor that
every method must clear: a seeded random sample of the turns in that scope.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from memtree_bench.coverage import Fact
from memtree_bench.locomo import Conversation, Turn, conversation_of

FAMILIES: tuple[str, ...] = ("person", "day", "month", "multi-hop")
"""The question families, in report order."""

_EVIDENCE = re.compile(r"D(\d+):(\d+)")
_SESSION = re.compile(r"(\d+)")


@dataclass(frozen=True)
class Scope:
    """What a question is about, for the random floor: a speaker's turns, the turns
    in ``[start, end)`` (POSIX seconds), or both; neither: every turn."""

    speaker: str | None = None
    start: float | None = None
    end: float | None = None

    def holds(self, turn: Turn) -> bool:
        if self.speaker is not None and turn.speaker != self.speaker:
            return False
        if self.start is not None and (turn.timestamp is None or turn.timestamp < self.start):
            return False
        return not (self.end is not None and (turn.timestamp is None or turn.timestamp >= self.end))


@dataclass(frozen=True)
class OverviewQuestion:
    family: str
    question: str
    facts: tuple[Fact, ...]
    scope: Scope = field(default_factory=Scope)


@dataclass(frozen=True)
class AnnotatedConversation:
    """A conversation's turns (what the memory is given) and its overview questions."""

    conversation: Conversation
    speakers: tuple[str, ...]
    questions: tuple[OverviewQuestion, ...]

    @property
    def utterances(self) -> dict[str, str]:
        return {turn.dia_id: turn.utterance for turn in self.conversation.turns}

    @property
    def latest(self) -> float | None:
        """The time of the latest turn: the reference ``now`` of relative expressions."""
        stamps = [turn.timestamp for turn in self.conversation.turns if turn.timestamp is not None]
        return max(stamps) if stamps else None


def annotated(item: dict[str, Any]) -> AnnotatedConversation:
    """One raw LoCoMo object (:func:`memtree_bench.locomo.read_locomo`) with the
    overview questions its annotations give."""
    conversation = conversation_of(item, categories=(1,))
    body = item.get("conversation", {})
    speakers = tuple(
        dict.fromkeys(
            [str(body[key]) for key in ("speaker_a", "speaker_b") if body.get(key)]
            + [turn.speaker for turn in conversation.turns]
        )
    )
    sessions = _sessions(conversation)
    observations = _observations(item.get("observation") or {}, conversation)
    events = _events(item.get("event_summary") or {})
    questions = [
        *_person_questions(speakers, observations),
        *_day_questions(speakers, sessions, observations, events),
        *_month_questions(speakers, sessions, observations, events),
        *_multi_hop_questions(conversation, observations),
    ]
    return AnnotatedConversation(conversation, speakers, tuple(questions))


# -- the annotations, read ------------------------------------------------------------


@dataclass(frozen=True)
class _Note:
    session: int
    speaker: str
    fact: Fact


def _session_number(key: str) -> int | None:
    match = _SESSION.search(key)
    return int(match.group(1)) if match else None


def _by_session(raw: dict[str, Any]) -> Iterator[tuple[int, str, Any]]:
    """(session number, speaker, that speaker's entries) of an annotation keyed
    ``session_N`` then by speaker (LoCoMo's observations and event summaries)."""
    for key, by_speaker in raw.items():
        session = _session_number(key)
        if session is None or not isinstance(by_speaker, dict):
            continue
        for speaker, facts in by_speaker.items():
            yield session, str(speaker), facts


def _observations(raw: dict[str, Any], conversation: Conversation) -> list[_Note]:
    notes = []
    for session, speaker, facts in _by_session(raw):
        for entry in facts if isinstance(facts, list) else []:
            if not isinstance(entry, (list, tuple)) or not entry or not str(entry[0]).strip():
                continue
            ids = [f"D{int(m.group(1))}:{int(m.group(2))}" for m in _EVIDENCE.finditer(str(entry[1:]))]
            evidence = tuple(dict.fromkeys(i for i in ids if i in conversation.turn_by_id))
            notes.append(_Note(session, speaker, Fact((str(entry[0]).strip(),), evidence, "observation")))
    return notes


def _events(raw: dict[str, Any]) -> list[_Note]:
    notes = []
    for session, speaker, facts in _by_session(raw):
        if speaker == "date" or not isinstance(facts, list):
            continue
        texts = [str(fact).strip() for fact in facts if str(fact).strip()]
        notes += [_Note(session, speaker, Fact((text,), (), "event")) for text in texts]
    return notes


@dataclass(frozen=True)
class _Session:
    number: int
    day: datetime
    """Midnight UTC of the session's date."""


def _sessions(conversation: Conversation) -> list[_Session]:
    found: dict[int, _Session] = {}
    for turn in conversation.turns:
        if turn.session not in found and turn.timestamp is not None:
            moment = datetime.fromtimestamp(turn.timestamp, tz=UTC)
            found[turn.session] = _Session(turn.session, moment.replace(hour=0, minute=0, second=0, microsecond=0))
    return [found[number] for number in sorted(found)]


def _day_text(day: datetime) -> str:
    return f"{day.day} {day:%B %Y}"


# -- the families ---------------------------------------------------------------------


def _person_questions(speakers: Sequence[str], observations: list[_Note]) -> list[OverviewQuestion]:
    questions = []
    for speaker in speakers:
        facts = tuple(note.fact for note in observations if note.speaker == speaker)
        if facts:
            questions.append(OverviewQuestion("person", f"What do you know about {speaker}?", facts, Scope(speaker)))
    return questions


def _pair(speakers: Sequence[str]) -> str:
    return " and ".join(speakers[:2]) if len(speakers) >= 2 else (speakers[0] if speakers else "they")


def _day_questions(
    speakers: Sequence[str], sessions: list[_Session], observations: list[_Note], events: list[_Note]
) -> list[OverviewQuestion]:
    by_day: dict[datetime, set[int]] = {}
    for session in sessions:
        by_day.setdefault(session.day, set()).add(session.number)
    questions = []
    for day, numbers in sorted(by_day.items()):
        facts = tuple(note.fact for note in [*observations, *events] if note.session in numbers)
        if facts:
            start = day.timestamp()
            end = (day + timedelta(days=1)).timestamp()
            text = f"What did {_pair(speakers)} talk about on {_day_text(day)}?"
            questions.append(OverviewQuestion("day", text, facts, Scope(None, start, end)))
    return questions


def _month_questions(
    speakers: Sequence[str], sessions: list[_Session], observations: list[_Note], events: list[_Note]
) -> list[OverviewQuestion]:
    by_month: dict[datetime, set[int]] = {}
    for session in sessions:
        by_month.setdefault(session.day.replace(day=1), set()).add(session.number)
    questions = []
    for month, numbers in sorted(by_month.items()):
        following = (month + timedelta(days=32)).replace(day=1)
        for speaker in speakers:
            notes = [*observations, *events]
            facts = tuple(note.fact for note in notes if note.session in numbers and note.speaker == speaker)
            if facts:
                text = f"What happened to {speaker} in {month:%B %Y}?"
                scope = Scope(speaker, month.timestamp(), following.timestamp())
                questions.append(OverviewQuestion("month", text, facts, scope))
    return questions


def _multi_hop_questions(conversation: Conversation, observations: list[_Note]) -> list[OverviewQuestion]:
    citing: dict[str, list[str]] = {}
    for note in observations:
        for turn in note.fact.evidence:
            citing.setdefault(turn, []).extend(note.fact.wordings)
    speakers = list(dict.fromkeys(turn.speaker for turn in conversation.turns))
    questions = []
    for question in conversation.questions:
        if question.category != 1:
            continue
        facts = tuple(Fact(tuple(citing.get(turn, ())), (turn,), "evidence") for turn in question.evidence)
        named = [name for name in speakers if re.search(rf"\b{re.escape(name)}\b", question.question)]
        scope = Scope(named[0]) if len(named) == 1 else Scope()
        questions.append(OverviewQuestion("multi-hop", question.question, facts, scope))
    return questions
