"""An OpenAI-compatible HTTP server on 127.0.0.1, for tests and benchmarks.

It answers ``POST /v1/chat/completions`` and ``POST /v1/embeddings`` (``/v1`` is
optional) the way the real API does, with deterministic content: embeddings are
memtree's :class:`~memtree.HashingEmbedder` vectors (``dimensions`` honoured, float
or base64), and a chat reply is derived from the prompt (for memtree's aggregation
prompt, a merge of the summary and the new entries; otherwise an echo of the
prompt's end), or whatever ``reply`` returns. ``usage`` is filled in (words count as
tokens). The real ``openai`` client talks to it::

    with FakeOpenAIServer() as server:
        model = OpenAIChatModel(**server.client_options())
        server.fail_next("429", retry_after=1)   # the next request is rate limited
        model.complete("hello")                  # retried after 1 s, then answered
        assert server.count("chat") == 2

Faults for :meth:`fail_next`: an HTTP status (``"429"``, ``"500"``, ``"503"``,
``"400"``, ``"401"``…, with optional Retry-After), ``"stall"`` (hold the request
until :meth:`release` or ``stall_limit`` seconds, so the client times out),
``"malformed"`` (invalid JSON with a JSON content type), ``"empty"`` (an empty
reply: no content for chat, no rows for embeddings). ``chat_delay`` answers every
chat call after a fixed delay (for benchmarks; tests should not time things).
:meth:`gate` holds the next ``n`` chat calls until all ``n`` are in flight, which
proves calls overlap without timing anything.
"""

from __future__ import annotations

import base64
import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np

from memtree import HashingEmbedder

ENDPOINTS = {"chat": "chat/completions", "embeddings": "embeddings"}


@dataclass
class Recorded:
    """One request the server received, and how it answered."""

    endpoint: str
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)
    status: int = 200
    fault: str | None = None


@dataclass
class _Fault:
    kind: str
    endpoint: str | None
    headers: dict[str, str] = field(default_factory=dict)


def default_reply(prompt: str) -> str:
    """A deterministic reply. For memtree's aggregation prompt: the first words of the
    current summary and of each new entry, so summaries share words with their
    leaves (and hashing embeddings place them near each other)."""
    entries = [line[2:].strip() for line in prompt.splitlines() if line.startswith("- ")]
    if not entries:
        return "Reply: " + " ".join(prompt.split()[-20:])
    summary = re.search(r"earlier entries:\n(.*?)\n\nNew entries", prompt, re.S)
    current = summary.group(1).strip() if summary else ""
    if current.startswith("(none yet"):
        current = ""
    words = current.split()[:24]
    for entry in entries:
        words += entry.split()[:8]
    return " ".join(words[:60])


