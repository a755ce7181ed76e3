"""A local GGUF model run in process by llama.cpp (``pip install 'memtree-llm[llamacpp]'``).

Experimental: it makes memtree fully offline *and* abstractive, but the small models
that run at a usable speed on a CPU write weak summaries (see the README section
"Fully offline, with a local model"), so :class:`LlamaCppChatModel` asks
:class:`~memtree.aggregate.LLMAggregator` to guard every reply
(:attr:`~memtree.llm.ChatModel.guard_summaries`). Select it with
``MemTree(llm="llama-cpp:/path/to/model.gguf")`` or ``--llm llama-cpp:PATH``.

The user supplies the model file; memtree ships none. ``llama_cpp`` is imported when
a model is created, not when memtree is imported.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from memtree.llm import ChatModel, Completion
from memtree.retry import ModelResponseError, RetryPolicy

GGUF_MAGIC = b"GGUF"
"""The first four bytes of every GGUF model file."""

THREADS_ENV = "MEMTREE_LLAMA_CPP_THREADS"
"""Environment variable with the default number of CPU threads (llama.cpp's own default
when unset): lets ``--llm llama-cpp:PATH`` runs share a busy machine."""


def check_gguf(model_path: str | os.PathLike[str]) -> Path:
    """``model_path`` as a :class:`~pathlib.Path` if it is a readable GGUF file, else
    a ``ValueError`` (``FileNotFoundError`` for a missing file) that says what to pass."""
    path = Path(model_path).expanduser()
    if not path.exists():
        raise FileNotFoundError(
            f"no GGUF model at {path}: pass the path of a .gguf file you downloaded, "
            "e.g. llm='llama-cpp:/models/qwen2.5-1.5b-instruct-q4_k_m.gguf'"
        )
    if path.is_dir():
        raise ValueError(f"{path} is a folder; pass the path of the .gguf model file inside it")
    try:
        with path.open("rb") as file:
            magic = file.read(len(GGUF_MAGIC))
    except OSError as error:
        raise ValueError(f"cannot read the model file {path}: {error.strerror or error}") from None
    if magic != GGUF_MAGIC:
        raise ValueError(
            f"{path} is not a GGUF model file (it starts with {magic!r}, not {GGUF_MAGIC!r}); "
            "llama.cpp needs a .gguf file: convert the model or download a GGUF build of it"
        )
    return path


def _import_llama_cpp() -> Any:
    try:
        import llama_cpp
    except ImportError:
        raise ImportError(
            "LlamaCppChatModel needs llama-cpp-python: pip install 'memtree-llm[llamacpp]' "
            "(a source build takes minutes; CMAKE_ARGS='-DLLAVA_BUILD=OFF' makes it shorter)"
        ) from None
    return llama_cpp


class LlamaCppChatModel(ChatModel):
    """A GGUF chat model run in this process by llama.cpp, one user message per prompt.

    The file is checked (it exists and starts with the GGUF magic bytes) and loaded
    when the model is created, so a bad path fails before a memory stores anything.
    The model's own chat template formats the prompt. ``max_tokens`` caps every
    reply (a reply cut at the cap is marked :attr:`~memtree.llm.Completion.truncated`);
    ``temperature=0`` and a fixed ``seed`` make runs repeatable. ``n_threads``
    defaults to ``$MEMTREE_LLAMA_CPP_THREADS`` or llama.cpp's choice; when given, it
    also bounds the threads that read the prompt (llama-cpp-python would use every
    core there, and two processes on two cores then made each call 3-4x slower);
    ``model_options``
    go to ``llama_cpp.Llama`` (``{"n_gpu_layers": -1}``).

    One llama.cpp context serves one call at a time, so calls from a memory's worker
    threads queue on a lock. The timeout of :attr:`retry` is enforced between
    generated tokens, counted from when the call gets the model: a call past it
    stops and raises ``TimeoutError`` (retried like a slow server). Waiting for the
    lock does not count: a deferred flush hands the model a session's summaries at
    once, and each waits its turn (each earlier call is bounded by its own timeout).
    Counting the wait failed most of such a flush's calls on a 2-core machine.

    Example::

        model = LlamaCppChatModel("/models/SmolLM2-135M-Instruct.Q4_1.gguf", n_threads=1)
        memory = MemTree(llm=model)  # or MemTree(llm="llama-cpp:/models/....gguf")
    """

    handles_timeout = True
    guard_summaries = True
    retry = RetryPolicy(max_attempts=2, timeout=120.0)

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        *,
        max_tokens: int = 160,
        temperature: float = 0.0,
        n_ctx: int = 4096,
        n_threads: int | None = None,
        seed: int = 0,
        system_prompt: str | None = None,
        retry: RetryPolicy | None = None,
        model_options: Mapping[str, Any] | None = None,
    ) -> None:
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be a positive number of tokens, got {max_tokens}")
        if n_threads is None and os.environ.get(THREADS_ENV, "").strip():
            raw = os.environ[THREADS_ENV].strip()
            if not raw.isdigit() or int(raw) < 1:
                raise ValueError(f"{THREADS_ENV} must be a positive whole number of threads, got {raw!r}")
            n_threads = int(raw)
        self.path = check_gguf(model_path)
        self.model = str(self.path)
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.system_prompt = system_prompt
        if retry is not None:
            self.retry = retry
        llama_cpp = _import_llama_cpp()
        options: dict[str, Any] = {"n_ctx": n_ctx, "seed": seed, "verbose": False, **(model_options or {})}
        if n_threads is not None:  # llama-cpp-python reads prompts on every core unless told otherwise
            options = {"n_threads": n_threads, "n_threads_batch": n_threads, **options}
        try:
            self._llama = llama_cpp.Llama(model_path=self.model, **options)
        except ValueError as error:  # llama.cpp's "Failed to load model from file"
            raise ValueError(f"llama.cpp could not load {self.path}: {error}") from None
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return f"LlamaCppChatModel({self.path.name})"

    def _complete(self, prompt: str, timeout: float | None) -> Completion:
        with self._lock:  # an earlier call ends within its own timeout
            started = time.monotonic()
            return self._generate(prompt, None if timeout is None else started + timeout)

    def _generate(self, prompt: str, deadline: float | None) -> Completion:
        messages = [{"role": "user", "content": prompt}]
        if self.system_prompt:
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        stream = self._llama.create_chat_completion(
            messages=messages, max_tokens=self.max_tokens, temperature=self.temperature, stream=True
        )
        pieces: list[str] = []
        finish: str | None = None
        try:
            for chunk in stream:
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"{self.name} took longer than its timeout")
                try:
                    choice = chunk["choices"][0]
                    content = choice["delta"].get("content")
                except (KeyError, IndexError, TypeError, AttributeError) as error:
                    raise ModelResponseError(f"{self.name}: malformed stream chunk ({error!r})") from None
                if content:
                    pieces.append(content)
                finish = choice.get("finish_reason") or finish
        finally:
            close = getattr(stream, "close", None)
            if close is not None:
                close()
        return Completion(
            "".join(pieces),
            prompt_tokens=len(self._llama.tokenize(prompt.encode("utf-8"), add_bos=False)),
            completion_tokens=len(pieces),
            truncated=finish == "length",
        )
