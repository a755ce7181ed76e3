"""OpenAI models (and any OpenAI-compatible server): embeddings and chat completions.

Both read ``OPENAI_API_KEY`` and ``OPENAI_BASE_URL`` unless given ``api_key`` /
``base_url``, so vLLM, Ollama, LM Studio, Azure-style gateways or a test server work
by setting the URL. The ``openai`` package is imported when a model is created, not
when memtree is imported. The client's own retries are turned off: memtree's
:class:`~memtree.retry.RetryPolicy` retries (and counts) instead, and its timeout is
passed to every request.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import re
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from memtree.embed import Matrix
from memtree.llm import ChatModel, Completion
from memtree.models.base import EmbeddingBatch, RemoteEmbedder
from memtree.retry import ModelResponseError, RetryPolicy

logger = logging.getLogger(__name__)

DEFAULT_EMBEDDING_MODEL = "text-embedding-3-small"
DEFAULT_CHAT_MODEL = "gpt-4o-mini"

MAX_INPUTS_PER_REQUEST = 2048
"""OpenAI's limit on texts in one embeddings request."""
MAX_TOKENS_PER_REQUEST = 300_000
"""OpenAI's limit on the summed tokens of one embeddings request."""
MAX_INPUT_TOKENS = 8191
"""The text-embedding-3 models' limit on one text."""


class MissingAPIKeyError(RuntimeError):
    """OpenAI was asked for but no API key was given or found in ``OPENAI_API_KEY``."""


def estimate_tokens(text: str) -> int:
    """A cautious upper estimate of a text's tokens without a tokenizer.

    English runs about four characters per token; counting three per ASCII character
    and two tokens per other character (CJK, emoji) overestimates, so requests built
    on it stay inside the API's limits. Pass ``token_counter=`` (e.g. tiktoken) for
    exact counts.
    """
    ascii_chars = len(text.encode("ascii", "ignore"))
    return math.ceil(ascii_chars / 3) + 2 * (len(text) - ascii_chars)


class _Clients:
    """One sync client, and one async client per event loop (an async HTTP client
    belongs to the loop it first ran on; reusing it on another loop fails)."""

    def __init__(self, owner: str, api_key: str | None, base_url: str | None, options: Mapping[str, Any]) -> None:
        openai = _import_openai(owner)
        key = api_key or os.environ.get("OPENAI_API_KEY")
        if not key:
            raise MissingAPIKeyError(
                f"{owner} needs an OpenAI API key: set OPENAI_API_KEY or pass api_key=...; "
                "for an OpenAI-compatible server that needs no key, pass base_url=... and any api_key"
            )
        self.base_url = base_url or os.environ.get("OPENAI_BASE_URL") or None
        self._settings = {"api_key": key, "base_url": self.base_url, "max_retries": 0, **options}
        self._openai = openai
        self.sync = openai.OpenAI(**self._settings)
        self._async: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = weakref.WeakKeyDictionary()

    def for_running_loop(self) -> Any:
        loop = asyncio.get_running_loop()
        client = self._async.get(loop)
        if client is None:
            client = self._async[loop] = self._openai.AsyncOpenAI(**self._settings)
        return client


@contextmanager
def _json_reply(name: str) -> Iterator[None]:
    """The client parses replies itself; invalid JSON becomes a (retried) ModelResponseError."""
    try:
        yield
    except json.JSONDecodeError as error:
        raise ModelResponseError(f"{name}: the server's reply is not valid JSON") from error


def _import_openai(owner: str) -> Any:
    try:
        import openai
    except ImportError as error:
        raise ImportError(f"{owner} needs the openai package: pip install 'memtree-llm[openai]'") from error
    return openai


