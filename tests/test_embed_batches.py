"""Embedding calls that survive a busy machine: bounded batches, timeouts that grow
with the batch, a timed-out batch split instead of repeated, and the progress bar.

The machine's slowness is simulated on a fake clock: a model's call of ``n`` texts
advances the clock by ``n`` times its cost per text, and the timeout check reads
that clock instead of the wall (``memtree.retry.call_with_timeout`` is replaced by
one that runs the call and fails it if the clock moved past the limit). Nothing
sleeps; the outcome, not the speed, is asserted.
"""

from __future__ import annotations

import io
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np
import pytest
from llama_index.core import Document, Settings
from llama_index.core.embeddings import BaseEmbedding
from pydantic import PrivateAttr

import memtree.model_calls as model_calls
import memtree.retry as retry
from llamaindex_memtree import MemTreeIndex
from memtree import HashingEmbedder, MemTree, MemTreeConfig
from memtree.embed import Embedder, Matrix
from memtree.models.base import EmbeddingBatch, RemoteEmbedder
from memtree.retry import BatchSplitter, RetryPolicy

T = TypeVar("T")


class FakeClock:
    """Seconds that pass only when a model says its work took them."""

    def __init__(self) -> None:
        self.now = 0.0
        self.lock = threading.Lock()

    def spend(self, seconds: float) -> None:
        with self.lock:
            self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    """Timeouts judged on the fake clock, and retry backoffs that take no time."""
    fake = FakeClock()

    def call_with_timeout(fn: Callable[[], T], timeout: float, what: str = "the model call") -> T:
        started = fake.now
        result = fn()
        if fake.now - started > timeout:
            raise TimeoutError(f"{what} took longer than {timeout} s")
        return result

    monkeypatch.setattr(retry, "call_with_timeout", call_with_timeout)
    monkeypatch.setattr(RetryPolicy, "backoff", lambda self, number, retry_after=None: 0.0)
    return fake


