"""Chat models: what memtree asks of a language model, and the plain-callable adapter.

The contract is one prompt in, one :class:`Completion` out. :class:`ChatModel` keeps
everything around that in the base class, so an adapter implements one method
(``_complete``, plus ``_acomplete`` when the model has a native async client):

* retries with the model's :class:`~memtree.retry.RetryPolicy` (timeouts, 429, 5xx,
  malformed or empty replies), each attempt bounded by the policy's timeout;
* usage reports (requests, prompt and completion tokens) to the calling memory;
* an async twin that runs the sync call in a worker thread by default.

Adapters for OpenAI, LangChain and LlamaIndex live in :mod:`memtree.models`;
:class:`CallableChatModel` turns any ``prompt -> str`` function (sync or async) into
a chat model.
"""

from __future__ import annotations

import asyncio
import inspect
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, cast

from memtree import model_usage as usage
from memtree.retry import CircuitBreaker, EmptyReplyError, RetryPolicy, breaker_for


@dataclass(frozen=True)
class Completion:
    """A model's reply and, when the API reported them, the tokens it used.

    ``truncated`` says the reply stopped at the output-token cap rather than where the
    model ended it, so it may be cut mid-sentence (summary guards reject it).
    """

    text: str
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    truncated: bool = False


class ChatModel(ABC):
    """A language model memtree can call: one prompt in, one reply out.

    Subclasses implement :meth:`_complete` (one attempt; ``timeout`` is the seconds
    the attempt may take) and override :meth:`_acomplete` for a native async path.
    Callers use :meth:`complete` / :meth:`acomplete`, which retry transient failures
    under :attr:`retry`, treat an empty reply as a failure (retried, then raised as
    :class:`~memtree.retry.ModelResponseError`) and report usage.

    Set ``handles_timeout = True`` on a subclass whose client enforces the timeout it
    is given (an HTTP client); otherwise each sync attempt runs in a helper thread
    abandoned after the timeout, and each async attempt is cancelled.

    Example::

        class EchoModel(ChatModel):
            def _complete(self, prompt: str, timeout: float | None) -> Completion:
                return Completion(prompt.upper())

        EchoModel().complete("hi").text  # 'HI'
    """

    retry: RetryPolicy = RetryPolicy()
    handles_timeout: bool = False
    guard_summaries: bool = False
    """Whether :class:`~memtree.aggregate.LLMAggregator` checks this model's summaries
    by default (see :mod:`memtree.summary_guard`): on for small local models, whose
    replies often drop facts or echo the prompt; off for hosted ones unless asked."""

    @abstractmethod
    def _complete(self, prompt: str, timeout: float | None) -> Completion:
        """One attempt at answering ``prompt``."""

    async def _acomplete(self, prompt: str, timeout: float | None) -> Completion:
        """One async attempt; by default the sync one in a worker thread."""
        return await asyncio.to_thread(self._complete, prompt, timeout)

    def complete(self, prompt: str) -> Completion:
        """Answer ``prompt``, retrying transient failures (see the class docstring)."""

        def attempt(timeout: float | None) -> Completion:
            usage.report(llm_requests=1)
            return self._checked(self._complete(prompt, timeout))

        return self.retry.call(attempt, what=self.name, enforce_timeout=not self.handles_timeout, breaker=self.breaker)

    async def acomplete(self, prompt: str) -> Completion:
        """Async :meth:`complete`."""

        async def attempt(timeout: float | None) -> Completion:
            usage.report(llm_requests=1)
            return self._checked(await self._acomplete(prompt, timeout))

        return await self.retry.acall(
            attempt, what=self.name, enforce_timeout=not self.handles_timeout, breaker=self.breaker
        )

    @property
    def breaker(self) -> CircuitBreaker:
        """This model's circuit breaker (see :class:`~memtree.retry.CircuitBreaker`;
        tuned by ``retry.breaker_failures`` and ``retry.breaker_cooldown``)."""
        return breaker_for(self, self.retry)

    @property
    def name(self) -> str:
        """A short description for logs and errors."""
        return type(self).__name__

    def _checked(self, completion: object) -> Completion:
        if not isinstance(completion, Completion):
            raise TypeError(f"{self.name}._complete returned {type(completion).__name__}, expected a Completion")
        usage.report(prompt_tokens=completion.prompt_tokens, completion_tokens=completion.completion_tokens)
        if not completion.text.strip():
            raise EmptyReplyError(f"{self.name} returned an empty reply")
        return completion


PromptCallable = Callable[[str], str] | Callable[[str], Awaitable[str]]


class CallableChatModel(ChatModel):
    """A chat model made of a function ``prompt -> reply text`` (sync or async).

    The function may also return a :class:`Completion` to report token usage.

    Example::

        model = CallableChatModel(lambda prompt: my_client.generate(prompt))
    """

    def __init__(self, fn: PromptCallable, *, retry: RetryPolicy | None = None) -> None:
        if not callable(fn):
            raise TypeError(f"expected a callable prompt -> text, got {type(fn).__name__}")
        self.fn = fn
        self.is_async = is_async_callable(fn)
        if retry is not None:
            self.retry = retry

    @property
    def name(self) -> str:
        return f"CallableChatModel({getattr(self.fn, '__name__', type(self.fn).__name__)})"

    def _complete(self, prompt: str, timeout: float | None) -> Completion:
        reply = asyncio.run(_awaited(cast(Awaitable[str], self.fn(prompt)))) if self.is_async else self.fn(prompt)
        return self._completion(reply)

    async def _acomplete(self, prompt: str, timeout: float | None) -> Completion:
        if not self.is_async:
            return await super()._acomplete(prompt, timeout)
        return self._completion(await self.fn(prompt))  # type: ignore[misc]

    def _completion(self, reply: object) -> Completion:
        if isinstance(reply, Completion):
            return reply
        if not isinstance(reply, str):
            raise TypeError(f"{self.name} returned {type(reply).__name__}, expected str")
        return Completion(reply)


def is_async_callable(fn: object) -> bool:
    """Whether calling ``fn`` returns a coroutine (an ``async def`` function or ``__call__``)."""
    call = type(fn).__call__ if callable(fn) and not inspect.isfunction(fn) else None
    return inspect.iscoroutinefunction(fn) or (call is not None and inspect.iscoroutinefunction(call))


async def _awaited(value: Awaitable[Any]) -> Any:
    return await value
