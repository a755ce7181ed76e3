"""The write procedures' model requests, and the two drivers that answer them.

Every write is written once, as a generator of requests (run these aggregation
jobs, embed these texts). :meth:`ModelCalls.drive` answers them with a thread pool
(sync API), :meth:`ModelCalls.adrive` on the event loop (async API), so one
procedure serves both. A failed call is handed back to the procedure as the
exception, which decides what it costs (a stale summary, never a lost leaf). Every
call is counted, and made inside a usage-recording scope so model adapters can
report the tokens and retries it spent.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Generator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from memtree.aggregate import Aggregator
from memtree.background import map_in_daemon_threads
from memtree.embed import DEFAULT_EMBED_TIMEOUT, Embedder, Matrix
from memtree.model_usage import recording
from memtree.planning import AggregationJob
from memtree.retry import ModelResponseError, call_with_timeout
from memtree.stats import Counters
from memtree.text import unstorable

T = TypeVar("T")

EMBED_CHUNK = 256
"""Texts per embedding call when many arrive together."""


@dataclass(frozen=True)
class Aggregate:
    """Request: run these jobs concurrently; answer with a text or an exception each."""

    jobs: list[AggregationJob]


@dataclass(frozen=True)
class Embed:
    """Request: embed these texts in one call; answer with a matrix or the exception.
    ``query`` asks for the embedder's query embedding of a single text; ``parts``
    (one list per text) asks :meth:`Embedder.embed_parts` for vectors of pieces of
    each text too, and is answered with ``(matrix, [part matrix per text])``."""

    texts: list[str]
    query: bool = False
    parts: list[list[str]] | None = None


Request = Aggregate | Embed
Steps = Generator[Request, Any, T]


def embed_steps(
    texts: list[str], check: Callable[[Any, int], Matrix], dimension: int | None, *, query: bool = False
) -> Steps[Matrix]:
    """Embed texts in chunks, checking every vector with ``check(vectors, count)``
    (no text: an empty matrix of the memory's ``dimension``)."""
    parts: list[Matrix] = []
    for start in range(0, len(texts), EMBED_CHUNK):
        chunk = texts[start : start + EMBED_CHUNK]
        answer = yield Embed(chunk, query)
        if isinstance(answer, BaseException):
            raise answer
        parts.append(check(answer, len(chunk)))
    return np.concatenate(parts) if parts else np.zeros((0, dimension or 1), np.float32)


def embed_with_parts(text: str, parts: list[str], check: Callable[[Any, int], Matrix]) -> Steps[tuple[Matrix, Matrix]]:
    """Embed one text and pieces of it (its sentences) in one call, checking both."""
    answer = yield Embed([text], parts=[parts])
    if isinstance(answer, BaseException):
        raise answer
    if not isinstance(answer, tuple) or len(answer) != 2 or len(answer[1]) != 1:
        raise ValueError("embed_parts must return (text vectors, [part vectors per text])")
    vectors, (part_vectors,) = answer
    return check(vectors, 1), check(part_vectors, len(parts))


def aggregations(jobs: list[AggregationJob], aggregator: Aggregator) -> Steps[list[str | BaseException]]:
    """Run jobs concurrently; each answer is a non-empty summary or the error."""
    outcomes = yield Aggregate(jobs)
    return [_checked_summary(outcome, aggregator) for outcome in outcomes]


def _checked_summary(outcome: object, aggregator: Aggregator) -> str | BaseException:
    if isinstance(outcome, BaseException):
        return outcome
    if not isinstance(outcome, str):
        return TypeError(
            f"{type(aggregator).__name__}.aggregate returned {type(outcome).__name__}, not the summary text (str)"
        )
    problem = unstorable(outcome)
    if problem:  # every store must refuse it alike, or an export could not be imported back
        return ModelResponseError(f"the aggregator's summary {problem}, which cannot be stored")
    return outcome.strip() or ModelResponseError("the aggregator returned an empty summary")


class ModelCalls:
    """A memory's embedder and summary writer, driven for its write procedures."""

    def __init__(self, embedder: Embedder, aggregator: Aggregator, counters: Counters, max_concurrency: int) -> None:
        self.embedder = embedder
        self.aggregator = aggregator
        self.counters = counters
        self.max_concurrency = max_concurrency
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        self.in_worker_thread: Callable[[], bool] = lambda: False
        """Whether the calling thread is the background worker, whose model calls run
        in daemon threads (which never hold up interpreter exit)."""

    def close(self, *, wait: bool = True) -> None:
        """Stop the worker threads (started again if a call comes later); with
        ``wait=False`` a thread still in a model call finishes on its own."""
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=wait)

    def drive(self, steps: Steps[T]) -> T:
        """Run a procedure, answering its requests with threads."""
        answer: Any = None
        try:
            while True:
                request = steps.send(answer)
                answer = self._answer_sync(request)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]

    async def adrive(self, steps: Steps[T]) -> T:
        """Run a procedure, answering its requests on the event loop.

        Reads and the final commit are short blocking store calls made from the
        loop's thread; model calls are awaited.
        """
        answer: Any = None
        try:
            while True:
                request = steps.send(answer)
                answer = await self._answer_async(request)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]

    def _answer_sync(self, request: Request) -> Any:
        if isinstance(request, Embed):
            self._count_embedding(request)
            embedder = self.embedder

            def embed() -> Any:
                with recording(self.counters):  # opened in the thread that calls the model
                    if request.parts is not None:
                        return embedder.embed_parts(request.texts, request.parts)
                    if request.query:
                        return _query_row(embedder.embed_query(request.texts[0]))
                    return embedder.embed(request.texts)

            timeout = embed_timeout(embedder)
            try:
                return embed() if timeout is None else call_with_timeout(embed, timeout, embedder.name)
            except Exception as error:  # noqa: BLE001 - handed back to the procedure
                return error
        self._count_aggregations(request.jobs)
        if not self.aggregator.calls_model:
            # CPU-bound Python (the extractive writer): threads would only take turns on
            # the GIL, and each hand-off waits for the scheduler, which on a busy machine
            # cost an insert more than the summaries themselves (benchmarks/results/scale.md).
            return [self._aggregate_one(job) for job in request.jobs]
        if self.in_worker_thread():
            return map_in_daemon_threads(self._aggregate_one, request.jobs, self.max_concurrency)
        return list(self._thread_pool().map(self._aggregate_one, request.jobs))

    async def _answer_async(self, request: Request) -> Any:
        if isinstance(request, Embed):
            self._count_embedding(request)
            embedder = self.embedder

            async def embed() -> Any:
                with recording(self.counters):
                    if request.parts is not None:
                        return await embedder.aembed_parts(request.texts, request.parts)
                    if request.query:
                        return _query_row(await embedder.aembed_query(request.texts[0]))
                    return await embedder.aembed(request.texts)

            timeout = embed_timeout(embedder)
            try:
                if timeout is None:
                    return await embed()
                try:
                    return await asyncio.wait_for(embed(), timeout)
                except TimeoutError:
                    raise TimeoutError(f"{embedder.name} took longer than {timeout} s") from None
            except Exception as error:  # noqa: BLE001
                return error
        self._count_aggregations(request.jobs)
        limit = asyncio.Semaphore(self.max_concurrency)

        async def one(job: AggregationJob) -> str | BaseException:
            async with limit:
                try:
                    with recording(self.counters):
                        if job.vectors is not None:
                            return await self.aggregator.asummarize(
                                job.new_texts, job.vectors, job.leaves, centroid=job.centroid
                            )
                        return await self.aggregator.aaggregate(
                            job.summary, job.new_texts, job.count, centroid=job.centroid
                        )
                except Exception as error:  # noqa: BLE001
                    return error

        return list(await asyncio.gather(*(one(job) for job in request.jobs)))

    def _aggregate_one(self, job: AggregationJob) -> str | BaseException:
        try:
            with recording(self.counters):  # this runs in a worker thread: open the scope here
                if job.vectors is not None:
                    return self.aggregator.summarize(job.new_texts, job.vectors, job.leaves, centroid=job.centroid)
                return self.aggregator.aggregate(job.summary, job.new_texts, job.count, centroid=job.centroid)
        except Exception as error:  # noqa: BLE001 - the procedure marks the node stale
            return error

    def _thread_pool(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    max_workers=self.max_concurrency, thread_name_prefix="memtree-aggregate"
                )
            return self._pool

    def _count_embedding(self, request: Embed) -> None:
        self.counters.add("embedding_calls")
        parts = sum(map(len, request.parts or [])) if not self.embedder.pools_parts else 0
        self.counters.add("embedded_texts", len(request.texts) + parts)

    def _count_aggregations(self, jobs: list[AggregationJob]) -> None:
        self.counters.add("aggregation_calls", len(jobs))
        if self.aggregator.calls_model:
            self.counters.add("llm_calls", len(jobs))


def embed_timeout(embedder: Embedder) -> float | None:
    """Seconds the memory lets one call to ``embedder`` take (its ``call_timeout``)."""
    return getattr(embedder, "call_timeout", DEFAULT_EMBED_TIMEOUT)


def _query_row(vector: Any) -> Any:
    """A query embedding as a one-row matrix; anything else is left for the vector
    check to reject with a clear message."""
    try:
        array = np.asarray(vector)
    except Exception:  # noqa: BLE001 - reported by check_embeddings
        return vector
    return array[None, :] if array.ndim == 1 else array
