"""Removed text stays unreadable: a writer to kill and a checker of every read path (issue 39 row 2).

    python privacy_worker.py loop LOCATION SEED
        opens a ``MemTreeStore`` in background mode (its default) whose summary writer
        takes a few milliseconds a call, as a model does, so summaries are stale most
        of the time; then puts, overwrites and deletes items at random, some with a
        TTL of about a second, until killed. After each operation returns it prints
        one JSON line: the key, the value's token, and the tokens that operation
        removed (the old value of an overwrite or a delete).
    python privacy_worker.py check LOCATION TOKENS.json
        opens the store again and looks for every removed token (``deleted``,
        ``replaced``, and ``expiring`` ones whose expiry has passed) in every read
        path, export and picture; prints one JSON line: checks per read path and the
        leaks found.

Every value's text carries a token no other value has (``zq00120037zq``), so a
token found anywhere is that value's text. Deleted and expired values must appear
nowhere. A replaced value's text is kept on purpose in its leaf's history
(``MemTree.history``, and the version lines of a backup); it must appear in no
summary, no retrieval, no picture and in no node of a backup.
"""

from __future__ import annotations

import io
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from langchain_memtree import MemTreeStore
from memtree import ExtractiveAggregator, HashingEmbedder, MemTree, MemTreeConfig, viz
from memtree.node import Vector

NAMESPACE = ("users", "alice")
TREE = ("store", *NAMESPACE)
KEYS = [f"k{i}" for i in range(10)]
TTL_MINUTES = 0.02
"""About a second: some items expire while the loop runs."""
WORKER = __file__
_HERE = Path(__file__).resolve().parent
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(_HERE.parent), str(_HERE)])}
"""How the worker's processes find memtree and this module."""
READ_PATHS = (
    "store.get",
    "store.search",
    "retrieve(summary_hits=text)",
    "retrieve(summary_hits=leaves)",
    "retrieve(traversal)",
    "get",
    "get_many",
    "walk",
    "leaves",
    "export_jsonl",
    "memtree export",
    "format_tree",
    "to_mermaid",
    "to_dot",
    "to_html",
    "to_dict",
    "check",
)