class FakeOpenAIServer:
    """See the module docstring. Thread-safe; one instance per test is typical."""

    api_key = "test-key"

    def __init__(
        self,
        *,
        dimension: int = 64,
        chat_delay: float = 0.0,
        embedding_delay: float = 0.0,
        reply: Callable[[str], str] = default_reply,
        stall_limit: float = 30.0,
    ) -> None:
        self.dimension = dimension
        self.chat_delay = chat_delay
        self.embedding_delay = embedding_delay
        self.reply = reply
        self.stall_limit = stall_limit
        self.requests: list[Recorded] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._faults: list[_Fault] = []
        self._lock = threading.Lock()
        self._released = threading.Event()
        self._gate: threading.Barrier | None = None
        self._embedders: dict[int, HashingEmbedder] = {}
        self._http: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------

    def start(self) -> FakeOpenAIServer:
        handler = type("Handler", (_Handler,), {"server_state": self})
        self._http = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._http.daemon_threads = True
        self._thread = threading.Thread(
            target=self._http.serve_forever, kwargs={"poll_interval": 0.05}, name="fake-openai", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self.release()
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None

    def __enter__(self) -> FakeOpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """The base URL to give a client (``.../v1``)."""
        assert self._http is not None, "start the server first"
        return f"http://127.0.0.1:{self._http.server_address[1]}/v1"

    def client_options(self) -> dict[str, str]:
        """``base_url`` and ``api_key`` for OpenAIEmbedder / OpenAIChatModel."""
        return {"base_url": self.url, "api_key": self.api_key}

    # -- controls ----------------------------------------------------------------

    def fail_next(
        self,
        kind: str,
        times: int = 1,
        *,
        endpoint: str | None = None,
        retry_after: float | str | None = None,
        retry_after_ms: float | None = None,
    ) -> None:
        """Answer the next ``times`` requests (to ``endpoint``: "chat" or "embeddings",
        or any) with a fault: an HTTP status like "429" or "500", "stall",
        "malformed" or "empty"."""
        if not (kind.isdigit() or kind in ("stall", "malformed", "empty")):
            raise ValueError(f"unknown fault {kind!r}")
        if endpoint is not None and endpoint not in ENDPOINTS:
            raise ValueError(f"endpoint must be one of {sorted(ENDPOINTS)}, got {endpoint!r}")
        headers: dict[str, str] = {}
        if retry_after is not None:
            headers["Retry-After"] = str(retry_after)
        if retry_after_ms is not None:
            headers["retry-after-ms"] = str(retry_after_ms)
        with self._lock:
            self._faults.extend(_Fault(kind, endpoint, headers) for _ in range(times))

    def release(self) -> None:
        """Let stalled requests finish (they answer normally, to a client long gone)."""
        self._released.set()

    def gate(self, parties: int, timeout: float = 20.0) -> None:
        """Hold the next ``parties`` chat calls until all of them are in flight; if they
        never are (calls made one after another), each is answered 500 after ``timeout``."""
        with self._lock:
            self._gate = threading.Barrier(parties, action=self._open_gate, timeout=timeout)

    def _open_gate(self) -> None:
        self._gate = None

    def count(self, endpoint: str | None = None, *, status: int | None = None) -> int:
        """Requests received (to ``endpoint``, answered with ``status``)."""
        with self._lock:
            return sum(
                1
                for r in self.requests
                if (endpoint is None or r.endpoint == endpoint) and (status is None or r.status == status)
            )

    def prompts(self) -> list[str]:
        """The user messages of every chat request, in arrival order."""
        with self._lock:
            return [r.body["messages"][-1]["content"] for r in self.requests if r.endpoint == "chat"]

    def reset(self) -> None:
        """Forget requests, faults and the in-flight maximum."""
        with self._lock:
            self.requests.clear()
            self._faults.clear()
            self.max_in_flight = 0
            self._released.clear()

    # -- answering -----------------------------------------------------------------

    def _take_fault(self, endpoint: str) -> _Fault | None:
        with self._lock:
            for position, fault in enumerate(self._faults):
                if fault.endpoint in (None, endpoint):
                    return self._faults.pop(position)
        return None

    def _embedder(self, dimension: int) -> HashingEmbedder:
        with self._lock:
            if dimension not in self._embedders:
                self._embedders[dimension] = HashingEmbedder(dimension)
            return self._embedders[dimension]

    def answer(
        self, endpoint: str, body: dict[str, Any], headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        """(status, headers, body bytes) for one request; records it."""
        record = Recorded(endpoint, body, dict(headers or {}))
        with self._lock:
            self.requests.append(record)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            return self._answer(endpoint, body, record)
        finally:
            with self._lock:
                self.in_flight -= 1

    def _answer(self, endpoint: str, body: dict[str, Any], record: Recorded) -> tuple[int, dict[str, str], bytes]:
        fault = self._take_fault(endpoint)
        record.fault = fault.kind if fault else None
        if fault is not None and fault.kind.isdigit():
            record.status = int(fault.kind)
            error = {"error": {"message": f"injected {fault.kind}", "type": "server_error", "code": fault.kind}}
            return record.status, fault.headers, json.dumps(error).encode()
        if fault is not None and fault.kind == "malformed":
            return 200, {}, b'{"id": "cmpl-1", "choices": [{"message": '
        if fault is not None and fault.kind == "stall":
            self._released.wait(self.stall_limit)
        if endpoint == "chat":
            gate = self._gate
            if gate is not None:
                try:
                    gate.wait()
                except threading.BrokenBarrierError:
                    self._gate = None
                    record.status = 500
                    return 500, {}, b'{"error": {"message": "gate broken: calls did not overlap"}}'
            if self.chat_delay:
                time.sleep(self.chat_delay)  # the benchmark's fixed model latency
            return 200, {}, json.dumps(self._chat(body, empty=fault is not None and fault.kind == "empty")).encode()
        if self.embedding_delay:
            time.sleep(self.embedding_delay)
        return 200, {}, json.dumps(self._embeddings(body, empty=fault is not None and fault.kind == "empty")).encode()

    def _chat(self, body: dict[str, Any], *, empty: bool) -> dict[str, Any]:
        prompt = "\n".join(str(m.get("content", "")) for m in body.get("messages", []) if m.get("role") == "user")
        text = "" if empty else self.reply(prompt)
        return {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", "fake"),
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"},
            ],
            "usage": {
                "prompt_tokens": len(prompt.split()),
                "completion_tokens": len(text.split()),
                "total_tokens": len(prompt.split()) + len(text.split()),
            },
        }

    def _embeddings(self, body: dict[str, Any], *, empty: bool) -> dict[str, Any]:
        inputs = body.get("input", [])
        inputs = [inputs] if isinstance(inputs, str) else list(inputs)
        vectors = self._embedder(int(body.get("dimensions") or self.dimension)).embed([str(x) for x in inputs])
        as_base64 = body.get("encoding_format") == "base64"
        data = [
            {
                "object": "embedding",
                "index": i,
                "embedding": base64.b64encode(np.asarray(v, "<f4").tobytes()).decode() if as_base64 else v.tolist(),
            }
            for i, v in enumerate(vectors)
        ]
        tokens = sum(len(str(x).split()) for x in inputs)
        return {
            "object": "list",
            "data": [] if empty else data,
            "model": body.get("model", "fake"),
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }


class _Handler(BaseHTTPRequestHandler):
    server_state: FakeOpenAIServer
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out in two writes: don't let them wait on ACKs

    def do_POST(self) -> None:
        path = self.path.split("?")[0].rstrip("/")
        endpoint = next((name for name, suffix in ENDPOINTS.items() if path.endswith("/" + suffix)), None)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        if endpoint is None:
            self._send(404, {}, b'{"error": {"message": "no such endpoint"}}')
            return
        try:
            body = json.loads(raw or b"{}")
        except json.JSONDecodeError:
            self._send(400, {}, b'{"error": {"message": "request body is not JSON"}}')
            return
        received = {name.lower(): value for name, value in self.headers.items()}
        status, headers, payload = self.server_state.answer(endpoint, body, received)
        self._send(status, headers, payload)

    def _send(self, status: int, headers: dict[str, str], payload: bytes) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (a timeout test)
            self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass
