"""The offline demo: a memory of a six-session conversation, its tree, and answers.

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
from memtree.digest import DigestAggregator
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


def run_demo(memory: MemTree, out: TextIO, *, k: int = 4, token_budget: int = 160, max_depth: int = 3) -> None:
    """Build the demo memory in ``memory``, then print its tree and three answers."""
    turns, questions = load_demo_conversation()
    print(f"Remembering {len(turns)} turns from {turns[-1].session} sessions…", file=out)
    memory.add_many(
        [turn.text for turn in turns],
        timestamps=[turn.timestamp for turn in turns],
        metadata=[{"speaker": turn.speaker, "session": turn.session} for turn in turns],
    )
    stats = memory.stats()
    print(
        f"\nThe tree: {stats.nodes} nodes ({stats.leaves} leaves, {stats.summaries} summaries), "
        f"max depth {stats.max_depth}, mean leaf depth {stats.mean_leaf_depth:.1f}, θ0 {stats.theta0:.2f}\n",
        file=out,
    )
    print(memory.format_tree(max_depth=max_depth, width=90), file=out)
    for question in questions:
        print(f"\nQ: {question}", file=out)
        # the relevance gate leaves out filler turns ("Did everything go smoothly?")
        # that only rank because little else is left
        for hit in memory.retrieve(question, k=k, token_budget=token_budget, min_similarity=memory.relevance_floor):
            kind = "leaf" if hit.is_leaf else f"summary of {len(hit.leaf_ids)}"
            if hit.found_by is not None:  # a summary matched the question and brought this leaf
                kind += ", via a summary"
            body = " / ".join(line for line in hit.context.splitlines() if line.strip())
            print(f"  [{hit.score:.2f} · depth {hit.depth} · {kind}] {body}", file=out)
