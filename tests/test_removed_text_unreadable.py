"""After a delete (or an overwrite, or an expiry) no read path returns the removed text (issue 39 row 2).

Before, in background mode (the LangGraph store's default) the summaries above a
removed leaf kept its text until the worker rewrote them: indefinitely with a slow
model, and until ``repair()`` after a crash; ``retrieve(summary_hits="text")``,
``get``, ``walk``, ``export_jsonl``, ``memtree export`` and the pictures returned
it, and ``check()`` called such a file sound. Now the write that removes a leaf
stores a stand-in for every summary that held it, in the same transaction; readers
mask summaries above a leaf that expired before a sweep; ``check()`` reports a
summary that still quotes a removed text and ``repair()`` rewrites it.

Every value carries a token no other value has (see ``tests/privacy_worker.py``),
looked for in every read path, every export and every picture: after every
operation of a random run on each store, and after every SIGKILL of a writer in
the kill loop (SQLite, PostgreSQL).
"""

from __future__ import annotations

import io
import json
import random
import time
from pathlib import Path
from typing import Any

import pytest
from cli_runner import memtree, ok
from gated import GatedAggregator
from privacy_worker import NAMESPACE, TREE, check, kill_round, open_store, removed_tokens, value_of
from privacy_worker import loop as run_loop

from langchain_memtree import MemTreeStore
from memtree import HashingEmbedder, MemoryBackend, MemTree, MemTreeConfig, viz
from memtree.store.sqlite import ReadOnlySQLiteBackend


