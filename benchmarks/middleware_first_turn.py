"""The agent middleware's first turn against its later turns, in a fresh process.

Each run is a new Python process that opens a small memory (a SQLite file with
``len(FACTS)`` memories, written beforehand by another process), builds
``MemTreeMemoryMiddleware`` over it with the default offline embedder (the bundled
all-MiniLM-L6-v2), builds a ``create_agent`` agent with a scripted chat model that
answers at once (so the turn is the middleware's cost plus LangGraph's), and sends
``--turns`` user messages, the first right after ``create_agent`` returns.

Reported (medians over ``--runs`` processes): the middleware's construction, the
first turn, the median of the later turns, and their ratio (goal, issue 23/24: the
first turn costs at most 1.5x a later one). With ``--baseline <checkout>`` the same
runs alternate with that checkout on ``PYTHONPATH``.

Writes ``middleware_first_turn.md`` and ``.json`` to ``--out``.

    python benchmarks/middleware_first_turn.py --baseline /path/to/main
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

FACTS = [
    "User: I adopted a greyhound named Biscuit.\nAssistant: Lovely name!",
    "User: I moved to Porto in May.\nAssistant: Porto is beautiful.",
    "User: I'm allergic to peanuts.\nAssistant: Noted, I'll keep that in mind.",
    "User: My sister Ana is a nurse.\nAssistant: That's a demanding job.",
    "User: I run a half marathon every October.\nAssistant: Impressive!",
]
QUESTIONS = [
    "What's my dog's name?",
    "Where do I live now?",
    "Can you suggest a snack for me?",
    "What does my sister do?",
    "When is my race?",
    "Any tips for my dog in thunderstorms?",
    "What should I cook for Ana?",
]

WHEN = ("load now, immediately", "load in background, immediately", "load in background, after-load")
"""How the middleware loads the embedder (``load_embedder``: ``"now"``, the default,
in its constructor; ``"background"``, on a thread) and when the first message
comes: right after ``create_agent``, or once the background load has ended (waited
for, and reported). A baseline checkout that has no ``load_embedder`` gets none."""

SEED = """
import sys
from memtree import MemTree
memory = MemTree(store=sys.argv[1])
memory.add_many({facts!r})
memory.close()
"""

RUN = """
import json, sys, time
started = time.perf_counter()
from langchain.agents import create_agent
from langchain_memtree import MemTreeMemoryMiddleware
from langchain_memtree.testing import scripted
from memtree import MemTree
imported = time.perf_counter()
memory = MemTree(store=sys.argv[1])
mode = "background" if "background" in sys.argv[2] else "now"
try:  # one user: the memory's own namespace, fixed
    middleware = MemTreeMemoryMiddleware(memory=memory, namespace=memory.namespace, load_embedder=mode)
except TypeError:  # a checkout from before load_embedder
    middleware = MemTreeMemoryMiddleware(memory=memory, namespace=memory.namespace)
constructed = time.perf_counter()
questions = {questions!r}
agent = create_agent(scripted(*[f"Answer {{i}}." for i in range(len(questions))]), middleware=[middleware])
agent_built = time.perf_counter()
loading = getattr(middleware, "embedder_loading", None)
if sys.argv[2].endswith("after-load") and loading is not None:
    loading.join()  # a user whose first message comes once the model has loaded
waited = time.perf_counter() - agent_built
turns = []
messages = []
for question in questions:
    messages.append({{"role": "user", "content": question}})
    t = time.perf_counter()
    state = agent.invoke({{"messages": messages}})
    turns.append(time.perf_counter() - t)
    messages = state["messages"]
memory.close()
print(json.dumps({{"import": imported - started, "construct": constructed - imported,
                  "create_agent": agent_built - constructed, "waited": waited, "turns": turns}}))
"""


def run_child(code: str, pythonpath: str, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": pythonpath, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    # cwd: a folder with no checkout in it (``-c`` puts the working directory first on sys.path)
    result = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
        cwd=tempfile.gettempdir(),
    )
    if result.returncode != 0:
        raise RuntimeError(result.stderr[-3000:])
    return result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""


def git_commit(path: Path) -> str:
    result = subprocess.run(["git", "-C", str(path), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return result.stdout.strip() or "unknown"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="fresh processes per checkout")
    parser.add_argument("--turns", type=int, default=len(QUESTIONS))
    parser.add_argument("--baseline", type=Path, default=None)
    parser.add_argument("--baseline-commit", default=None, help="the baseline's commit, if it is no git checkout")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    questions = QUESTIONS[: args.turns]

    checkouts = {"this branch": ROOT}
    if args.baseline is not None:
        checkouts = {"baseline": args.baseline.resolve(), **checkouts}
    runs: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        stores = {}
        for label, path in checkouts.items():
            stores[label] = str(Path(scratch) / f"{label.replace(' ', '_')}.db")
            run_child(SEED.format(facts=FACTS), str(path), stores[label])
        for _ in range(args.runs):
            for label, path in checkouts.items():
                for when in WHEN:
                    code = RUN.format(questions=questions)
                    runs.setdefault(f"{label}, {when}", []).append(
                        json.loads(run_child(code, str(path), stores[label], when))
                    )

    summary: dict[str, dict[str, float]] = {}
    for label, results in runs.items():
        first = statistics.median(r["turns"][0] for r in results)
        later = statistics.median(statistics.median(r["turns"][1:]) for r in results)
        summary[label] = {
            "construct_s": statistics.median(r["construct"] for r in results),
            "create_agent_s": statistics.median(r["create_agent"] for r in results),
            "waited_s": statistics.median(r["waited"] for r in results),
            "first_turn_s": first,
            "later_turn_s": later,
            "first_over_later": first / later,
        }
    results_json: dict[str, Any] = {
        "command": "python benchmarks/middleware_first_turn.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "load_average": os.getloadavg(),
        "commits": {
            label: (args.baseline_commit if label == "baseline" and args.baseline_commit else git_commit(path))
            for label, path in checkouts.items()
        },
        "summary": summary,
        "runs": runs,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "middleware_first_turn.json").write_text(json.dumps(results_json, indent=2) + "\n", encoding="utf-8")
    (args.out / "middleware_first_turn.md").write_text(report(results_json), encoding="utf-8")
    print(report(results_json))


def report(r: dict[str, Any]) -> str:
    lines = [
        "# The agent middleware's first turn",
        "",
        f"`{r['command']}` on {r['date']} ({r['machine']}; a machine shared with other jobs, load average "
        f"{r['load_average'][0]:.1f} at the end). Commits: "
        + ", ".join(f"{label} {commit}" for label, commit in r["commits"].items())
        + ". Medians over fresh processes; the chat model is scripted (answers at once), the embedder is the "
        'default offline one. `load now` (the default, `load_embedder="now"`): the constructor loads the '
        "embedder; `load in background`: it starts a thread that loads it. `immediately`: the first message "
        "right after `create_agent` returns; `after-load`: once that thread has loaded the embedder.",
        "",
        "| checkout, first message | middleware construction s | create_agent s | waited for the load s "
        "| first turn s | later turn s (median) | first / later (goal <= 1.5) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for label, s in r["summary"].items():
        lines.append(
            f"| {label} | {s['construct_s']:.3f} | {s['create_agent_s']:.3f} | {s['waited_s']:.3f} | "
            f"{s['first_turn_s']:.3f} | "
            f"{s['later_turn_s']:.3f} | {s['first_over_later']:.2f} |"
        )
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
