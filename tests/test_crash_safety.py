"""SIGKILL a process in the middle of inserting: nothing acknowledged is lost and the
tree that remains is whole (design.md §4: the previous or the next tree, never half).

Writers run in three modes (store_worker.py): eager adds, adds inside a
``deferred()`` block (summaries stale until a flush the kill never reaches) and a
slow model that fails now and then; afterwards ``repair()`` must rewrite every
stale summary.

Writers are forked from one fork server (``store_worker.py forkserver``) that has
imported memtree once, so a kill cycle costs its inserts and a reopen, not an
interpreter start-up: the test affords 25 kills per store. Each writer is still
its own process, opens its own store after the fork and dies by SIGKILL.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import pytest
from store_worker import open_memory

WORKER = str(Path(__file__).with_name("store_worker.py"))
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")])}
KILLS = 25
ACCEPT_TIMEOUT = 60.0  # seconds for a forked writer to connect; only reached if it hangs


class ForkServer:
    """Starts writers (``insert`` of store_worker.py) by fork and reaps them."""

    def __init__(self, location: str, namespace: str, log: Path) -> None:
        self.log = log
        with log.open("w") as errors:  # the server and the writers it forks keep their own copy
            self._process = subprocess.Popen(
                [sys.executable, WORKER, "forkserver", location, namespace],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=errors,
                text=True,
                env=ENV,
            )
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(ACCEPT_TIMEOUT)
        assert self._reply() == "ready"

    def start(self, prefix: str, mode: str = "eager") -> tuple[int, IO[str]]:
        """Fork a writer; return its pid and the stream its acknowledgements arrive on."""
        port = self._listener.getsockname()[1]
        pid = int(self._ask(f"insert {prefix} 100000 {port} {mode}").removeprefix("pid "))
        connection, _ = self._listener.accept()
        stream = connection.makefile("r")
        connection.close()  # the stream keeps the socket open
        return pid, stream

    def reap(self, pid: int) -> int:
        """Wait for a writer to end; its exit status as ``Popen.returncode`` has it."""
        return int(self._ask(f"reap {pid}").removeprefix("status "))

    def close(self) -> None:
        self._listener.close()
        assert self._process.stdin is not None and self._process.stdout is not None
        self._process.stdin.close()
        self._process.wait(timeout=60)
        self._process.stdout.close()

    def _ask(self, command: str) -> str:
        assert self._process.stdin is not None
        self._process.stdin.write(command + "\n")
        self._process.stdin.flush()
        return self._reply()

    def errors(self) -> str:
        """What the server and its writers wrote to stderr."""
        return self.log.read_text()

    def _reply(self) -> str:
        assert self._process.stdout is not None
        reply = self._process.stdout.readline().strip()
        assert reply, f"the fork server stopped:\n{self.errors()}"
        return reply


@contextmanager
def fork_server(location: str, folder: Path) -> Iterator[ForkServer]:
    server = ForkServer(location, "crash", folder / "writers.log")
    try:
        yield server
    finally:
        server.close()


def kill_while_inserting(server: ForkServer, rng: random.Random, prefix: str, mode: str = "eager") -> list[str]:
    """Start a writer, let it acknowledge a random number of inserts, SIGKILL it.

    Returns the ids it acknowledged. The kill lands after a random count of
    acknowledgements (0 means while it opens the store or does its first insert)
    plus a random delay of up to about one insert, so it hits every phase of an
    insert: embedding, routing, aggregation, the commit itself.
    """
    target = rng.choice([0, 1, 2, *range(3, 40)])
    pid, stream = server.start(prefix, mode)
    acknowledged: list[str] = []
    with stream:
        while len(acknowledged) < target:
            line = stream.readline()
            if not line.endswith("\n"):
                break
            acknowledged.append(line.split()[1])
        time.sleep(rng.uniform(0, 0.02))  # randomizes where in the next insert the kill lands
        os.kill(pid, signal.SIGKILL)
        status = server.reap(pid)
        # Lines sent before the kill were acknowledged too; the stream ends where the
        # writer died. A line cut short (no newline) was not acknowledged.
        acknowledged += [line.split()[1] for line in stream.read().splitlines(keepends=True) if line.endswith("\n")]
    assert status == -signal.SIGKILL, f"the writer ended on its own (status {status}):\n{server.errors()}"
    return acknowledged


def crash_repeatedly(location: str, folder: Path, kills: int, seed: int, mode: str = "eager") -> None:
    """Kill ``kills`` writers (in ``mode``: see store_worker.py) and check after each
    kill that every acknowledged insert is there and the tree is whole, and that
    :meth:`~memtree.MemTree.repair` rewrites every summary the writer left stale."""
    rng = random.Random(seed)
    acknowledged: list[str] = []
    repaired = 0
    with fork_server(location, folder) as server:
        for round_number in range(kills):
            acknowledged += kill_while_inserting(server, rng, f"r{round_number}", mode)
            with open_memory(location, "crash") as memory:
                stored = {node.id for node in memory.leaves()}
                lost = [leaf_id for leaf_id in acknowledged if leaf_id not in stored]
                assert lost == [], f"after kill {round_number + 1}: acknowledged inserts lost"
                assert memory.check_integrity() == []
                # Besides them, at most the one insert in flight per kill may have landed.
                assert len(acknowledged) <= len(stored) <= len(acknowledged) + round_number + 1
                stale = memory.stats().stale
                if stale:
                    assert memory.repair() == stale
                    assert memory.stats().stale == 0 and memory.check_integrity() == []
                    repaired += stale
    assert len(acknowledged) > kills  # the kills did land among inserts
    if mode != "eager":  # killed inside deferred blocks / after failed model calls
        assert repaired > 0, "the writers should have left stale summaries to repair"


@pytest.mark.slow
def test_sqlite_keeps_every_acknowledged_insert_through_sigkill(tmp_path: Path) -> None:
    crash_repeatedly(str(tmp_path / "crash.db"), tmp_path, kills=KILLS, seed=4)


@pytest.mark.slow
def test_postgres_keeps_every_acknowledged_insert_through_sigkill(postgres_dsn: str, tmp_path: Path) -> None:
    crash_repeatedly(postgres_dsn, tmp_path, kills=KILLS, seed=5)


MODE_KILLS = 12
"""Kills per store in the deferred and slow-model modes (each about 0.5 s)."""


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["deferred", "slow"])
def test_sqlite_sigkill_inside_deferred_blocks_and_slow_model_calls(tmp_path: Path, mode: str) -> None:
    crash_repeatedly(str(tmp_path / "crash.db"), tmp_path, kills=MODE_KILLS, seed=6, mode=mode)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["deferred", "slow"])
def test_postgres_sigkill_inside_deferred_blocks_and_slow_model_calls(
    postgres_dsn: str, tmp_path: Path, mode: str
) -> None:
    crash_repeatedly(postgres_dsn, tmp_path, kills=MODE_KILLS, seed=7, mode=mode)