class BusyMachineEmbedding(BaseEmbedding):
    """A LlamaIndex embed model on a machine so busy that each text takes 2 s: a batch
    of 100 takes 200 s. It records the size of every call."""

    embed_batch_size: int = 100
    _clock: FakeClock = PrivateAttr()
    _sizes: list[int] = PrivateAttr(default_factory=list)

    def __init__(self, clock: FakeClock, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._clock = clock

    def _embed(self, texts: Sequence[str]) -> list[list[float]]:
        self._sizes.append(len(texts))
        self._clock.spend(2.0 * len(texts))
        return HashingEmbedder(64).embed(list(texts)).tolist()

    def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return self._embed(texts)

    def _get_text_embedding(self, text: str) -> list[float]:
        return self._embed([text])[0]

    def _get_query_embedding(self, query: str) -> list[float]:
        return self._embed([query])[0]

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return self._embed([query])[0]


DOCUMENTS = [
    Document(text=f"Chunk {n} about topic {n % 7}: the river, the garden and the {n}th bridge.") for n in range(300)
]


@pytest.fixture
def busy_settings(clock: FakeClock) -> Any:
    previous = Settings._embed_model
    model = BusyMachineEmbedding(clock)
    Settings.embed_model = model
    yield model
    Settings._embed_model = previous


@pytest.mark.usefixtures("clock")
def test_from_documents_on_a_busy_machine_builds_instead_of_timing_out(busy_settings: BusyMachineEmbedding) -> None:
    # 300 chunks at 2 s each: one request of all of them (the old batch of 256)
    # overran the fixed 60 s limit on every one of its five attempts.
    index = MemTreeIndex.from_documents(DOCUMENTS)

    assert len(index.memory) == 300
    sizes = busy_settings._sizes
    assert max(sizes) <= busy_settings.embed_batch_size  # the model's own batch size bounds every call
    first_timeout = sizes.index(100) if 100 in sizes else None
    assert first_timeout is not None and sizes[first_timeout + 1] == 50  # timed out at 100: tried in halves
    after = sizes[first_timeout + 1 :]
    assert 100 not in after  # never again at the size that timed out
    assert all(size * 2.0 <= 60 + 1.0 * size for size in after)  # what followed fitted its scaled timeout


def test_a_batch_that_times_out_is_split_never_repeated_at_its_size(clock: FakeClock) -> None:
    seen: list[int] = []

    def call(batch: list[int]) -> list[int]:
        seen.append(len(batch))
        if len(batch) > 3:
            raise TimeoutError("took too long")
        return batch

    splitter = BatchSplitter()
    parts = splitter.run([list(range(10)), list(range(10, 20))], call)
    assert [item for part in parts for item in part] == list(range(20))
    assert seen[:3] == [10, 5, 3]  # 10 timed out, then 5, then halves of 5 fit
    assert seen.count(10) == 1 and seen.count(5) == 1  # the second batch starts below the size that failed
    assert splitter.cap == 3

    with pytest.raises(TimeoutError):  # one item cannot be split: its error is the caller's
        BatchSplitter().run([[1]], lambda batch: (_ for _ in ()).throw(TimeoutError("slow")))
    with pytest.raises(ValueError):  # other errors are not timeouts: raised at once
        BatchSplitter().run([[1, 2]], lambda batch: (_ for _ in ()).throw(ValueError("bad")))


class SlowCustomEmbedder(Embedder):
    """A user's own embedder (the engine bounds its calls): 1.5 s per text, 10 s allowed per call
    plus 1 s per text."""

    call_timeout = 10.0
    seconds_per_text = 1.0
    batch_size = 40

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.sizes: list[int] = []
        self.inner = HashingEmbedder(32)

    def embed(self, texts: Sequence[str]) -> Matrix:
        self.sizes.append(len(texts))
        self.clock.spend(1.5 * len(texts))
        return self.inner.embed(texts)


def test_the_engine_bounds_calls_to_a_custom_embedder_and_splits_those_that_time_out(clock: FakeClock) -> None:
    embedder = SlowCustomEmbedder(clock)
    memory = MemTree(embedder=embedder, config=MemTreeConfig(deduplicate=False))
    memory.add_many([f"note {n} on the weather in town {n % 5}" for n in range(100)], bulk=True)

    assert len(memory) == 100
    assert max(embedder.sizes) <= 40  # the embedder's batch_size, not the engine's 256-text request
    assert 20 in embedder.sizes  # 40 texts (60 s of work) overran 10 + 40 s: halves
    assert embedder.sizes.count(40) == 1  # and 40 was not tried again


def test_timeouts_grow_with_the_batch() -> None:
    assert model_calls.embed_timeout(SlowCustomEmbedder(FakeClock()), 40) == 50.0
    assert model_calls.embed_timeout(HashingEmbedder(8), 40) is None  # no limit stays no limit


@pytest.mark.usefixtures("clock")
def test_from_documents_shows_a_progress_bar_while_it_embeds(
    busy_settings: BusyMachineEmbedding, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tqdm.auto

    shown = io.StringIO()
    original = tqdm.auto.tqdm
    monkeypatch.setattr(tqdm.auto, "tqdm", lambda *a, **k: original(*a, **{**k, "file": shown}))
    MemTreeIndex.from_documents(DOCUMENTS[:40], show_progress=True)

    text = shown.getvalue()
    assert "Generating embeddings" in text and "40/40" in text


class SelfTimingAPI(RemoteEmbedder):
    """An API client that enforces the timeout it is given (as HTTP clients do) and needs
    2 s per text: requests over 60 texts cannot finish within 60 s + 1 s per text."""

    handles_timeout = True
    batch_size = 256

    def __init__(self) -> None:
        self.retry = RetryPolicy(timeout=60.0, initial_delay=0.0)
        self.sizes: list[int] = []
        self.timeouts: list[float | None] = []

    def _embed_batch(self, texts: list[str], timeout: float | None) -> EmbeddingBatch:
        self.sizes.append(len(texts))
        self.timeouts.append(timeout)
        if timeout is not None and 2.0 * len(texts) > timeout:
            raise TimeoutError(f"request of {len(texts)} texts timed out after {timeout} s")
        return EmbeddingBatch(HashingEmbedder(16).embed(texts))


def test_an_api_embedder_gets_timeouts_scaled_to_each_request_and_splits_the_ones_that_time_out() -> None:
    api = SelfTimingAPI()
    texts = [f"text {n}" for n in range(200)]
    vectors = api.embed(texts)

    assert np.allclose(vectors, HashingEmbedder(16).embed(texts))  # every row, in order
    assert api.sizes[:4] == [200, 100, 50, 50]  # 200 and 100 timed out once each, then halves fit
    assert api.timeouts[:3] == [260.0, 160.0, 110.0]  # 60 s plus 1 s per text
    assert api.sizes.count(200) == 1 and api.sizes.count(100) == 1


async def test_async_calls_split_a_timed_out_batch_too() -> None:
    api = SelfTimingAPI()
    texts = [f"text {n}" for n in range(120)]
    assert np.allclose(await api.aembed(texts), HashingEmbedder(16).embed(texts))
    assert api.sizes == [120, 60, 60]

    class OwnDeadline(Embedder):  # a custom embedder whose own client times out past 30 texts
        call_timeout = None
        batch_size = 100

        def __init__(self) -> None:
            self.sizes: list[int] = []

        def embed(self, texts: Sequence[str]) -> Matrix:
            self.sizes.append(len(texts))
            if len(texts) > 30:
                raise TimeoutError("the client's own deadline")
            return HashingEmbedder(16).embed(texts)

    embedder = OwnDeadline()
    memory = MemTree(embedder=embedder, config=MemTreeConfig(deduplicate=False))
    await memory.aadd_many([f"note {n} on the river" for n in range(100)])
    assert len(memory) == 100 and embedder.sizes[:3] == [100, 50, 25]
