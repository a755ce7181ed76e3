"""Churn benchmark: what 8,000 adds, updates and deletes leave in a store, and what
``MemTree.compact()`` gives back (issue 25, rows 5 and 6).

A tree of about 200 leaves is churned: each operation, drawn at random (seeded), adds
a note, updates one or deletes one, steering the tree back towards 200 leaves when it
drifts past 180 or 220. Models are out of the way: ``HashingEmbedder(384)`` (the
dimension of the default all-MiniLM-L6-v2) and the offline extractive aggregator.

For SQLite and PostgreSQL the report gives, after the churn: the store's size on
disk (SQLite: file plus write-ahead log; PostgreSQL: memtree's tables with indexes
and TOAST), the node rows, live and tombstones; then the same after ``compact()``,
and how long compaction took. For the in-memory store: how many commits its log
keeps and their size in Python objects, with the default ``log_limit`` and with
the log unbounded (as it was before ``log_limit``).

Writes ``churn.md`` and ``churn.json`` to ``--out``.

    python benchmarks/churn.py                       # 8,000 operations, every store
    python benchmarks/churn.py --ops 500 --no-postgres   # a quick look
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import random
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the throwaway PostgreSQL server

from pg_server import PostgresServer, PostgresUnavailable  # noqa: E402

from memtree import HashingEmbedder, MemoryBackend, MemTree, MemTreeConfig, PostgresBackend, SQLiteBackend  # noqa: E402
from memtree.store import Store  # noqa: E402
from memtree.store.memory import LOG_LIMIT  # noqa: E402

TOPICS = ["garden", "cello", "bread", "sailing", "chess", "hiking", "pottery", "astronomy"]
TARGET, LOW, HIGH = 200, 180, 220


def note(rng: random.Random, number: int) -> str:
    topic, other = rng.sample(TOPICS, 2)
    return f"Note {number}: Alice spent the afternoon on {topic}, then planned some {other} for the weekend."


def churn(memory: MemTree, ops: int, seed: int) -> dict[str, int]:
    """Grow the tree to ``TARGET`` leaves, then run ``ops`` random operations."""
    rng = random.Random(seed)
    ids = memory.add_many([note(rng, i) for i in range(TARGET)])
    counts = {"add": 0, "update": 0, "delete": 0}
    number = TARGET
    for _ in range(ops):
        kind = rng.choice(["add", "update", "delete"])
        if len(ids) < LOW:
            kind = "add"
        elif len(ids) > HIGH:
            kind = "delete"
        number += 1
        if kind == "add":
            ids.append(memory.add(note(rng, number)))
        elif kind == "update":
            memory.update(rng.choice(ids), note(rng, number))
        else:
            memory.delete(ids.pop(rng.randrange(len(ids))))
        counts[kind] += 1
    return counts


def node_rows(store: Store) -> tuple[int, int]:
    """(live rows, tombstones) in memtree_nodes."""
    query = "SELECT count(*) FILTER (WHERE NOT deleted), count(*) FILTER (WHERE deleted) FROM memtree_nodes"
    if isinstance(store, SQLiteBackend):
        with sqlite3.connect(store.path) as connection:
            live, dead = connection.execute(query).fetchone()
    else:
        assert isinstance(store, PostgresBackend)
        with store._read_session() as connection:
            live, dead = connection.execute(query).fetchone()
    return int(live), int(dead)


def measure_sql(name: str, make_store: Callable[[], Store], ops: int, seed: int) -> dict[str, Any]:
    store = make_store()
    memory = MemTree(embedder=HashingEmbedder(384), store=store, config=MemTreeConfig())
    started = time.perf_counter()
    counts = churn(memory, ops, seed)
    churn_s = time.perf_counter() - started
    live_before, dead_before = node_rows(store)
    started = time.perf_counter()
    report = memory.compact()
    compact_s = time.perf_counter() - started
    live_after, dead_after = node_rows(store)
    leaves, problems = len(memory), memory.check_integrity()
    memory.close()
    store.close()
    return {
        "store": name,
        "ops": counts,
        "leaves": leaves,
        "integrity_problems": len(problems),
        "churn_s": round(churn_s, 1),
        "bytes_before": report.bytes_before,
        "bytes_after": report.bytes_after,
        "rows_before": live_before + dead_before,
        "live_before": live_before,
        "tombstones_before": dead_before,
        "rows_after": live_after + dead_after,
        "tombstones_after": dead_after,
        "rows_dropped": report.rows_dropped,
        "compact_s": round(compact_s, 2),
    }


def log_bytes(log: list[tuple[int, list[str], list[str]]]) -> int:
    """What a namespace's commit log holds in Python objects (entries, lists, ids)."""
    total = sys.getsizeof(log)
    for entry in log:
        total += sys.getsizeof(entry) + sys.getsizeof(entry[0])
        for ids in entry[1:]:
            total += sys.getsizeof(ids) + sum(sys.getsizeof(node_id) for node_id in ids)
    return total


