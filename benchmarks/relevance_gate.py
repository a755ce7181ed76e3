"""Calibrate the relevance gate: which floor keeps LoCoMo's evidence and drops the rest?

The gate (``MemTree.retrieve(min_similarity=...)``) leaves out every result whose
cosine similarity to the query is below a floor. This script measures, for floors
on a grid, with the agent middleware's retrieval (``k=5``, ``token_budget=400``):

(a) **evidence kept**: of the LoCoMo questions (categories 1-4) whose ungated
    context holds some of their gold evidence, the share whose gated context still
    holds some; and the mean evidence recall, gated against ungated. Tuned on
    conversations 0-4, reported on 5-9 too (never tuned there);
(b) **unrelated questions left alone**: benchmarks/data/unrelated_questions.json
    (105 questions written for this: arithmetic, general knowledge, small talk;
    not derived from LoCoMo), asked of every LoCoMo conversation's memory and of the
    demo's: the share of (question, memory) pairs that get no memory at all.

The same grid runs for ``min_score``, the cut on the hybrid score, for comparison:
the hybrid score's BM25 part is normalized by the best BM25 score of the query's
hits, so the best word match of any query gets the full BM25 share, however
unrelated; the cosine part is the one absolute measure of relevance.

The chosen floor is the highest on the grid that keeps the evidence of at least
``--keep`` (95%) of the tuning questions that had some.

Trees are built by the engine with its defaults and cached (as
benchmarks/locomo_research.py does); a re-run embeds nothing.

    python benchmarks/relevance_gate.py --data ../shared/data/locomo10.json \\
        --cache /tmp/locomo-cache --out benchmarks/results

Writes ``relevance_gate.md`` and ``relevance_gate.json``. LoCoMo is CC BY-NC: only
aggregate numbers are written.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from locomo_research import TREES, DiskCachedEmbedder, build_tree, make_embedder  # noqa: E402

from memtree.aggregate import ExtractiveAggregator  # noqa: E402
from memtree.demo import demo_memory, load_demo_conversation  # noqa: E402
from memtree.retrieval import RELEVANCE_FLOOR  # noqa: E402
from memtree.tree import MemTree  # noqa: E402
from memtree_bench.locomo import Conversation, load_locomo, select_conversations  # noqa: E402
from memtree_bench.metrics import evidence_recall  # noqa: E402
from memtree_bench.report import machine_info, machine_lines, markdown_table  # noqa: E402

QUESTIONS = ROOT / "benchmarks" / "data" / "unrelated_questions.json"
K, BUDGET = 5, 400  # MemTreeMemoryMiddleware's defaults
COSINE_GRID: tuple[float, ...] = tuple(round(x, 2) for x in np.arange(0.10, 0.56, 0.05))
HYBRID_GRID: tuple[float, ...] = tuple(round(x, 2) for x in np.arange(0.20, 0.56, 0.05))


def unrelated_questions(path: Path = QUESTIONS) -> dict[str, list[str]]:
    """The unrelated questions by kind (arithmetic, general knowledge, small talk)."""
    raw = json.loads(path.read_text(encoding="utf-8"))
    return {kind: list(items) for kind, items in raw.items() if kind != "about"}


def locomo_memory(cache: Path, conversation: Conversation, embedder: DiskCachedEmbedder) -> MemTree:
    """The engine's default tree of ``conversation``, from the cache (built if absent)."""
    path = build_tree(cache, TREES["default"], conversation, embedder)
    memory = MemTree(embedder=embedder, aggregator=ExtractiveAggregator(embedder))
    memory.import_jsonl(path)
    return memory


def gate_options(scale: str, floor: float | None) -> dict[str, Any]:
    if floor is None:
        return {"min_similarity": None}  # ungated: MemTree.retrieve's default floor off
    return {"min_similarity": floor} if scale == "cosine" else {"min_score": floor, "min_similarity": None}


def evidence_rows(
    memory: MemTree, conversation: Conversation, grids: dict[str, Sequence[float]]
) -> dict[str, list[dict[str, float]]]:
    """Per question: evidence recall ungated and at every floor of every scale."""
    rows: list[dict[str, float]] = []
    vectors = memory.embedder.embed([question.question for question in conversation.questions])  # one batch
    for question, vector in zip(conversation.questions, vectors, strict=True):
        evidence = [conversation.turn_by_id[dia_id].text for dia_id in question.evidence]
        row: dict[str, float] = {}
        for scale, grid in (("none", [None]), *grids.items()):
            for floor in grid:
                hits = memory.retrieve(
                    question.question,
                    k=K,
                    token_budget=BUDGET,
                    query_embedding=vector,
                    **gate_options(scale, floor),
                )
                row[f"{scale}:{floor}"] = evidence_recall(evidence, "\n".join(hit.context for hit in hits))
        rows.append(row)
    return {"questions": rows}


