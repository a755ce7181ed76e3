"""SIGKILL a process that puts, changes and deletes ``MemTreeStore`` items, N times,
and count the items whose record and leaves diverged (issue 25 row 1).

    PYTHONPATH=. python benchmarks/store_kill_loop.py --kills 30 [--postgres DSN] [--out results/store_kill_loop]

Each round starts the writer of ``tests/store_kill_worker.py loop`` on a new
SQLite file (or on the PostgreSQL database, its namespace emptied first), lets it acknowledge a random number of
operations (1-40), kills it after a random extra delay (0-20 ms, so kills land
anywhere in an operation), then reopens the store in a new process and checks
every item: its leaves must be exactly the texts its record calls for, no leaf
may belong to a missing item, and ``MemTreeStore.check()`` must find nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
WORKER = str(ROOT / "tests" / "store_kill_worker.py")


def one_round(location: str, seed: int, chooser: random.Random, env: dict[str, str]) -> dict[str, Any]:
    writer = subprocess.Popen(
        [sys.executable, WORKER, "loop", location, str(seed)], stdout=subprocess.PIPE, text=True, env=env
    )
    assert writer.stdout is not None
    wanted = chooser.randint(1, 40)
    acked = 0
    while acked < wanted and writer.stdout.readline():
        acked += 1
    time.sleep(chooser.uniform(0, 0.02))
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    writer.stdout.close()
    checked = subprocess.run(
        [sys.executable, WORKER, "check", location, "-"], capture_output=True, text=True, env=env, check=True
    )
    report: dict[str, Any] = json.loads(checked.stdout.strip().splitlines()[-1])
    report["acknowledged"] = acked
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=30)
    parser.add_argument("--seed", type=int, default=25)
    parser.add_argument("--postgres", default=None, help="a PostgreSQL DSN instead of a SQLite file")
    parser.add_argument("--out", default=None, help="write OUT.json and OUT.md")
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", str(ROOT))])}
    chooser = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as folder:
        rounds = [
            one_round(args.postgres or str(Path(folder) / f"kill{i}.db"), args.seed + i, chooser, env)
            for i in range(args.kills)
        ]
    diverged = [r for r in rounds if r["divergent"] or r["problems"]]
    result = {
        "backend": "postgresql" if args.postgres else "sqlite",
        "kills": len(rounds),
        "rounds_with_divergence": len(diverged),
        "divergent_items": sum(len(r["divergent"]) for r in rounds),
        "operations_acknowledged": sum(r["acknowledged"] for r in rounds),
        "items_per_round": sorted({r["items"] for r in rounds}),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores (shared), Python {platform.python_version()}",
        "command": " ".join(sys.argv),
        "rounds": rounds,
    }
    print(json.dumps({k: v for k, v in result.items() if k != "rounds"}))
    if args.out:
        out = Path(args.out)
        out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
