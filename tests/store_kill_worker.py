"""A child process for the MemTreeStore crash tests (tests/test_store_atomicity.py).

    python store_kill_worker.py steps LOCATION OP
        for N = 1, 2, ...: forks a writer that sets up the store (LOCATION: a SQLite
        file or a PostgreSQL DSN), then runs OP ("put-new", "put-change",
        "put-fields", "delete") and SIGKILLs itself at its N-th step; afterwards
        checks the store. Stops at the first N that the operation outlives. Prints
        one JSON summary: steps, kills, divergences and what each kill left.
    python store_kill_worker.py loop LOCATION SEED
        puts, changes and deletes items at random until killed, printing each key
        after its operation returns.
    python store_kill_worker.py check LOCATION _
        after a kill in the loop: prints the divergent items and problems as JSON.

A *step* is every place a kill can land between two effects: each call the store's
procedure makes (a record read, ``replace_source``...), and inside the engine each
write transaction opened, batch staged and commit. The checks: ``store.check()``
finds nothing, every item's leaves are exactly the texts its record calls for, no
leaf belongs to a missing item, and the item is as before the operation or as after.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

from langchain_memtree import MemTreeStore, _calls
from memtree import HashingEmbedder, MemTree, MemTreeConfig
from memtree.replica import Replica
from memtree.store.base import Store
from memtree.store.sql import _SQLTransaction
from memtree.writer import Writer

try:
    from memtree.writer import Staging
except ImportError:  # an older memtree
    Staging = None  # type: ignore[assignment,misc]

NAMESPACE = ("users", "alice")
BEFORE = {"text": "Alice's PIN code is 4921.", "note": "Alice keeps a cat named Miso."}
AFTER = {"text": "Alice's PIN code is 1234.", "note": "Alice keeps a cat named Miso."}
OTHERS = {f"other-{i}": {"text": f"Alice visited city number {i} in spring.", "note": f"note {i}"} for i in range(4)}


def open_store(location: str) -> tuple[MemTree, MemTreeStore]:
    memory = MemTree.open(location, embedder=HashingEmbedder(64), config=MemTreeConfig(theta0=0.2))
    return memory, MemTreeStore(memory, index={"fields": ["text", "note"]}, aggregation="eager")


def set_up(location: str, op: str) -> None:
    """The state before ``op``: other items, and the key itself unless it is new."""
    memory, store = open_store(location)
    memory.delete_namespace(("store", *NAMESPACE))
    for key, value in OTHERS.items():
        store.put(NAMESPACE, key, value)
    if op != "put-new":
        store.put(NAMESPACE, "pin", BEFORE)
    memory.close()


def run_op(store: MemTreeStore, op: str) -> None:
    if op in ("put-new", "put-change"):
        store.put(NAMESPACE, "pin", AFTER)
    elif op == "put-fields":
        store.put(NAMESPACE, "pin", AFTER, index=["note"])
    elif op == "delete":
        store.delete(NAMESPACE, "pin")
    else:
        raise ValueError(f"unknown op {op!r}")


class Steps:
    """Counts steps and SIGKILLs this process at step ``kill_at``."""

    def __init__(self, kill_at: int) -> None:
        self.kill_at = kill_at
        self.count = 0

    def step(self) -> None:
        self.count += 1
        if self.count == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    def wrap(self, owner: Any, name: str) -> None:
        original: Callable[..., Any] | None = getattr(owner, name, None)
        if original is None:  # (an older memtree, to see the test fail there)
            return

        def stepped(*args: Any, **kwargs: Any) -> Any:
            self.step()
            result = original(*args, **kwargs)
            self.step()
            return result

        setattr(owner, name, stepped)


def instrument(store: MemTreeStore, steps: Steps) -> None:
    advance = _calls._advance

    def stepped_advance(procedure: Any, outcome: Any) -> Any:
        steps.step()
        return advance(procedure, outcome)

    _calls._advance = stepped_advance  # type: ignore[assignment]
    for owner, name in [(Writer, "write_together"), (Writer, "write"), (Replica, "stage"), (Replica, "commit")]:
        steps.wrap(owner, name)
    if Staging is not None:
        steps.wrap(Staging, "run")
    backend: Store = store.memory.store
    for name in ("stage", "commit_staged", "commit", "rollback"):
        steps.wrap(_SQLTransaction, name)
    steps.wrap(type(backend), "begin")


def texts_wanted(value: dict[str, Any] | None, fields: list[str]) -> list[tuple[str, str]]:
    return sorted((field, value[field]) for field in fields) if value is not None else []


def divergent_keys(store: MemTreeStore) -> list[str]:
    """Items whose leaves are not exactly what their record calls for, and leaves of
    items that do not exist (read directly, not through ``check()``)."""
    namespace = ("store", *NAMESPACE)
    records = store._records.get_records(namespace, "store_items")
    tree = store.tree(NAMESPACE)
    held: dict[str, list[tuple[str, str]]] = {}
    for leaf in tree.leaves():
        if leaf.source_id is not None:
            held.setdefault(leaf.source_id, []).append((leaf.metadata["path"], leaf.text))
    bad = [key for key in held if key not in records]
    for key, record in records.items():
        fields = {2: ["text", "note"], 1: ["note"], 0: []}[record["vectors"]]
        if sorted(held.get(key, [])) != texts_wanted(record["value"], fields):
            bad.append(key)
    return sorted(bad)


def inspect(location: str) -> dict[str, Any]:
    """What the store holds for the key, and whether anything diverged."""
    memory, store = open_store(location)
    try:
        problems = store.check() if hasattr(store, "check") else []
        item = store.get(NAMESPACE, "pin")
        tree = store.tree(NAMESPACE)
        leaves = sorted((tree.get(i).metadata["path"], tree.get(i).text) for i in tree.find(source_id="pin"))
        value = None if item is None else item.value
        state = {None: "absent", json.dumps(BEFORE): "before", json.dumps(AFTER): "after"}.get(
            None if value is None else json.dumps(value), "other"
        )
        record = store._records.get_records(("store", *NAMESPACE), "store_items", ["pin"]).get("pin")
        if record is None:
            agree = not leaves
        else:
            fields = ["text", "note"] if record["vectors"] == 2 else ["note"]
            agree = leaves == texts_wanted(record["value"], fields)
        hits = [hit.text for hit in tree.retrieve("PIN code", k=20, leaves_only=True)]
        pin_visible = any("PIN" in text for text in hits)
        if item is None or "PIN" not in json.dumps(item.value):
            agree = agree and not pin_visible
        integrity = tree.check_integrity()
        return {"state": state, "agree": agree, "problems": problems + integrity}
    finally:
        memory.close()


def steps_mode(location: str, op: str) -> None:
    report: dict[str, Any] = {"op": op, "kills": 0, "divergences": 0, "states": {}, "bad": []}
    for kill_at in range(1, 500):
        set_up(location, op)
        pid = os.fork()
        if pid == 0:  # the writer: its own store, opened after the fork
            try:
                memory, store = open_store(location)
                instrument(store, Steps(kill_at))
                run_op(store, op)
                memory.close()
            except BaseException:  # noqa: BLE001 - any failure is reported by the exit status
                os._exit(3)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        if not killed and not (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0):
            report["bad"].append({"kill_at": kill_at, "status": status})
            break
        seen = inspect(location)
        report["states"][seen["state"]] = report["states"].get(seen["state"], 0) + 1
        if not seen["agree"] or seen["problems"]:
            report["divergences"] += 1
            report["bad"].append({"kill_at": kill_at, **seen})
        if not killed:
            report["steps"] = kill_at - 1
            break
        report["kills"] += 1
    print(json.dumps(report), flush=True)


def loop_check(location: str) -> None:
    """After a kill in the loop: one JSON line with the divergent items and problems."""
    memory, store = open_store(location)
    try:
        tree = store.tree(NAMESPACE)
        checked = store.check() if hasattr(store, "check") else []
        report = {"divergent": divergent_keys(store), "problems": checked + tree.check_integrity()}
        report["items"] = len(store.search(NAMESPACE, limit=100))
        report["leaves"] = len(tree)
    finally:
        memory.close()
    print(json.dumps(report), flush=True)


def loop_mode(location: str, seed: int) -> None:
    import random

    chooser = random.Random(seed)
    memory, store = open_store(location)
    memory.delete_namespace(("store", *NAMESPACE))  # each round starts empty
    keys = [f"k{i}" for i in range(8)]
    while True:
        key = chooser.choice(keys)
        action = chooser.random()
        if action < 0.25:
            store.delete(NAMESPACE, key)
        else:
            number = chooser.randrange(10_000)
            value = {"text": f"Item {key}: the code is {number}.", "note": f"Note {number % 7} of {key}."}
            store.put(NAMESPACE, key, value, index=["note"] if action > 0.9 else None)
        print(key, flush=True)


if __name__ == "__main__":
    mode, location, argument = sys.argv[1:4]
    if mode == "steps":
        steps_mode(location, argument)
    elif mode == "check":
        loop_check(location)
    else:
        loop_mode(location, int(argument))
