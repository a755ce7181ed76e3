"""``memtree bench locomo``: choose the methods, run them, write the report.

The rows, all with the same embedder and aggregator:

* ``flat dense`` — cosine over raw turns (the MemoryStream baseline);
* ``BM25`` — Okapi BM25 over raw turns (``rank-bm25``);
* ``flat hybrid`` — memtree's hybrid ranking (cosine + BM25, the default weight)
  over the turns alone: a memtree that never groups anything (every turn a leaf of
  the root), so its scoring and packing are the engine's own;
* ``memtree`` — memtree with its defaults (collapsed, hybrid dense + BM25);
* ``memtree, leaves only`` — the same tree and ranking, summaries left out: with
  ``flat hybrid``, what tells whether the summaries add anything;
* ``memtree traversal`` — the same tree, beam descent from the root;
* ``memtree paper`` — the paper's algorithm: its own tree (θ0 = 0.4, λ = 0.5,
  summaries embedded from their text), dense collapsed retrieval, no sentence
  de-duplication;
* ``RAPTOR-style`` — a tree built offline with the whole conversation in view,
  packed with the same sentence de-duplication as memtree's rows.

``variants=True`` adds the tuning variants of the engine's defaults the report
keeps on record (:data:`VARIANT_ROWS`); benchmarks/locomo_research.py scores many
more ways of reading the tree over cached trees.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from memtree.aggregate import Aggregator, ExtractiveAggregator, LLMAggregator
from memtree.config import MemTreeConfig
from memtree.embed import Embedder
from memtree_bench.harness import MethodResult, ProgressFactory, run_locomo
from memtree_bench.locomo import Conversation
from memtree_bench.methods import BM25Baseline, FlatDense, MemTreeMethod, Method, RaptorMethod, TreeBuilder
from memtree_bench.report import git_commit
from memtree_bench.saved_trees import SavedTrees, TreeRecipe, model_file_sha256, model_name

logger = logging.getLogger("memtree_bench")

DEFAULT_BUDGETS: tuple[int, ...] = (250, 500, 1000, 2000)


@dataclass(frozen=True)
class LocomoSettings:
    """What one ``memtree bench locomo`` run compares and how."""

    budgets: tuple[int, ...] = DEFAULT_BUDGETS
    embedder: str = "local"
    aggregator: str = "extractive"
    aggregation: str = "eager"
    llm: str | None = None
    variants: bool = False
    raptor: bool = True
    paper: bool = True
    qa_budget: int = 500
    extra_rows: dict[str, dict[str, Any]] = field(default_factory=dict)
    keep_trees: str | None = None
    """A folder where every memtree tree built is saved (one already there is read)."""
    trees: str | None = None
    """A folder of saved trees to score instead of building any (a missing one is an error)."""

    def __post_init__(self) -> None:
        if self.embedder not in ("local", "openai", "hashing"):
            raise ValueError(f"unknown embedder {self.embedder!r}; choose local, openai or hashing")
        if self.aggregator not in ("extractive", "llm"):
            raise ValueError(f"unknown aggregator {self.aggregator!r}; choose extractive or llm")
        if self.aggregation not in ("eager", "deferred"):
            raise ValueError(f"unknown aggregation {self.aggregation!r}; choose eager or deferred")
        if not self.budgets or any(b <= 0 for b in self.budgets):
            raise ValueError(f"budgets must be positive word counts, got {list(self.budgets)}")
        if self.keep_trees is not None and self.trees is not None and self.keep_trees != self.trees:
            raise ValueError("--keep-trees and --trees name different folders; name one (--keep-trees also reads)")


def make_embedder(kind: str) -> Embedder:
    """The embedder every row of the run shares."""
    if kind == "openai":
        from memtree.models.openai import OpenAIEmbedder

        return OpenAIEmbedder()
    if kind == "hashing":
        from memtree.embed import HashingEmbedder

        return HashingEmbedder(256)
    from memtree.embed import LocalEmbedder

    return LocalEmbedder()


def make_aggregator_factory(kind: str, embedder: Embedder, llm: str | None = None) -> Callable[[], Aggregator]:
    """A fresh aggregator per memory (the extractive one caches sentence vectors).

    ``llm`` names the chat model as ``MemTree(llm=...)`` does (``openai:MODEL``,
    ``llama-cpp:PATH``); the default is OpenAI's. One model object serves every
    memory of the run, so a local model is loaded once."""
    if kind == "llm":
        from memtree.models.resolve import resolve_chat_model

        models: list[Any] = []

        def model_aggregator() -> Aggregator:
            # Loaded on first use: a run that only reads saved trees never loads the model.
            if not models:
                models.append(resolve_chat_model(llm or "openai"))
            return LLMAggregator(models[0]).bound_to(embedder)

        return model_aggregator
    return lambda: ExtractiveAggregator(embedder)


FLAT_TREE: dict[str, Any] = {"theta0": 1.0, "max_threshold": 1.0, "deduplicate": False}
"""A memtree that never groups: θ = 1 at the root, so every turn becomes a leaf of the
root (a near-duplicate still hangs beside its twin there), and identical turns are
kept, as the flat baselines keep them."""

PAPER_TREE: dict[str, Any] = {
    "theta0": 0.4,
    "decay": 0.5,
    "parent_embedding": "text",
    "lexical_weight": 0.0,
    "drop_repeated_sentences": False,
    "summary_hits": "text",
}
"""The paper's settings: θ0 = 0.4, λ = 0.5, a summary embedded from its own text,
cosine ranking, every result's whole text delivered (a summary's own text too)."""

# Variants of the defaults tried while tuning them (benchmarks/results/locomo_variants.md).
# "config" changes how the tree is built (a tree of its own); "retrieve" only how it is read.
VARIANT_ROWS: dict[str, dict[str, Any]] = {
    "memtree, lexical 0.1": {"retrieve": {"lexical_weight": 0.1}},
    "memtree, lexical 0.2": {"retrieve": {"lexical_weight": 0.2}},
    "memtree, lexical 0.5": {"retrieve": {"lexical_weight": 0.5}},
    "memtree, dense ranking (the paper's) over the default tree": {"retrieve": {"lexical_weight": 0.0}},
    "memtree, parent = mean of leaves": {"config": {"parent_embedding": "mean"}},
    "memtree, relevance floor on (MemTree.retrieve's default)": {"retrieve": {"min_similarity": "auto"}},
}


def method_factories(settings: LocomoSettings, embedder: Embedder) -> list[Callable[[], Method]]:
    """The rows of the report, in order. Rows that read the same tree share it."""
    aggregators = make_aggregator_factory(settings.aggregator, embedder, settings.llm)
    builders: dict[str, TreeBuilder] = {}
    folder = settings.trees or settings.keep_trees
    saved = SavedTrees(folder) if folder else None
    facts: dict[str, Any] = {}
    if saved is not None and settings.trees is None:
        facts = {
            "embedder": embedder.name,
            "llm": settings.llm,
            "model_sha256": model_file_sha256(settings.llm),
            "memtree_commit": git_commit(),
        }

    def builder(config: dict[str, Any]) -> TreeBuilder:
        key = repr(sorted(config.items()))
        if key not in builders:
            recipe = TreeRecipe.of(config, settings.aggregator, model_name(settings.llm), settings.aggregation)
            builders[key] = TreeBuilder(
                embedder,
                config=MemTreeConfig(**config),
                aggregator_factory=aggregators,
                deferred=settings.aggregation == "deferred",
                saved=saved,
                recipe=recipe,
                reuse_only=settings.trees is not None,
                facts=facts,
            )
        return builders[key]

    def memtree_row(name: str, row: dict[str, Any], *, variant: bool = False) -> Callable[[], Method]:
        shared = builder(row.get("config", {}))
        return lambda: MemTreeMethod(
            name, shared, mode=row.get("mode", "collapsed"), retrieve_options=row.get("retrieve"), variant=variant
        )

    rows: list[Callable[[], Method]] = [
        lambda: FlatDense(embedder),
        lambda: BM25Baseline(),
        memtree_row("flat hybrid", {"config": FLAT_TREE}),
        memtree_row("memtree", {}),
        memtree_row("memtree, summaries as text", {"retrieve": {"summary_hits": "text"}}),
        memtree_row("memtree, leaves only", {"retrieve": {"leaves_only": True}}),
        memtree_row("memtree traversal", {"mode": "traversal"}),
    ]
    if settings.paper:
        rows.append(memtree_row("memtree paper", {"config": PAPER_TREE}))
    if settings.raptor:
        rows.append(lambda: RaptorMethod(embedder, aggregators))
    chosen = {**(VARIANT_ROWS if settings.variants else {}), **settings.extra_rows}
    rows.extend(memtree_row(name, row, variant=True) for name, row in chosen.items())
    return rows


def run_locomo_bench(
    conversations: Sequence[Conversation],
    settings: LocomoSettings,
    *,
    embedder: Embedder | None = None,
    progress: ProgressFactory | None = None,
) -> list[MethodResult]:
    """Run every row over ``conversations``."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    embedder = embedder or make_embedder(settings.embedder)
    return run_locomo(
        conversations,
        method_factories(settings, embedder),
        settings.budgets,
        keep_contexts=settings.qa_budget,
        progress=progress,
    )
