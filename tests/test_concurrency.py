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


def run_concurrently(location: str) -> None:
    total = WRITERS * PER_WRITER
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
            [sys.executable, WORKER, "insert", location, "shared", f"w{i}", str(PER_WRITER)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=ENV,
        )
        for i in range(WRITERS)
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
