"""Issue 25's lifecycle and growth rows: a bounded close, the exit flush on every
Python, background updates and deletes, a bounded in-memory log, compaction, and a
cap on every summary. Each test runs on every store it applies to."""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import subprocess
import sys
import textwrap
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
from gated import GATE_LIMIT, SEP, GatedAggregator, gated_memory, summaries_cover_exactly_their_leaves

from memtree import HashingEmbedder, LLMAggregator, MemoryBackend, MemTree, MemTreeConfig, SQLiteBackend, Store
from memtree.embed import Matrix
from memtree.llm import CallableChatModel
from memtree.retry import RetryPolicy


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "memory":
        opened: Store = MemoryBackend()
    elif request.param == "sqlite":
        opened = SQLiteBackend(tmp_path / "memory.db")
    else:
        from memtree import PostgresBackend

        opened = PostgresBackend(request.getfixturevalue("postgres_dsn"))
    yield opened
    opened.close()


ONE_TRY = RetryPolicy(max_attempts=1, timeout=None, breaker_failures=0)
TEXTS = [f"Alice practised the cello on day {i}. She played scales and a sonata." for i in range(6)]


# -- row 9: every summary is capped, whatever the model ---------------------------------------


def _replying(reply: str, store: Store, limit: int) -> MemTree:
    model = CallableChatModel(lambda prompt: reply, retry=ONE_TRY)
    config = MemTreeConfig(theta0=0.05, summary_max_chars=limit)
    return MemTree(embedder=HashingEmbedder(64), aggregator=LLMAggregator(model), store=store, config=config)


def test_a_100_kb_reply_is_cut_at_a_sentence_end_within_the_cap(store: Store) -> None:
    reply = "Alice practises the cello daily. " * 3100  # about 100 KB of sentences
    memory = _replying(reply, store, limit=500)
    memory.add_many(TEXTS[:4])
    summaries = [node for node in memory.walk() if not node.is_leaf and not node.is_root]
    assert summaries
    for node in summaries:
        assert len(node.text) <= 500 and node.text.endswith("daily.") and not node.stale
    assert memory.stats().extra["summaries_cut"] >= len(summaries)
    assert len(memory) == 4
    memory.close()


def test_a_100_kb_reply_without_a_sentence_end_is_rejected_and_counted(store: Store) -> None:
    memory = _replying("cello " * 17000, store, limit=500)
    memory.add_many(TEXTS[:4])
    summaries = [node for node in memory.walk() if not node.is_leaf and not node.is_root]
    assert summaries and all(len(node.text) <= 500 and node.stale for node in summaries)
    extra = memory.stats().extra
    assert extra["summaries_rejected"] >= len(summaries)
    assert memory.stats().aggregation_failures >= len(summaries)
    assert len(memory) == 4  # no leaf is lost to a bad reply
    memory.close()


def test_a_cap_too_small_to_hold_a_sentence_is_refused() -> None:
    with pytest.raises(ValueError, match="summary_max_chars must be an integer >= 16"):
        MemTreeConfig(summary_max_chars=3)


# -- row 5: the in-memory store's log is bounded; a reader left behind reloads in full ---------


def test_the_in_memory_log_is_bounded_and_a_reader_behind_it_still_sees_every_deletion() -> None:
    store = MemoryBackend(log_limit=8)
    writer = MemTree(embedder=HashingEmbedder(64), store=store, config=MemTreeConfig(theta0=0.1))
    reader = MemTree(embedder=HashingEmbedder(64), store=store, config=MemTreeConfig(theta0=0.1))
    ids = writer.add_many([f"note {i} about the garden and the cello" for i in range(40)])
    reader.refresh()
    assert len(reader) == 40
    for i in range(0, 40, 2):  # 20 deletes and 20 updates: far more commits than the log keeps
        writer.delete(ids[i])
        writer.update(ids[i + 1], f"corrected note {i} about sailing")
    space = store._namespaces[writer.namespace]
    assert len(space.log) <= 16 and space.log_floor > 0
    reader.refresh()
    assert {leaf.id for leaf in reader.leaves()} == {leaf.id for leaf in writer.leaves()} == set(ids[1::2])
    assert sorted(leaf.text for leaf in reader.leaves()) == sorted(leaf.text for leaf in writer.leaves())
    assert reader.check_integrity() == []
    hit = reader.retrieve("corrected note 38 about sailing", k=1, leaves_only=True)[0]
    assert hit.id == ids[39]


