"""``memtree bench overview``: what a flat index cannot answer, asked of every method.

Questions come from a LoCoMo-schema file's annotations
(:mod:`memtree_bench.overview_questions`); every row of
:mod:`memtree_bench.overview_methods` answers each of them at each word budget;
:mod:`memtree_bench.coverage` scores the contexts (fact coverage and evidence
recall). Trees are read from folders of saved trees (``memtree bench locomo
--keep-trees`` format, :mod:`memtree_bench.saved_trees`): the extractive folder is
filled with any tree missing from it (a turn's insert costs tens of milliseconds),
the model-written folder is only read, so a run never loads a model and a
conversation whose model-written tree is not there yet is reported missing. Each
saved tree is copied to a temporary folder before it is opened, so a tree another
process is writing or reading is never touched.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memtree.text import count_words
from memtree_bench.locomo_bench import FLAT_TREE
from memtree_bench.overview_methods import Memories, Row, default_rows
from memtree_bench.overview_questions import FAMILIES, AnnotatedConversation, annotated
from memtree_bench.saved_trees import SavedTrees, TreeRecipe

EXTRACTIVE = "extractive"
MODEL_WRITTEN = "model-written"


@dataclass(frozen=True)
class OverviewSettings:
    """What one ``memtree bench overview`` run reads and how it scores."""

    budgets: tuple[int, ...] = (250, 500, 1000, 2000)
    trees: str = "/tmp/memtree-trees"
    """The folder of extractive trees (missing ones are built into it)."""
    model_trees: str | None = None
    """A folder of model-written trees to read (never built here), or ``None``."""
    model: str = "llama-cpp:qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
    """The model name in the model-written trees' recipe (as ``--llm`` names it, file base name)."""
    model_aggregation: str = "deferred"
    tuning: frozenset[int] = frozenset(range(5))
    """Indices (in the file) of the conversations the defaults were tuned on."""
    extractive: bool = True
    """Whether to score the extractive trees too (``False``: only the model-written
    ones, a re-run in minutes; the flat rows still read the extractive folder's flat trees)."""


@dataclass
class Score:
    """One row's scores for one question at one budget."""

    conversation: int
    sample_id: str
    trees: str
    family: str
    row: str
    variant: bool
    question: int
    budget: int
    coverage: float
    evidence_recall: float | None
    restated: int


@dataclass
class OverviewRun:
    settings: OverviewSettings
    scores: list[Score] = field(default_factory=list)
    questions: dict[str, dict[str, int]] = field(default_factory=dict)
    """Per conversation (sample id): questions per family."""
    missing: list[str] = field(default_factory=list)
    """Model-written trees not found (conversation sample ids)."""
    trees_read: list[dict[str, str]] = field(default_factory=list)
    seconds: float = 0.0


