"""Many processes on one PostgreSQL namespace of a large tree: what each holds, how a
new one starts, how a running one catches up.

The tree comes from the scale benchmark's SQLite file (``--source``, built by
``memtree bench scale``), copied into a throwaway local PostgreSQL server with
``export_jsonl`` / ``import_jsonl`` (the public backup path). Then, each in a fresh
process (this script's ``worker`` mode), measured one after another:

* **start, no index files**: ``PostgresBackend(dsn)`` (the default): the process reads
  every row and builds its tree and indexes in memory;
* **start, first on this machine**: ``PostgresBackend(dsn, index_dir=...)`` with an
  empty folder: the same, and it writes a segment in the background (timed to done);
* **start, later**: the same with that segment present: it maps the segment and reads
  the rows committed after it;
* **catching up**: a running process (segment mapped) while another process adds
  notes; the running one's next ``refresh()``;
* **what each holds**: two processes with the segment mapped, side by side: each
  one's resident set (RSS) and its proportional share (PSS, from
  ``/proc/<pid>/smaps_rollup``: pages shared with the other count half).

Writes ``postgres_scale.json`` and ``postgres_scale.md`` to ``--out``; the databases
stay under ``--work`` (gigabytes: not in the repository) until the server stops.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

NAMESPACE = "default"


def memory_stats() -> dict[str, int]:
    """This process's RSS and PSS in bytes."""
    out = {"rss": 0, "pss": 0}
    with open("/proc/self/smaps_rollup", encoding="ascii") as rollup:
        for line in rollup:
            name, _, rest = line.partition(":")
            if name in ("Rss", "Pss"):
                out[name.lower()] = int(rest.split()[0]) * 1024
    return out


def worker(dsn: str, index_dir: str, action: str, extra: str) -> None:
    """One measured process; prints JSON lines."""
    from memtree import MemTree, PostgresBackend
    from memtree_bench.scale_data import Memories, TopicEmbedder

    embedder = TopicEmbedder()
    query = Memories().queries(1, seed=99)[0]
    embedder.embed([query])
    started = time.perf_counter()
    cpu = time.process_time()
    store = PostgresBackend(dsn, index_dir=index_dir or None)
    memory = MemTree(store=store, namespace=NAMESPACE, embedder=embedder)
    memory.retrieve(query, k=10)
    result: dict[str, Any] = {
        "start_to_answer": time.perf_counter() - started,
        "cpu": time.process_time() - cpu,
        **memory_stats(),
        "mapped": memory._replica.state.nodes.segment is not None,
        "nodes": len(memory._replica.state.nodes) - 1,
    }
    if action == "start-and-write":
        memory._replica.wait()
        result["segment_written_after"] = time.perf_counter() - started
        result["segments"] = memory._replica.index_facts().get("segments_written", 0)
    print(json.dumps(result), flush=True)
    if action == "hold":  # stay up: report, wait for a line, refresh, report again
        sys.stdin.readline()
        refreshed = time.perf_counter()
        memory.refresh()
        memory.retrieve(query, k=10)
        print(
            json.dumps(
                {
                    "catch_up": time.perf_counter() - refreshed,
                    **memory_stats(),
                    "nodes": len(memory._replica.state.nodes) - 1,
                }
            ),
            flush=True,
        )
        sys.stdin.readline()
    elif action == "add":
        texts, metadata, stamps = Memories(seed=9).batch(50_000_000, int(extra))
        added = time.perf_counter()
        for text, meta, stamp in zip(texts, metadata, stamps, strict=True):
            memory.add(text, metadata=meta, timestamp=stamp)
        print(json.dumps({"added": int(extra), "seconds": time.perf_counter() - added}), flush=True)
        memory._replica.checkpoints = None  # the adder leaves no new segment: the reader catches up from rows
    memory.close()
    store.close()


def run_worker(dsn: str, index_dir: str, action: str, extra: str = "") -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, __file__, "worker", dsn, index_dir, action, extra],
        capture_output=True,
        text=True,
        timeout=7200,
        check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    if done.returncode != 0:
        raise SystemExit(done.stderr[-3000:])
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    merged: dict[str, Any] = {}
    for line in lines:
        merged.update(line)
    return merged


