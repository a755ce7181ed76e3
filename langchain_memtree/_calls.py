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
    answer: Any = None
    failure: BaseException | None = None
    try:
        while True:
            try:
                call = procedure.throw(failure) if failure is not None else procedure.send(answer)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            failure = None
            try:
                answer = getattr(call.target, call.method)(*call.args, **call.kwargs)
            except Exception as error:  # noqa: BLE001 - handed to the procedure, which decides
                failure = error
    finally:
        procedure.close()  # runs its cleanup (e.g. a lock release) if we leave early


async def arun(procedure: Procedure[T]) -> T:
    """Drive a procedure on the event loop; see the module docstring."""
    answer: Any = None
    failure: BaseException | None = None
    try:
        while True:
            try:
                call = procedure.throw(failure) if failure is not None else procedure.send(answer)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            failure = None
            try:
                twin = getattr(call.target, "a" + call.method, None)
                if twin is not None and inspect.iscoroutinefunction(twin):
                    answer = await twin(*call.args, **call.kwargs)
                else:
                    answer = await asyncio.to_thread(getattr(call.target, call.method), *call.args, **call.kwargs)
            except Exception as error:  # noqa: BLE001
                failure = error
    finally:
        procedure.close()  # also on cancellation
