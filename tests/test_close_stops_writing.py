"""``close()`` stops writing before it returns (issue 39 rows 3 and 8).

* Exit does not wait again for a memory already closed (before, ``close(timeout=1)``
  returned, then exit waited 10 s more and named the same summaries again).
* A flush still waiting for its model when ``close()`` gives up drops its write:
  nothing is committed, and nothing is logged, after ``close()`` returned, even when
  the store was closed with the memory.
* ``memory.close()`` while a ``MemTreeStore`` built on it is still open stops the
  store's writers too, before the store they write to closes: no traceback later.
* Four writer processes with an instant summary writer each close at once, leaving
  nothing stale (before, 2-3 of 4 hit the 10 s default and logged "is closed"
  tracebacks from a worker still running).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from gated import GATE_LIMIT, GatedAggregator

from langchain_memtree import MemTreeStore
from memtree import HashingEmbedder, MemoryBackend, MemTree, MemTreeConfig, Store
from memtree.background import flush_all_at_exit

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])}
TEXTS = [f"Alice practised the cello on day {i}. She played scales and a sonata." for i in range(6)]


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def location(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "memory":
        return "memory"
    if request.param == "sqlite":
        return str(tmp_path / "memory.db")
    return str(request.getfixturevalue("postgres_dsn"))


def open_gated(location: str, aggregator: GatedAggregator, backend: list[Store]) -> MemTree:
    """A background memory owning its store (``MemTree.open``), or on a shared in-memory one."""
    config = MemTreeConfig(theta0=0.15, aggregation="background")
    if location == "memory":
        backend.append(MemoryBackend())
        return MemTree(embedder=HashingEmbedder(64), aggregator=aggregator, store=backend[0], config=config)
    return MemTree.open(location, embedder=HashingEmbedder(64), aggregator=aggregator, config=config)


def reader_of(location: str, backend: list[Store]) -> MemTree:
    if location == "memory":
        return MemTree(embedder=HashingEmbedder(64), store=backend[0])
    return MemTree.open(location, embedder=HashingEmbedder(64))


def worker_threads() -> set[threading.Thread]:
    return {thread for thread in threading.enumerate() if thread.name.startswith("memtree-background")}


@pytest.fixture
def records_after_close(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    with caplog.at_level(logging.DEBUG, logger="memtree"):
        yield caplog


def test_a_flush_waiting_for_its_model_at_close_writes_nothing_and_logs_nothing_after(
    location: str, records_after_close: pytest.LogCaptureFixture
) -> None:
    aggregator = GatedAggregator()  # closed: the worker's model call waits
    backend: list[Store] = []
    memory = open_gated(location, aggregator, backend)
    memory.add_many(TEXTS[:4])
    assert aggregator.entered.wait(GATE_LIMIT)
    running = worker_threads()
    memory.close(timeout=0.2)
    warnings = [r for r in records_after_close.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "close() left" in warnings[0].getMessage()  # named once
    records_after_close.clear()
    reader = reader_of(location, backend)
    before = sorted((node.id, node.text, node.stale) for node in reader.walk())
    assert any(stale for _, _, stale in before)
    aggregator.gate.set()  # the model answers now, after close() returned
    for thread in running:
        thread.join(GATE_LIMIT)
    assert not any(thread.is_alive() for thread in running)
    reader.refresh()
    assert sorted((node.id, node.text, node.stale) for node in reader.walk()) == before  # nothing committed
    assert [r.getMessage() for r in records_after_close.records if r.levelno >= logging.WARNING] == []
    assert not any(r.exc_info for r in records_after_close.records)
    assert flush_all_at_exit(timeout=GATE_LIMIT) == 0  # exit has nothing left to wait for from it
    reader.close()


EXIT_AFTER_CLOSE = textwrap.dedent(
    """
    import logging, sys, time
    logging.basicConfig(level=logging.WARNING)
    from memtree import HashingEmbedder, MemTree, MemTreeConfig, Aggregator

    class Hanging(Aggregator):
        def aggregate(self, summary, new_texts, count, *, centroid=None):
            time.sleep(3600)

    config = MemTreeConfig(theta0=0.0, aggregation="background")
    memory = MemTree.open(sys.argv[1], embedder=HashingEmbedder(64), aggregator=Hanging(), config=config)
    for i in range(4):
        memory.add(f"note {i} about cats. And dogs too.")
    memory.close(timeout=0.5)
    print("closed", flush=True)
    """
)


def test_exit_does_not_wait_again_for_a_memory_already_closed(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", EXIT_AFTER_CLOSE, str(tmp_path / "m.db")],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=300,
        check=True,
    )
    assert done.stdout.strip() == "closed"
    assert done.stderr.count("close() left") == 1  # named once, by close()
    assert "exiting with" not in done.stderr  # exit did not wait for it (10 s) and name them again
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])  # stores a memory owns and closes with it
def test_closing_the_memory_under_an_open_langgraph_store_stops_the_stores_writers_first(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest, records_after_close: pytest.LogCaptureFixture
) -> None:
    aggregator = GatedAggregator()
    location = str(tmp_path / "memory.db") if backend == "sqlite" else request.getfixturevalue("postgres_dsn")
    memory = open_gated(location, aggregator, [])
    store = MemTreeStore(memory, index={"fields": ["text"]}, ttl={"sweep_interval_minutes": 1 / 60})
    for number, text in enumerate(TEXTS[:4]):
        store.put(("users", "alice"), f"day-{number}", {"text": text})
    assert aggregator.entered.wait(GATE_LIMIT)
    running = worker_threads()
    memory.close(timeout=0.2)  # the store is still open: its writers stop first
    warnings = [r.getMessage() for r in records_after_close.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "store/users/alice:" in warnings[0]
    records_after_close.clear()
    aggregator.gate.set()
    for thread in running:
        thread.join(GATE_LIMIT)
    assert store.stop_ttl_sweeper(timeout=GATE_LIMIT)  # it found the store closed and ended quietly
    store.close()
    assert [r.getMessage() for r in records_after_close.records if r.levelno >= logging.WARNING] == []
    assert not any(r.exc_info for r in records_after_close.records)


WRITER = textwrap.dedent(
    """
    import json, logging, random, sys, time
    logging.basicConfig(level=logging.WARNING)
    from langchain_memtree import MemTreeStore
    from memtree import HashingEmbedder, MemTree, MemTreeConfig

    location, name = sys.argv[1], sys.argv[2]
    memory = MemTree.open(location, embedder=HashingEmbedder(64), config=MemTreeConfig(theta0=0.2))
    store = MemTreeStore(memory, index={"fields": ["text"]})  # background summaries, instant extractive writer
    chooser = random.Random(name)
    for number in range(100):
        key = f"{name}-{chooser.randint(0, 30)}"
        if chooser.random() < 0.2:
            store.delete(("shared",), key)
        else:
            store.put(("shared",), key, {"text": f"{name} wrote note {number} about topic {chooser.randint(0, 9)}."})
    store.close()
    memory.close()
    print(json.dumps({"name": name}), flush=True)
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_four_writer_processes_close_leaving_nothing_stale_and_no_traceback(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    location = str(tmp_path / "shared.db") if backend == "sqlite" else request.getfixturevalue("postgres_dsn")
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, location, f"w{i}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=ENV,
        )
        for i in range(4)
    ]
    for writer in writers:
        out, errors = writer.communicate(timeout=600)
        assert writer.returncode == 0, errors
        assert json.loads(out.strip().splitlines()[-1])["name"]
        assert "Traceback" not in errors and "close() left" not in errors and "exiting with" not in errors, errors
    with MemTree.open(location, embedder=HashingEmbedder(64)) as memory:
        tree = memory.sibling(("store", "shared"))
        assert tree.check_integrity() == []
        assert tree.stats().stale == 0
