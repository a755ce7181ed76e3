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
import contextlib
import contextvars
import threading
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from memtree import retry
from memtree.aggregate import Aggregator
from memtree.background import map_in_daemon_threads
from memtree.embed import DEFAULT_BATCH_SIZE, DEFAULT_EMBED_TIMEOUT, DEFAULT_SECONDS_PER_TEXT, Embedder, Matrix
from memtree.model_usage import recording
from memtree.planning import AggregationJob
from memtree.retry import BatchSplitter, ModelResponseError, batch_timeout
from memtree.stats import Counters
from memtree.text import unstorable

T = TypeVar("T")

EMBED_CHUNK = 256
"""Texts per embedding request of a write procedure; the drivers answer it in calls of
the embedder's own ``batch_size``."""

_progress: contextvars.ContextVar[Callable[[int], None] | None] = contextvars.ContextVar(
    "memtree_embedding_progress", default=None
)


@contextlib.contextmanager
def embedding_progress(callback: Callable[[int], None]) -> Iterator[None]:
    """Call ``callback(count)`` each time an embedding call of ``count`` texts made in
    this block (this thread or task) returns: the adapters' progress bars
    (``MemTreeIndex.from_documents(show_progress=True)``)."""
    token = _progress.set(callback)
    try:
        yield
    finally:
        _progress.reset(token)


def _report_progress(count: int) -> None:
    callback = _progress.get()
    if callback is not None:
        callback(count)


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
        self._splitter = BatchSplitter()
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

            def embed(texts: list[str]) -> Any:
                with recording(self.counters):  # opened in the thread that calls the model
                    if request.parts is not None:
                        return embedder.embed_parts(texts, request.parts)
                    if request.query:
                        return _query_row(embedder.embed_query(texts[0]))
                    return embedder.embed(texts)

            def bounded(texts: list[str]) -> Any:
                timeout = embed_timeout(embedder, len(texts))
                if timeout is None:
                    answer = embed(texts)
                else:
                    answer = retry.call_with_timeout(lambda: embed(texts), timeout, embedder.name)
                _report_progress(len(texts))
                return answer

            try:
                if request.parts is not None or request.query:
                    return bounded(request.texts)
                return _joined(self._splitter.run(_batches(request.texts, embedder), bounded, embedder.name))
            except Exception as error:  # noqa: BLE001 - handed back to the procedure
                return error
        self._count_aggregations(request.jobs)
        if len(request.jobs) == 1 and not self.aggregator.calls_model:
            return [self._aggregate_one(request.jobs[0])]  # CPU-bound: no thread hop
        if self.in_worker_thread():
            return map_in_daemon_threads(self._aggregate_one, request.jobs, self.max_concurrency)
        return list(self._thread_pool().map(self._aggregate_one, request.jobs))

    async def _answer_async(self, request: Request) -> Any:
        if isinstance(request, Embed):
            self._count_embedding(request)
            embedder = self.embedder

            async def embed(texts: list[str]) -> Any:
                with recording(self.counters):
                    if request.parts is not None:
                        return await embedder.aembed_parts(texts, request.parts)
                    if request.query:
                        return _query_row(await embedder.aembed_query(texts[0]))
                    return await embedder.aembed(texts)

            async def bounded(texts: list[str]) -> Any:
                timeout = embed_timeout(embedder, len(texts))
                if timeout is None:
                    answer = await embed(texts)
                else:
                    try:
                        answer = await asyncio.wait_for(embed(texts), timeout)
                    except TimeoutError:
                        raise TimeoutError(f"{embedder.name} took longer than {timeout} s") from None
                _report_progress(len(texts))
                return answer

            try:
                if request.parts is not None or request.query:
                    return await bounded(request.texts)
                return _joined(await self._splitter.arun(_batches(request.texts, embedder), bounded, embedder.name))
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


def embed_timeout(embedder: Embedder, count: int = 1) -> float | None:
    """Seconds the memory lets one call of ``count`` texts to ``embedder`` take: its
    ``call_timeout`` plus ``seconds_per_text`` per text (``None``: no limit)."""
    base = getattr(embedder, "call_timeout", DEFAULT_EMBED_TIMEOUT)
    return batch_timeout(base, getattr(embedder, "seconds_per_text", DEFAULT_SECONDS_PER_TEXT), count)


def embed_batch_size(embedder: Embedder) -> int:
    """Texts per call to ``embedder``: its ``batch_size`` when it has a usable one."""
    size = getattr(embedder, "batch_size", None)
    if isinstance(size, int) and not isinstance(size, bool) and size >= 1:
        return size
    return DEFAULT_BATCH_SIZE


def _batches(texts: list[str], embedder: Embedder) -> list[list[str]]:
    size = embed_batch_size(embedder)
    return [texts[start : start + size] for start in range(0, len(texts), size)]


def _joined(answers: list[Any]) -> Any:
    """One matrix of the answers to a request's calls, in order. An answer that is not
    a matrix is handed on alone, for the vector check to name (its row count is wrong)."""
    if len(answers) == 1:
        return answers[0]
    arrays: list[Matrix] = []
    for answer in answers:
        try:
            array = np.asarray(answer, dtype=np.float32)
        except (TypeError, ValueError):
            return answer
        if array.ndim != 2 or (arrays and array.shape[1] != arrays[0].shape[1]):
            return answer
        arrays.append(array)
    return np.concatenate(arrays)


def _query_row(vector: Any) -> Any:
    """A query embedding as a one-row matrix; anything else is left for the vector
    check to reject with a clear message."""
    try:
        array = np.asarray(vector)
    except Exception:  # noqa: BLE001 - reported by check_embeddings
        return vector
    return array[None, :] if array.ndim == 1 else array
