"""``RemoteEmbedder``: the base of embedders that call an API or a framework.

Like :class:`~memtree.llm.ChatModel` for chat models, it keeps the plumbing in one
place so an adapter implements one method (``_embed_batch``): texts are sent in
requests of at most ``batch_size``, each request is retried under ``retry`` and
bounded by a timeout that grows with its size (``retry.timeout`` plus
``seconds_per_text`` per text); a request that times out is split in two, never
sent again at its size (:class:`~memtree.retry.BatchSplitter`), the reply is checked (one row per text, else a retried
:class:`~memtree.retry.ModelResponseError`) and L2-normalized, and usage
(requests, tokens) is reported to the calling memory.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import threading
from abc import abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from memtree import model_usage as usage
from memtree.embed import Embedder, Matrix, unit_rows
from memtree.retry import BatchSplitter, CircuitBreaker, ModelResponseError, RetryPolicy, batch_timeout, breaker_for


@dataclass(frozen=True)
class EmbeddingBatch:
    """Vectors for a batch of texts (rows in order) and the tokens the API billed."""

    vectors: Any
    tokens: int | None = None


class RemoteEmbedder(Embedder):
    """Base for embedders behind an API: batching, retries, timeouts, usage reports.

    Subclasses implement :meth:`_embed_batch` (one attempt at one request) and may
    override :meth:`_aembed_batch` (native async), :meth:`_embed_query` (asymmetric
    models) and :meth:`_batches` (request limits other than a count). Set
    ``handles_timeout = True`` when the client enforces the timeout it is given.
    """

    retry: RetryPolicy = RetryPolicy()
    handles_timeout: bool = False
    batch_size: int = 256
    seconds_per_text: float = 1.0
    """Seconds each text adds to a request's timeout, on top of ``retry.timeout``: a
    local model wrapped by a framework embeds a 150-word chunk in 0.1-2 s, depending
    on how busy the machine is."""
    call_timeout = None  # each request is bounded under ``retry`` instead

    @abstractmethod
    def _embed_batch(self, texts: list[str], timeout: float | None) -> EmbeddingBatch:
        """One attempt at embedding one request's texts."""

    async def _aembed_batch(self, texts: list[str], timeout: float | None) -> EmbeddingBatch:
        """Async :meth:`_embed_batch`; by default the sync one in a worker thread."""
        return await asyncio.to_thread(self._embed_batch, texts, timeout)

    def _embed_query(self, text: str, timeout: float | None) -> EmbeddingBatch:
        """One attempt at embedding a retrieval query (a one-row batch)."""
        return self._embed_batch([text], timeout)

    async def _aembed_query(self, text: str, timeout: float | None) -> EmbeddingBatch:
        return await self._aembed_batch([text], timeout)

    def _batches(self, texts: list[str]) -> list[list[str]]:
        """How texts are split into requests: at most ``batch_size`` each."""
        return [texts[start : start + self.batch_size] for start in range(0, len(texts), self.batch_size)]

    # -- the Embedder contract, written once ---------------------------------------

    def embed(self, texts: Sequence[str]) -> Matrix:
        return _stack(
            self._splitter.run(
                self._batches(list(texts)),
                lambda batch: self._call(functools.partial(self._embed_batch, batch), len(batch)),
                self.name,
            )
        )

    async def aembed(self, texts: Sequence[str]) -> Matrix:
        async def request(batch: list[str]) -> Matrix:
            return await self._acall(functools.partial(self._aembed_batch, batch), len(batch))

        return _stack(await self._splitter.arun(self._batches(list(texts)), request, self.name))

    @property
    def _splitter(self) -> BatchSplitter:
        """This embedder's :class:`~memtree.retry.BatchSplitter` (made on first use: the
        subclasses' constructors need not call ours)."""
        found = self.__dict__.get("_memtree_splitter")
        if found is None:
            with _splitter_lock:
                found = self.__dict__.setdefault("_memtree_splitter", BatchSplitter())
        return found  # type: ignore[no-any-return]

    def request_policy(self, count: int) -> RetryPolicy:
        """``retry`` with the timeout of a request of ``count`` texts (see
        :data:`seconds_per_text`)."""
        timeout = batch_timeout(self.retry.timeout, self.seconds_per_text, count)
        return self.retry if timeout == self.retry.timeout else dataclasses.replace(self.retry, timeout=timeout)

    def embed_query(self, text: str) -> Matrix:
        return self._call(lambda timeout: self._embed_query(text, timeout), 1)[0]

    async def aembed_query(self, text: str) -> Matrix:
        return (await self._acall(lambda timeout: self._aembed_query(text, timeout), 1))[0]

    def _call(self, request: Callable[[float | None], EmbeddingBatch], count: int) -> Matrix:
        """One request under the retry policy: every attempt is counted and checked."""

        def attempt(timeout: float | None) -> Matrix:
            usage.report(embedding_requests=1)
            return self._checked(request(timeout), count)

        return self.request_policy(count).call(
            attempt,
            what=self.name,
            enforce_timeout=not self.handles_timeout,
            breaker=self.breaker,
            retry_timeouts=count < 2,  # a batch that timed out is split instead
        )

    async def _acall(self, request: Callable[[float | None], Awaitable[EmbeddingBatch]], count: int) -> Matrix:
        async def attempt(timeout: float | None) -> Matrix:
            usage.report(embedding_requests=1)
            return self._checked(await request(timeout), count)

        return await self.request_policy(count).acall(
            attempt,
            what=self.name,
            enforce_timeout=not self.handles_timeout,
            breaker=self.breaker,
            retry_timeouts=count < 2,
        )

    @property
    def breaker(self) -> CircuitBreaker:
        """This model's circuit breaker (see :class:`~memtree.retry.CircuitBreaker`;
        tuned by ``retry.breaker_failures`` and ``retry.breaker_cooldown``)."""
        return breaker_for(self, self.retry)

    def _checked(self, batch: object, count: int) -> Matrix:
        """The batch's vectors as unit float32 rows, or a retried error if malformed."""
        if not isinstance(batch, EmbeddingBatch):
            raise TypeError(f"{self.name}._embed_batch returned {type(batch).__name__}, expected an EmbeddingBatch")
        usage.report(embedding_tokens=batch.tokens)
        try:
            array = np.asarray(batch.vectors, dtype=np.float64)
        except (TypeError, ValueError) as error:
            raise ModelResponseError(f"{self.name} returned embeddings that are not numeric: {error}") from None
        if array.ndim != 2 or array.shape[0] != count or array.shape[1] == 0:
            raise ModelResponseError(f"{self.name} returned embeddings of shape {array.shape} for {count} texts")
        if not np.isfinite(array).all():
            return np.ascontiguousarray(array, dtype=np.float32)  # the engine's check names the problem
        unit = unit_rows(array)
        # Zero rows are left for the engine's check, which names the problem.
        return unit if unit is not None else np.ascontiguousarray(array, dtype=np.float32)


