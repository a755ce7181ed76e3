"""LoCoMo (Maharana et al., ACL 2024) as design.md §5 reads it.

Each conversation becomes a list of turns, each turn ingested as
``"<session date> <speaker>: <text>"``; each category 1–4 question keeps the
evidence ids that name a real turn (``D\\d+:\\d+``, leading zeros stripped).
Questions left without evidence are dropped and counted, so a report can say how
many. The data file is CC BY-NC 4.0: users pass its path, it is never bundled.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

CATEGORY_NAMES: dict[int, str] = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}
RETRIEVAL_CATEGORIES: tuple[int, ...] = (1, 2, 3, 4)
_EVIDENCE_ID = re.compile(r"D(\d+):(\d+)")
_SESSION_KEY = re.compile(r"session_(\d+)$")


@dataclass(frozen=True)
class Turn:
    """One utterance: its id (``D3:7``), the text ingested and the raw utterance."""

    dia_id: str
    session: int
    speaker: str
    date: str
    timestamp: float | None
    utterance: str

    @property
    def text(self) -> str:
        """What the memory under test is given (design.md §5)."""
        return f"{self.date} {self.speaker}: {self.utterance}"


@dataclass(frozen=True)
class Question:
    question: str
    answer: str
    category: int
    evidence: tuple[str, ...]


@dataclass(frozen=True)
class Conversation:
    sample_id: str
    turns: tuple[Turn, ...]
    questions: tuple[Question, ...]
    dropped_questions: int = 0
    turn_by_id: dict[str, Turn] = field(default_factory=dict, compare=False, repr=False)


def load_locomo(path: str | os.PathLike[str], categories: Sequence[int] = RETRIEVAL_CATEGORIES) -> list[Conversation]:
    """Every conversation of the LoCoMo file at ``path``, with questions of ``categories``."""
    return [conversation_of(item, categories) for item in read_locomo(path)]


def read_locomo(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The raw objects of a file in LoCoMo's schema (a list of objects with a
    ``conversation``), for readers of more than the turns and questions (the
    annotations the overview benchmark builds its questions from)."""
    try:
        with open(path, encoding="utf-8") as file:
            raw = json.load(file)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"LoCoMo data not found at {os.fspath(path)!r}; download data/locomo10.json from "
            "github.com/snap-research/LoCoMo and pass its path"
        ) from None
    except json.JSONDecodeError as error:
        raise ValueError(f"{os.fspath(path)!r} is not LoCoMo JSON: {error}") from None
    if not isinstance(raw, list) or not all(isinstance(item, dict) and "conversation" in item for item in raw):
        raise ValueError(f"{os.fspath(path)!r} is not LoCoMo data: expected a list of objects with 'conversation'")
    return raw


def select_conversations(conversations: list[Conversation], spec: str) -> list[Conversation]:
    """``spec`` as ``"all"``, ``"0-9"``, ``"0,3,5"`` or ``"2"`` (indices into the file)."""
    if spec.strip().lower() == "all":
        return list(conversations)
    chosen: list[int] = []
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            if "-" in part:
                low, high = (int(x) for x in part.split("-", 1))
                chosen.extend(range(low, high + 1))
            else:
                chosen.append(int(part))
        except ValueError:
            raise ValueError(f"bad conversation selection {spec!r}: use e.g. 0-9 or 0,3,5") from None
    if not chosen:
        raise ValueError(f"bad conversation selection {spec!r}: it selects nothing")
    for index in chosen:
        if not 0 <= index < len(conversations):
            raise ValueError(f"conversation {index} does not exist; the file has 0-{len(conversations) - 1}")
    return [conversations[index] for index in dict.fromkeys(chosen)]


def first_sessions(conversation: Conversation, sessions: int) -> Conversation:
    """The conversation cut after its first ``sessions`` sessions, keeping only the
    questions whose evidence lies wholly in them: a slice small enough for a local
    model to summarize, scored on questions it can answer."""
    if sessions < 1:
        raise ValueError(f"sessions must be a positive number of sessions, got {sessions}")
    kept = sorted({turn.session for turn in conversation.turns})[:sessions]
    turns = tuple(turn for turn in conversation.turns if turn.session in kept)
    by_id = {turn.dia_id: turn for turn in turns}
    questions = tuple(q for q in conversation.questions if all(e in by_id for e in q.evidence))
    return Conversation(conversation.sample_id, turns, questions, conversation.dropped_questions, by_id)


def conversation_of(item: dict[str, Any], categories: Sequence[int] = RETRIEVAL_CATEGORIES) -> Conversation:
    """One raw LoCoMo object (see :func:`read_locomo`) as a :class:`Conversation`."""
    return _conversation(item, set(categories))


def _conversation(item: dict[str, object], categories: set[int]) -> Conversation:
    body = item["conversation"]
    assert isinstance(body, dict)
    sessions = sorted(int(m.group(1)) for key in body if (m := _SESSION_KEY.match(key)))
    turns: list[Turn] = []
    for session in sessions:
        date = str(body.get(f"session_{session}_date_time", "")).strip()
        stamp = _parse_date(date)
        for raw_turn in body[f"session_{session}"]:
            text = str(raw_turn.get("text", "")).strip()
            if not text:
                continue
            turns.append(Turn(_norm_id(raw_turn["dia_id"]), session, str(raw_turn["speaker"]), date, stamp, text))
    by_id = {turn.dia_id: turn for turn in turns}
    questions: list[Question] = []
    dropped = 0
    raw_questions = item.get("qa", [])
    assert isinstance(raw_questions, list)
    for qa in raw_questions:
        category = int(qa["category"])
        if category not in categories:
            continue
        evidence = tuple(
            dict.fromkeys(
                f"D{int(m.group(1))}:{int(m.group(2))}"
                for ref in qa.get("evidence", [])
                for m in _EVIDENCE_ID.finditer(str(ref))
                if f"D{int(m.group(1))}:{int(m.group(2))}" in by_id
            )
        )
        if not evidence:
            dropped += 1
            continue
        answer = qa.get("answer", qa.get("adversarial_answer", ""))
        questions.append(Question(str(qa["question"]), str(answer), category, evidence))
    return Conversation(str(item.get("sample_id", "")), tuple(turns), tuple(questions), dropped, by_id)


def _norm_id(dia_id: str) -> str:
    match = _EVIDENCE_ID.fullmatch(dia_id.strip())
    return f"D{int(match.group(1))}:{int(match.group(2))}" if match else dia_id.strip()


def _parse_date(date: str) -> float | None:
    """``"1:56 pm on 8 May, 2023"`` as a UNIX time (None when it does not parse)."""
    for pattern in ("%I:%M %p on %d %B, %Y", "%I:%M %p on %d %b, %Y"):
        try:
            return datetime.strptime(date, pattern).timestamp()
        except ValueError:
            continue
    return None
