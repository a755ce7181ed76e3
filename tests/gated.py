"""An aggregator whose model calls wait behind a gate, for background-aggregation tests.

It joins texts with " | " (so a summary shows exactly the leaves it was told about)
and counts as a model (``calls_model``). While the gate is closed every call waits:
a caller that returns meanwhile provably did not wait for a model call. Nothing is
timed: tests open the gate and wait on the memory (``wait_for_summaries``).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from memtree import ROOT_ID, Aggregator, HashingEmbedder, MemTree, MemTreeConfig
from memtree.node import Vector
from memtree.store import Store

SEP = " | "
GATE_LIMIT = 30.0
"""A call still waiting after this long fails (a test bug), instead of hanging the suite."""


class GatedAggregator(Aggregator):
    """See the module docstring. ``fail=True`` makes every call raise."""

    def __init__(self, *, open_gate: bool = False) -> None:
        self.gate = threading.Event()
        if open_gate:
            self.gate.set()
        self.entered = threading.Event()
        self.calls = 0
        self.fail = False
        self._lock = threading.Lock()

    def aggregate(self, summary: str, new_texts: Sequence[str], count: int, *, centroid: Vector | None = None) -> str:
        self.entered.set()
        if not self.gate.wait(GATE_LIMIT):
            raise TimeoutError("the test never opened the gate")
        with self._lock:
            self.calls += 1
        if self.fail:
            raise ConnectionError("model unavailable")
        return SEP.join([summary, *new_texts]) if summary else SEP.join(new_texts)

    @property
    def calls_model(self) -> bool:
        return True


def gated_memory(aggregator: GatedAggregator | None = None, store: Store | None = None, **config: object) -> MemTree:
    options = {"theta0": 0.15, **config}
    return MemTree(
        embedder=HashingEmbedder(64),
        aggregator=aggregator or GatedAggregator(),
        store=store,
        config=MemTreeConfig(**options),  # type: ignore[arg-type]
    )


def summaries_cover_exactly_their_leaves(memory: MemTree) -> bool:
    """Every summary names exactly the leaves below it (and at least one exists)."""
    summaries = 0
    for node in memory.walk():
        if node.id == ROOT_ID or node.is_leaf:
            continue
        summaries += 1
        below = set().union(*(_pieces(memory.get(leaf).text) for leaf in memory.leaf_ids_under(node.id)))
        if _pieces(node.text) != below:
            return False
    return summaries > 0


def _pieces(text: str) -> set[str]:
    """The lines of the texts a summary joined ("\n": a new parent's text before its
    first summary is its two leaves, one per line)."""
    return {piece for line in text.split("\n") for piece in line.split(SEP)}
