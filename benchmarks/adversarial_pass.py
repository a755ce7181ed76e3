"""Issue 39's whole table as one adversarial pass, on SQLite and PostgreSQL (and the
in-memory store where a row applies); writes a Markdown table and a small JSON.

    PYTHONPATH=. python benchmarks/adversarial_pass.py [--kills 10] [--race-rounds 350] \\
        [--no-postgres] [--out benchmarks/results/adversarial_pass]

Per row of the issue, what is done and counted:

1. **Namespace race.** Two writer processes loop put / get / delete in one namespace
   with no pause (``tests/store_race_worker.py``), and a pair where one writer
   removes its items by TTL and ``sweep_ttl()`` instead: acknowledged puts, puts lost.
2. **Removed text.** ``--kills`` SIGKILLs of a background-mode ``MemTreeStore``
   writer that puts, overwrites, deletes and lets items expire, its summary writer
   as slow as a model (``tests/privacy_worker.py``); after each kill a new process
   looks for every removed value's text in every read path, export and picture:
   checks per read path, leaks. Beside it, the store kill loop of issue 25
   (``tests/store_kill_worker.py``): kills, items apart from their leaves.
3. **Exit after close.** A memory whose model hangs is closed with ``timeout=0.5``,
   then the interpreter exits: runs whose exit waited or named the stale summaries again.
4-6, 9. **Bad inputs.** TTLs, expiries, sweep intervals and the raw-error inputs of
   the issue, passed to every entry point that takes them: refused naming the
   parameter, refused otherwise (raw), accepted; and whether anything stored changed.
7. ``memtree check --db postgresql://...``: works, and a database without memtree
   tables is refused and left without any.
8. **Close under four writers.** Four processes put and delete through a store with
   the instant extractive writer and close: close warnings, tracebacks, stale after.
10. ``memtree repair`` / ``compact`` on a 0-byte file: refused, size after.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks")]

from pg_server import PostgresServer, PostgresUnavailable  # noqa: E402
from privacy_worker import READ_PATHS, kill_round  # noqa: E402
from store_kill_loop import one_round as store_kill_round  # noqa: E402

from langchain_memtree import MemTreeStore  # noqa: E402
from memtree import HashingEmbedder, MemTree, MemTreeConfig  # noqa: E402

ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")]), "TOKENIZERS_PARALLELISM": "false"}
RACE_WORKER = str(ROOT / "tests" / "store_race_worker.py")


def python(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=ENV, timeout=timeout)


def memtree_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``memtree ARGS`` with the instant hashing embedder (``MEMTREE_EMBEDDER``)."""
    return subprocess.run(
        [sys.executable, "-m", "memtree", *args],
        capture_output=True,
        text=True,
        env={**ENV, "MEMTREE_EMBEDDER": "hashing:64"},
        timeout=300,
    )


# -- row 1 ---------------------------------------------------------------------------------


