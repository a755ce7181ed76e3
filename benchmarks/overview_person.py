"""Person overviews against their ceiling: what choosing a speaker's turns (or sentences) can reach.

Issue 36 asks person overviews ("What do you know about {speaker}?") for +15 points
of fact coverage over the best flat baseline at 500 words. This script scores, for
the person questions of the chosen conversations only (a run in minutes, not the
hours of ``memtree bench overview``), under the benchmark's own rule
(:func:`memtree_bench.coverage.score_context`, the same for every row):

* **oracle** rows, which read the gold: greedy, each step the candidate that adds the
  most uncovered gold coverage per word, until the budget is full. Candidates are
  the speaker's turns as the memory holds them (``{date} {speaker}: {utterance}``),
  as ``{speaker}: {utterance}`` (the date said once per day, as the overview does),
  or single sentences of the turns (``{speaker}: {sentence}``). Their coverage is
  the ceiling of any method that delivers such parts;
* the random sample of the speaker's turns, the flat baselines (the report's
  :data:`~memtree_bench.overview_methods.FLAT_BASELINES`) and ``memtree overview``,
  rows of :mod:`memtree_bench.overview_methods` as the report runs them.

    python benchmarks/overview_person.py --data locomo10.json --trees /work/trees/ext-final --conversations 0-4

``--family day`` (``month``, ``multi-hop``) scores another family the same way (its
oracle picks from the question's scope: the span's turns, the named speaker's).
``--recipe model --trees /work/trees/llm --flat-trees /work/trees/ext-final`` reads
the model-written trees.

Derived from the data: prints a table, writes nothing into the repository.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def oracle_context(
    candidates: Sequence[str], facts: Sequence[Any], utterances: dict[str, str], names: Sequence[str], budget: int
) -> str:
    """Greedy: each step the candidate with the most new coverage per word, until
    nothing that fits adds any. A candidate's coverage of each fact is computed once
    by the benchmark's rule (its delivered share, whether it restates the fact); a set's
    is 1 where any restates, else the sum of delivered shares up to 1 (exact while no
    sentence is in two candidates; the caller scores the context it returns)."""
    import numpy as np

    from memtree_bench.coverage import Context, _delivered, content_words

    texts = list(dict.fromkeys(candidates))
    delivered = np.zeros((len(texts), len(facts)))
    restated = np.zeros((len(texts), len(facts)), dtype=bool)
    wordings = [[content_words(text, names) for text in fact.wordings] for fact in facts]
    for i, text in enumerate(texts):
        prepared = Context(text, names)
        for j, fact in enumerate(facts):
            delivered[i, j] = _delivered(fact.evidence, utterances, prepared.folded)
            restated[i, j] = any(prepared.restates(words) for words in wordings[j])
    cost = np.array([max(1, len(text.split())) for text in texts], dtype=float)
    got = np.zeros(len(facts))
    said = np.zeros(len(facts), dtype=bool)
    left = np.ones(len(texts), dtype=bool)
    chosen: list[str] = []
    used = 0.0
    while True:
        now = np.where(said, 1.0, np.minimum(1.0, got))
        after = np.where(said | restated, 1.0, np.minimum(1.0, got + delivered))
        gain = (after - now).sum(axis=1) / cost
        gain[~left | (used + cost > budget)] = 0.0
        best = int(np.argmax(gain))
        if gain[best] <= 0.0:
            return "\n".join(chosen)
        chosen.append(texts[best])
        left[best] = False
        used += cost[best]
        got += delivered[best]
        said |= restated[best]


def _indices(spec: str) -> list[int]:
    """``0-4``, ``0,3`` or ``2``: conversation indices."""
    chosen: list[int] = []
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        low, _, high = part.partition("-")
        chosen.extend(range(int(low), int(high or low) + 1))
    return chosen


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path("/work/shared/data/locomo10.json"))
    parser.add_argument("--trees", type=Path, required=True, help="saved extractive (or model-written) trees")
    parser.add_argument("--recipe", default="extractive", help="extractive, or model (the --model-trees recipe)")
    parser.add_argument("--flat-trees", type=Path, help="where the flat trees are (default: --trees)")
    parser.add_argument("--conversations", default="0-4")
    parser.add_argument("--budgets", default="250,500")
    parser.add_argument("--family", default="person", help="person, day, month or multi-hop")
    parser.add_argument("--no-oracle", action="store_true", help="skip the oracle rows (slow)")
    parser.add_argument("--rows", default="all", help="all, or overview (only memtree overview and flat hybrid)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from memtree.minilm import blas_on_one_thread_for_this_process

    blas_on_one_thread_for_this_process()
    from memtree.text import split_sentences
    from memtree_bench.coverage import content_words, score_context
    from memtree_bench.locomo import read_locomo
    from memtree_bench.locomo_bench import FLAT_TREE, make_embedder
    from memtree_bench.methods import CachedEmbedder
    from memtree_bench.overview_bench import OverviewRun, OverviewSettings, _open_copy
    from memtree_bench.overview_methods import FlatHybrid, Memories, Overview, RandomSample, default_rows
    from memtree_bench.overview_questions import annotated
    from memtree_bench.saved_trees import SavedTrees, TreeRecipe

    budgets = tuple(int(b) for b in args.budgets.split(","))
    raw = read_locomo(args.data)
    embedder = CachedEmbedder(make_embedder("local"))
    saved = SavedTrees(str(args.trees))
    flat_saved = SavedTrees(str(args.flat_trees or args.trees))
    recipe = (
        TreeRecipe.of({}, "extractive", None, "eager")
        if args.recipe == "extractive"
        else TreeRecipe.of({}, "llm", "llama-cpp:qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", "deferred")
    )
    flat_recipe = TreeRecipe.of(FLAT_TREE, "extractive", None, "eager")
    rows: list[Any] = [
        row for row in default_rows() if isinstance(row, (RandomSample, FlatHybrid, Overview))
    ]
    if args.rows == "overview":
        rows = [row for row in rows if row.name in ("flat hybrid", "memtree overview")]
    totals: dict[str, dict[int, list[float]]] = {}

    def add(name: str, budget: int, value: float) -> None:
        totals.setdefault(name, {}).setdefault(budget, []).append(value)

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="memtree-person-") as scratch:
        run = OverviewRun(OverviewSettings())
        for index in _indices(args.conversations):
            conversation = annotated(raw[index])
            sample_id = conversation.conversation.sample_id
            turns = len(conversation.conversation.turns)
            flat = _open_copy(flat_saved, flat_recipe, sample_id, turns, embedder, scratch, run)
            tree = _open_copy(saved, recipe, sample_id, turns, embedder, scratch, run)
            memories = Memories(conversation, flat, tree, embedder)
            utterances, names = conversation.utterances, conversation.speakers
            for question in (q for q in conversation.questions if q.family == args.family):
                line = [f"{sample_id} {question.question} ({len(question.facts)} facts)"]
                for row in rows:
                    contexts = row.contexts(memories, question, budgets)
                    for budget in budgets:
                        got = score_context(contexts[budget], question.facts, utterances, names).coverage
                        add(row.name, budget, got)
                        line.append(f"{row.name}@{budget}={got:.3f}")
                if not args.no_oracle:
                    mine = [t for t in conversation.conversation.turns if question.scope.holds(t)]
                    forms = {
                        "oracle: whole turns as stored": [t.text for t in mine],
                        "oracle: whole turns, speaker label only": [f"{t.speaker}: {t.utterance}" for t in mine],
                        "oracle: single sentences": [
                            f"{t.speaker}: {s}" for t in mine for s in split_sentences(t.utterance)
                        ],
                        "oracle: single sentences of 3+ content words": [
                            f"{t.speaker}: {s}"
                            for t in mine
                            for s in split_sentences(t.utterance)
                            if len(content_words(s, names)) >= 3
                        ],
                    }
                    for name, candidates in forms.items():
                        for budget in budgets:
                            context = oracle_context(candidates, question.facts, utterances, names, budget)
                            got = score_context(context, question.facts, utterances, names).coverage
                            add(name, budget, got)
                            line.append(f"{name}@{budget}={got:.3f}")
                print(" | ".join(line), file=sys.stderr, flush=True)
            tree.close()
            flat.close()
    print(f"\n{args.family} questions, conversations {args.conversations}, trees {args.trees} ({args.recipe})")
    print("| row | " + " | ".join(f"{b} words" for b in budgets) + " |")
    print("|---|" + "---:|" * len(budgets))
    for name, by_budget in totals.items():
        cells = [f"{sum(v) / len(v):.3f}" for v in (by_budget[b] for b in budgets)]
        print(f"| {name} | " + " | ".join(cells) + " |")
    print(f"\n{time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