class OpenAIEmbedder(RemoteEmbedder):
    """OpenAI embeddings (``text-embedding-3-small`` by default).

    ``dimensions`` shortens text-embedding-3 vectors (e.g. 512). Requests hold at
    most ``batch_size`` texts (OpenAI allows 2048) and ``max_request_tokens``
    tokens. A text longer than ``max_input_tokens`` is split into pieces that are
    embedded and averaged (``long_inputs="split"``) or cut to its first piece
    (``"truncate"``), with a warning either way. Token counts are estimated
    cautiously unless ``token_counter`` is given.

    Example::

        embedder = OpenAIEmbedder(dimensions=512)            # OPENAI_API_KEY from the env
        local = OpenAIEmbedder("nomic-embed-text", base_url="http://localhost:11434/v1", api_key="ollama")
    """

    handles_timeout = True

    def __init__(
        self,
        model: str = DEFAULT_EMBEDDING_MODEL,
        *,
        dimensions: int | None = None,
        api_key: str | None = None,
        base_url: str | None = None,
        retry: RetryPolicy | None = None,
        batch_size: int = MAX_INPUTS_PER_REQUEST,
        max_request_tokens: int = MAX_TOKENS_PER_REQUEST,
        max_input_tokens: int = MAX_INPUT_TOKENS,
        long_inputs: str = "split",
        token_counter: Callable[[str], int] | None = None,
        client_options: Mapping[str, Any] | None = None,
    ) -> None:
        if dimensions is not None and (
            isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions < 1
        ):
            raise ValueError(f"dimensions must be a positive integer or None, got {dimensions!r}")
        if long_inputs not in ("split", "truncate"):
            raise ValueError(f"long_inputs must be 'split' or 'truncate', got {long_inputs!r}")
        for label, value in (
            ("batch_size", batch_size),
            ("max_request_tokens", max_request_tokens),
            ("max_input_tokens", max_input_tokens),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{label} must be a positive integer, got {value!r}")
        self.model = model
        self.dimensions = dimensions
        self.batch_size = min(batch_size, MAX_INPUTS_PER_REQUEST)
        self.max_request_tokens = max_request_tokens
        self.max_input_tokens = max_input_tokens
        self.long_inputs = long_inputs
        self.count_tokens = token_counter or estimate_tokens
        if retry is not None:
            self.retry = retry
        self._clients = _Clients(
            "OpenAIEmbedder", api_key, base_url, {"timeout": self.retry.timeout, **(client_options or {})}
        )

    @property
    def name(self) -> str:
        suffix = f", dimensions={self.dimensions}" if self.dimensions else ""
        return f"OpenAIEmbedder({self.model}{suffix})"

    def _request(self, texts: list[str]) -> dict[str, Any]:
        request: dict[str, Any] = {"model": self.model, "input": texts, "encoding_format": "float"}
        if self.dimensions is not None:
            request["dimensions"] = self.dimensions
        return request

    def _embed_batch(self, texts: list[str], timeout: float | None) -> EmbeddingBatch:
        with _json_reply(self.name):
            response = self._clients.sync.embeddings.create(**self._request(texts), timeout=timeout)
        return _embedding_batch(response, len(texts), self.name)

    async def _aembed_batch(self, texts: list[str], timeout: float | None) -> EmbeddingBatch:
        with _json_reply(self.name):
            response = await self._clients.for_running_loop().embeddings.create(**self._request(texts), timeout=timeout)
        return _embedding_batch(response, len(texts), self.name)

    def _batches(self, texts: list[str]) -> list[list[str]]:
        batches: list[list[str]] = []
        current: list[str] = []
        tokens = 0
        for text in texts:
            size = self.count_tokens(text)
            if current and (len(current) >= self.batch_size or tokens + size > self.max_request_tokens):
                batches.append(current)
                current, tokens = [], 0
            current.append(text)
            tokens += size
        if current:
            batches.append(current)
        return batches

    # Long texts become several inputs whose vectors are averaged back into one.

    def embed(self, texts: Sequence[str]) -> Matrix:
        pieces, owners, weights = self._pieces(texts)
        return _merge_pieces(super().embed(pieces), owners, weights, len(texts))

    async def aembed(self, texts: Sequence[str]) -> Matrix:
        pieces, owners, weights = self._pieces(texts)
        return _merge_pieces(await super().aembed(pieces), owners, weights, len(texts))

    def embed_query(self, text: str) -> Matrix:
        return self.embed([text])[0]

    async def aembed_query(self, text: str) -> Matrix:
        return (await self.aembed([text]))[0]

    def _pieces(self, texts: Sequence[str]) -> tuple[list[str], list[int], list[int]]:
        pieces: list[str] = []
        owners: list[int] = []
        weights: list[int] = []
        for position, text in enumerate(texts):
            parts = split_by_tokens(text, self.max_input_tokens, self.count_tokens)
            if len(parts) > 1:
                kept = parts if self.long_inputs == "split" else parts[:1]
                logger.warning(
                    "%s: a text of about %d tokens exceeds the %d-token input limit; %s",
                    self.name,
                    self.count_tokens(text),
                    self.max_input_tokens,
                    f"embedding it as {len(parts)} pieces and averaging them"
                    if self.long_inputs == "split"
                    else "embedding only its start (long_inputs='truncate')",
                )
                parts = kept
            for part in parts:
                pieces.append(part)
                owners.append(position)
                weights.append(max(1, self.count_tokens(part)))
        return pieces, owners, weights


def split_by_tokens(text: str, limit: int, count: Callable[[str], int]) -> list[str]:
    """Split ``text`` at whitespace into pieces of at most ``limit`` tokens (by ``count``).

    A single word longer than the limit is cut by characters.
    """
    if count(text) <= limit:
        return [text]
    pieces: list[str] = []
    current: list[str] = []
    for word in re.findall(r"\S+", text):
        while count(word) > limit:  # no whitespace to split at: cut the word itself
            cut = max(1, len(word) * limit // max(1, count(word)))
            while cut > 1 and count(word[:cut]) > limit:
                cut = cut * 9 // 10
            if current:
                pieces.append(" ".join(current))
                current = []
            pieces.append(word[:cut])
            word = word[cut:]
        if current and count(" ".join([*current, word])) > limit:
            pieces.append(" ".join(current))
            current = []
        current.append(word)
    if current:
        pieces.append(" ".join(current))
    return [piece for piece in pieces if piece]


def _merge_pieces(vectors: Matrix, owners: list[int], weights: list[int], count: int) -> Matrix:
    if len(owners) == count:  # nothing was split: rows are already in order
        return vectors
    out = np.zeros((count, vectors.shape[1]), dtype=np.float64)
    for row, (owner, weight) in enumerate(zip(owners, weights, strict=True)):
        out[owner] += weight * vectors[row]
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    return (out / np.where(norms > 0, norms, 1.0)).astype(np.float32)


def _embedding_batch(response: Any, count: int, name: str) -> EmbeddingBatch:
    data = getattr(response, "data", None)
    if not isinstance(data, list) or len(data) != count:
        got = "text" if isinstance(response, str) else f"{len(data)} rows" if isinstance(data, list) else "no data"
        raise ModelResponseError(f"{name}: expected {count} embeddings in the reply, got {got}")
    try:
        rows = sorted(data, key=lambda item: item.index)
        vectors = [list(item.embedding) for item in rows]
    except (AttributeError, TypeError) as error:
        raise ModelResponseError(f"{name}: malformed embeddings in the reply ({error})") from None
    reported = getattr(response, "usage", None)
    tokens = getattr(reported, "prompt_tokens", None) or getattr(reported, "total_tokens", None)
    return EmbeddingBatch(vectors, tokens if isinstance(tokens, int) else None)


class OpenAIChatModel(ChatModel):
    """OpenAI chat completions (``gpt-4o-mini`` by default), one user message per prompt.

    ``temperature`` and ``max_tokens`` are sent only when given (some models reject
    them); ``system_prompt`` adds a system message; ``request_options`` adds any
    other field of the request (``{"seed": 7}``, ``{"max_completion_tokens": 400}``).

    Example::

        model = OpenAIChatModel("gpt-4o-mini", temperature=0)
        model.complete("Say hi").text
    """

    handles_timeout = True

    def __init__(
        self,
        model: str = DEFAULT_CHAT_MODEL,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        temperature: float | None = None,
        max_tokens: int | None = None,
        system_prompt: str | None = None,
        retry: RetryPolicy | None = None,
        request_options: Mapping[str, Any] | None = None,
        client_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.model = model
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.system_prompt = system_prompt
        self.request_options = dict(request_options or {})
        if retry is not None:
            self.retry = retry
        self._clients = _Clients(
            "OpenAIChatModel", api_key, base_url, {"timeout": self.retry.timeout, **(client_options or {})}
        )

    @property
    def name(self) -> str:
        return f"OpenAIChatModel({self.model})"

    def _request(self, prompt: str) -> dict[str, Any]:
        messages = [{"role": "user", "content": prompt}]
        if self.system_prompt:
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        request: dict[str, Any] = {"model": self.model, "messages": messages}
        if self.temperature is not None:
            request["temperature"] = self.temperature
        if self.max_tokens is not None:
            request["max_tokens"] = self.max_tokens
        return {**request, **self.request_options}

    def _complete(self, prompt: str, timeout: float | None) -> Completion:
        with _json_reply(self.name):
            response = self._clients.sync.chat.completions.create(**self._request(prompt), timeout=timeout)
        return _completion(response, self.name)

    async def _acomplete(self, prompt: str, timeout: float | None) -> Completion:
        with _json_reply(self.name):
            response = await self._clients.for_running_loop().chat.completions.create(
                **self._request(prompt), timeout=timeout
            )
        return _completion(response, self.name)


def _completion(response: Any, name: str) -> Completion:
    choices = getattr(response, "choices", None)
    if not isinstance(choices, list) or not choices:
        raise ModelResponseError(f"{name}: the reply has no choices")
    message = getattr(choices[0], "message", None)
    content = getattr(message, "content", None)
    if content is not None and not isinstance(content, str):
        raise ModelResponseError(f"{name}: the reply's content is {type(content).__name__}, expected text")
    reported = getattr(response, "usage", None)
    prompt_tokens = getattr(reported, "prompt_tokens", None)
    completion_tokens = getattr(reported, "completion_tokens", None)
    return Completion(
        content or "",
        prompt_tokens if isinstance(prompt_tokens, int) else None,
        completion_tokens if isinstance(completion_tokens, int) else None,
        truncated=getattr(choices[0], "finish_reason", None) == "length",
    )