def run_overview(
    items: Sequence[tuple[int, dict[str, Any]]],
    settings: OverviewSettings,
    embedder: Any,
    rows: Sequence[Row] | None = None,
    progress: Callable[[str], None] | None = None,
) -> OverviewRun:
    """Every row over every conversation (``(index in the file, raw LoCoMo object)``),
    on the extractive trees and, where there are some, the model-written ones."""
    started = time.perf_counter()
    rows = list(rows) if rows is not None else default_rows()
    run = OverviewRun(settings)
    say = progress or (lambda _line: None)
    extractive = SavedTrees(settings.trees)
    default_recipe = TreeRecipe.of({}, "extractive", None, "eager")
    flat_recipe = TreeRecipe.of(FLAT_TREE, "extractive", None, "eager")
    model_recipe = TreeRecipe.of({}, "llm", settings.model, settings.model_aggregation)
    with tempfile.TemporaryDirectory(prefix="memtree-overview-") as scratch:
        for index, item in items:
            conversation = annotated(item)
            sample_id = conversation.conversation.sample_id
            run.questions[sample_id] = {f: sum(q.family == f for q in conversation.questions) for f in FAMILIES}
            for recipe in (default_recipe, flat_recipe):
                _build_if_missing(extractive, recipe, conversation, embedder)
            turns = len(conversation.conversation.turns)
            flat = _open_copy(extractive, flat_recipe, sample_id, turns, embedder, scratch, run)
            kinds = [(EXTRACTIVE, extractive, default_recipe)] if settings.extractive else []
            if settings.model_trees is not None:
                model = SavedTrees(settings.model_trees)
                if model.has(sample_id, model_recipe):
                    kinds.append((MODEL_WRITTEN, model, model_recipe))
                else:
                    run.missing.append(sample_id)
            raptor = None
            try:
                for kind, folder, recipe in kinds:
                    tree = _open_copy(folder, recipe, sample_id, turns, embedder, scratch, run)
                    memories = Memories(conversation, flat, tree, embedder, raptor)
                    try:
                        say(f"{sample_id} ({kind} tree): {len(conversation.questions)} questions x {len(rows)} rows")
                        _score(run, index, sample_id, kind, conversation, memories, rows)
                    finally:
                        raptor = memories.raptor  # built once per conversation, read by both kinds
                        tree.close()
            finally:
                flat.close()
    run.seconds = time.perf_counter() - started
    return run


def _score(
    run: OverviewRun,
    index: int,
    sample_id: str,
    kind: str,
    conversation: AnnotatedConversation,
    memories: Memories,
    rows: Sequence[Row],
) -> None:
    from memtree_bench.coverage import score_context

    budgets = run.settings.budgets
    utterances = conversation.utterances
    for row in rows:
        for number, question in enumerate(conversation.questions):
            contexts = row.contexts(memories, question, budgets)
            for budget in budgets:
                got = score_context(contexts[budget], question.facts, utterances, conversation.speakers)
                run.scores.append(
                    Score(
                        index,
                        sample_id,
                        kind,
                        question.family,
                        row.name,
                        row.variant,
                        number,
                        budget,
                        got.coverage,
                        got.evidence_recall,
                        got.restated,
                    )
                )


def _build_if_missing(
    saved: SavedTrees, recipe: TreeRecipe, conversation: AnnotatedConversation, embedder: Any
) -> None:
    """Build and save an extractive tree the folder lacks (as ``memtree bench locomo
    --keep-trees`` would)."""
    sample_id = conversation.conversation.sample_id
    if saved.has(sample_id, recipe):
        return
    from memtree_bench.locomo_bench import make_aggregator_factory
    from memtree_bench.methods import TreeBuilder
    from memtree_bench.report import git_commit

    facts = {"embedder": embedder.name, "llm": None, "model_sha256": None, "memtree_commit": git_commit()}
    builder = TreeBuilder(
        embedder,
        config=recipe.config,
        aggregator_factory=make_aggregator_factory("extractive", embedder),
        saved=saved,
        recipe=recipe,
        facts=facts,
    )
    try:
        builder.build(conversation.conversation.turns, sample_id)
    finally:
        builder.close()


def _open_copy(
    saved: SavedTrees, recipe: TreeRecipe, sample_id: str, turns: int, embedder: Any, scratch: str, run: OverviewRun
) -> Any:
    """A saved tree copied into ``scratch`` and opened there, its budgets counted in
    words (``token_counter=count_words``): the benchmark's budgets are words."""
    from memtree.aggregate import ExtractiveAggregator
    from memtree.tree import MemTree

    sidecar = saved.load_sidecar(sample_id, recipe, turns)
    source = saved.tree_path(sample_id, recipe)
    target = Path(scratch) / f"{len(run.trees_read)}-{source.name}"
    shutil.copyfile(source, target)
    run.trees_read.append({"file": source.name, "sha256": str(sidecar.get("tree_sha256", ""))})
    config = dataclasses.replace(recipe.config, token_counter=count_words)
    return MemTree.open(target, embedder=embedder, aggregator=ExtractiveAggregator(embedder), config=config)
