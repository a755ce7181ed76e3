"""Cold start: what a fresh process pays before memtree answers.

Each command runs in a new Python process, on the same small memory (``--texts``
short texts in a SQLite file, built once with the bundled model, not timed):

* ``python -c pass`` and ``import numpy, faiss`` (floors: the interpreter, and the
  two libraries every memory needs);
* ``import memtree`` (also ``python -X importtime``'s own total for memtree);
* ``from memtree import MemTree`` (what an application imports to use it);
* ``memtree stats`` (opens the file, embeds nothing);
* ``memtree query "<question>"`` (opens the file, loads the embedder, embeds one query);
* ``memtree demo`` (builds the demo tree offline and answers three questions).

The goal (issue 23): ``query`` costs at most 2x ``stats``; ``import memtree`` under 0.3 s.
With ``--baseline <path>`` every command also runs with that checkout first on
``PYTHONPATH`` (for example the main branch before this change), alternating with
this checkout, so both see the same machine load. Wall time and CPU time
(user + system of the child) are both reported, as medians of ``--repeats`` runs:
on a shared machine the wall time mostly measures waiting for a core.

``--load`` names the conditions, each a count of spinning processes run meanwhile
(benchmarks/busy_load.py): 0 is the machine as it is, the number of cores a machine
with every core busy. Each condition gets its own table.

Writes ``cold_start.md`` and ``cold_start.json`` to ``--out``.

    python benchmarks/cold_start.py --baseline /path/to/main --repeats 5 --load 0,2
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from busy_load import busy_cores, load_average  # noqa: E402

TEXTS = [
    "Maya adopted a greyhound named Biscuit in March.",
    "Tom moved to Porto in May and works at a bakery.",
    "Maya's sister Ana is a nurse in Lisbon.",
    "Biscuit is afraid of thunderstorms and hides under the bed.",
    "Tom is learning to surf on weekends.",
    "Maya runs a half marathon every October.",
    "Ana gave Maya a cookbook of Portuguese soups.",
    "Tom's favourite band is Radiohead.",
    "Maya is allergic to peanuts.",
    "Biscuit eats chicken and rice when his stomach is upset.",
    "Tom bought a second-hand bicycle for commuting.",
    "Maya plans a trip to Japan next spring.",
    "Ana is getting married in September.",
    "Tom's bakery makes a famous custard tart.",
    "Maya started learning the cello in January.",
    "Biscuit's vet is Dr. Silva on Rua Augusta.",
    "Tom and Maya met at university in Coimbra.",
    "Maya works as a data engineer at a logistics firm.",
    "Ana's fiancé is a firefighter named Rui.",
    "Tom wants to open his own café one day.",
]
QUESTION = "What is the name of Maya's dog?"


def timed(command: list[str], pythonpath: str, cwd: Path) -> dict[str, float]:
    """Wall and CPU seconds of one child process (its own CPU only, from wait4)."""
    env = {**os.environ, "PYTHONPATH": pythonpath, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    started = time.perf_counter()
    child = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert child.stderr is not None
    stderr = child.stderr.read()
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - started
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({child.returncode}): {stderr.decode()[-2000:]}")
    return {"wall": wall, "cpu": usage.ru_utime + usage.ru_stime, "stderr": stderr.decode()}  # type: ignore[dict-item]


def importtime_total(stderr: str) -> float:
    """Seconds ``python -X importtime`` reports for ``import memtree`` (cumulative)."""
    for line in reversed(stderr.splitlines()):
        match = re.match(r"import time:\s+\d+ \|\s+(\d+) \| memtree$", line)
        if match:
            return int(match.group(1)) / 1e6
    raise RuntimeError("no 'memtree' line in -X importtime output")


def git_commit(path: Path) -> str:
    result = subprocess.run(["git", "-C", str(path), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return result.stdout.strip() or "unknown"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--demo-repeats", type=int, default=3)
    parser.add_argument("--baseline", type=Path, default=None, help="another checkout to time side by side")
    parser.add_argument("--baseline-commit", default=None, help="the baseline's commit, if it is no git checkout")
    parser.add_argument("--load", default="0", help="spinning processes per condition, comma-separated")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)

    python = sys.executable
    checkouts = {"this branch": ROOT}
    if args.baseline is not None:
        checkouts = {"baseline": args.baseline.resolve(), **checkouts}
    commands: dict[str, list[str]] = {
        "python -c pass": [python, "-c", "pass"],
        "import numpy, faiss": [python, "-c", "import numpy, faiss"],
        "import memtree": [python, "-c", "import memtree"],
        "from memtree import MemTree": [python, "-c", "from memtree import MemTree"],
        "import memtree (-X importtime)": [python, "-X", "importtime", "-c", "import memtree"],
        "memtree stats": [python, "-m", "memtree", "stats", "--db", "memory.db"],
        "memtree query": [python, "-m", "memtree", "query", "--db", "memory.db", QUESTION],
        "memtree demo": [python, "-m", "memtree", "demo"],
    }
    conditions = []
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        for label, path in checkouts.items():
            (work / label).mkdir()
            add = [python, "-m", "memtree", "add", "--db", "memory.db", *TEXTS]
            timed(add, str(path), work / label)
        for spinners in (int(value) for value in args.load.split(",")):
            samples: dict[str, dict[str, list[dict[str, float]]]] = {label: {} for label in checkouts}
            with busy_cores(spinners):
                time.sleep(2.0 if spinners else 0.0)  # let the spinners reach the run queue
                load_before = load_average()
                for name, command in commands.items():
                    repeats = args.demo_repeats if name == "memtree demo" else args.repeats
                    for _ in range(repeats):
                        for label, path in checkouts.items():  # alternate: both see the same load
                            sample = timed(command, str(path), work / label)
                            if "importtime" in name:
                                sample["importtime"] = importtime_total(str(sample["stderr"]))
                            sample.pop("stderr")
                            samples[label].setdefault(name, []).append(sample)
                load_after = load_average()
            medians = {
                label: {
                    name: {key: statistics.median(s[key] for s in runs) for key in runs[0]}
                    for name, runs in by_name.items()
                }
                for label, by_name in samples.items()
            }
            conditions.append(
                {
                    "spinning_processes": spinners,
                    "load_before": load_before,
                    "load_after": load_after,
                    "medians": medians,
                    "samples": samples,
                }
            )

    results: dict[str, Any] = {
        "command": "python benchmarks/cold_start.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "commits": {
            label: (args.baseline_commit if label == "baseline" and args.baseline_commit else git_commit(path))
            for label, path in checkouts.items()
        },
        "conditions": conditions,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "cold_start.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    (args.out / "cold_start.md").write_text(report(results), encoding="utf-8")
    print(report(results))


def report(r: dict[str, Any]) -> str:
    lines = [
        "# Cold start: a fresh process, a small memory",
        "",
        f"`{r['command']}` on {r['date']} ({r['machine']}; a machine shared with other jobs). Commits: "
        + ", ".join(f"{label} {commit}" for label, commit in r["commits"].items())
        + '. Medians; each command in a new process, the checkouts alternating. "Spinning processes" are '
        "busy loops the benchmark starts (benchmarks/busy_load.py); the load average before and after each "
        "condition is shown.",
        "",
    ]
    for condition in r["conditions"]:
        lines += condition_report(condition)
    return "\n".join(lines)


def condition_report(c: dict[str, Any]) -> list[str]:
    labels = list(c["medians"])
    spinners = c["spinning_processes"]
    title = f"{spinners} spinning processes" if spinners else "No added load"
    header = "| command | " + " | ".join(f"{label} wall s | {label} CPU s" for label in labels) + " |"
    lines = [
        f"## {title} (load {c['load_before']} → {c['load_after']})",
        "",
        header,
        "|---|" + "---:|---:|" * len(labels),
    ]
    for name in c["medians"][labels[0]]:
        cells = []
        for label in labels:
            m = c["medians"][label][name]
            cells.append(f"{m['wall']:.2f} | {m['cpu']:.2f}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "| ratio | " + " | ".join(f"{label} wall | {label} CPU" for label in labels) + " |"]
    lines.append("|---|" + "---:|---:|" * len(labels))
    for label_row, (top, bottom) in {
        "query / stats (goal <= 2)": ("memtree query", "memtree stats"),
    }.items():
        cells = []
        for label in labels:
            m = c["medians"][label]
            cells.append(f"{m[top]['wall'] / m[bottom]['wall']:.2f} | {m[top]['cpu'] / m[bottom]['cpu']:.2f}")
        lines.append(f"| {label_row} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "`-X importtime` total for `import memtree` (goal < 0.3 s): "
        + ", ".join(
            f"{label} {c['medians'][label]['import memtree (-X importtime)']['importtime']:.3f} s" for label in labels
        )
        + ".",
        "",
    ]
    return lines


if __name__ == "__main__":
    main()
