"""Retries for model calls: exponential backoff with jitter, Retry-After, per-call timeouts.

One policy serves every model kind (OpenAI, LangChain, LlamaIndex, plain callables):
the adapters in :mod:`memtree.llm` and :mod:`memtree.models` run each request through
:meth:`RetryPolicy.call` / :meth:`RetryPolicy.acall`. A failure is retried when it is
transient: a timeout, a dropped connection, HTTP 408/409/425/429 or 5xx, or a
response that could not be used (:class:`ModelResponseError`: malformed JSON,
missing fields, an empty reply). Anything else (a bad request, a wrong key) fails
at once. Each retry is reported to the current usage scope (``retries``), so a
memory's ``stats()`` shows them.

What an error is decides, never its class name: first the type hierarchy
(``TimeoutError`` and ``ConnectionError`` are transient), then an HTTP status
(``error.status_code`` or ``error.response.status_code``, with Retry-After headers:
``retry-after-ms`` or ``retry-after``, seconds or an HTTP date), then the connection
and timeout error classes of the client libraries already imported (openai,
anthropic, httpx, aiohttp, google-api-core; none is imported here). An error that
will not go away by waiting fails at once: 400/401/403/404/422, ``OSError``s such as
``FileNotFoundError`` or a failed model or tokenizer download (``requests`` errors,
which downloaders raise, are ``OSError``s too), huggingface_hub's offline-mode error
(a ``ConnectionError`` raised without trying the network), ``ValueError``, ``TypeError``.
"""

from __future__ import annotations

import asyncio
import contextvars
import email.utils
import json
import logging
import random
import sys
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

from memtree import model_usage as usage
from memtree.text import preview

logger = logging.getLogger(__name__)

T = TypeVar("T")
Item = TypeVar("Item")

RETRYABLE_STATUS = frozenset({408, 409, 425, 429})
"""HTTP statuses worth retrying besides 5xx: timeout, conflict, too early, rate limit."""

_TRANSIENT_CLIENT_ERRORS = {
    "openai": ("APIConnectionError",),  # APITimeoutError is one
    "anthropic": ("APIConnectionError",),
    "httpx": ("TransportError",),  # timeouts, network and protocol errors
    "aiohttp": ("ClientConnectionError", "ServerTimeoutError"),
    "google.api_core.exceptions": (
        "ServiceUnavailable",
        "ResourceExhausted",
        "DeadlineExceeded",
        "InternalServerError",
    ),
}
"""Connection and timeout errors of client libraries, by module: looked up among the
modules already imported (an error of a library can only exist once it is)."""

_PERMANENT_CLIENT_ERRORS = {
    # a ConnectionError, but raised without trying: offline mode does not end by waiting
    "huggingface_hub.errors": ("OfflineModeIsEnabled",),
}
"""Client errors that subclass a transient type yet never pass by waiting; checked first."""

_TIMEOUT_CLIENT_ERRORS = {
    "openai": ("APITimeoutError",),
    "anthropic": ("APITimeoutError",),
    "httpx": ("TimeoutException",),
    "aiohttp": ("ServerTimeoutError",),
    "google.api_core.exceptions": ("DeadlineExceeded",),
}
"""The client libraries' timeout errors, by module (see :func:`is_timeout`)."""

PERMANENT_ERRORS: tuple[type[BaseException], ...] = (
    OSError,  # FileNotFoundError, PermissionError, a failed download (its ConnectionError is caught first)
    ValueError,
    TypeError,
    LookupError,
    AttributeError,
    ImportError,
    NotImplementedError,
)
"""Errors that waiting does not fix: they fail at once, whatever their cause says."""


class ModelResponseError(RuntimeError):
    """A model answered, but with nothing usable: malformed JSON, missing fields, an
    empty reply. Retried like a server error."""


class EmptyReplyError(ModelResponseError):
    """A model answered with nothing but whitespace (after its retries).

    Its own class so a caller that guards replies (:class:`~memtree.aggregate.LLMAggregator`)
    can count an empty reply as a failed guard and fall back, while other unusable
    replies keep the default handling."""