def test_a_reader_within_the_log_catches_up_incrementally() -> None:
    store = MemoryBackend(log_limit=8)
    writer = MemTree(embedder=HashingEmbedder(64), store=store)
    ids = writer.add_many([f"note {i}" for i in range(4)])
    since = store.head(writer.namespace)[0]
    writer.delete(ids[0])
    batch = store.read_changes(writer.namespace, since)
    assert not batch.complete and batch.deleted == [ids[0]]


def test_a_bad_log_limit_is_refused() -> None:
    with pytest.raises(ValueError, match="log_limit must be an integer >= 1"):
        MemoryBackend(log_limit=0)


# -- row 6: compaction drops dead rows and shrinks the store, safely beside readers ------------


def _second_handle(store: Store, tmp_path: Path, request: pytest.FixtureRequest) -> Store:
    """Another connection to the same memory, as another process would have."""
    if isinstance(store, MemoryBackend):
        return store
    if isinstance(store, SQLiteBackend):
        return SQLiteBackend(store.path)
    from memtree import PostgresBackend

    return PostgresBackend(request.getfixturevalue("postgres_dsn"))


def test_compact_drops_tombstones_and_a_reader_that_looked_before_misses_no_deletion(
    store: Store, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    config = MemTreeConfig(theta0=0.1)
    writer = MemTree(embedder=HashingEmbedder(64), store=store, config=config)
    other = _second_handle(store, tmp_path, request)
    reader = MemTree(embedder=HashingEmbedder(64), store=other, config=config)
    ids = writer.add_many([f"note {i} about the garden, the cello and sailing plans" for i in range(30)])
    reader.refresh()
    assert len(reader) == 30
    for i in range(10):
        writer.delete(ids[i])
        writer.update(ids[10 + i], f"corrected note {i} about bread")
    report = writer.compact()
    if isinstance(store, MemoryBackend):
        assert report.rows_dropped == 0  # it keeps no tombstones
    else:
        assert report.rows_dropped > 10 and report.namespaces == 1
        assert store.compact().rows_dropped == 0  # nothing left to drop
    reader.refresh()  # it last looked before every delete, and their tombstones are gone
    assert {leaf.id for leaf in reader.leaves()} == {leaf.id for leaf in writer.leaves()} == set(ids[10:])
    assert sorted(leaf.text for leaf in reader.leaves()) == sorted(leaf.text for leaf in writer.leaves())
    assert reader.check_integrity() == [] and writer.check_integrity() == []
    writer.add("a note after compaction about kites")  # both keep working on the compacted store
    reader.refresh()
    assert len(reader) == len(writer) == 21
    reader.close()
    writer.close()
    if other is not store:
        other.close()


def test_compact_shrinks_a_churned_sqlite_file_and_the_command_says_by_how_much(tmp_path: Path) -> None:
    from cli_runner import as_json, memtree, ok

    path = tmp_path / "memory.db"
    memory = MemTree.open(path, embedder=HashingEmbedder(64), config=MemTreeConfig(theta0=0.1))
    ids = memory.add_many([f"note {i} about the garden and the cello " + "words " * 60 for i in range(40)])
    for round_ in range(3):
        for i, leaf_id in enumerate(ids):
            memory.update(leaf_id, f"round {round_} note {i} about sailing " + "other " * 60)
    ids_gone = ids[:20]
    memory.delete(ids_gone)
    memory.close()
    before = path.stat().st_size
    reading = sqlite3.connect(path, isolation_level=None)  # another process in the middle of a read
    reading.execute("BEGIN")
    live = reading.execute("SELECT count(*) FROM memtree_nodes WHERE NOT deleted").fetchone()
    report = as_json(ok(memtree("compact", "--json", db=path)))
    assert reading.execute("SELECT count(*) FROM memtree_nodes WHERE NOT deleted").fetchone() == live
    reading.execute("COMMIT")  # its snapshot held to the end; the file shrinks at the next checkpoint
    reading.close()
    assert report["rows_dropped"] >= 20 and report["namespaces"] == 1
    assert as_json(ok(memtree("compact", "--json", db=path)))["rows_dropped"] == 0
    assert path.stat().st_size < before
    reopened = MemTree.open(path, embedder=HashingEmbedder(64))
    assert len(reopened) == 20 and reopened.check_integrity() == []
    reopened.close()


# -- row 2: close() is bounded, whatever the model or the embedder does ------------------------


class HangingEmbedder(HashingEmbedder):
    """Hashing embeddings, except that calls whose texts ``hang_on`` picks wait until
    ``release`` is set (at most ``GATE_LIMIT`` seconds: a test bug must not hang the suite)."""

    def __init__(self, hang_on: Callable[[Sequence[str]], bool], call_timeout: float | None) -> None:
        super().__init__(64)
        self.hang_on = hang_on
        self.call_timeout = call_timeout  # type: ignore[misc]
        self.release = threading.Event()
        self.entered = threading.Event()

    def embed(self, texts: Sequence[str]) -> Matrix:
        if self.hang_on(texts):
            self.entered.set()
            self.release.wait(GATE_LIMIT)
        return super().embed(texts)


def _wait_for_worker(memory: MemTree) -> None:
    thread = memory._background._thread
    if thread is not None:
        thread.join(GATE_LIMIT)


def test_close_with_a_hanging_model_returns_within_its_timeout_and_names_the_stale_summaries(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    aggregator = GatedAggregator()  # its gate stays closed: every model call hangs
    memory = gated_memory(aggregator, store=store, aggregation="background")
    memory.add_many(TEXTS[:3])
    assert aggregator.entered.wait(GATE_LIMIT)  # the worker waits for the model
    with caplog.at_level(logging.WARNING, logger="memtree.tree"):
        memory.close(timeout=0.2)  # returns although the model never answers
    warnings = [record.getMessage() for record in caplog.records if "close() left" in record.getMessage()]
    assert len(warnings) == 1
    reader = MemTree(embedder=HashingEmbedder(64), store=store)
    stale = [node.id for node in reader.walk() if node.stale]
    assert stale and all(node_id in warnings[0] for node_id in stale)
    assert len(reader) == 3  # every leaf was committed before
    aggregator.gate.set()
    _wait_for_worker(memory)
    reader.refresh()
    reader.aggregator = GatedAggregator(open_gate=True)
    reader.repair()
    assert reader.stats().stale == 0
    reader.close()


def test_close_with_an_embedder_that_hangs_without_a_timeout_is_bounded_too(store: Store) -> None:
    embedder = HangingEmbedder(lambda texts: any(SEP in text for text in texts), call_timeout=None)
    memory = MemTree(
        embedder=embedder,
        aggregator=GatedAggregator(open_gate=True),
        store=store,
        config=MemTreeConfig(theta0=0.15, aggregation="background"),
    )
    memory.add_many(TEXTS[:3])
    assert embedder.entered.wait(GATE_LIMIT)  # the worker embeds a summary: that call hangs
    memory.close(timeout=0.2)
    assert MemTree(embedder=HashingEmbedder(64), store=store).stats().stale > 0
    embedder.release.set()
    _wait_for_worker(memory)


def test_an_embedding_call_that_overruns_its_timeout_fails_and_stores_nothing(store: Store) -> None:
    embedder = HangingEmbedder(lambda texts: any("hang" in text for text in texts), call_timeout=0.05)
    embedder.seconds_per_text = 0.0  # no allowance per text: the call's own timeout alone (memtree.retry.batch_timeout)
    memory = MemTree(embedder=embedder, aggregator=GatedAggregator(open_gate=True), store=store)
    memory.add("a first note about the garden")
    with pytest.raises(TimeoutError, match=r"took longer than 0\.05 s"):
        memory.add("a note that makes the embedder hang")
    with pytest.raises(TimeoutError, match=r"took longer than 0\.05 s"):
        memory.retrieve("hang on", k=1)
    assert len(memory) == 1
    embedder.release.set()
    memory.close()


def test_a_bad_close_timeout_is_refused() -> None:
    memory = MemTree(embedder=HashingEmbedder(16))
    with pytest.raises(ValueError, match="timeout must be >= 0 seconds or None"):
        memory.close(timeout=-1)
    memory.close()


# -- row 4: in background mode, update, delete and a put on an existing key never wait for a chat model


class CallerWatchingAggregator(GatedAggregator):
    """A gated aggregator that refuses at once (and remembers) a call made on the
    test's own thread: in background mode only the worker may call the model."""

    def __init__(self) -> None:
        super().__init__()
        self.caller_waited = False
        self._test_thread = threading.current_thread()

    def aggregate(self, summary: str, new_texts: Sequence[str], count: int, *, centroid: object = None) -> str:
        if threading.current_thread() is self._test_thread:
            self.caller_waited = True
            raise ConnectionError("the caller itself called the model")
        return super().aggregate(summary, new_texts, count, centroid=centroid)  # type: ignore[arg-type]


def test_background_update_and_delete_return_while_the_model_hangs_and_the_worker_rewrites_after(
    store: Store,
) -> None:
    aggregator = CallerWatchingAggregator()  # closed: the worker's model calls wait
    memory = gated_memory(aggregator, store=store, aggregation="background")
    ids = memory.add_many(TEXTS)
    assert aggregator.entered.wait(GATE_LIMIT)  # the worker is inside a model call
    memory.update(ids[1], "Alice sold her cello and bought a kayak.")
    memory.delete(ids[2])
    memory.delete([ids[3]])
    assert aggregator.calls == 0 and not aggregator.caller_waited  # no write above called the model
    assert memory.get(ids[1]).text == "Alice sold her cello and bought a kayak."
    assert memory.retrieve("kayak", k=1, leaves_only=True)[0].id == ids[1]
    assert len(memory) == 4
    summaries = [node for node in memory.walk() if not node.is_leaf and not node.is_root]
    assert summaries and any(node.stale for node in summaries)
    forgotten = {TEXTS[2], TEXTS[3], TEXTS[1]}
    assert not any(text in node.text for node in summaries for text in forgotten)  # nothing deleted shows
    aggregator.gate.set()
    assert memory.wait_for_summaries(timeout=GATE_LIMIT)
    assert memory.stats().stale == 0 and memory.stats().pending == 0
    assert summaries_cover_exactly_their_leaves(memory)
    assert memory.check_integrity() == []
    memory.close()


def test_a_langgraph_put_on_an_existing_key_returns_while_the_model_hangs(store: Store) -> None:
    pytest.importorskip("langgraph")
    from langchain_memtree import MemTreeStore

    aggregator = CallerWatchingAggregator()
    memory = gated_memory(aggregator, store=store)
    items = MemTreeStore(memory, index={"fields": ["text"]})  # background aggregation by default
    for i, text in enumerate(TEXTS):
        items.put(("notes",), f"k{i}", {"text": text})
    items.put(("notes",), "k1", {"text": "Alice sold her cello and bought a kayak."})
    items.delete(("notes",), "k2")
    assert aggregator.calls == 0 and not aggregator.caller_waited
    item = items.get(("notes",), "k1")
    assert item is not None and item.value["text"] == "Alice sold her cello and bought a kayak."
    assert items.search(("notes",), query="kayak", limit=1)[0].key == "k1"
    aggregator.gate.set()
    tree = items._memories.sibling(("store", "notes"))
    assert tree.wait_for_summaries(timeout=GATE_LIMIT)
    assert tree.stats().stale == 0
    items.close()
    memory.close()


# -- row 3: the exit flush on Python 3.11, 3.12 and 3.13 ----------------------------------------

REFUSED = RuntimeError("can't create new thread at interpreter shutdown")
"""What Python 3.12 raises for any new thread once interpreter exit has begun."""


def _model_memory(store: Store, mode: str) -> MemTree:
    """A memory whose summaries come from a chat model, so every model call goes
    through the per-call timeout machinery (a helper thread each, normally)."""
    model = CallableChatModel(lambda prompt: "Alice practises music.", retry=RetryPolicy(max_attempts=1, timeout=5))
    config = MemTreeConfig(theta0=0.15, aggregation=mode)  # type: ignore[arg-type]
    return MemTree(embedder=HashingEmbedder(64), aggregator=LLMAggregator(model), store=store, config=config)


def _only_this_tests_memories_at_exit(monkeypatch: pytest.MonkeyPatch) -> None:
    """The exit flush serves every live memory of the process; memories that earlier
    tests left open must not count in this test's numbers."""
    import memtree.background

    monkeypatch.setattr(memtree.background, "_LIVE", weakref.WeakSet())


def _refuse_new_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    def start(self: threading.Thread) -> None:
        raise REFUSED

    monkeypatch.setattr(threading.Thread, "start", start)


def test_the_exit_flush_writes_through_a_live_worker_when_python_refuses_new_threads(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    import memtree.background

    _only_this_tests_memories_at_exit(monkeypatch)
    memory = _model_memory(store, "background")
    memory.add_many(TEXTS[:2])
    assert memory.wait_for_summaries(timeout=GATE_LIMIT)  # the worker is alive, idle
    for text in TEXTS[2:5]:  # pending in the ledger, the worker not told: exit will be
        memory.add(text, aggregation="deferred")
    assert memory.stats().pending > 0
    _refuse_new_threads(monkeypatch)  # exit on 3.12 begins: no thread may start from here on
    assert memtree.background.flush_all_at_exit(timeout=GATE_LIMIT) == 0
    monkeypatch.undo()
    assert memory.stats().stale == 0  # written by the worker, each model call made inline
    memory.close()


def test_pending_summaries_no_thread_can_write_at_exit_are_named_stale_in_one_warning(
    store: Store, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import memtree.background

    _only_this_tests_memories_at_exit(monkeypatch)
    memory = _model_memory(store, "deferred")
    memory.add_many(TEXTS[:4])  # deferred: no worker, the summaries wait in the ledger
    pending = memory.stats().pending
    assert pending > 0
    _refuse_new_threads(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="memtree.background"):
        left = memtree.background.flush_all_at_exit(timeout=1.0)
    monkeypatch.undo()
    assert left >= pending
    warnings = [record.getMessage() for record in caplog.records]
    assert len(warnings) == 1
    assert "Python refused a thread to write them (can't create new thread at interpreter shutdown" in warnings[0]
    assert "default: " in warnings[0] and "call repair() later" in warnings[0]
    assert MemTree(embedder=HashingEmbedder(64), store=store).stats().stale > 0  # stale, never lost
    memory.close()


EXITING_WITH_A_MODEL = textwrap.dedent(
    """
    import atexit, sys, threading
    from memtree import HashingEmbedder, LLMAggregator, MemTree, MemTreeConfig, RetryPolicy, SQLiteBackend
    from memtree.llm import CallableChatModel

    began = threading.Event()

    def reply(prompt):  # answers only once exit has begun: the exit flush must do the writing
        began.wait(20)
        return "Alice practises music."

    model = CallableChatModel(reply, retry=RetryPolicy(max_attempts=1, timeout=20, breaker_failures=0))
    config = MemTreeConfig(theta0=0.15, aggregation=sys.argv[2])
    memory = MemTree(
        embedder=HashingEmbedder(64), aggregator=LLMAggregator(model), store=SQLiteBackend(sys.argv[1]), config=config
    )
    for i in range(12):
        memory.add(f"garden note {i}: garden practice and cello plans {i % 3}")
    atexit.register(began.set)  # runs before memtree's exit flush (last registered, first run)
    """
)


def exit_interpreters() -> list[str]:
    """This interpreter, and those named in ``MEMTREE_EXIT_PYTHONS`` (paths separated
    by ``os.pathsep``; .ci/run names a Python 3.12 when it can make one offline)."""
    named = [path for path in os.environ.get("MEMTREE_EXIT_PYTHONS", "").split(os.pathsep) if path]
    return [sys.executable, *named]


@pytest.mark.parametrize("python", exit_interpreters())
@pytest.mark.parametrize("mode", ["background", "deferred"])
def test_interpreter_exit_writes_summaries_through_a_chat_model_or_says_plainly_it_could_not(
    tmp_path: Path, python: str, mode: str
) -> None:
    path = tmp_path / "memory.db"
    script = tmp_path / "run.py"
    script.write_text(EXITING_WITH_A_MODEL, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run(
        [python, str(script), str(path), mode], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    store = SQLiteBackend(path)
    try:
        memory = MemTree(embedder=HashingEmbedder(64), store=store)
        assert len(memory) == 12  # no leaf is ever lost
        stale = memory.stats().stale
        if mode == "background":  # the worker writes them, on every Python
            assert stale == 0, done.stderr
        else:  # Python 3.12 refuses the thread a deferred memory's last flush needs: said plainly
            assert stale == 0 or "Python refused a thread to write them" in done.stderr, done.stderr
        memory.close()
    finally:
        store.close()


@pytest.mark.slow
def test_the_churn_benchmark_reports_sizes_before_and_after_compaction(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[1]
    command = [sys.executable, str(root / "benchmarks" / "churn.py"), "--ops=30", "--no-postgres"]
    command += [f"--out={tmp_path / 'out'}", f"--work={tmp_path / 'work'}"]
    env = {**os.environ, "PYTHONPATH": str(root)}
    subprocess.run(command, check=True, cwd=root, env=env, capture_output=True, timeout=600)
    results = {row["store"]: row for row in json.loads((tmp_path / "out" / "churn.json").read_text())["results"]}
    sqlite_row = results["sqlite"]
    assert sqlite_row["tombstones_after"] == 0 and sqlite_row["integrity_problems"] == 0
    assert sqlite_row["bytes_after"] < sqlite_row["bytes_before"]
    assert "| sqlite |" in (tmp_path / "out" / "churn.md").read_text()
