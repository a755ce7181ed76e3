"""A LangGraph store item and its leaves commit together (issue 25 row 1).

Before, ``MemTreeStore.put`` wrote the item's record, then changed its leaves in
further transactions: a kill in between left them apart (after an interrupted
delete, ``get`` said the item was gone while the tree still recalled its text),
and nothing noticed. Now the record and every leaf change commit in one
transaction (``MemTree.replace_source``), a kill at any step leaves the item as
before or as after, ``memtree check`` reports a divergence and ``repair()``
rewrites the leaves from the record.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cli_runner import command_line, environment
from lc_fakes import hashing_memory

from langchain_memtree import MemTreeStore
from memtree import HashingEmbedder, MemTree, MemTreeConfig
from memtree.store.memory import _MemoryTransaction
from memtree.store.sql import _SQLTransaction

WORKER = str(Path(__file__).with_name("store_kill_worker.py"))
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")])}
NAMESPACE = ("users", "alice")


def kill_at_every_step(location: str, op: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, WORKER, "steps", location, op], capture_output=True, text=True, env=ENV, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


EXPECTED_STATES = {
    "put-new": {"absent", "after"},
    "put-change": {"before", "after"},
    "put-fields": {"before", "after"},
    "delete": {"before", "absent"},
}


@pytest.mark.parametrize("op", list(EXPECTED_STATES))
def test_a_kill_at_any_step_of_put_or_delete_leaves_item_and_leaves_in_step_on_sqlite(tmp_path: Path, op: str) -> None:
    report = kill_at_every_step(str(tmp_path / "kill.db"), op)
    assert report["bad"] == [] and report["divergences"] == 0
    assert report["kills"] >= 10  # every step was reached, up to the commit
    assert set(report["states"]) == EXPECTED_STATES[op]  # as before or as after, both seen


@pytest.mark.parametrize("op", ["put-change", "delete"])
def test_a_kill_at_any_step_of_put_or_delete_leaves_item_and_leaves_in_step_on_postgres(
    postgres_dsn: str, op: str
) -> None:
    report = kill_at_every_step(postgres_dsn, op)
    assert report["bad"] == [] and report["divergences"] == 0
    assert report["kills"] >= 10
    assert set(report["states"]) == EXPECTED_STATES[op]


def open_durable(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> MemTree:
    if kind == "memory":
        return hashing_memory()
    location = str(tmp_path / "m.db") if kind == "sqlite" else request.getfixturevalue("postgres_dsn")
    return MemTree.open(location, embedder=HashingEmbedder(64), config=MemTreeConfig(theta0=0.2))


@pytest.mark.parametrize("kind", ["memory", "sqlite", "postgres"])
@pytest.mark.parametrize("failing_stage", [1, 2, 3])
def test_a_failure_between_the_batches_of_a_put_commits_none_of_them(
    kind: str, failing_stage: int, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    with open_durable(kind, tmp_path, request) as memory:
        store = MemTreeStore(memory, index={"fields": ["text", "note"]}, aggregation="eager")
        for i in range(4):
            store.put(NAMESPACE, f"o{i}", {"text": f"Alice visited city {i}.", "note": f"note {i}"})
        store.put(NAMESPACE, "pin", {"text": "Alice's PIN code is 4921.", "note": "Alice has a cat."})
        before = sorted((leaf.id, leaf.text) for leaf in store.tree(NAMESPACE).leaves())
        transaction = _MemoryTransaction if kind == "memory" else _SQLTransaction
        original = transaction.stage
        calls = {"n": 0}

        def failing(self: Any, *args: Any, **kwargs: Any) -> int:
            calls["n"] += 1
            if calls["n"] == failing_stage:
                raise OSError("disk full")
            return original(self, *args, **kwargs)

        monkeypatch.setattr(transaction, "stage", failing)
        # a new text at one path, another path dropped, a new path: a correction,
        # a delete and an insert, then the record: four batches in one transaction
        with pytest.raises(OSError, match="disk full"):
            store.put(NAMESPACE, "pin", {"text": "Alice's PIN code is 1234.", "extra": "x"}, index=["text", "extra"])
        monkeypatch.setattr(transaction, "stage", original)
        item = store.get(NAMESPACE, "pin")
        assert item is not None and item.value["text"] == "Alice's PIN code is 4921."
        tree = store.tree(NAMESPACE)
        assert sorted((leaf.id, leaf.text) for leaf in tree.leaves()) == before  # this process forgot it too
        assert tree.check_integrity() == [] and store.check() == []
        store.put(NAMESPACE, "pin", {"text": "Alice's PIN code is 1234.", "extra": "x"}, index=["text", "extra"])
        assert sorted(leaf.text for leaf in tree.leaves() if leaf.source_id == "pin") == [
            "Alice's PIN code is 1234.",
            "x",
        ]


def old_style_divergence(memory: MemTree, store: MemTreeStore) -> None:
    """What an interrupted put and delete of an older memtree left: a record without
    its leaves, and leaves without their record (no manifests)."""
    namespace = ("store", *NAMESPACE)
    memory.store.put_records(namespace, "store_items", {"new": _record({"text": "Alice moved to Lyon."}, 1)})
    tree = store.tree(NAMESPACE)
    tree.add("Alice's PIN code is 4921.", metadata={"path": "text"}, source_id="pin")  # its item was deleted
    memory.store.put_records(namespace, "store_items", {"old": _record({"text": "Alice likes tea."}, 1)})
    tree.add("Alice likes coffee.", metadata={"path": "text"}, source_id="old")  # the record moved on


def _record(value: dict[str, Any], vectors: int) -> dict[str, Any]:
    moment = "2026-01-01T00:00:00+00:00"
    return {"value": value, "created_at": moment, "updated_at": moment, "vectors": vectors}


def test_repair_reconciles_an_older_files_divergence_from_the_item_records(tmp_path: Path) -> None:
    with MemTree.open(tmp_path / "m.db", embedder=HashingEmbedder(64), config=MemTreeConfig(theta0=0.2)) as memory:
        store = MemTreeStore(memory, index={"fields": ["text"]}, aggregation="eager")
        store.put(NAMESPACE, "kept", {"text": "Alice has a cat named Miso."})
        old_style_divergence(memory, store)
        problems = store.check()
        assert len(problems) == 3, problems
        assert any("'pin', which no longer exists" in problem for problem in problems)
        tree = store.tree(NAMESPACE)
        assert any("PIN" in hit.text for hit in tree.retrieve("PIN code", k=10, leaves_only=True))
        assert store.repair() >= 3
        assert store.check() == []
        assert not any("PIN" in hit.text for hit in tree.retrieve("PIN code", k=10, leaves_only=True))
        texts = {leaf.source_id: leaf.text for leaf in tree.leaves()}
        assert texts == {
            "kept": "Alice has a cat named Miso.",
            "new": "Alice moved to Lyon.",
            "old": "Alice likes tea.",
        }


def test_memtree_check_reports_a_divergence_read_only_and_repair_fixes_it(tmp_path: Path) -> None:
    db = tmp_path / "m.db"
    with MemTree.open(db, embedder=HashingEmbedder(64), config=MemTreeConfig(theta0=0.2)) as memory:
        store = MemTreeStore(memory, index={"fields": ["text"]}, aggregation="eager")
        for i in range(4):
            store.put(NAMESPACE, f"k{i}", {"text": f"Alice's fact number {i}."})
        tree = store.tree(NAMESPACE)
        tree.delete(tree.find(source_id="k2")[0])  # by hand, around the store
    sound = subprocess.run(command_line("check", db=db), capture_output=True, text=True, env=environment())
    assert sound.returncode == 1
    assert "store/users/alice: 1 problem(s)" in sound.stdout
    assert "source 'k2': its record lists 1 leaves, the tree holds 0" in sound.stderr
    assert sorted(path.name for path in tmp_path.iterdir()) == ["m.db"]  # opened read-only: no -wal, no -shm
    as_json = subprocess.run(command_line("check", "--json", db=db), capture_output=True, text=True, env=environment())
    assert as_json.returncode == 1 and json.loads(as_json.stdout)["sound"] is False
    fixed = subprocess.run(
        command_line("repair", "--namespace", "store/users/alice", db=db),
        capture_output=True,
        text=True,
        env=environment(),
    )
    assert fixed.returncode == 0, fixed.stderr
    again = subprocess.run(command_line("check", db=db), capture_output=True, text=True, env=environment())
    assert again.returncode == 0 and again.stdout.strip() == "store/users/alice: sound"


def test_replace_source_keeps_a_corrected_leafs_earlier_text_only_when_asked() -> None:
    memory = hashing_memory()
    (leaf,) = memory.replace_source("note", ["Alice's PIN is 4921."], metadata=[{"field": "pin"}])
    assert memory.replace_source("note", ["Alice's PIN is 1234."], metadata=[{"field": "pin"}]) == [leaf]
    assert [version.text for version in memory.history(leaf)] == ["Alice's PIN is 4921."]  # the default, as update
    memory.replace_source("note", ["Alice's PIN is changed."], metadata=[{"field": "pin"}], keep_history=False)
    assert [version.text for version in memory.history(leaf)] == ["Alice's PIN is 4921."]  # nothing added
    assert memory.get(leaf).text == "Alice's PIN is changed."
    with pytest.raises(TypeError, match="keep_history must be True or False, got 'no'"):
        memory.replace_source("note", ["x"], keep_history="no")  # type: ignore[typeddict-item]
    assert memory.get(leaf).text == "Alice's PIN is changed."