class SlowExtractive(ExtractiveAggregator):
    """Extractive summaries that take 5-30 ms a call and count as a model's, so the
    background worker lags behind the writes as with a real model."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        self._chooser = random.Random(seed)

    @property
    def calls_model(self) -> bool:
        return True

    def aggregate(self, summary: str, new_texts: Sequence[str], count: int, *, centroid: Vector | None = None) -> str:
        time.sleep(self._chooser.uniform(0.005, 0.03))
        return super().aggregate(summary, new_texts, count, centroid=centroid)


def token(seed: int, number: int) -> str:
    return f"zq{seed % 10_000:04d}{number:05d}zq"


def value_of(key: str, mark: str, number: int) -> dict[str, Any]:
    return {"text": f"Alice's code word for {key} is {mark}. She chose it on day {number % 30}."}


def open_store(location: str, seed: int = 0) -> tuple[MemTree, MemTreeStore]:
    embedder = HashingEmbedder(64)
    aggregator = SlowExtractive(seed).bound_to(embedder)
    memory = MemTree.open(location, embedder=embedder, aggregator=aggregator, config=MemTreeConfig(theta0=0.2))
    return memory, MemTreeStore(memory, index={"fields": ["text"]})


def loop(store: MemTreeStore, seed: int, report: Callable[[dict[str, Any]], None], limit: int | None = None) -> None:
    """Random puts, overwrites and deletes; ``report`` gets each acknowledged one."""
    chooser = random.Random(seed)
    current: dict[str, str] = {}
    number = 0
    while limit is None or number < limit:
        number += 1
        key = chooser.choice(KEYS)
        removed = [current.pop(key)] if key in current else []
        if removed and chooser.random() < 0.3:
            store.delete(NAMESPACE, key)
            report({"op": "delete", "key": key, "token": None, "removed": removed, "ttl": None})
            continue
        mark = token(seed, number)
        ttl = TTL_MINUTES if chooser.random() < 0.2 else None
        store.put(NAMESPACE, key, value_of(key, mark, number), ttl=ttl)
        current[key] = mark
        op = "overwrite" if removed else "put"
        expires = time.time() + ttl * 60 if ttl else None
        report({"op": op, "key": key, "token": mark, "removed": removed, "ttl": ttl, "expires_by": expires})


def loop_mode(location: str, seed: int) -> None:
    memory, store = open_store(location, seed)
    memory.delete_namespace(TREE)  # each round starts empty

    def report(entry: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(entry) + "\n")  # one write per acknowledgement
        sys.stdout.flush()

    loop(store, seed, report)


def removed_tokens(entries: list[dict[str, Any]], now: float) -> tuple[set[str], set[str]]:
    """(tokens that must appear nowhere, tokens of replaced values) after these
    acknowledged operations, as of ``now``. A value replaced or deleted counts as
    replaced or deleted; one still current whose TTL passed by ``now`` (its expiry
    ends before ``now``, counting from when its put returned) as deleted. (A value
    with a TTL that was replaced may have been replaced before it expired: its text
    is then in the leaf's history, as any replaced value's.)"""
    gone: set[str] = set()
    replaced: set[str] = set()
    for entry in entries:
        for mark in entry["removed"]:
            (gone if entry["op"] == "delete" else replaced).add(mark)
    for entry in entries:
        expired = entry.get("expires_by") is not None and entry["expires_by"] < now
        if expired and entry["token"] and entry["token"] not in replaced:
            gone.add(entry["token"])
    return gone, replaced - gone


def check(store: MemTreeStore, gone: set[str], replaced: set[str], location: str | None) -> dict[str, Any]:
    """Look for every removed token in every read path; return checks per path and leaks."""
    tree = store.tree(NAMESPACE)
    everywhere = gone | replaced
    checks: dict[str, int] = dict.fromkeys(READ_PATHS, 0)
    leaks: list[str] = []

    def look(path: str, text: str, marks: set[str] = everywhere) -> None:
        checks[path] += len(marks)
        leaks.extend(f"{path}: {mark}" for mark in marks if mark in text)

    for key in KEYS:
        item = store.get(NAMESPACE, key, refresh_ttl=False)
        look("store.get", json.dumps(None if item is None else item.value))
    found = store.search(NAMESPACE, query="Alice's code word", limit=50, refresh_ttl=False)
    look("store.search", json.dumps([hit.value for hit in found]))
    for mode, hits in (
        ("retrieve(summary_hits=text)", tree.retrieve("Alice's code word", k=50, summary_hits="text")),
        ("retrieve(summary_hits=leaves)", tree.retrieve("Alice's code word", k=50, summary_hits="leaves")),
        ("retrieve(traversal)", tree.retrieve("Alice's code word", k=50, mode="traversal", summary_hits="text")),
    ):
        look(mode, "\n".join(hit.text for hit in hits))
    nodes = list(tree.walk())
    look("walk", "\n".join(node.text for node in nodes))
    look("get", "\n".join(tree.get(node.id).text for node in nodes if node.id in tree.get_many([node.id])))
    look("get_many", "\n".join(node.text for node in tree.get_many([node.id for node in nodes]).values()))
    look("leaves", "\n".join(leaf.text for leaf in tree.leaves()))
    backup = io.StringIO()
    tree.export_jsonl(backup)
    lines = [json.loads(line) for line in backup.getvalue().splitlines()]
    look("export_jsonl", backup.getvalue(), gone)  # deleted: nowhere, history included
    look("export_jsonl", "\n".join(line.get("text", "") for line in lines if line.get("type") == "node"), replaced)
    if location is not None:
        exported = subprocess.run(
            [
                sys.executable,
                "-m",
                "memtree",
                "export",
                "-",
                "--db",
                location,
                "-n",
                "/".join(TREE),
                "--embedder",
                "hashing:64",
            ],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "TOKENIZERS_PARALLELISM": "false"},
        ).stdout
        look("memtree export", exported, gone)
        nodes_only = [json.loads(line) for line in exported.splitlines() if line.strip()]
        look("memtree export", "\n".join(line.get("text", "") for line in nodes_only if line.get("type") == "node"))
    look("format_tree", tree.format_tree(width=100_000))
    look("to_mermaid", viz.to_mermaid(tree, width=100_000, line_width=100_000))
    look("to_dot", viz.to_dot(tree, width=100_000, line_width=100_000))
    look("to_html", viz.to_html(tree))
    look("to_dict", json.dumps(viz.to_dict(tree)))
    # check() reads only, so a leaf that expired after the last write (and sweep) is
    # still on disk under its summaries, and check() rightly names it; every reader
    # above masks it. Any other problem (a deleted or replaced text kept) is a leak.
    problems = [problem for problem in store.check() if "text of an expired leaf" not in problem]
    checks["check"] += 1
    leaks.extend(f"check: {problem}" for problem in problems)
    return {"checks": checks, "leaks": leaks, "items": len(store.search(NAMESPACE, limit=100, refresh_ttl=False))}


def replaced_by_the_killed_operation(store: MemTreeStore, entries: list[dict[str, Any]]) -> set[str]:
    """The token the operation cut short by the kill replaced, if it committed: the
    last acknowledged value of a key whose record now holds another. (Its text is
    then in the leaf's history, as any replaced value's.)"""
    current: dict[str, str | None] = {}
    for entry in entries:
        current[entry["key"]] = entry["token"]
    records = store._records.get_records(TREE, "store_items")
    return {
        mark
        for key, mark in current.items()
        if mark is not None and key in records and mark not in json.dumps(records[key]["value"])
    }


def check_mode(location: str, tokens_path: str) -> None:
    with open(tokens_path, encoding="utf-8") as file:
        entries = json.load(file)
    memory, store = open_store(location)
    try:
        now = time.time()
        gone, replaced = removed_tokens(entries, now)
        interrupted = replaced_by_the_killed_operation(store, entries)
        report = check(store, gone - interrupted, replaced | interrupted, location)
        report["removed"] = len(gone | replaced)
    finally:
        store.close()
        memory.close()
    print(json.dumps(report), flush=True)


def kill_round(location: str, seed: int, chooser: random.Random, folder: Path) -> dict[str, Any]:
    """One round of the kill loop: start ``loop`` on ``location``, let it acknowledge
    5-40 operations, SIGKILL it 0-30 ms later, then ``check`` in a new process."""
    writer = subprocess.Popen(
        [sys.executable, WORKER, "loop", location, str(seed)], stdout=subprocess.PIPE, text=True, env=ENV
    )
    assert writer.stdout is not None
    wanted = chooser.randint(5, 40)
    entries = []
    while len(entries) < wanted:
        line = writer.stdout.readline()
        if not line:
            break
        entries.append(json.loads(line))
    time.sleep(chooser.uniform(0, 0.03))  # the kill lands anywhere in the next operation
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    writer.stdout.close()
    tokens = folder / f"tokens{seed}.json"
    tokens.write_text(json.dumps(entries), encoding="utf-8")
    checked = subprocess.run(
        [sys.executable, WORKER, "check", location, str(tokens)], capture_output=True, text=True, env=ENV, check=True
    )
    report: dict[str, Any] = json.loads(checked.stdout.strip().splitlines()[-1])
    report["acknowledged"] = len(entries)
    return report


if __name__ == "__main__":
    mode, location, argument = sys.argv[1:4]
    if mode == "loop":
        loop_mode(location, int(argument))
    else:
        check_mode(location, argument)
