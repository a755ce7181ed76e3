"""Adds with a model that is down or hangs: time per add and threads left behind (issue 17, D5).

Two scenarios, each a fresh in-memory tree of 6 leaves written while the model
worked, then ``--adds`` more while it does not:

* ``failing``: an OpenAI-compatible model on a closed 127.0.0.1 port (every call is
  a refused connection, retried with 0.1 s initial backoff, 5 attempts);
* ``hanging``: a model callable that never answers (0.2 s timeout per attempt,
  3 attempts), so each attempt leaves a thread behind.

Prints one JSON line per scenario: seconds per add (first, last, total), model calls,
``memtree-model-call`` threads alive at the end, leaves stored and summaries stale.
Runs against whichever memtree is on ``PYTHONPATH`` (to compare versions).

    python benchmarks/failing_model.py --adds 22
"""

from __future__ import annotations

import argparse
import json
import socket
import threading
import time
from typing import Any

from memtree import HashingEmbedder, MemTree, MemTreeConfig
from memtree.llm import CallableChatModel
from memtree.retry import RetryPolicy


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _run(model: Any, adds: int, switch: Any) -> dict[str, Any]:
    memory = MemTree(embedder=HashingEmbedder(64), llm=model, config=MemTreeConfig(theta0=0.3))
    switch(False)
    memory.add_many([f"Alice's cat Miso likes tuna fish {i}" for i in range(6)])
    switch(True)
    seconds = []
    for i in range(adds):
        start = time.perf_counter()
        memory.add(f"Bob's dog Rex chases the red ball number {i}")
        seconds.append(round(time.perf_counter() - start, 3))
    threads = sum(1 for thread in threading.enumerate() if thread.name == "memtree-model-call")
    return {
        "adds": adds,
        "first_add_s": seconds[0],
        "last_add_s": seconds[-1],
        "max_add_s": max(seconds),
        "total_s": round(sum(seconds), 2),
        "per_add_s": seconds,
        "threads_left": threads,
        "leaves": len(memory.leaves()),
        "stale": sum(1 for node in memory.walk() if node.stale),
    }


def _policy(breaker: int | None, **options: Any) -> RetryPolicy:
    """A policy; ``breaker`` sets ``breaker_failures`` (versions before the breaker lack it)."""
    return RetryPolicy(**options) if breaker is None else RetryPolicy(breaker_failures=breaker, **options)


def failing(adds: int, breaker: int | None = None) -> dict[str, Any]:
    from memtree.models import OpenAIChatModel

    policy = _policy(breaker, initial_delay=0.1, max_attempts=5, timeout=5.0)
    working = CallableChatModel(lambda prompt: "A summary of the entries.")
    down = OpenAIChatModel(api_key="test", base_url=f"http://127.0.0.1:{_closed_port()}/v1", retry=policy)
    current = {"model": working}

    def switch(broken: bool) -> None:
        current["model"] = down if broken else working

    calls = [0]

    def model(prompt: str) -> str:
        calls[0] += 1
        return current["model"].complete(prompt).text

    result = _run(CallableChatModel(model, retry=_policy(breaker, max_attempts=1, timeout=None)), adds, switch)
    return {"scenario": "failing", **result, "model_calls": calls[0]}


def hanging(adds: int, breaker: int | None = None) -> dict[str, Any]:
    never = threading.Event()
    broken = {"on": False}
    calls = [0]

    def model(prompt: str) -> str:
        calls[0] += 1
        if broken["on"]:
            never.wait(600)
        return "A summary of the entries."

    def switch(on: bool) -> None:
        broken["on"] = on

    policy = _policy(breaker, initial_delay=0.05, max_attempts=3, timeout=0.2)
    result = _run(CallableChatModel(model, retry=policy), adds, switch)
    never.set()
    return {"scenario": "hanging", **result, "model_calls": calls[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--adds", type=int, default=22)
    parser.add_argument("--scenario", choices=["failing", "hanging", "both"], default="both")
    parser.add_argument("--breaker-failures", type=int, default=None, help="0 turns the circuit breaker off")
    options = parser.parse_args()
    if options.scenario in ("failing", "both"):
        print(json.dumps(failing(options.adds, options.breaker_failures)))
    if options.scenario in ("hanging", "both"):
        print(json.dumps(hanging(options.adds, options.breaker_failures)))


if __name__ == "__main__":
    main()