_splitter_lock = threading.Lock()


def _stack(parts: list[Matrix]) -> Matrix:
    if not parts:
        return np.zeros((0, 0), dtype=np.float32)
    return np.concatenate(parts) if len(parts) > 1 else parts[0]


DEFAULT_WRAPPED_BATCH = 32
"""Texts per request to a framework's embedding model that names no batch size of its
own: it may be a local model on a busy CPU, where 256 texts took minutes."""


def checked_batch_size(given: object, model_default: object) -> int:
    """``batch_size`` as given, else the wrapped model's own, else
    :data:`DEFAULT_WRAPPED_BATCH`; a ``ValueError`` names a bad one."""
    if given is None:
        fallback = optional_int(model_default)
        return fallback if fallback is not None and fallback >= 1 else DEFAULT_WRAPPED_BATCH
    if optional_int(given) is None or given < 1:  # type: ignore[operator]
        raise ValueError(f"batch_size must be an integer >= 1 or None (the model's own), got {given!r}")
    return given  # type: ignore[return-value]


def optional_int(value: object) -> int | None:
    """``value`` if it is an int (not a bool), else ``None``: for optional usage fields."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def describe_model(model: Any) -> str:
    """The class name, plus the model name when the object carries one."""
    label = type(model).__name__
    for field in ("model", "model_name", "model_id"):
        value = getattr(model, field, None)
        if isinstance(value, str) and value:
            return f"{label}:{value}"
    return label
