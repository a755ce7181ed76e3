"""Tree shape and cost counters, so a bad shape or an expensive setup is visible."""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from memtree.state import TreeState


class Counters:
    """Thread-safe cost counters of one memory object (since it was opened)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.values: dict[str, float] = {}

    def add(self, name: str, amount: float = 1) -> None:
        with self._lock:
            self.values[name] = self.values.get(name, 0) + amount

    def get(self, name: str) -> float:
        with self._lock:
            return self.values.get(name, 0)

    def snapshot(self) -> dict[str, float]:
        with self._lock:
            return dict(self.values)


@dataclass(frozen=True)
class TreeStats:
    """A memory's size, shape and costs.

    Shape: ``max_depth`` and ``mean_leaf_depth``; ``branching`` is the mean number of
    children of the summaries (the root excluded); ``root_children`` and
    ``largest_root_share`` (the fraction of all leaves under the biggest root
    child) reveal a tree that degenerated into one chain.

    Costs are counted since this memory object was opened: ``embedding_calls``
    (model calls, the offline summarizer's sentence embeddings included;
    ``embedded_texts`` counts the texts in them), ``aggregation_calls``
    (summaries written; ``llm_calls`` counts those that called a model) and
    ``aggregation_failures`` (summaries left stale after a failure). Model adapters
    add what the APIs reported: ``prompt_tokens`` and ``completion_tokens`` of chat
    calls, ``embedding_tokens``, and ``retries`` (extra attempts after timeouts,
    rate limits, server errors or unusable replies). ``extra`` holds the other
    counters (``llm_requests`` and ``embedding_requests``: HTTP-level requests,
    retries included; ``flushes``; ``write_conflicts``: writes planned again because
    another writer changed the summaries they were rewriting meanwhile). ``stale``
    counts summaries waiting for a rewrite, ``pending`` those of them waiting for
    this memory's :meth:`~memtree.MemTree.flush`.
    Expiry: ``expired`` counts the leaves this memory object's sweeps deleted
    (:meth:`~memtree.MemTree.sweep_expired`, or a write's sweep on the way);
    ``awaiting_sweep`` the stored leaves that have expired but are not swept yet
    (no read returns them; ``leaves`` still counts them).
    The ``*_per_insert`` properties divide by ``inserts``.
    """

    nodes: int
    leaves: int
    summaries: int
    max_depth: int
    mean_leaf_depth: float
    branching: float
    root_children: int
    largest_root_share: float
    stale: int
    theta0: float
    inserts: int
    embedding_calls: int
    embedded_texts: int
    aggregation_calls: int
    llm_calls: int
    aggregation_failures: int
    prompt_tokens: int = 0
    completion_tokens: int = 0
    embedding_tokens: int = 0
    retries: int = 0
    pending: int = 0
    expired: int = 0
    awaiting_sweep: int = 0
    depth_histogram: dict[int, int] = field(default_factory=dict)
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def embedding_calls_per_insert(self) -> float:
        return self.embedding_calls / self.inserts if self.inserts else 0.0

    @property
    def aggregation_calls_per_insert(self) -> float:
        return self.aggregation_calls / self.inserts if self.inserts else 0.0

    @property
    def llm_calls_per_insert(self) -> float:
        return self.llm_calls / self.inserts if self.inserts else 0.0

    @property
    def prompt_tokens_per_insert(self) -> float:
        return self.prompt_tokens / self.inserts if self.inserts else 0.0

    @property
    def completion_tokens_per_insert(self) -> float:
        return self.completion_tokens / self.inserts if self.inserts else 0.0

    @property
    def embedding_tokens_per_insert(self) -> float:
        return self.embedding_tokens / self.inserts if self.inserts else 0.0

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for name in _PER_INSERT:
            out[name] = getattr(self, name)
        return out


_PER_INSERT = (
    "embedding_calls_per_insert",
    "aggregation_calls_per_insert",
    "llm_calls_per_insert",
    "prompt_tokens_per_insert",
    "completion_tokens_per_insert",
    "embedding_tokens_per_insert",
)


def tree_stats(state: TreeState, counters: dict[str, float], theta0: float, *, pending: int = 0) -> TreeStats:
    """Walk the tree once and combine its shape with the cost counters."""
    leaves, summaries, stale, leaf_depth_total, child_total = state.shape()
    root = state.root
    root_children = len(root.children) if root is not None else 0
    largest = 0
    if root is not None:
        for child_id in root.children:
            largest = max(largest, state.nodes[child_id].leaf_count)
    known = {
        "inserts",
        "embedding_calls",
        "embedded_texts",
        "aggregation_calls",
        "llm_calls",
        "aggregation_failures",
        "prompt_tokens",
        "completion_tokens",
        "embedding_tokens",
        "retries",
        "expired",
    }
    return TreeStats(
        nodes=leaves + summaries,
        leaves=leaves,
        summaries=summaries,
        max_depth=state.depth,
        mean_leaf_depth=leaf_depth_total / leaves if leaves else 0.0,
        branching=child_total / summaries if summaries else 0.0,
        root_children=root_children,
        largest_root_share=largest / leaves if leaves else 0.0,
        stale=stale,
        theta0=theta0,
        inserts=int(counters.get("inserts", 0)),
        embedding_calls=int(counters.get("embedding_calls", 0)),
        embedded_texts=int(counters.get("embedded_texts", 0)),
        aggregation_calls=int(counters.get("aggregation_calls", 0)),
        llm_calls=int(counters.get("llm_calls", 0)),
        aggregation_failures=int(counters.get("aggregation_failures", 0)),
        prompt_tokens=int(counters.get("prompt_tokens", 0)),
        completion_tokens=int(counters.get("completion_tokens", 0)),
        embedding_tokens=int(counters.get("embedding_tokens", 0)),
        retries=int(counters.get("retries", 0)),
        pending=pending,
        expired=int(counters.get("expired", 0)),
        awaiting_sweep=len(state.expired(time.time())),
        depth_histogram=state.depth_histogram(),
        extra={name: value for name, value in counters.items() if name not in known},
    )
