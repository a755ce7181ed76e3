"""SIGKILL a process in the middle of inserting: nothing acknowledged is lost and the
tree that remains is whole (design.md §4: the previous or the next tree, never half)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from store_worker import open_memory

WORKER = str(Path(__file__).with_name("store_worker.py"))
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")])}


def kill_while_inserting(location: str, rng: random.Random, prefix: str) -> list[str]:
    """Start a writer, let it acknowledge a random number of inserts, SIGKILL it.

    Returns the ids it acknowledged. The kill lands after a random count of
    acknowledgements (0 means during start-up or the first insert) plus a random
    delay of up to about one insert, so it hits every phase of an insert:
    embedding, routing, aggregation, the commit itself.
    """
    target = rng.choice([0, 1, 2, *range(3, 40)])
    child = subprocess.Popen(
        [sys.executable, WORKER, "insert", location, "crash", prefix, "100000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    acknowledged: list[str] = []
    assert child.stdout is not None
    while len(acknowledged) < target:
        line = child.stdout.readline()
        if not line.endswith("\n"):
            break
        acknowledged.append(line.split()[1])
    time.sleep(rng.uniform(0, 0.02))  # randomizes where in the next insert the kill lands
    child.send_signal(signal.SIGKILL)
    child.wait()
    # Lines written before the kill were acknowledged too. Read them through the same
    # buffered stream (communicate() would skip what readline() already buffered).
    # A line cut short by the kill (no newline yet) was not acknowledged.
    acknowledged += [line.split()[1] for line in child.stdout.read().splitlines(keepends=True) if line.endswith("\n")]
    assert child.stderr is not None
    errors = child.stderr.read()
    child.stdout.close()
    child.stderr.close()
    assert child.returncode == -signal.SIGKILL, errors
    return acknowledged


def crash_repeatedly(location: str, kills: int, seed: int) -> None:
    rng = random.Random(seed)
    acknowledged: list[str] = []
    for round_number in range(kills):
        acknowledged += kill_while_inserting(location, rng, f"r{round_number}")
        with open_memory(location, "crash") as memory:
            stored = {node.id for node in memory.leaves()}
            lost = [leaf_id for leaf_id in acknowledged if leaf_id not in stored]
            assert lost == [], f"after kill {round_number + 1}: acknowledged inserts lost"
            assert memory.check_integrity() == []
            # Besides them, at most the one insert in flight per kill may have landed.
            assert len(acknowledged) <= len(stored) <= len(acknowledged) + round_number + 1
    assert len(acknowledged) > kills  # the kills did land among inserts


@pytest.mark.slow
def test_sqlite_keeps_every_acknowledged_insert_through_sigkill(tmp_path: Path) -> None:
    crash_repeatedly(str(tmp_path / "crash.db"), kills=25, seed=4)


@pytest.mark.slow
def test_postgres_keeps_every_acknowledged_insert_through_sigkill(postgres_dsn: str) -> None:
    crash_repeatedly(postgres_dsn, kills=8, seed=5)
