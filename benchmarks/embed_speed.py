"""How fast does the bundled MiniLM embed, against sentence-transformers, quiet and loaded?

Side by side in one process, on the same texts, the backends alternating (the order
flips every repeat) so whatever else runs on the machine slows each alike:

* ``numpy``: ``LocalEmbedder()``, memtree's default (memtree.minilm: its thread
  policy decides how many cores to use);
* ``sentence-transformers``: ``LocalEmbedder(backend="sentence-transformers")``,
  the same model on torch with torch's default threads;
* ``numpy before`` (with ``--before COMMIT``): memtree.minilm as it was at that
  commit, run once per condition, for reference.

Texts: ``--chunks`` chunks of exactly 150 words and ``--turns`` turns of exactly 20
words, cut from the licence texts installed on the machine
(``/usr/share/common-licenses``), in order, one call per kind. Conditions: each
number in ``--load`` is a count of spinning processes run meanwhile
(benchmarks/busy_load.py): 0 is the machine as it is (other users' load, recorded
with the load average), the number of cores is a machine with every core busy.
Parity: the cosine between the two backends' vectors of every text.

Writes ``embed_speed.md`` and ``embed_speed.json`` to ``--out``.

    python benchmarks/embed_speed.py --load 0,2 --before d2e35f1
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from busy_load import busy_cores, load_average  # noqa: E402

from memtree.embed import LocalEmbedder  # noqa: E402
from memtree.local_models import bundled_minilm_dir  # noqa: E402


def words_of_licences() -> list[str]:
    words: list[str] = []
    for path in sorted(Path("/usr/share/common-licenses").glob("*")):
        if path.is_file() and not path.is_symlink():
            words += path.read_text(encoding="utf-8", errors="ignore").split()
    return words


def texts_of(words: list[str], count: int, size: int, start: int) -> list[str]:
    needed = start + count * size
    if len(words) < needed:
        raise SystemExit(f"only {len(words)} words of licence text on this machine; {needed} needed")
    return [" ".join(words[start + n * size : start + (n + 1) * size]) for n in range(count)]


class Before:
    """memtree.minilm at an older commit, loaded from git as a module of its own."""

    def __init__(self, commit: str) -> None:
        source = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{commit}:memtree/minilm.py"], capture_output=True, text=True, check=True
        ).stdout
        folder = Path(tempfile.mkdtemp(prefix="embed-speed-"))
        path = folder / "minilm_before.py"
        path.write_text(source, encoding="utf-8")
        spec = importlib.util.spec_from_file_location("minilm_before", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["minilm_before"] = module  # its dataclasses look their module up
        spec.loader.exec_module(module)
        directory = bundled_minilm_dir()
        assert directory is not None
        self.model = module.NumpyMiniLM(directory)

    def embed(self, texts: list[str]) -> Any:
        return self.model.encode(texts)


def timed(embedder: Any, texts: list[str]) -> float:
    started = time.perf_counter()
    embedder.embed(texts)
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--chunks", type=int, default=64, help="150-word texts in one call")
    parser.add_argument("--turns", type=int, default=256, help="20-word texts in one call")
    parser.add_argument("--repeats", type=int, default=3, help="alternating runs per backend and condition")
    parser.add_argument("--load", default="0,2", help="spinning processes per condition, comma-separated")
    parser.add_argument("--before", default=None, help="also time memtree.minilm at this commit (once)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)

    words = words_of_licences()
    kinds = {
        "150-word chunks": texts_of(words, args.chunks, 150, 0),
        "20-word turns": texts_of(words, args.turns, 20, args.chunks * 150),
    }
    numpy_backend = LocalEmbedder()
    torch_backend = LocalEmbedder(backend="sentence-transformers")
    loads: dict[str, float] = {}
    for label, embedder in (("numpy", numpy_backend), ("sentence-transformers", torch_backend)):
        started = time.perf_counter()
        embedder.preload()
        loads[label] = time.perf_counter() - started
    before = Before(args.before) if args.before else None
    backends: dict[str, Any] = {"numpy": numpy_backend, "sentence-transformers": torch_backend}

    all_texts = [text for texts in kinds.values() for text in texts]
    ours, theirs = numpy_backend.embed(all_texts), torch_backend.embed(all_texts)
    cosines = (ours * theirs).sum(axis=1) / (np.linalg.norm(ours, axis=1) * np.linalg.norm(theirs, axis=1))

    conditions = []
    for spinners in (int(value) for value in args.load.split(",")):
        with busy_cores(spinners):
            time.sleep(2.0 if spinners else 0.0)  # let the spinners reach the run queue
            condition: dict[str, Any] = {"spinning_processes": spinners, "load_before": load_average(), "kinds": {}}
            for kind, texts in kinds.items():
                seconds: dict[str, list[float]] = {name: [] for name in backends}
                for repeat in range(args.repeats):
                    order = list(backends) if repeat % 2 == 0 else list(reversed(backends))
                    for name in order:
                        seconds[name].append(timed(backends[name], texts))
                        print(
                            f"load {spinners} {kind} {name}: {len(texts) / seconds[name][-1]:.1f} texts/s", flush=True
                        )
                row: dict[str, Any] = {
                    "texts": len(texts),
                    "seconds": seconds,
                    "texts_per_second": {name: len(texts) / statistics.median(v) for name, v in seconds.items()},
                }
                if before is not None:
                    row["before_seconds"] = timed(before, texts)
                    row["texts_per_second"]["numpy before"] = len(texts) / row["before_seconds"]
                condition["kinds"][kind] = row
            condition["load_after"] = load_average()
        conditions.append(condition)

    results: dict[str, Any] = {
        "command": "python benchmarks/embed_speed.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, {_cpu_name()}",
        "commit": _git("rev-parse", "--short", "HEAD") + ("-dirty" if _git("status", "--porcelain", "-uno") else ""),
        "before": args.before,
        "torch_threads": _torch_threads(),
        "load_seconds": loads,
        "parity_texts": len(all_texts),
        "min_cosine": float(cosines.min()),
        "mean_cosine": float(cosines.mean()),
        "conditions": conditions,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "embed_speed.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    (args.out / "embed_speed.md").write_text(report(results), encoding="utf-8")
    print(report(results))


def report(r: dict[str, Any]) -> str:
    before = r.get("before")
    lines = [
        "# The bundled MiniLM on numpy against sentence-transformers (torch), quiet and loaded",
        "",
        f"`{r['command']}` on {r['date']} ({r['machine']}; commit {r['commit']}). One process; in each "
        "condition the backends alternate on the same texts, one call per kind of text, medians of the runs. "
        f"sentence-transformers runs with torch's default threads ({r['torch_threads']}); numpy with memtree's "
        "thread policy (BLAS on one thread, whole batches on at most one thread per core). "
        '"Spinning processes" are busy loops the '
        "benchmark starts (benchmarks/busy_load.py); the machine is shared, so the load average before and "
        "after each condition is shown too.",
        "",
        f"Parity: cosine between the two backends' vectors of all {r['parity_texts']} texts: "
        f"min **{r['min_cosine']:.7f}**, mean {r['mean_cosine']:.7f}.",
        "",
        "| condition | texts | numpy texts/s | sentence-transformers texts/s | numpy ÷ sentence-transformers |"
        + (f" numpy at {before} texts/s |" if before else ""),
        "|---|---|---:|---:|---:|" + ("---:|" if before else ""),
    ]
    for condition in r["conditions"]:
        label = (
            f"{condition['spinning_processes']} spinning processes"
            if condition["spinning_processes"]
            else "no added load"
        ) + f" (load {condition['load_before']} → {condition['load_after']})"
        for kind, row in condition["kinds"].items():
            speed = row["texts_per_second"]
            ratio = speed["numpy"] / speed["sentence-transformers"]
            line = (
                f"| {label} | {row['texts']} {kind} | {speed['numpy']:.1f} | {speed['sentence-transformers']:.1f} "
                f"| **{ratio:.2f}×** |"
            )
            if before:
                line += f" {speed.get('numpy before', float('nan')):.1f} |"
            lines.append(line)
    lines += [
        "",
        f"Model load in this process: numpy {r['load_seconds']['numpy']:.2f} s, sentence-transformers "
        f"{r['load_seconds']['sentence-transformers']:.2f} s (the second reuses libraries the first imported; "
        "cold_start.md has the fair comparison).",
    ]
    return "\n".join(lines) + "\n"


def _git(*command: str) -> str:
    try:
        return subprocess.run(["git", "-C", str(ROOT), *command], capture_output=True, text=True).stdout.strip()
    except OSError:
        return ""


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _torch_threads() -> int | None:
    try:
        import torch
    except ImportError:
        return None
    return int(torch.get_num_threads())


if __name__ == "__main__":
    main()