def measure_memory(name: str, store: MemoryBackend, ops: int, seed: int) -> dict[str, Any]:
    memory = MemTree(embedder=HashingEmbedder(384), store=store, config=MemTreeConfig())
    started = time.perf_counter()
    counts = churn(memory, ops, seed)
    churn_s = time.perf_counter() - started
    space = store._namespaces[memory.namespace]
    leaves = len(memory)
    memory.close()
    return {
        "store": name,
        "ops": counts,
        "leaves": leaves,
        "churn_s": round(churn_s, 1),
        "commits": space.seq,
        "log_commits_kept": len(space.log),
        "log_bytes": log_bytes(space.log),
    }


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


def write_report(out: Path, results: list[dict[str, Any]], info: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "churn.json").write_text(json.dumps({"machine": info, "results": results}, indent=2) + "\n")
    lines = [
        "# Churn: what adds, updates and deletes leave in a store, and what compact() gives back",
        "",
        f"`{info['command']}` on {info['date']}.",
        "",
        f"Machine: {info['cpu']}; Python {info['python']}, SQLite {info['sqlite']}, PostgreSQL {info['postgresql']}. "
        "The machine is shared with other engineers' jobs (2 cores); load before and after:",
        "",
        f"- before: `{info['load_before']}`",
        f"- after: `{info['load_after']}`",
        "",
        "A 200-leaf tree (HashingEmbedder(384), extractive summaries), then random adds, updates and deletes "
        "that keep it between 180 and 220 leaves. Size = SQLite file plus its write-ahead log; for PostgreSQL "
        "memtree's tables with indexes and TOAST (plain `VACUUM` marks the space reusable; it does not hand it "
        "back to the operating system).",
        "",
        "| store | ops (add / update / delete) | leaves | size before | size after compact | rows before "
        "(tombstones) | rows after (tombstones) | compact (s) |",
        "|---|---|---:|---:|---:|---|---|---:|",
    ]
    for row in results:
        if row["store"].startswith("memory"):
            continue
        ops = row["ops"]
        lines.append(
            f"| {row['store']} | {ops['add']:,} / {ops['update']:,} / {ops['delete']:,} | {row['leaves']} "
            f"| {row['bytes_before'] / 1e6:.1f} MB | {row['bytes_after'] / 1e6:.1f} MB "
            f"| {row['rows_before']:,} ({row['tombstones_before']:,}) | {row['rows_after']:,} "
            f"({row['tombstones_after']:,}) | {row['compact_s']:.2f} |"
        )
    lines += [
        "",
        "In-memory store, same churn: the commit log each namespace keeps for other memories to catch up.",
        "",
        "| store | commits | log entries kept | log size |",
        "|---|---:|---:|---:|",
    ]
    for row in results:
        if row["store"].startswith("memory"):
            size = f"{row['log_bytes'] / 1e6:.2f} MB"
            lines.append(f"| {row['store']} | {row['commits']:,} | {row['log_commits_kept']:,} | {size} |")
    (out / "churn.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", type=int, default=8000)
    parser.add_argument("--seed", type=int, default=25)
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--work", type=Path, default=Path("/tmp/memtree-churn"))
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    load_before = uptime()
    results = []
    path = args.work / "churn.db"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    results.append(measure_sql("sqlite", lambda: SQLiteBackend(path), args.ops, args.seed))
    print(results[-1], flush=True)
    postgres_version = "not run"
    if not args.no_postgres:
        try:
            server = PostgresServer(fsync=True).start()
        except PostgresUnavailable as error:
            print(f"PostgreSQL skipped: {error}", flush=True)
        else:
            try:
                dsn = server.dsn()
                results.append(measure_sql("postgresql", lambda: PostgresBackend(dsn), args.ops, args.seed))
                backend = PostgresBackend(dsn)
                with backend._read_session() as connection:
                    postgres_version = str(connection.execute("SHOW server_version").fetchone()[0])
                backend.close()
                print(results[-1], flush=True)
            finally:
                server.stop()
    for name, store in (
        (f"memory (log_limit {LOG_LIMIT:,}, the default)", MemoryBackend()),
        ("memory, log unbounded (as before log_limit)", MemoryBackend(log_limit=10**9)),
    ):
        results.append(measure_memory(name, store, args.ops, args.seed))
        print(results[-1], flush=True)
    info = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": " ".join(["python", *[str(part) for part in sys.argv]]),
        "cpu": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "postgresql": postgres_version,
        "load_before": load_before,
        "load_after": uptime(),
    }
    write_report(args.out, results, info)


if __name__ == "__main__":
    main()
