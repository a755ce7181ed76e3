"""One procedure, two drivers: how the adapters offer sync and async twins.

LangChain and LangGraph want every operation twice (``add_messages`` and
``aadd_messages``, ``batch`` and ``abatch``...). Rather than write each twice, an
adapter writes it once as a generator that *yields* the calls it needs
(:class:`Call`: "call ``memory.add(...)``", "call ``store.get_records(...)``") and
receives their results. :func:`run` answers the calls directly; :func:`arun`
awaits the target's async twin (``aadd`` for ``add``) when it has one and runs
the call in a worker thread otherwise, so blocking store I/O never stalls the
event loop. This mirrors how the engine drives its own write procedures.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Call:
    """Request: ``target.method(*args, **kwargs)``; the answer is its result."""

    target: Any
    method: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


Procedure = Generator[Call, Any, T]


def run(procedure: Procedure[T]) -> T:
    """Drive a procedure synchronously; a failing call is raised inside it."""
    outcome: _Outcome = (None, None)
    try:
        while isinstance(step := _advance(procedure, outcome), Call):
            try:
                outcome = (getattr(step.target, step.method)(*step.args, **step.kwargs), None)
            except Exception as error:  # noqa: BLE001 - handed to the procedure, which decides
                outcome = (None, error)
        return step.value  # type: ignore[no-any-return]
    finally:
        procedure.close()  # runs its cleanup (e.g. a lock release) if we leave early


async def arun(procedure: Procedure[T]) -> T:
    """Drive a procedure on the event loop; see the module docstring."""
    outcome: _Outcome = (None, None)
    try:
        while isinstance(step := _advance(procedure, outcome), Call):
            try:
                outcome = (await _acall(step), None)
            except Exception as error:  # noqa: BLE001 - handed to the procedure, which decides
                outcome = (None, error)
        return step.value  # type: ignore[no-any-return]
    finally:
        procedure.close()  # also on cancellation


_Outcome = tuple[Any, Exception | None]
"""A call's result, or the exception it raised."""


def _advance(procedure: Procedure[Any], outcome: _Outcome) -> Call | StopIteration:
    """Hand the last outcome to the procedure; return its next call, or how it ended."""
    answer, failure = outcome
    try:
        return procedure.throw(failure) if failure is not None else procedure.send(answer)
    except StopIteration as stop:
        return stop


async def _acall(call: Call) -> Any:
    twin = getattr(call.target, "a" + call.method, None)
    if twin is not None and inspect.iscoroutinefunction(twin):
        return await twin(*call.args, **call.kwargs)
    return await asyncio.to_thread(getattr(call.target, call.method), *call.args, **call.kwargs)


class WriteLock:
    """A lock for procedures: the sync driver takes it blocking, the async driver by
    polling, so a cancelled coroutine never ends up holding it.

    Use it as ``yield Call(lock, "acquire")`` then ``try: ... finally: lock.release()``.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def acquire(self) -> None:
        self._lock.acquire()

    async def aacquire(self) -> None:
        delay = 0.001
        while not self._lock.acquire(blocking=False):
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.05)

    def release(self) -> None:
        self._lock.release()
