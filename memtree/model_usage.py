"""Usage reports: model adapters say what a call cost, the memory that made it counts it.

A memory opens a recording scope around every model call it makes
(``with recording(counters): ...``). Inside, model adapters call :func:`report` with
what the API said the call used (tokens) and the retry policy reports each retry.
Scopes live in a context variable, so they follow a call into asyncio tasks and into
threads started with :func:`contextvars.copy_context` (``asyncio.to_thread`` does
that), and two memories sharing one model object never mix their counts.

Use it yourself to count what your own code spends through memtree's models::

    from memtree.stats import Counters
    from memtree.model_usage import recording

    spent = Counters()
    with recording(spent):
        model.complete("Say hi")
    print(spent.snapshot())  # {'llm_requests': 1, 'prompt_tokens': ..., ...}
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Protocol


class UsageSink(Protocol):
    """Anything that adds up named amounts (``memtree.stats.Counters`` does)."""

    def add(self, name: str, amount: float = 1) -> None: ...


_current: ContextVar[UsageSink | None] = ContextVar("memtree_usage_sink", default=None)


@contextmanager
def recording(sink: UsageSink) -> Iterator[UsageSink]:
    """Send every usage report made inside the block (in this context) to ``sink``."""
    token = _current.set(sink)
    try:
        yield sink
    finally:
        _current.reset(token)


def report(**amounts: float | None) -> None:
    """Add amounts to the current scope's sink; a no-op outside any scope.

    ``None`` and zero amounts are skipped, so adapters can pass what an API may or
    may not have returned (``prompt_tokens=usage.prompt_tokens if usage else None``).
    """
    sink = _current.get()
    if sink is None:
        return
    for name, amount in amounts.items():
        if amount:
            sink.add(name, amount)
