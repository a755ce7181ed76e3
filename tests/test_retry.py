"""RetryPolicy: what is retried, how long it waits, when it gives up, how timeouts work."""

from __future__ import annotations

import asyncio
import email.utils
import json
import threading
import time

import aiohttp
import httpx
import openai
import pytest
import requests
from hypothesis import given
from hypothesis import strategies as st
from langchain_core.embeddings import Embeddings
from openai_server import FakeOpenAIServer

from memtree.model_usage import recording
from memtree.models import OpenAIChatModel
from memtree.models.langchain import LangChainEmbedder
from memtree.retry import ModelResponseError, RetryPolicy, call_with_timeout, retry_after_seconds, transient
from memtree.stats import Counters

NO_WAIT = RetryPolicy(max_attempts=4, initial_delay=0.0, timeout=None)


class _Response:
    def __init__(self, status: int, headers: dict[str, str] | None = None) -> None:
        self.status_code = status
        self.headers = headers or {}


class StatusError(Exception):
    """Shaped like the errors of openai, anthropic and httpx: ``.response.status_code``."""

    def __init__(self, status: int, headers: dict[str, str] | None = None) -> None:
        super().__init__(f"HTTP {status}")
        self.response = _Response(status, headers)


class APIConnectionError(Exception):
    """Named like openai's, but not it: a class name alone decides nothing."""


def _request() -> httpx.Request:
    return httpx.Request("POST", "http://127.0.0.1:9/v1/chat/completions")


def _status(cls: type[openai.APIStatusError], status: int) -> openai.APIStatusError:
    return cls(f"HTTP {status}", response=httpx.Response(status, request=_request()), body=None)


def _wrapped(error: BaseException, outer: BaseException) -> BaseException:
    """``outer`` as if raised from ``error``, as wrappers and downloaders do."""
    outer.__cause__ = error
    return outer