def holder(dsn: str, index_dir: str) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    process = subprocess.Popen(
        [sys.executable, __file__, "worker", dsn, index_dir, "hold", ""],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert process.stdout is not None
    return process, json.loads(process.stdout.readline())


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", type=Path, required=True, help="a SQLite memory of the scale benchmark")
    parser.add_argument("--work", type=Path, default=Path("/work/trees/scale/postgres"))
    parser.add_argument("--adds", type=int, default=1000)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    from pg_server import PostgresServer

    from memtree import MemTree, PostgresBackend
    from memtree_bench.scale_data import TopicEmbedder

    args.work.mkdir(parents=True, exist_ok=True)
    backup = args.work / f"{args.source.stem}.jsonl"
    load = {"start": uptime()}
    if not backup.exists():
        with MemTree.open(args.source, embedder=TopicEmbedder()) as memory:
            memory.export_jsonl(backup)
    server = PostgresServer(fsync=True).start()
    try:
        dsn = server.create_database()
        started = time.perf_counter()
        with MemTree(store=PostgresBackend(dsn), namespace=NAMESPACE, embedder=TopicEmbedder()) as memory:
            memory._replica.checkpoints = None
            memory.import_jsonl(backup)
            nodes = len(memory._replica.state.nodes) - 1
        imported = time.perf_counter() - started
        load["after import"] = uptime()
        index_dir = str(args.work / "index")
        shutil.rmtree(index_dir, ignore_errors=True)
        results: dict[str, Any] = {"nodes": nodes, "import_seconds": imported, "backup_bytes": backup.stat().st_size}
        results["no_index_dir"] = run_worker(dsn, "", "start")
        load["after start from rows"] = uptime()
        results["first_with_index_dir"] = run_worker(dsn, index_dir, "start-and-write")
        load["after first start"] = uptime()
        results["later_with_index_dir"] = run_worker(dsn, index_dir, "start")
        first, first_stats = holder(dsn, index_dir)
        second, second_stats = holder(dsn, index_dir)
        results["two_processes"] = [first_stats, second_stats]
        results["adder"] = run_worker(dsn, index_dir, "add", str(args.adds))
        assert first.stdin is not None and first.stdout is not None
        first.stdin.write("\n")
        first.stdin.flush()
        results["catch_up"] = json.loads(first.stdout.readline())
        assert second.stdin is not None and second.stdout is not None
        second.stdin.write("\n")  # the second holder refreshes too, then both are told to end
        second.stdin.flush()
        second.stdout.readline()
        for process in (first, second):
            assert process.stdin is not None
            process.stdin.write("\n")
            process.stdin.flush()
            process.wait(timeout=600)
        results["new_after_adds"] = run_worker(dsn, index_dir, "start")
        load["end"] = uptime()
        with __import__("psycopg").connect(dsn) as connection:
            row = connection.execute("SELECT pg_database_size(current_database())").fetchone()
            results["database_bytes"] = int(row[0]) if row else 0
            version = connection.execute("SHOW server_version").fetchone()
        results["postgresql"] = version[0] if version else "unknown"
    finally:
        server.stop()
    results["load"] = load
    segment_bytes = sum(path.stat().st_size for path in Path(index_dir).rglob("*.npy"))
    results["segment_bytes"] = segment_bytes
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "postgres_scale.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    write_markdown(args.out / "postgres_scale.md", results, args)
    print(json.dumps(results, indent=2))


def write_markdown(path: Path, r: dict[str, Any], args: argparse.Namespace) -> None:
    raw = r["nodes"] * 384 * 4
    mb = 1e6

    def row(label: str, run: dict[str, Any]) -> str:
        return (
            f"| {label} | {run['start_to_answer']:.2f} | {run['cpu']:.2f} | {run['rss'] / mb:,.0f} | "
            f"{run['pss'] / mb:,.0f} | {'yes' if run['mapped'] else 'no'} |"
        )

    first, second = r["two_processes"]
    lines = [
        f"# PostgreSQL: many processes on one namespace of {r['nodes']:,} nodes",
        "",
        f"`python benchmarks/postgres_scale.py --source {args.source.name}` (the scale benchmark's tree, "
        f"copied into a local PostgreSQL {r['postgresql']} server with `export_jsonl` / `import_jsonl` in "
        f"{r['import_seconds']:,.0f} s; database {r['database_bytes'] / 1e9:,.2f} GB, segment "
        f"{r['segment_bytes'] / 1e9:,.2f} GB, raw vectors {raw / 1e9:,.2f} GB). Every process is fresh: "
        "timed from constructing the store to its first `retrieve` answered, RSS and PSS after it "
        "(PSS counts a page shared with another process at its share).",
        "",
        "| process | start to first answer (s) | CPU (s) | RSS (MB) | PSS (MB) | segment mapped |",
        "|---|---:|---:|---:|---:|---:|",
        row("no `index_dir` (the default): reads every row", r["no_index_dir"]),
        row("`index_dir`, first on the machine: reads every row", r["first_with_index_dir"]),
        row("`index_dir`, later: maps the segment", r["later_with_index_dir"]),
        row("two at once, the first", first),
        row("two at once, the second", second),
        row(f"a new one after {r['adder']['added']:,} more adds", r["new_after_adds"]),
        "",
        f"The first process with an `index_dir` wrote its segment in the background, done "
        f"{r['first_with_index_dir']['segment_written_after']:,.0f} s after it started. "
        f"While one process held the tree, another added {r['adder']['added']:,} notes one by one "
        f"({r['adder']['seconds'] / r['adder']['added'] * 1e3:.1f} ms each); the holder's next `refresh()` "
        f"and query took {r['catch_up']['catch_up']:.3f} s (it read only those rows), and its RSS went to "
        f"{r['catch_up']['rss'] / mb:,.0f} MB.",
        "",
        "Load (`uptime`): " + "; ".join(f"{key}: `{value}`" for key, value in r["load"].items()),
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        worker(*sys.argv[2:6])
    else:
        main()
