"""Does the torch-free encoder give sentence-transformers' vectors, and how fast is it?

Both backends of ``LocalEmbedder`` embed the same texts in one process:
``backend="numpy"`` (memtree.minilm: tokenizers + safetensors + numpy) and
``backend="sentence-transformers"`` (torch), both on the bundled all-MiniLM-L6-v2.

* parity: the cosine between the two vectors of each text, over ``--turns`` LoCoMo
  turns (as memtree ingests them: ``"<date> <speaker>: <text>"``) and a set of odd
  inputs (empty, whitespace only, texts far past the 256-token limit, unicode,
  emoji, control characters). Target: every cosine >= 0.999.
* throughput: texts per second on one batch of ``--batch`` LoCoMo turns, the two
  backends alternating ``--repeats`` times (medians), so load on a shared machine
  hits both alike.

Writes ``embed_parity.md`` and ``embed_parity.json`` to ``--out``. No LoCoMo text
is written: only counts, cosines and the odd inputs' labels.

    python benchmarks/embed_parity.py --locomo ../shared/data/locomo10.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from memtree.embed import LocalEmbedder  # noqa: E402

ODD_INPUTS: dict[str, str] = {
    "empty": "",
    "one space": " ",
    "whitespace and newlines": " \n\t \r\n ",
    "leading/trailing spaces": "   Maya adopted a greyhound.   ",
    "one character": "a",
    "punctuation only": "?!...;;--",
    "600 words (past 256 tokens)": " ".join(["memory"] * 600),
    "long mixed text (past 256 tokens)": " ".join(
        f"Sentence {i}: Maya walked Biscuit to the park near Porto on day {i}." for i in range(60)
    ),
    "one 3,000-character word": "x" * 3000,
    "accents": "naïve café résumé Ångström Zoë São Paulo",
    "CJK": "東京で犬を飼っています。北京欢迎你。서울은 아름답다",
    "emoji": "I love my dog 🐕🐶❤️ and pizza 🍕🍕🍕",
    "Arabic and Hebrew": "مرحبا بالعالم שלום עולם",
    "control characters": "tab\there\x00nul\x07bell\u200bzero-width",
    "combining marks": "e\u0301 a\u0300 Z\u0335\u0321a\u0334\u0322l\u0338g\u0337o\u0336",
    "digits and symbols": "3.14159 2026-11-25 $1,000,000 50% #tag @user http://example.com/a?b=c",
    "upper case": "MAYA ADOPTED A GREYHOUND NAMED BISCUIT",
    "repeated newlines": "line one\n\n\n\nline two\n\n\n",
}


def locomo_turns(path: Path, limit: int) -> list[str]:
    """Turns as memtree's LoCoMo benchmark ingests them, conversations in order."""
    data = json.loads(path.read_text(encoding="utf-8"))
    turns: list[str] = []
    for sample in data:
        conversation = sample["conversation"]
        sessions = sorted(
            (int(key.split("_")[1]), value)
            for key, value in conversation.items()
            if key.startswith("session_") and isinstance(value, list)
        )
        for number, session in sessions:
            date = conversation.get(f"session_{number}_date_time", "")
            turns += [f"{date} {turn['speaker']}: {turn['text']}" for turn in session]
    return turns[:limit]


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.asarray((a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--locomo", type=Path, default=ROOT.parent / "shared" / "data" / "locomo10.json")
    parser.add_argument("--turns", type=int, default=3000, help="LoCoMo turns compared")
    parser.add_argument("--batch", type=int, default=256, help="texts per throughput batch")
    parser.add_argument("--repeats", type=int, default=3, help="alternating throughput runs per backend")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)

    turns = locomo_turns(args.locomo, args.turns)
    odd = list(ODD_INPUTS.values())
    numpy_backend = LocalEmbedder(backend="numpy")
    torch_backend = LocalEmbedder(backend="sentence-transformers")
    loads: dict[str, float] = {}
    for label, embedder in (("numpy", numpy_backend), ("sentence-transformers", torch_backend)):
        started = time.perf_counter()
        embedder.preload()
        loads[label] = time.perf_counter() - started

    texts = turns + odd
    fast = numpy_backend.embed(texts)
    reference = torch_backend.embed(texts)
    cos = cosines(fast, reference)
    turn_cos, odd_cos = cos[: len(turns)], cos[len(turns) :]

    batch = turns[: args.batch]
    timings: dict[str, list[float]] = {"numpy": [], "sentence-transformers": []}
    for _ in range(args.repeats):
        for label, embedder in (("numpy", numpy_backend), ("sentence-transformers", torch_backend)):
            started = time.perf_counter()
            embedder.embed(batch)
            timings[label].append(time.perf_counter() - started)
    per_second = {label: len(batch) / statistics.median(values) for label, values in timings.items()}

    results: dict[str, Any] = {
        "command": "python benchmarks/embed_parity.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "turns": len(turns),
        "odd_inputs": len(odd),
        "min_cosine_turns": float(turn_cos.min()),
        "mean_cosine_turns": float(turn_cos.mean()),
        "below_0_999": int((cos < 0.999).sum()),
        "odd_cosines": {label: float(value) for label, value in zip(ODD_INPUTS, odd_cos, strict=True)},
        "load_s_in_this_process": loads,
        "batch": len(batch),
        "batch_seconds": timings,
        "texts_per_second": per_second,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "embed_parity.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    (args.out / "embed_parity.md").write_text(report(results), encoding="utf-8")
    print(report(results))


def report(r: dict[str, Any]) -> str:
    lines = [
        "# Torch-free all-MiniLM-L6-v2: same vectors as sentence-transformers?",
        "",
        f"`{r['command']}` on {r['date']} ({r['machine']}; a shared machine, other jobs running).",
        "",
        f"- {r['turns']} LoCoMo turns: cosine numpy vs sentence-transformers min **{r['min_cosine_turns']:.7f}**, "
        f"mean {r['mean_cosine_turns']:.7f}.",
        f"- Texts below the 0.999 target (turns and odd inputs): **{r['below_0_999']}**.",
        "",
        "| odd input | cosine |",
        "|---|---:|",
        *[f"| {label} | {value:.7f} |" for label, value in r["odd_cosines"].items()],
        "",
        f"Throughput on one batch of {r['batch']} LoCoMo turns, the backends alternating "
        f"{len(r['batch_seconds']['numpy'])} times (median):",
        "",
        "| backend | texts/s | batch seconds (each run) |",
        "|---|---:|---|",
        *[
            f"| {label} | {r['texts_per_second'][label]:.1f} | "
            + ", ".join(f"{value:.2f}" for value in r["batch_seconds"][label])
            + " |"
            for label in ("numpy", "sentence-transformers")
        ],
        "",
        "Load time in this process (the second load reuses libraries the first imported, so the "
        "cold-start table in cold_start.md is the fair comparison): "
        + ", ".join(f"{label} {value:.2f} s" for label, value in r["load_s_in_this_process"].items())
        + ".",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
