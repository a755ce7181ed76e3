"""Packing: a ranking becomes the results, best first, under ``k``, the token
budget and sentence de-duplication.

De-duplication matters because a summary repeats sentences of its leaves (an
extractive one only repeats them): a result's ``context`` keeps just the sentences
no better-ranked result already contributed, a result with nothing new is skipped,
and the budget is charged on ``context``. A summary that ranks may deliver its best
leaves in its place (:mod:`memtree.summary_hits`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from memtree.node import RetrievedNode
from memtree.state import TreeState
from memtree.summary_hits import LEAF_ALLOWANCE, Ranked
from memtree.text import fold, split_sentences


@dataclass(frozen=True)
class Packing:
    """How a ranking becomes results."""

    k: int
    token_budget: int | None
    min_score: float | None
    """The lowest score a result may have; ``None``: no cut."""
    drop_repeated_sentences: bool
    count_tokens: Callable[[str], int]
    min_similarity: float | None = None
    """The relevance gate: the lowest cosine similarity to the query a result may
    have (whatever its hybrid score); ``None``: no gate."""
    same_subject: float | None = None
    """Leaves this similar to each other (or siblings) come newest first
    (:func:`newer_first`); ``None``: ranking order kept."""
    summary_hits: str = "leaves"
    """What a summary that ranks delivers (:mod:`memtree.summary_hits`)."""


class DeliveredSentences:
    """The sentences already given to the reader, so each later text gives only what
    is new. Sentences compare case- and whitespace-folded.

    Retrieval packs with it, and the benchmark packs other trees' results with it,
    so every tree method pays for a repeated sentence the same way (not at all).

    Example::

        delivered = DeliveredSentences()
        delivered.new_part("Ana has a cat. It is grey.")  # the whole text
        delivered.new_part("It is grey. Ben runs.")  # "Ben runs."
        delivered.new_part("Ana has a cat.")  # None: nothing new
    """

    def __init__(self) -> None:
        self._seen: set[str] = set()

    def new_part(self, text: str) -> str | None:
        """``text`` without the sentences given before (joined as ``text`` joins
        them: by line breaks if it has any), or ``None`` when none is new. Its
        sentences count as given from now on."""
        sentences = split_sentences(text)
        fresh = [sentence for sentence in sentences if fold(sentence) not in self._seen]
        self._seen.update(fold(sentence) for sentence in sentences)
        if not fresh:
            return None
        if len(fresh) == len(sentences):
            return text
        return ("\n" if "\n" in text else " ").join(fresh)


def pack(
    state: TreeState,
    ranked: Ranked,
    packing: Packing,
    hidden: frozenset[str] = frozenset(),
    leaves_of: Callable[[str], Ranked] | None = None,
) -> tuple[list[RetrievedNode], bool]:
    """Results in rank order; also whether the ranking ran out before ``k`` or the
    budget. ``hidden`` (expired) leaves are left out of each result's ``leaf_ids``.

    With ``leaves_of`` (``summary_hits="leaves"``, :mod:`memtree.summary_hits`) a
    summary in the ranking is not delivered: its best leaves not delivered yet come
    in its place, until they cost the tokens its own text would have."""
    packer = _Packer(state, packing, hidden)
    for node_id, score in ranked:
        node = state.nodes[node_id]
        if leaves_of is None or node.is_leaf:
            if not packer.add(node_id, score):
                return packer.results, False
            continue
        allowance, spent = LEAF_ALLOWANCE * packing.count_tokens(node.text), 0
        for leaf_id, leaf_score in leaves_of(node_id):
            if spent >= allowance:
                break
            delivered = len(packer.results)
            if not packer.add(leaf_id, leaf_score, found_by=node_id):
                return packer.results, False
            if len(packer.results) > delivered:
                spent += packing.count_tokens(packer.results[-1].context)
    return packer.results, True


class _Packer:
    """The results so far, the sentences they gave and the tokens they cost."""

    def __init__(self, state: TreeState, packing: Packing, hidden: frozenset[str]) -> None:
        self.state = state
        self.packing = packing
        self.hidden = hidden
        self.results: list[RetrievedNode] = []
        self.delivered = DeliveredSentences()
        self.given: set[str] = set()
        self.used_tokens = 0

    def add(self, node_id: str, score: float, found_by: str | None = None) -> bool:
        """Deliver a node (or skip it: given already, or nothing new in it); ``False``
        when the results are complete (``k`` reached or the budget spent)."""
        if node_id in self.given:
            return True
        packing = self.packing
        node = self.state.nodes[node_id]
        context = node.text
        if packing.drop_repeated_sentences:
            new_part = self.delivered.new_part(node.text)
            if new_part is None:
                return True
            context = new_part
        full = True
        if packing.token_budget is not None:
            cost = packing.count_tokens(context)
            if self.used_tokens + cost > packing.token_budget:
                context = cut_to_budget(context, packing.token_budget - self.used_tokens, packing.count_tokens)
                full = False
                if not context:
                    return False
            self.used_tokens += packing.count_tokens(context)
        self.given.add(node_id)
        self.results.append(
            RetrievedNode(
                id=node.id,
                text=node.text,
                score=score,
                depth=node.depth,
                is_leaf=node.is_leaf,
                timestamp=node.timestamp,
                metadata=dict(node.metadata),
                leaf_ids=_live(self.state.leaf_ids_under(node.id), self.hidden),
                source_id=node.source_id,
                context=context,
                found_by=found_by,
            )
        )
        return full and len(self.results) < packing.k


def _live(leaf_ids: tuple[str, ...], hidden: frozenset[str]) -> tuple[str, ...]:
    return tuple(leaf for leaf in leaf_ids if leaf not in hidden) if hidden else leaf_ids


def cut_to_budget(text: str, budget: int, count_tokens: Callable[[str], int]) -> str:
    """The longest word prefix of ``text`` that costs at most ``budget`` tokens."""
    if budget <= 0:
        return ""
    words = text.split(" ")
    low, high = 0, len(words)
    while low < high:
        middle = (low + high + 1) // 2
        if count_tokens(" ".join(words[:middle])) <= budget:
            low = middle
        else:
            high = middle - 1
    return " ".join(words[:low]).strip()