def unrelated_rows(
    memory: MemTree, vectors: dict[str, Any], grids: dict[str, Sequence[float]]
) -> dict[str, dict[str, int]]:
    """Per floor: how many unrelated questions got no memory from ``memory``."""
    empty: dict[str, dict[str, int]] = {}
    for kind_question, vector in vectors.items():
        for scale, grid in grids.items():
            for floor in grid:
                key = f"{scale}:{floor}"
                hits = memory.retrieve(
                    kind_question.split("|", 1)[1],
                    k=K,
                    token_budget=BUDGET,
                    query_embedding=vector,
                    **gate_options(scale, floor),
                )
                counts = empty.setdefault(key, {})
                kind = kind_question.split("|", 1)[0]
                counts[kind] = counts.get(kind, 0) + (not hits)
    return empty


def summarize_evidence(rows: list[dict[str, float]], key: str) -> dict[str, float]:
    """(a) for one floor over some questions."""
    had = [row for row in rows if row["none:None"] > 0]
    kept = sum(row[key] > 0 for row in had)
    ungated = float(np.mean([row["none:None"] for row in rows]))
    gated = float(np.mean([row[key] for row in rows]))
    return {
        "questions": len(rows),
        "with_evidence_ungated": len(had),
        "evidence_kept": kept / max(1, len(had)),
        "recall_ungated": ungated,
        "recall_gated": gated,
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="locomo10.json")
    parser.add_argument("--cache", type=Path, default=Path("/tmp/locomo-cache"), help="trees and embeddings")
    parser.add_argument("--tune", default="0-4", help="conversations the floor is chosen on")
    parser.add_argument("--report", default="5-9", help="conversations only reported")
    parser.add_argument("--keep", type=float, default=0.95, help="share of evidence the chosen floor must keep")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    embedder = make_embedder("local", args.cache)
    conversations = load_locomo(args.data)
    tune = select_conversations(conversations, args.tune)
    report = select_conversations(conversations, args.report)
    grids = {"cosine": COSINE_GRID, "hybrid": HYBRID_GRID}
    questions = unrelated_questions()
    flat = {f"{kind}|{q}": q for kind, items in questions.items() for q in items}
    vectors = dict(zip(flat, embedder.embed(list(flat.values())), strict=True))  # one batch

    evidence: dict[str, list[dict[str, float]]] = {"tune": [], "report": []}
    unrelated: dict[str, dict[str, int]] = {}
    memories = 0

    def add_unrelated(memory: MemTree) -> None:
        nonlocal memories
        memories += 1
        for key, counts in unrelated_rows(memory, vectors, grids).items():
            total = unrelated.setdefault(key, {})
            for kind, count in counts.items():
                total[kind] = total.get(kind, 0) + count

    for group, chosen in (("tune", tune), ("report", report)):
        for conversation in chosen:
            with locomo_memory(args.cache, conversation, embedder) as memory:
                evidence[group].extend(evidence_rows(memory, conversation, grids)["questions"])
                add_unrelated(memory)
            embedder.save()
            print(f"{conversation.sample_id}: done", flush=True)
    demo = demo_memory_with_turns()
    add_unrelated(demo)
    embedder.save()

    sizes = {kind: len(items) * memories for kind, items in questions.items()}
    table: dict[str, dict[str, Any]] = {}
    for scale, grid in grids.items():
        for floor in grid:
            key = f"{scale}:{floor}"
            counts = unrelated[key]
            table[key] = {
                "scale": scale,
                "floor": floor,
                "tune": summarize_evidence(evidence["tune"], key),
                "report": summarize_evidence(evidence["report"], key),
                "unrelated_empty": sum(counts.values()) / sum(sizes.values()),
                "unrelated_empty_by_kind": {kind: counts.get(kind, 0) / sizes[kind] for kind in sizes},
            }
    chosen_floor = max(
        (
            row["floor"]
            for row in table.values()
            if row["scale"] == "cosine" and row["tune"]["evidence_kept"] >= args.keep
        ),
        default=None,
    )
    demo_hits = demo_answers(demo, chosen_floor)
    demo.close()
    result = {
        "machine": machine_info(),
        "k": K,
        "token_budget": BUDGET,
        "keep": args.keep,
        "chosen_cosine_floor": chosen_floor,
        "engine_floor": RELEVANCE_FLOOR,
        "memories": memories,
        "unrelated_questions": {kind: len(items) for kind, items in questions.items()},
        "rows": table,
        "demo_answers": demo_hits,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "relevance_gate.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    (args.out / "relevance_gate.md").write_text(markdown(result, args), encoding="utf-8")
    print(f"chosen cosine floor: {chosen_floor} (engine's RELEVANCE_FLOOR: {RELEVANCE_FLOOR})")


def demo_memory_with_turns() -> MemTree:
    """The demo's memory (``memtree demo``), filled with its conversation."""
    turns, _ = load_demo_conversation()
    memory = demo_memory()
    memory.add_many([turn.text for turn in turns], timestamps=[turn.timestamp for turn in turns])
    return memory


def demo_answers(memory: MemTree, floor: float | None) -> dict[str, dict[str, int]]:
    """How many hits each demo question gets with and without ``floor``."""
    _, questions = load_demo_conversation()
    return {
        question: {
            "ungated": len(memory.retrieve(question, k=4, token_budget=160, min_similarity=None)),
            "gated": len(memory.retrieve(question, k=4, token_budget=160, min_similarity=floor)),
        }
        for question in questions
    }


def markdown(result: dict[str, Any], args: argparse.Namespace) -> str:
    rows = []
    for row in result["rows"].values():
        by_kind = row["unrelated_empty_by_kind"]
        rows.append(
            (
                f"{row['scale']} >= {row['floor']:.2f}",
                f"{row['tune']['evidence_kept']:.3f}",
                f"{row['tune']['recall_gated']:.3f} / {row['tune']['recall_ungated']:.3f}",
                f"{row['report']['evidence_kept']:.3f}",
                f"{row['report']['recall_gated']:.3f} / {row['report']['recall_ungated']:.3f}",
                f"{row['unrelated_empty']:.3f}",
                " / ".join(f"{by_kind[kind]:.2f}" for kind in sorted(by_kind)),
            )
        )
    tune, report = (
        result["rows"][next(iter(result["rows"]))]["tune"],
        result["rows"][next(iter(result["rows"]))]["report"],
    )
    kinds = ", ".join(f"{count} {kind.replace('_', ' ')}" for kind, count in result["unrelated_questions"].items())
    lines = [
        "# Relevance gate: calibration",
        "",
        f"Retrieval as the agent middleware does it (k = {result['k']}, token budget {result['token_budget']}), "
        "with a floor on the cosine similarity of each result to the query (`min_similarity`) or, for "
        "comparison, on the hybrid score (`min_score`).",
        "",
        f"* **evidence kept**: of the LoCoMo questions (categories 1-4) whose ungated context holds some of "
        f"their gold evidence ({tune['with_evidence_ungated']} of {tune['questions']} on the tuning "
        f"conversations {args.tune}, {report['with_evidence_ungated']} of {report['questions']} on {args.report}), "
        "the share whose gated context still does. *recall*: mean evidence recall gated / ungated.",
        f"* **unrelated left alone**: {kinds} questions (benchmarks/data/unrelated_questions.json, written for "
        f"this, not from LoCoMo) asked of {result['memories']} memories (the 10 LoCoMo conversations and the "
        "demo's): the share of (question, memory) pairs that get no memory at all; then by kind "
        "(arithmetic / general knowledge / small talk).",
        "",
        *markdown_table(
            (
                "gate",
                f"evidence kept ({args.tune})",
                "recall",
                f"evidence kept ({args.report})",
                "recall",
                "unrelated left alone",
                "by kind",
            ),
            rows,
        ),
        "",
        f"Chosen: the highest cosine floor that keeps the evidence of at least {result['keep']:.0%} of the tuning "
        f"questions that had some: **{result['chosen_cosine_floor']}** "
        f"(the engine's `RELEVANCE_FLOOR`: {result['engine_floor']}).",
        "",
        "Why cosine and not the hybrid score: a hybrid score is `(cosine + w * BM25 / best BM25) / (1 + w)`; "
        "the best word match of *any* query gets the whole BM25 share (0.23 at w = 0.3), so an unrelated "
        "question that shares one word with a memory scores like a related one. Cosine similarity does not "
        "depend on the other hits. On these sets the two trade about alike (hybrid >= 0.40 is close to "
        "cosine >= 0.30); the cosine floor is kept because its meaning does not depend on the memory's contents.",
        "",
        "The demo's questions, hits with k = 4 and budget 160 (what `memtree demo` asks), ungated and at the "
        "chosen floor:",
        "",
        *markdown_table(
            ("question", "ungated", "gated"),
            ((question, row["ungated"], row["gated"]) for question, row in result["demo_answers"].items()),
        ),
        "",
        "Command:",
        "",
        "```",
        result["machine"].get("command", ""),
        "```",
        "",
        *machine_lines(result["machine"]),
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