class ModelUnavailableError(RuntimeError):
    """A model was not called: its circuit breaker is open after repeated failures,
    or too many earlier calls to it still run past their timeout. Never retried; a
    summary it should have written stays stale for ``repair()``."""


@dataclass(frozen=True)
class RetryPolicy:
    """How model calls are retried and timed out.

    Attempt ``n`` that fails transiently is followed by a wait of
    ``min(max_delay, initial_delay · multiplier^(n-1))``, shortened at random by up to
    ``jitter`` of itself (so clients that failed together do not retry together), or
    by what the server asked in Retry-After if that is longer (at most
    ``max_retry_after``). ``timeout`` bounds each attempt in seconds (``None``: no
    limit). ``max_attempts=1`` turns retries off.

    Example::

        OpenAIChatModel(retry=RetryPolicy(max_attempts=8, timeout=30))
    """

    max_attempts: int = 5
    initial_delay: float = 0.5
    max_delay: float = 30.0
    multiplier: float = 2.0
    jitter: float = 0.5
    timeout: float | None = 60.0
    max_retry_after: float = 120.0
    breaker_failures: int = 5
    """Calls in a row that fail for a transient reason (after their retries) before
    the model's circuit breaker opens; ``0`` never opens it."""
    breaker_cooldown: float = 30.0
    """Seconds an open breaker refuses calls before letting one trial call through."""

    def __post_init__(self) -> None:
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int) or self.max_attempts < 1:
            raise ValueError(f"max_attempts must be an integer >= 1, got {self.max_attempts!r}")
        for name in ("initial_delay", "max_delay", "max_retry_after"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0 seconds, got {getattr(self, name)}")
        if self.multiplier < 1:
            raise ValueError(f"multiplier must be >= 1, got {self.multiplier}")
        if not 0.0 <= self.jitter <= 1.0:
            raise ValueError(f"jitter must be between 0 and 1, got {self.jitter}")
        if self.timeout is not None and self.timeout <= 0:
            raise ValueError(f"timeout must be a positive number of seconds or None, got {self.timeout}")
        if isinstance(self.breaker_failures, bool) or not isinstance(self.breaker_failures, int):
            raise ValueError(f"breaker_failures must be an integer >= 0, got {self.breaker_failures!r}")
        if self.breaker_failures < 0:
            raise ValueError(f"breaker_failures must be an integer >= 0, got {self.breaker_failures!r}")
        if self.breaker_cooldown < 0:
            raise ValueError(f"breaker_cooldown must be >= 0 seconds, got {self.breaker_cooldown}")

    def backoff(self, retry: int, retry_after: float | None = None) -> float:
        """Seconds to wait before retry number ``retry`` (1 for the first)."""
        base = min(self.max_delay, self.initial_delay * self.multiplier ** (retry - 1))
        delay = base * (1.0 - self.jitter * random.random())
        if retry_after is not None:
            delay = max(delay, min(retry_after, self.max_retry_after))
        return delay

    def call(
        self,
        attempt: Callable[[float | None], T],
        *,
        what: str,
        enforce_timeout: bool = True,
        breaker: CircuitBreaker | None = None,
        retry_timeouts: bool = True,
    ) -> T:
        """Run ``attempt(timeout)`` until it succeeds, fails for good, or attempts run out.

        With ``enforce_timeout`` each attempt runs in a helper thread that is abandoned
        after ``timeout`` seconds (a ``TimeoutError``, retried); pass ``False`` when the
        attempt enforces the timeout it is given itself (an HTTP client's timeout).
        The last error is raised with a note saying how many attempts were made.
        ``breaker`` (the model's :class:`CircuitBreaker`) refuses the call at once
        while it is open, and stops retrying when it opens meanwhile.
        ``retry_timeouts=False`` raises a timeout at once instead of retrying it (a
        caller that can split its batch does that instead: :class:`BatchSplitter`).
        """
        if breaker is not None:
            breaker.before(what)
        number = 1
        while True:
            try:
                if enforce_timeout and self.timeout is not None:
                    result = call_with_timeout(lambda: attempt(self.timeout), self.timeout, what)
                else:
                    result = attempt(self.timeout)
            except Exception as error:
                delay = self._delay_after(error, number, what, breaker, retry_timeouts)
                if delay is None:
                    raise
            else:
                if breaker is not None:
                    breaker.succeeded()
                return result
            time.sleep(delay)
            number += 1

    async def acall(
        self,
        attempt: Callable[[float | None], Awaitable[T]],
        *,
        what: str,
        enforce_timeout: bool = True,
        breaker: CircuitBreaker | None = None,
        retry_timeouts: bool = True,
    ) -> T:
        """Async :meth:`call`: the timeout cancels the attempt's coroutine."""
        if breaker is not None:
            breaker.before(what)
        number = 1
        while True:
            try:
                if enforce_timeout and self.timeout is not None:
                    try:
                        result = await asyncio.wait_for(attempt(self.timeout), self.timeout)
                    except TimeoutError:
                        raise TimeoutError(f"{what} took longer than {self.timeout} s") from None
                else:
                    result = await attempt(self.timeout)
            except Exception as error:
                delay = self._delay_after(error, number, what, breaker, retry_timeouts)
                if delay is None:
                    raise
            else:
                if breaker is not None:
                    breaker.succeeded()
                return result
            await asyncio.sleep(delay)
            number += 1

    def _delay_after(
        self,
        error: Exception,
        number: int,
        what: str,
        breaker: CircuitBreaker | None = None,
        retry_timeouts: bool = True,
    ) -> float | None:
        """The wait before the next attempt, or ``None`` to give up (noting why on the
        error, and telling the breaker of a call that failed for a transient reason).
        A timeout the caller will split rather than retry (``retry_timeouts=False``)
        tells the breaker nothing: the model answered slowly, not wrongly."""
        if not retry_timeouts and is_timeout(error):
            return None
        retryable, retry_after = transient(error)
        if not retryable:
            if breaker is not None:  # refused for hanging: a failure; any other answer: reachable
                breaker.failed() if isinstance(error, ModelUnavailableError) else breaker.settled()
            return None
        if breaker is not None and breaker.is_open():
            error.add_note(f"{what}: gave up after {number} attempts; its circuit breaker opened meanwhile")
            breaker.failed()
            return None
        if number >= self.max_attempts:
            if breaker is not None:
                breaker.failed()
            if number > 1:
                error.add_note(f"{what}: gave up after {number} attempts")
            return None
        delay = self.backoff(number, retry_after)
        usage.report(retries=1)
        logger.info(
            "%s failed (%s: %s); retry %d of %d in %.2f s",
            what,
            type(error).__name__,
            _short(error),
            number,
            self.max_attempts - 1,
            delay,
        )
        return delay


def batch_timeout(base: float | None, per_item: float, count: int) -> float | None:
    """Seconds a call over ``count`` texts may take: ``base`` for the call plus
    ``per_item`` per text (``None``: no limit). Why: a batch of 256 chunks that an idle
    machine embeds in 20 s takes minutes on a busy one; one fixed limit either fails
    big batches under load or waits minutes for a single text that hangs."""
    return None if base is None else base + per_item * count


def is_timeout(error: BaseException) -> bool:
    """Whether ``error`` (or its cause, a few levels down) is a timeout: ``TimeoutError``
    or a client library's timeout error."""
    current: BaseException | None = error
    for _ in range(4):
        if current is None:
            return False
        if isinstance(current, (TimeoutError, *_client_errors(_TIMEOUT_CLIENT_ERRORS))):
            return True
        current = current.__cause__
    return False


class BatchSplitter:
    """Runs a call over batches of items so that a batch that times out is split in two
    halves, never tried again at its size, and remembers the size that timed out.

    Each later batch (of this call and of later ones through the same splitter) is
    first cut to below the smallest size that timed out: once a busy machine has made
    a batch of 256 time out, the next batch is not tried at 256 again. A single item
    that times out raises (its caller's retry policy has had its say). Results come
    back in the order of the items.

    Example::

        splitter = BatchSplitter()
        rows = splitter.run([texts[:64], texts[64:]], lambda batch: embed_with_timeout(batch))
    """

    def __init__(self) -> None:
        self.cap: int | None = None
        """Largest batch size tried from now on: half the smallest that timed out."""
        self._lock = threading.Lock()

    def run(
        self, batches: Sequence[Sequence[Item]], call: Callable[[list[Item]], T], what: str = "the model"
    ) -> list[T]:
        """``call`` on each batch, in order; timed-out batches split (see the class)."""
        pending = deque(list(batch) for batch in batches)
        results: list[T] = []
        while pending:
            batch = pending.popleft()
            if self._recut(batch, pending):
                continue
            try:
                results.append(call(batch))
            except Exception as error:
                if len(batch) < 2 or not is_timeout(error):
                    raise
                pending.extendleft(reversed(self._split(batch, what, error)))
        return results

    async def arun(
        self, batches: Sequence[Sequence[Item]], call: Callable[[list[Item]], Awaitable[T]], what: str = "the model"
    ) -> list[T]:
        """Async :meth:`run`."""
        pending = deque(list(batch) for batch in batches)
        results: list[T] = []
        while pending:
            batch = pending.popleft()
            if self._recut(batch, pending):
                continue
            try:
                results.append(await call(batch))
            except Exception as error:
                if len(batch) < 2 or not is_timeout(error):
                    raise
                pending.extendleft(reversed(self._split(batch, what, error)))
        return results

    def _recut(self, batch: list[Item], pending: deque[list[Item]]) -> bool:
        """Put ``batch`` back in pieces below the cap, if it is above it (then ``True``)."""
        cap = self.cap
        if cap is None or len(batch) <= cap:
            return False
        pending.extendleft(reversed([batch[start : start + cap] for start in range(0, len(batch), cap)]))
        return True

    def _split(self, batch: list[Item], what: str, error: BaseException) -> list[list[Item]]:
        half = (len(batch) + 1) // 2
        with self._lock:
            self.cap = half if self.cap is None else min(self.cap, half)
        usage.report(retries=1)  # an extra attempt after a timeout, as a retry is
        logger.info("%s timed out on a batch of %d (%s); trying it in two halves", what, len(batch), _short(error))
        return [batch[:half], batch[half:]]


NO_RETRIES = RetryPolicy(max_attempts=1, timeout=None, breaker_failures=0)
"""A policy that makes exactly one attempt with no time limit (and no breaker)."""


class CircuitBreaker:
    """Stops calling a model that keeps failing, so a dead or hanging model costs
    each write nothing instead of a full round of retries.

    After ``failures`` calls in a row fail for a transient reason (timeouts, dropped
    connections, 429/5xx, after their retries) the breaker opens: calls raise
    :class:`ModelUnavailableError` at once for ``cooldown`` seconds. Then calls go
    through again on probation: one more such failure opens it for another
    ``cooldown``, a success closes it. A summary refused meanwhile is stale, and
    ``MemTree.repair()`` rewrites it once the model answers again (:meth:`reset`
    lets a caller try before the cooldown ends). ``failures=0`` never opens.
    """

    def __init__(self, failures: int, cooldown: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.failures = failures
        self.cooldown = cooldown
        self.clock = clock
        self._lock = threading.Lock()
        self._failed = 0
        self._opened_at: float | None = None

    def is_open(self) -> bool:
        """Whether calls are being refused."""
        with self._lock:
            return self._opened_at is not None and self.clock() - self._opened_at < self.cooldown

    def before(self, what: str) -> None:
        """Let a call through, or raise :class:`ModelUnavailableError` while open."""
        with self._lock:
            if self._opened_at is None:
                return
            waited = self.clock() - self._opened_at
            if waited >= self.cooldown:  # on probation: the next failure opens it again
                self._opened_at, self._failed = None, max(0, self.failures - 1)
                return
            failed, left = self._failed, self.cooldown - waited
        raise ModelUnavailableError(
            f"{what} failed {failed} calls in a row, so it is not called for {left:.0f} s more "
            "(summaries wait, marked stale, for repair())"
        )

    def succeeded(self) -> None:
        """A call succeeded: close."""
        with self._lock:
            self._failed, self._opened_at = 0, None

    def settled(self) -> None:
        """A call ended with an answer that is not the model's fault to retry (a bad
        request): the model is reachable, so this closes the breaker too."""
        self.succeeded()

    def failed(self) -> None:
        """A call failed for a transient reason after its retries: count it, and open
        (again) once there are ``failures`` in a row."""
        with self._lock:
            self._failed += 1
            if self.failures and self._failed >= self.failures:
                self._opened_at = self.clock()

    def reset(self) -> None:
        """Close now, e.g. when the caller knows the model is back."""
        self.succeeded()


def breaker_for(owner: object, policy: RetryPolicy) -> CircuitBreaker:
    """``owner``'s breaker for ``policy`` (one per model object, made on first use and
    again if its retry policy is replaced)."""
    found = getattr(owner, "_memtree_breaker", None)
    if found is None or found[0] is not policy:
        found = (policy, CircuitBreaker(policy.breaker_failures, policy.breaker_cooldown))
        object.__setattr__(owner, "_memtree_breaker", found)
    return found[1]  # type: ignore[no-any-return]


def transient(error: BaseException) -> tuple[bool, float | None]:
    """Whether ``error`` is worth retrying, and the wait the server asked for (seconds).

    Follows ``__cause__`` a few levels, since wrappers often re-raise a client's error.
    """
    seen = 0
    current: BaseException | None = error
    while current is not None and seen < 4:
        verdict = _classify(current)
        if verdict is not None:
            return verdict
        current = current.__cause__
        seen += 1
    return False, None


def _classify(error: BaseException) -> tuple[bool, float | None] | None:
    """``(retryable, retry_after)``, or ``None`` when only the error's cause can tell."""
    if isinstance(error, _client_errors(_PERMANENT_CLIENT_ERRORS)):
        return False, None
    if isinstance(error, (ModelResponseError, TimeoutError, ConnectionError, json.JSONDecodeError)):
        return True, None
    status = _status_code(error)
    if status is not None:
        retryable = status in RETRYABLE_STATUS or 500 <= status <= 599
        return retryable, retry_after_seconds(_headers(error)) if retryable else None
    if isinstance(error, _client_errors(_TRANSIENT_CLIENT_ERRORS)):
        return True, None
    if isinstance(error, PERMANENT_ERRORS):
        return False, None
    return None


def _client_errors(by_module: Mapping[str, tuple[str, ...]]) -> tuple[type[BaseException], ...]:
    """The error classes named in ``by_module`` of the client libraries imported so far."""
    found: list[type[BaseException]] = []
    for module_name, names in by_module.items():
        module = sys.modules.get(module_name)
        for name in names:
            cls = getattr(module, name, None) if module is not None else None
            if isinstance(cls, type) and issubclass(cls, BaseException):
                found.append(cls)
    return tuple(found)


def _status_code(error: BaseException) -> int | None:
    for holder in (error, getattr(error, "response", None)):
        for name in ("status_code", "status"):
            value = getattr(holder, name, None)
            if isinstance(value, int) and not isinstance(value, bool) and 100 <= value <= 599:
                return value
    return None


def _headers(error: BaseException) -> Mapping[str, str] | None:
    response = getattr(error, "response", None)
    headers = getattr(response, "headers", None)
    return headers if isinstance(headers, Mapping) or hasattr(headers, "get") else None


def retry_after_seconds(headers: Mapping[str, str] | Any | None) -> float | None:
    """Seconds from ``retry-after-ms`` or ``retry-after`` (seconds or an HTTP date)."""
    if headers is None:
        return None
    milliseconds = _header(headers, "retry-after-ms")
    if milliseconds is not None:
        try:
            return max(0.0, float(milliseconds) / 1000.0)
        except ValueError:
            pass
    value = _header(headers, "retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        moment = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, moment.timestamp() - time.time())


def _header(headers: Any, name: str) -> str | None:
    value = headers.get(name)
    if value is None and isinstance(headers, Mapping):  # a plain dict is case-sensitive
        value = next((v for k, v in headers.items() if isinstance(k, str) and k.lower() == name), None)
    return None if value is None else str(value)


MAX_OVERRUNNING_CALLS = 8
"""Calls to one model (by name) that may still run in abandoned threads after their
timeout; while that many hang, further calls fail at once instead of adding threads."""

_overrunning: dict[str, int] = {}
_overrunning_lock = threading.Lock()


def overrunning_calls(what: str | None = None) -> int:
    """Abandoned calls still running past their timeout (to the model ``what``, or all)."""
    with _overrunning_lock:
        return sum(_overrunning.values()) if what is None else _overrunning.get(what, 0)


def call_with_timeout(fn: Callable[[], T], timeout: float, what: str = "the model call") -> T:
    """Run a blocking call, giving up with ``TimeoutError`` after ``timeout`` seconds.

    The call runs in a daemon thread (with the caller's context variables, so usage
    reports still reach the caller's scope). Python cannot stop a thread, so an
    overrunning call finishes in the background and its result is dropped. Once
    :data:`MAX_OVERRUNNING_CALLS` such calls to one model (``what``) are left running,
    a call raises :class:`ModelUnavailableError` without starting a thread, so a
    hanging model cannot pile up threads (at most that many, plus the calls already
    in flight when the limit was reached).
    """
    with _overrunning_lock:
        hanging = _overrunning.get(what, 0)
    if hanging >= MAX_OVERRUNNING_CALLS:
        raise ModelUnavailableError(
            f"{what}: {hanging} earlier calls still run past their {timeout} s timeout; "
            "not starting another until one returns"
        )
    future: Future[T] = Future()
    context = contextvars.copy_context()
    state = {"abandoned": False}
    state_lock = threading.Lock()

    def run() -> None:
        try:
            future.set_result(context.run(fn))
        except BaseException as error:  # noqa: BLE001 - handed to the waiting caller
            future.set_exception(error)
        finally:
            with state_lock:
                abandoned = state["abandoned"]
                state["abandoned"] = False
            if abandoned:
                _count_overrunning(what, -1)

    try:
        threading.Thread(target=run, name="memtree-model-call", daemon=True).start()
    except RuntimeError as error:
        if not refused_at_shutdown(error):
            raise
        # Python 3.12 refuses new threads at interpreter exit. The exit flush runs in
        # the background worker, a daemon thread that exit waits for only so long
        # (memtree.background.EXIT_FLUSH_SECONDS): that wait bounds this call instead.
        return context.run(fn)
    try:
        return future.result(timeout)
    except TimeoutError:
        if future.done():  # the call itself raised TimeoutError
            raise
        with state_lock:
            if not future.done():
                state["abandoned"] = True
                _count_overrunning(what, +1)
        raise TimeoutError(f"{what} took longer than {timeout} s") from None


def refused_at_shutdown(error: RuntimeError) -> bool:
    """Whether starting a thread failed because the interpreter is exiting (Python
    3.12 refuses them from the start of shutdown; 3.11 and 3.13 allow them in
    ``atexit`` handlers)."""
    return "interpreter shutdown" in str(error)


def _count_overrunning(what: str, change: int) -> None:
    with _overrunning_lock:
        count = _overrunning.get(what, 0) + change
        if count > 0:
            _overrunning[what] = count
        else:
            _overrunning.pop(what, None)


def _short(error: BaseException, width: int = 160) -> str:
    return preview(str(error), width)
