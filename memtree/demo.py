"""The offline demo: a memory of a six-session conversation, its tree, and what it
retrieves for three questions.

``memtree demo`` runs this with no API key and no network: local embeddings
(all-MiniLM-L6-v2 from the installed package) and extractive summaries.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from typing import Any, TextIO

from memtree.config import MemTreeConfig
from memtree.digest import DigestAggregator, words_said
from memtree.node import RetrievedNode
from memtree.text import count_words, split_sentences
from memtree.tree import MemTree


@dataclass(frozen=True)
class Turn:
    """One line of the sample conversation, as the memory stores it."""

    text: str
    timestamp: str
    speaker: str
    session: int


def load_demo_conversation() -> tuple[list[Turn], list[str]]:
    """The shipped sample conversation (about 70 dated turns) and its questions."""
    raw: dict[str, Any] = json.loads(
        resources.files("memtree.data").joinpath("demo_conversation.json").read_text(encoding="utf-8")
    )
    turns: list[Turn] = []
    for number, session in enumerate(raw["sessions"], start=1):
        day = datetime.fromisoformat(session["date"]).strftime("%d %B %Y")
        for speaker, text in session["turns"]:
            turns.append(Turn(f"{day} {speaker}: {text}", session["date"], speaker, number))
    return turns, list(raw["questions"])


DEMO_CONFIG = MemTreeConfig(theta0=0.5, threshold_depth=3)
"""Routing for a tree a person would draw from 69 turns: with the defaults (θ0 "auto",
the threshold normalized by the tree's current depth) the demo's tree is 10 levels
deep and 13 of the root's 19 children are single turns; with θ0 0.5 and the
threshold normalized by a fixed depth of 3 (so it reaches its 0.99 cap below depth
4 and deep chains stop) it is 5 levels deep with 6 topics under the root, 2 of them
single turns. The engine's defaults stay as measured on LoCoMo."""


def demo_memory(llm: Any = None) -> MemTree:
    """The demo's memory: offline defaults, with digest summaries so that each
    summary reads as a topic heading (dates, people, distinctive terms) a person
    can scan, rather than glued sentence fragments. With ``llm`` (anything
    ``MemTree(llm=...)`` takes) the model writes the summaries instead."""
    if llm is not None:
        return MemTree(llm=llm, config=DEMO_CONFIG)
    return MemTree(aggregator=DigestAggregator(), config=DEMO_CONFIG)


RELATIVE_SCORE = 0.72
"""A memory shown for a question scores at least this share of the best one's score.
The relevance floor keeps out what is unrelated; a short chat is full of turns that
are only a little related (\"I knew she would. Did everything go smoothly?\"), which
rank when little else is left and would read as answers. (0.65 before context
feedback, which moves the query towards the best match and so brings the scores of a
question's related memories closer together: that filler now scores 0.71 of the best.)"""


def says_something(text: str) -> bool:
    """Whether a turn states something (three words or more outside its questions):
    a question, or \"Eighteen!\", is no answer to show."""
    statements = [s for s in split_sentences(words_said(text)) if not s.rstrip().endswith("?")]
    return count_words(" ".join(statements)) >= 3


def memories_for(memory: MemTree, question: str, *, k: int, token_budget: int) -> list[RetrievedNode]:
    """The memories the demo shows for ``question``, best first: retrieved (over the
    relevance floor), then only those that state something and score close enough
    to the best (:data:`RELATIVE_SCORE`), at most ``k`` within ``token_budget``."""
    hits = memory.retrieve(question, k=2 * k, token_budget=2 * token_budget)
    if not hits:
        return []
    best = hits[0].score
    shown: list[RetrievedNode] = []
    spent = 0
    for hit in hits:
        cost = memory.config.token_counter(hit.context)
        if hit.score < RELATIVE_SCORE * best or not says_something(hit.context) or spent + cost > token_budget:
            continue
        shown.append(hit)
        spent += cost
        if len(shown) == k:
            break
    return shown


def run_demo(memory: MemTree, out: TextIO, *, k: int = 4, token_budget: int = 160, max_depth: int = 3) -> None:
    """Build the demo memory in ``memory``, then print its tree and, for each question,
    the memories it retrieves (the demo retrieves; it writes no answer)."""
    turns, questions = load_demo_conversation()
    print(f"Remembering {len(turns)} turns from {turns[-1].session} sessions…", file=out)
    memory.add_many(
        [turn.text for turn in turns],
        timestamps=[turn.timestamp for turn in turns],
        metadata=[{"speaker": turn.speaker, "session": turn.session} for turn in turns],
    )
    stats = memory.stats()
    print(
        f"\nThe tree: {stats.leaves} turns grouped under {stats.summaries} summaries, {stats.max_depth} levels deep. "
        "A summary says who and when, then its most central sentences; the turns it covers hang below it.\n",
        file=out,
    )
    print(memory.format_tree(max_depth=max_depth, width=90), file=out)
    print(
        "\nThree questions. For each, the turns the memory retrieves, best first, as they were said: "
        "the demo retrieves memories, it does not write an answer.",
        file=out,
    )
    for question in questions:
        print(f"\nQ: {question}", file=out)
        found = memories_for(memory, question, k=k, token_budget=token_budget)
        if not found:
            print("  (nothing in the memory is about this)", file=out)
        for hit in found:
            body = " / ".join(line for line in hit.context.splitlines() if line.strip())
            via = " (found through a summary)" if hit.found_by is not None else ""
            print(f"  - {body}{via}", file=out)