class Flaky:
    """Fails with the given errors in turn, then answers."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.calls = 0

    def __call__(self, timeout: float | None) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


@pytest.mark.parametrize(
    ("error", "retryable"),
    [
        (StatusError(429), True),
        (StatusError(500), True),
        (StatusError(503), True),
        (StatusError(408), True),
        (StatusError(400), False),
        (StatusError(401), False),
        (StatusError(404), False),
        (TimeoutError("slow"), True),
        (ConnectionResetError("reset"), True),
        (APIConnectionError("down"), False),
        (ModelResponseError("empty reply"), True),
        (json.JSONDecodeError("bad", "{", 1), True),
        (ValueError("bad argument"), False),
        (TypeError("wrong type"), False),
    ],
)
def test_transient_errors_are_recognized(error: Exception, retryable: bool) -> None:
    assert transient(error)[0] is retryable


@pytest.mark.parametrize(
    ("error", "retryable"),
    [
        # transient: the client libraries' connection and timeout errors, 408/409/425/429/5xx
        (openai.APIConnectionError(request=_request()), True),
        (openai.APITimeoutError(request=_request()), True),
        (_status(openai.RateLimitError, 429), True),
        (_status(openai.InternalServerError, 500), True),
        (_status(openai.InternalServerError, 503), True),
        (httpx.ConnectError("refused"), True),
        (httpx.ReadTimeout("slow"), True),
        (httpx.RemoteProtocolError("closed mid-reply"), True),
        (aiohttp.ServerDisconnectedError(), True),
        (_wrapped(httpx.ReadTimeout("slow"), RuntimeError("provider failed")), True),
        # permanent: waiting does not fix them
        (_status(openai.AuthenticationError, 401), False),
        (_status(openai.PermissionDeniedError, 403), False),
        (_status(openai.BadRequestError, 400), False),
        (_status(openai.NotFoundError, 404), False),
        (_status(openai.UnprocessableEntityError, 422), False),
        (FileNotFoundError("tokenizer.json"), False),
        (PermissionError("model cache"), False),
        # a tokenizer download (tiktoken fetches with requests) and a model download
        (requests.exceptions.ConnectionError("Failed to resolve 'openaipublic.blob.core.windows.net'"), False),
        (_wrapped(httpx.ConnectError("offline"), OSError("We couldn't connect to 'https://huggingface.co'")), False),
        (_wrapped(_status(openai.InternalServerError, 503), ValueError("bad config")), False),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, BaseException) else str(value),
)
def test_errors_are_judged_by_their_type_and_status_not_their_name(error: BaseException, retryable: bool) -> None:
    assert transient(error)[0] is retryable


def test_a_wrapped_error_is_judged_by_its_cause() -> None:
    try:
        try:
            raise StatusError(503)
        except StatusError as inner:
            raise RuntimeError("provider failed") from inner
    except RuntimeError as outer:
        assert transient(outer) == (True, None)


def test_retry_after_headers() -> None:
    assert retry_after_seconds({"retry-after-ms": "250"}) == 0.25
    assert retry_after_seconds({"Retry-After": "3"}) == 3.0
    assert retry_after_seconds({"retry-after": "1.5", "retry-after-ms": "20"}) == 0.02  # ms is more precise
    later = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 25 <= retry_after_seconds({"Retry-After": later}) <= 30  # type: ignore[operator]
    assert retry_after_seconds({"Retry-After": "soon"}) is None
    assert retry_after_seconds({}) is None
    assert transient(StatusError(429, {"Retry-After": "7"})) == (True, 7.0)


@given(retry=st.integers(1, 12), jitter=st.floats(0, 1), retry_after=st.none() | st.floats(0, 500))
def test_backoff_grows_is_capped_and_honours_retry_after(retry: int, jitter: float, retry_after: float | None) -> None:
    policy = RetryPolicy(initial_delay=0.5, multiplier=2.0, max_delay=10.0, jitter=jitter, max_retry_after=60.0)
    base = min(10.0, 0.5 * 2 ** (retry - 1))
    delay = policy.backoff(retry, retry_after)
    if retry_after is None:
        assert base * (1 - jitter) - 1e-9 <= delay <= base
    else:
        assert delay >= min(retry_after, 60.0)
        assert delay <= max(base, min(retry_after, 60.0))


def test_transient_failures_are_retried_and_counted() -> None:
    attempt = Flaky(StatusError(429), TimeoutError(), ModelResponseError("empty"))
    counters = Counters()
    with recording(counters):
        assert NO_WAIT.call(attempt, what="test model") == "ok"
    assert attempt.calls == 4
    assert counters.get("retries") == 3


def test_permanent_failures_are_not_retried() -> None:
    attempt = Flaky(StatusError(401))
    with pytest.raises(StatusError):
        NO_WAIT.call(attempt, what="test model")
    assert attempt.calls == 1


def test_gives_up_after_max_attempts_with_a_note() -> None:
    attempt = Flaky(*[StatusError(500) for _ in range(10)])
    with pytest.raises(StatusError) as caught:
        NO_WAIT.call(attempt, what="test model")
    assert attempt.calls == 4
    assert "test model: gave up after 4 attempts" in caught.value.__notes__


def test_the_wait_follows_retry_after(caplog: pytest.LogCaptureFixture) -> None:
    attempt = Flaky(StatusError(429, {"retry-after-ms": "40"}))
    with caplog.at_level("INFO", logger="memtree.retry"):
        NO_WAIT.call(attempt, what="test model")
    assert "retry 1 of 3 in 0.04 s" in caplog.text


async def test_async_retries_and_timeouts() -> None:
    calls = 0
    never = asyncio.Event()

    async def attempt(timeout: float | None) -> str:
        nonlocal calls
        calls += 1
        if calls == 1:
            await never.wait()  # stalls until the policy's timeout cancels it
        if calls == 2:
            raise StatusError(502)
        return "ok"

    policy = RetryPolicy(max_attempts=3, initial_delay=0.0, timeout=0.2)
    counters = Counters()
    with recording(counters):
        assert await policy.acall(attempt, what="async model") == "ok"
    assert calls == 3 and counters.get("retries") == 2


def test_call_with_timeout_abandons_a_stuck_call_and_keeps_context() -> None:
    release = threading.Event()
    with pytest.raises(TimeoutError, match=r"stuck call took longer than 0\.1 s"):
        call_with_timeout(lambda: release.wait(30), 0.1, "stuck call")
    release.set()
    counters = Counters()
    with recording(counters):
        call_with_timeout(lambda: counters.add("seen") or "x", 5.0)
    assert counters.get("seen") == 1


def test_a_stalled_attempt_is_retried_after_the_timeout() -> None:
    release = threading.Event()
    calls = 0

    def attempt(timeout: float | None) -> str:
        nonlocal calls
        calls += 1
        if calls == 1:
            release.wait(30)
        return "ok"

    policy = RetryPolicy(max_attempts=2, initial_delay=0.0, timeout=0.2)
    try:
        assert policy.call(attempt, what="model") == "ok"
    finally:
        release.set()
    assert calls == 2


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_attempts": 0}, "max_attempts"),
        ({"initial_delay": -1}, "initial_delay"),
        ({"multiplier": 0.5}, "multiplier"),
        ({"jitter": 2}, "jitter"),
        ({"timeout": 0}, "timeout"),
    ],
)
def test_bad_policies_name_the_field(options: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RetryPolicy(**options)  # type: ignore[arg-type]


@pytest.mark.parametrize("status", ["400", "401", "403", "404", "422"])
def test_an_openai_error_that_will_not_go_away_fails_at_once(openai_server: FakeOpenAIServer, status: str) -> None:
    model = OpenAIChatModel(**openai_server.client_options(), retry=RetryPolicy(initial_delay=0.0))
    openai_server.fail_next(status, times=5, endpoint="chat")
    with pytest.raises(openai.APIStatusError) as caught:
        model.complete("hello")
    assert caught.value.status_code == int(status)
    assert openai_server.count("chat") == 1


@pytest.mark.parametrize("status", ["408", "429", "500", "502", "503"])
def test_an_openai_error_that_may_go_away_is_retried(openai_server: FakeOpenAIServer, status: str) -> None:
    model = OpenAIChatModel(**openai_server.client_options(), retry=RetryPolicy(initial_delay=0.0))
    openai_server.fail_next(status, times=2, endpoint="chat")
    assert model.complete("hello").text
    assert openai_server.count("chat") == 3


def test_a_failed_tokenizer_download_is_not_retried() -> None:
    """What ``OpenAIEmbeddings`` raises when tiktoken cannot download its encoding:
    retrying it five times only made the failure slower."""

    class OfflineTokenizer(Embeddings):
        calls = 0

        def embed_documents(self, texts: list[str]) -> list[list[float]]:
            OfflineTokenizer.calls += 1
            raise requests.exceptions.ConnectionError(
                "HTTPSConnectionPool(host='openaipublic.blob.core.windows.net', port=443): "
                "Max retries exceeded with url: /encodings/cl100k_base.tiktoken"
            )

        def embed_query(self, text: str) -> list[float]:
            return self.embed_documents([text])[0]

    embedder = LangChainEmbedder(OfflineTokenizer(), retry=RetryPolicy(initial_delay=0.0))
    with pytest.raises(requests.exceptions.ConnectionError, match="cl100k_base"):
        embedder.embed(["hello"])
    assert OfflineTokenizer.calls == 1


def test_a_missing_model_file_is_not_retried() -> None:
    calls = 0

    def attempt(timeout: float | None) -> str:
        nonlocal calls
        calls += 1
        raise FileNotFoundError("/models/tokenizer.json")

    with pytest.raises(FileNotFoundError):
        NO_WAIT.call(attempt, what="test model")
    assert calls == 1


def test_model_loading_that_fails_offline_is_not_retried() -> None:
    """huggingface_hub's offline error is a ConnectionError raised without trying the
    network, and memtree's own local-model errors are OSErrors: none is retried."""
    from huggingface_hub.errors import OfflineModeIsEnabled

    from memtree.local_models import LocalModelUnavailableError
    from memtree.minilm import ModelFileError

    for error in (
        OfflineModeIsEnabled("Cannot reach https://huggingface.co: offline mode is enabled"),
        LocalModelUnavailableError("local model 'x' is not cached and the hub is offline"),
        ModelFileError("model file /m/model.safetensors is unreadable"),
    ):
        calls = 0

        def attempt(timeout: float | None, error: Exception = error) -> str:
            nonlocal calls
            calls += 1
            raise error

        with pytest.raises(type(error)):
            NO_WAIT.call(attempt, what="test model")
        assert calls == 1, type(error).__name__