def race(location: Callable[[], str], rounds: int) -> dict[str, Any]:
    """Two pairs of writers: delete/delete, then sweep/delete, each on a fresh location."""
    pairs = {"put/get/delete x2": ("delete", "delete"), "TTL sweep + put/get/delete": ("sweep", "delete")}
    out: dict[str, Any] = {}
    for label, (first, second) in pairs.items():
        where = location()
        writers = [
            subprocess.Popen(
                [
                    sys.executable,
                    RACE_WORKER,
                    where,
                    f"w{i}",
                    str(rounds if how == "delete" else rounds // 3),
                    "plain",
                    how,
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=ENV,
            )
            for i, how in enumerate((first, second))
        ]
        results = []
        for writer in writers:
            stdout, stderr = writer.communicate(timeout=1800)
            if writer.returncode != 0:
                raise RuntimeError(stderr)
            results.append(json.loads(stdout.strip().splitlines()[-1]))
        out[label] = {
            "operations": sum(result["operations"] for result in results),
            "acknowledged_puts": sum(result["acknowledged_puts"] for result in results),
            "swept": sum(result["swept"] for result in results),
            "lost": sum(len(result["lost"]) for result in results),
        }
    return out


# -- row 2 ---------------------------------------------------------------------------------


def privacy(location: Callable[[], str], kills: int, seed: int) -> dict[str, Any]:
    chooser = random.Random(seed)
    checks = dict.fromkeys(READ_PATHS, 0)
    leaks: list[str] = []
    acknowledged = removed = 0
    with tempfile.TemporaryDirectory() as folder:
        for number in range(kills):
            report = kill_round(location(), seed * 100 + number, chooser, Path(folder))
            acknowledged += report["acknowledged"]
            removed += report["removed"]
            leaks += report["leaks"]
            for path, count in report["checks"].items():
                checks[path] += count
    return {"kills": kills, "acknowledged": acknowledged, "removed_values": removed, "checks": checks, "leaks": leaks}


def items_and_leaves(location: Callable[[], str], kills: int, seed: int) -> dict[str, Any]:
    chooser = random.Random(seed)
    rounds = [store_kill_round(location(), seed + i, chooser, ENV) for i in range(kills)]
    return {
        "kills": kills,
        "acknowledged": sum(r["acknowledged"] for r in rounds),
        "rounds_with_divergence": sum(1 for r in rounds if r["divergent"] or r["problems"]),
    }


# -- row 3 ---------------------------------------------------------------------------------

EXIT_AFTER_CLOSE = textwrap.dedent(
    """
    import logging, sys, time
    logging.basicConfig(level=logging.WARNING)
    from memtree import Aggregator, HashingEmbedder, MemTree, MemTreeConfig

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


def exit_after_close(location: Callable[[], str], runs: int) -> dict[str, Any]:
    waited = named_again = tracebacks = 0
    for _ in range(runs):
        done = python("-c", EXIT_AFTER_CLOSE, location(), timeout=120)
        waited += "exiting with" in done.stderr
        named_again += done.stderr.count("close() left") != 1
        tracebacks += "Traceback" in done.stderr
    return {"runs": runs, "exit_waited": waited, "named_not_once": named_again, "tracebacks": tracebacks}


# -- rows 4-6, 9 ---------------------------------------------------------------------------


def bad_inputs(location: Callable[[], str]) -> dict[str, Any]:
    """Every bad value at every entry point: refused naming the parameter, raw, or accepted."""
    memory = MemTree.open(location(), embedder=HashingEmbedder(64), config=MemTreeConfig(theta0=0.2))
    store = MemTreeStore(memory, index={"fields": ["text"]})
    leaf = memory.replace_source("note", ["Alice keeps bees."])[0]
    store.put(("n",), "k", {"text": "Bob keeps goats."})
    before = sorted((node.id, node.text, node.expires_at) for node in memory.walk())
    ttls: list[Any] = [1e300, timedelta.max, 10**400, 1e-300, 1e-9, 0.0, -1.0, float("nan"), float("inf"), "60"]
    minutes: list[Any] = [1e300, 10**400, 1e-300, 1e-7, 0, float("nan"), "5"]
    cases: list[tuple[str, str, Callable[[], object]]] = []
    for ttl in ttls:
        cases += [
            ("add", "ttl", lambda ttl=ttl: memory.add("Carol keeps hens.", ttl=ttl)),
            ("add_many", "ttl", lambda ttl=ttl: memory.add_many(["Dan keeps pigs."], ttl=ttl)),
            ("replace_source", "ttl", lambda ttl=ttl: memory.replace_source("note", ["Alice keeps wasps."], ttl=ttl)),
            ("set_expiry", "ttl", lambda ttl=ttl: memory.set_expiry([leaf], ttl=ttl)),
            ("MemTreeConfig", "default_ttl", lambda ttl=ttl: MemTreeConfig(default_ttl=ttl)),
        ]
    for value in minutes:
        cases += [
            ("store.put", "ttl", lambda value=value: store.put(("n",), "k", {"text": "Bob keeps sheep."}, ttl=value)),
            ("TTLConfig", "default_ttl", lambda value=value: MemTreeStore(memory, ttl={"default_ttl": value})),
            (
                "TTLConfig",
                "sweep_interval_minutes",
                lambda value=value: MemTreeStore(memory, ttl={"sweep_interval_minutes": value}),
            ),
            ("start_ttl_sweeper", "sweep_interval_minutes", lambda value=value: store.start_ttl_sweeper(value)),
        ]
    cases += [
        ("MemTree", "namespace", lambda: MemTree(embedder=HashingEmbedder(64), namespace=5)),  # type: ignore[arg-type]
        ("store.put", "index", lambda: store.put(("n",), "k2", {"text": "x"}, index=5)),  # type: ignore[arg-type]
        ("MemTreeStore", "index fields", lambda: MemTreeStore(memory, index={"fields": 5})),  # type: ignore[typeddict-item]
        ("store.search", "limit", lambda: store.search(("n",), limit="5")),  # type: ignore[arg-type]
        ("store.search", "limit", lambda: store.search(("n",), limit=2.5)),  # type: ignore[arg-type]
        ("expires_at", "expires_at", lambda: memory.add("x", expires_at=1e300)),
    ]
    refused = raw = accepted = 0
    failures: list[str] = []
    for where, name, call in cases:
        try:
            made = call()
            if isinstance(made, MemTreeStore):
                made.stop_ttl_sweeper(timeout=5)
        except (TypeError, ValueError) as error:
            if name in str(error):
                refused += 1
            else:
                raw += 1
                failures.append(f"{where}({name}): {error}")
        except Exception as error:  # noqa: BLE001 - a raw error is what is counted
            raw += 1
            failures.append(f"{where}({name}): {type(error).__name__}: {error}")
        else:
            accepted += 1
            failures.append(f"{where}({name}): accepted")
        finally:  # a store or sweeper an accepted bad value made must not run on (a busy loop)
            store.stop_ttl_sweeper(timeout=5)
    store.stop_ttl_sweeper()
    changed = sorted((node.id, node.text, node.expires_at) for node in memory.walk()) != before
    item = store.get(("n",), "k")
    changed = changed or item is None or item.value != {"text": "Bob keeps goats."}
    store.close()
    memory.close()
    counts = {"inputs": len(cases), "refused_by_name": refused, "raw": raw, "accepted": accepted}
    return {**counts, "stored_changed": changed, "failures": failures}


# -- row 7, 10 -------------------------------------------------------------------------------


def check_on_postgres(dsn: str) -> dict[str, Any]:
    import psycopg

    empty = memtree_cli("check", "--db", dsn)
    with psycopg.connect(dsn) as connection:
        made = connection.execute("SELECT count(*) FROM pg_tables WHERE tablename LIKE 'memtree_%'").fetchone()[0]
    memtree_cli("add", "Maya adopted a greyhound.", "-n", "users/maya", "--db", dsn)
    done = memtree_cli("check", "--json", "--db", dsn)
    report = json.loads(done.stdout) if done.returncode == 0 else {}
    return {
        "empty_database_refused": empty.returncode == 1 and "Traceback" not in empty.stderr,
        "tables_made_by_check": made,
        "check_ok": done.returncode == 0 and report.get("sound") is True,
    }


def empty_file(folder: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for command in ("repair", "compact"):
        db = folder / f"{command}.db"
        db.touch()
        done = memtree_cli(command, "--db", str(db))
        out[command] = {
            "refused": done.returncode == 1 and "empty file" in done.stderr,
            "bytes_after": db.stat().st_size,
        }
    return out


# -- row 8 ---------------------------------------------------------------------------------

CLOSING_WRITER = textwrap.dedent(
    """
    import logging, random, sys
    logging.basicConfig(level=logging.WARNING)
    from langchain_memtree import MemTreeStore
    from memtree import HashingEmbedder, MemTree, MemTreeConfig

    location, name = sys.argv[1], sys.argv[2]
    memory = MemTree.open(location, embedder=HashingEmbedder(64), config=MemTreeConfig(theta0=0.2))
    store = MemTreeStore(memory, index={"fields": ["text"]})
    chooser = random.Random(name)
    for number in range(150):
        key = f"{name}-{chooser.randint(0, 40)}"
        if chooser.random() < 0.2:
            store.delete(("shared",), key)
        else:
            store.put(("shared",), key, {"text": f"{name} wrote note {number} about topic {chooser.randint(0, 9)}."})
    store.close()
    memory.close()
    """
)


def close_under_writers(location: str) -> dict[str, Any]:
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", CLOSING_WRITER, location, f"w{i}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=ENV,
        )
        for i in range(4)
    ]
    errors = [writer.communicate(timeout=900)[1] for writer in writers]
    with MemTree.open(location, embedder=HashingEmbedder(64)) as memory:
        stale = memory.sibling(("store", "shared")).stats().stale
    return {
        "writers": 4,
        "close_warnings": sum(error.count("close() left") for error in errors),
        "tracebacks": sum(error.count("Traceback") for error in errors),
        "exit_warnings": sum(error.count("exiting with") for error in errors),
        "stale_after": stale,
    }


# -- the pass --------------------------------------------------------------------------------


def one_backend(name: str, location: Callable[[], str], args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    timings: dict[str, float] = {}

    def timed(label: str, work: Callable[[], Any]) -> Any:
        started = time.monotonic()
        result = work()
        timings[label] = round(time.monotonic() - started, 1)
        print(f"{name} {label}: {json.dumps(result)[:300]}", flush=True)
        return result

    result = {
        "race": timed("race", lambda: race(location, args.race_rounds)),
        "privacy": timed("privacy", lambda: privacy(location, args.kills, args.seed)),
        "items_and_leaves": timed("items_and_leaves", lambda: items_and_leaves(location, args.kills, args.seed)),
        "exit_after_close": timed("exit_after_close", lambda: exit_after_close(location, 3)),
        "bad_inputs": timed("bad_inputs", lambda: bad_inputs(location)),
        "close_under_writers": timed("close_under_writers", lambda: close_under_writers(location())),
    }
    if name == "sqlite":
        result["empty_file"] = timed("empty_file", lambda: empty_file(folder))
    else:
        result["check_cli"] = timed("check_cli", lambda: check_on_postgres(location()))
    result["seconds"] = timings
    return result


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "# Issue 39: one adversarial pass over the whole table",
        "",
        *([f"Code: {result['code']}.", ""] if result.get("code") else []),
        f"`{result['command']}` on {result['machine']}; load average before {result['load_before']}, "
        f"after {result['load_after']}; {result['seconds']} s in all.",
        "",
        "| row | what | " + " | ".join(result["backends"]) + " |",
        "|---|---|" + "---|" * len(result["backends"]),
    ]
    by = result["backends"]

    def row(number: str, what: str, cell: Callable[[dict[str, Any]], str]) -> None:
        cells = [cell(by[name]) if name in by else "n/a" for name in by]
        lines.append(f"| {number} | {what} | " + " | ".join(cells) + " |")

    for label in ("put/get/delete x2", "TTL sweep + put/get/delete"):
        row(
            "1",
            f"namespace race, {label}: acknowledged puts / operations / lost",
            lambda b, label=label: (
                f"{b['race'][label]['acknowledged_puts']} / {b['race'][label]['operations']} / "
                f"**{b['race'][label]['lost']}**"
            ),
        )
    row(
        "2",
        "background writer SIGKILLed: kills / acknowledged ops / removed values / leaks",
        lambda b: (
            f"{b['privacy']['kills']} / {b['privacy']['acknowledged']} / {b['privacy']['removed_values']} / "
            f"**{len(b['privacy']['leaks'])}**"
        ),
    )
    row(
        "2",
        "store kill loop: kills / acknowledged ops / rounds with an item apart from its leaves",
        lambda b: (
            f"{b['items_and_leaves']['kills']} / {b['items_and_leaves']['acknowledged']} / "
            f"**{b['items_and_leaves']['rounds_with_divergence']}**"
        ),
    )
    row(
        "3",
        "exit after close(timeout=0.5), model hanging: runs / exits that waited / named not once",
        lambda b: (
            f"{b['exit_after_close']['runs']} / **{b['exit_after_close']['exit_waited']}** / "
            f"**{b['exit_after_close']['named_not_once']}**"
        ),
    )
    row(
        "4-6, 9",
        "bad inputs: given / refused naming the parameter / raw / accepted / stored changed",
        lambda b: (
            f"{b['bad_inputs']['inputs']} / {b['bad_inputs']['refused_by_name']} / **{b['bad_inputs']['raw']}** / "
            f"**{b['bad_inputs']['accepted']}** / {b['bad_inputs']['stored_changed']}"
        ),
    )
    row(
        "7",
        "`memtree check` on PostgreSQL: empty database refused / tables made / check works",
        lambda b: (
            f"{b['check_cli']['empty_database_refused']} / {b['check_cli']['tables_made_by_check']} / "
            f"{b['check_cli']['check_ok']}"
            if "check_cli" in b
            else "n/a"
        ),
    )
    row(
        "8",
        "4 writers close: close warnings / tracebacks / exit warnings / stale after",
        lambda b: (
            f"**{b['close_under_writers']['close_warnings']}** / **{b['close_under_writers']['tracebacks']}** / "
            f"**{b['close_under_writers']['exit_warnings']}** / {b['close_under_writers']['stale_after']}"
        ),
    )
    row(
        "10",
        "`repair` / `compact` on a 0-byte file: refused, bytes after",
        lambda b: (
            " · ".join(f"{k}: {v['refused']}, {v['bytes_after']} B" for k, v in b["empty_file"].items())
            if "empty_file" in b
            else "n/a"
        ),
    )
    lines += [
        "",
        "Checks per read path (row 2): a check is one removed value looked for in one read path's output after",
        "one kill (`store.get`: per key; `memtree export`: deleted values in the whole file, then every removed",
        "value in its node lines, since a replaced value stays in its leaf's history on purpose).",
        "",
    ]
    names = list(by)
    lines += ["| read path | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for path in READ_PATHS:
        lines.append(f"| {path} | " + " | ".join(str(by[name]["privacy"]["checks"][path]) for name in names) + " |")
    lines += ["", "Seconds per part: " + "; ".join(f"{name}: {by[name]['seconds']}" for name in names), ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--race-rounds", type=int, default=350)
    parser.add_argument("--seed", type=int, default=39)
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument("--out", default=None, help="write OUT.json and OUT.md")
    parser.add_argument("--code", default="", help="which code ran, for the report (e.g. a commit)")
    args = parser.parse_args()
    started = time.monotonic()
    load_before = [round(x, 2) for x in os.getloadavg()]
    backends: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as folder_name:
        folder = Path(folder_name)
        counter = iter(range(1_000_000))
        backends["sqlite"] = one_backend("sqlite", lambda: str(folder / f"m{next(counter)}.db"), args, folder)
        if not args.no_postgres:
            try:
                server = PostgresServer().start()
            except PostgresUnavailable as error:
                print(f"PostgreSQL skipped: {error}", flush=True)
            else:
                try:
                    backends["postgresql"] = one_backend("postgresql", server.create_database, args, folder)
                finally:
                    server.stop()
    result = {
        "command": " ".join(["python benchmarks/adversarial_pass.py", *sys.argv[1:]]),
        "code": args.code,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores (shared), Python {platform.python_version()}",
        "load_before": load_before,
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "seconds": round(time.monotonic() - started),
        "backends": backends,
    }  # fmt: skip
    print(markdown(result))
    if args.out:
        out = Path(args.out)
        out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        out.with_suffix(".md").write_text(markdown(result), encoding="utf-8")


if __name__ == "__main__":
    main()
