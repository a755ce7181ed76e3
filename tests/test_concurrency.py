"""Several processes writing one namespace at once, and one reading meanwhile."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from store_worker import note, open_memory
from test_crash_safety import ENV, WORKER

WRITERS = 4
PER_WRITER = 200


def run_concurrently(
    location: str, per_writer: int = PER_WRITER, modes: tuple[str, ...] = ("eager",) * WRITERS
) -> None:
    """``len(modes)`` writer processes (one per mode, see store_worker.py) add
    ``per_writer`` notes each while a reader re-reads the tree; every insert must get
    its own leaf, every version the reader sees must be whole, and summaries a slow,
    failing model left stale must be repairable afterwards."""
    total = len(modes) * per_writer
    watcher = subprocess.Popen(
        [sys.executable, WORKER, "watch", location, "shared", str(total)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    assert watcher.stdout is not None
    assert watcher.stdout.readline().strip() == "ready"  # it has the (empty) tree open
    writers = [
        subprocess.Popen(
            [sys.executable, WORKER, "insert", location, "shared", f"w{i}", str(per_writer), mode],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=ENV,
        )
        for i, mode in enumerate(modes)
    ]
    acknowledged: dict[str, str] = {}
    for number, writer in enumerate(writers):
        out, errors = writer.communicate(timeout=600)
        assert writer.returncode == 0, errors
        for line in out.splitlines():
            index, leaf_id = line.split()
            acknowledged[leaf_id] = note(f"w{number}", int(index))
    if len(acknowledged) != total:
        watcher.kill()
    out, errors = watcher.communicate(timeout=600)
    assert watcher.returncode == 0, errors
    seen = json.loads(out.strip().splitlines()[-1])

    assert len(acknowledged) == total  # every insert got its own leaf
    with open_memory(location, "shared") as memory:
        assert len(memory) == total
        assert {leaf.id: leaf.text for leaf in memory.leaves()} == acknowledged
        assert memory.check_integrity() == []
        stale = memory.stats().stale
        assert memory.repair() == stale and memory.stats().stale == 0
        assert memory.check_integrity() == [] and len(memory) == total
    assert seen["problems"] == []  # every version the reader saw was a whole tree
    counts = seen["counts"]
    assert counts == sorted(counts) and counts[-1] == total  # growing, never going back
    assert len(set(counts)) >= 3  # it really watched the tree grow


@pytest.mark.slow
def test_four_sqlite_writers_and_a_reader(tmp_path: Path) -> None:
    run_concurrently(str(tmp_path / "shared.db"))


@pytest.mark.slow
def test_four_postgres_writers_and_a_reader(postgres_dsn: str) -> None:
    run_concurrently(postgres_dsn)


MIXED = ("eager", "deferred", "slow", "eager")
"""Four writers of different kinds at once: plain adds, a deferred block that flushes
at its end, and a slow model that fails every fifth call."""


@pytest.mark.slow
def test_four_by_a_hundred_sqlite_writers_of_every_kind_and_a_reader(tmp_path: Path) -> None:
    run_concurrently(str(tmp_path / "mixed.db"), per_writer=100, modes=MIXED)


@pytest.mark.slow
def test_four_by_a_hundred_postgres_writers_of_every_kind_and_a_reader(postgres_dsn: str) -> None:
    run_concurrently(postgres_dsn, per_writer=100, modes=MIXED)