def store_on(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> tuple[MemTree, MemTreeStore, str]:
    if backend == "memory":
        memory = MemTree(embedder=HashingEmbedder(64), store=MemoryBackend(), config=MemTreeConfig(theta0=0.2))
        from privacy_worker import SlowExtractive

        memory.aggregator = SlowExtractive(7).bound_to(memory.embedder)
        return memory, MemTreeStore(memory, index={"fields": ["text"]}), ""
    location = str(tmp_path / "m.db") if backend == "sqlite" else request.getfixturevalue("postgres_dsn")
    memory, store = open_store(location, seed=7)
    return memory, store, location


@pytest.mark.parametrize("backend", ["memory", "sqlite", "postgres"])
def test_no_read_path_returns_a_removed_value_after_any_operation(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    memory, store, location = store_on(backend, tmp_path, request)
    entries: list[dict[str, Any]] = []
    leaks: list[str] = []
    totals: dict[str, int] = {}

    def after_each(entry: dict[str, Any]) -> None:
        entries.append(entry)
        gone, replaced = removed_tokens(entries, time.time())
        found = check(store, gone, replaced, None)
        leaks.extend(f"after op {len(entries)} ({entry['op']}): {leak}" for leak in found["leaks"])
        for path, count in found["checks"].items():
            totals[path] = totals.get(path, 0) + count

    run_loop(store, seed=39, report=after_each, limit=40)
    assert leaks == []
    assert {"delete", "overwrite"} <= {entry["op"] for entry in entries}
    assert all(count > 0 for path, count in totals.items() if path != "memtree export"), totals
    if location:  # and the command line's export, once at the end
        gone, replaced = removed_tokens(entries, time.time())
        exported = ok(
            memtree(
                "export",
                "-n",
                "/".join(TREE),
                db=Path(location) if backend == "sqlite" else None,
                env={"MEMTREE_DB": location},
            )
        ).stdout
        nodes = "\n".join(json.loads(line).get("text", "") for line in exported.splitlines() if '"node"' in line)
        assert not [mark for mark in gone if mark in exported] and not [mark for mark in replaced if mark in nodes]
    store.close()
    memory.close()


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_killed_background_writer_leaves_no_removed_text_readable(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    chooser = random.Random(39)
    rounds = []
    for number in range(3):
        location = (
            str(tmp_path / f"kill{number}.db") if backend == "sqlite" else request.getfixturevalue("postgres_dsn")
        )
        rounds.append(kill_round(location, 100 + number, chooser, tmp_path))
    assert [leak for report in rounds for leak in report["leaks"]] == []
    assert sum(report["removed"] for report in rounds) > 0


# -- check() and repair() on a file whose summaries still hold removed text ------------------


def leak_into_a_summary(memory: MemTree, text: str) -> str:
    """Write what the code before issue 39 left behind: a summary quoting ``text``."""
    summary = next(node for node in memory.walk() if not node.is_leaf and not node.is_root)
    summary.text = f"{summary.text}\n{text}"
    with memory.store.write(memory.namespace) as transaction:
        transaction.commit([summary], [])
    memory.refresh()
    return summary.id


@pytest.mark.parametrize("backend", ["memory", "sqlite", "postgres"])
def test_check_reports_a_summary_that_still_quotes_a_replaced_value_and_repair_rewrites_it(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    memory, store, location = store_on(backend, tmp_path, request)
    for number, key in enumerate(("pin", "cat", "bike")):
        store.put(NAMESPACE, key, value_of(key, f"old{number}", number))
    store.put(NAMESPACE, "pin", value_of("pin", "new0", 9))  # the old value lives in the leaf's history only
    tree = store.tree(NAMESPACE)
    assert store._memories.sibling(TREE).wait_for_summaries(30)  # the store's writer: nothing left to rewrite
    assert store.check() == []
    old = value_of("pin", "old0", 0)["text"]
    summary = leak_into_a_summary(tree, old.split(". ")[0] + ".")
    problems = store.check()
    assert len(problems) == 1 and summary in problems[0] and "replaced version" in problems[0]
    if backend == "sqlite":
        done = memtree("check", db=Path(location))
        assert done.returncode == 1 and "privacy problem" in done.stderr
    assert store.repair() >= 1
    assert store.check() == []
    assert "old0" not in "\n".join(node.text for node in tree.walk() if not node.is_leaf)
    store.close()
    memory.close()


def test_an_expired_value_is_masked_on_a_read_only_store_and_check_reports_it(tmp_path: Path) -> None:
    location = str(tmp_path / "m.db")
    memory, store = open_store(location, seed=3)
    store.put(NAMESPACE, "keep", value_of("keep", "kept1", 1))
    store.put(NAMESPACE, "keep2", value_of("keep2", "kept2", 2))
    store.put(NAMESPACE, "brief", value_of("brief", "brief3", 3), ttl=0.005)  # 0.3 s
    store.close()
    memory.close()  # writes what is pending
    expires = time.time() + 0.3
    while time.time() <= expires:  # the real clock must pass the expiry (no upper bound: not a timing test)
        time.sleep(0.05)
    reader_store = ReadOnlySQLiteBackend(location)  # it cannot sweep
    reader = MemTree(embedder=HashingEmbedder(64), store=reader_store).sibling(TREE)
    shown = [
        "\n".join(hit.text for hit in reader.retrieve("code word", k=20, summary_hits="text")),
        "\n".join(node.text for node in reader.walk()),
        "\n".join(reader.get(node.id).text for node in reader.walk()),
        reader.format_tree(width=100_000),
        viz.to_mermaid(reader, width=100_000, line_width=100_000),
        viz.to_dot(reader, width=100_000, line_width=100_000),
        viz.to_html(reader),
        json.dumps(viz.to_dict(reader)),
    ]
    assert ["brief3" in text for text in shown] == [False] * len(shown)
    assert all("kept1" in text for text in shown[1:])
    with pytest.raises(PermissionError):
        reader.export_jsonl(io.StringIO())  # a backup must not hold it, and this store cannot sweep it
    assert any("expired leaf" in problem for problem in reader.check_integrity())
    reader_store.close()
    done = memtree("check", db=Path(location))
    assert done.returncode == 1 and "expired leaf" in done.stderr
    ok(memtree("repair", "-n", "/".join(TREE), db=Path(location)))
    assert ok(memtree("check", db=Path(location))).returncode == 0


# -- the engine: failures and other writers ------------------------------------------------


PIN, NEW_PIN = "Alice's PIN code is 4921 for the bank.", "Alice's PIN code is 1234 for the bank."
OTHERS = ["Alice's cat is called Miso.", "Alice rides a red bicycle.", "Alice's PIN code reminder note for the bank."]


def summaries_text(memory: MemTree) -> str:
    return "\n".join(node.text for node in memory.walk() if not node.is_leaf)


@pytest.mark.parametrize("change", ["delete", "update", "sweep"])
def test_a_removal_whose_model_call_fails_leaves_a_stand_in_not_the_old_text(change: str) -> None:
    """Eager mode, the model failing: the summaries above keep no removed text (before,
    a failed rewrite kept the old one, stale, until ``repair()``)."""
    clock = [time.time()]
    aggregator = GatedAggregator(open_gate=True)
    memory = MemTree(
        embedder=HashingEmbedder(64), aggregator=aggregator, config=MemTreeConfig(theta0=0.0), store=MemoryBackend()
    )
    pin = memory.add(PIN, ttl=60)
    memory.add_many(OTHERS)
    assert "4921" in summaries_text(memory)
    aggregator.fail = True
    if change == "delete":
        memory.delete(pin)
    elif change == "update":
        memory.update(pin, NEW_PIN)
    else:
        clock[0] += 61
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(time, "time", lambda: clock[0])
            assert memory.sweep_expired() == 1
    assert "4921" not in summaries_text(memory)
    assert memory.stats().stale > 0  # the model writes them once it answers
    aggregator.fail = False
    memory.repair()
    assert "4921" not in summaries_text(memory) and memory.stats().stale == 0


def test_a_deferred_flush_never_merges_into_a_summary_another_writer_rewrote() -> None:
    """Writer A defers a summary's rewrite (its ledger keeps the summary's text as it
    was); writer B, on the same store, replaces a leaf below it. A's flush used to
    merge its new leaf into the text it had remembered, quoting B's replaced text
    again in a summary no longer stale. It rebuilds from the children instead."""
    backend = MemoryBackend()
    first = MemTree(store=backend, embedder=HashingEmbedder(64), config=MemTreeConfig(theta0=0.0))
    gated = GatedAggregator()  # B's own worker never writes before A's flush
    config = MemTreeConfig(theta0=0.0, aggregation="background")
    second = MemTree(store=backend, embedder=HashingEmbedder(64), aggregator=gated, config=config)
    ids = first.add_many([PIN, *OTHERS])
    with first.deferred():
        first.add("Alice's bank card expires in May.")
        second.refresh()
        second.update(ids[0], NEW_PIN)
    first.refresh()
    assert "4921" not in summaries_text(first)
    assert first.check_integrity() == []
    gated.gate.set()
    second.close()
