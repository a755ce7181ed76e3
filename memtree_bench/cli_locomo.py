"""``memtree bench locomo``: retrieval quality on LoCoMo against the baselines."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from memtree.commands.common import CliError, cli_errors, err, parse_embedder, parse_llm
from memtree_bench.deps import require_bench_extra


def _budgets(text: str) -> tuple[int, ...]:
    try:
        budgets = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise CliError(f"--budgets takes word counts like 250,500,1000,2000, got {text!r}") from None
    if not budgets or any(b <= 0 for b in budgets):
        raise CliError(f"--budgets takes positive word counts like 250,500,1000,2000, got {text!r}")
    return tuple(sorted(set(budgets)))


@cli_errors
def locomo(
    data: Annotated[Path, typer.Option("--data", help="Path to locomo10.json (CC BY-NC 4.0; download it yourself).")],
    conversations: Annotated[
        str, typer.Option("--conversations", help="Which conversations: all, 0-9, 0,3,5 or 2.")
    ] = "all",
    budgets: Annotated[str, typer.Option("--budgets", help="Word budgets, comma separated.")] = "250,500,1000,2000",
    embedder: Annotated[
        str, typer.Option("--embedder", help="local, openai[:MODEL] or hashing (not semantic; for smoke runs).")
    ] = "local",
    aggregator: Annotated[
        str, typer.Option("--aggregator", help="extractive (offline) or llm (a chat model, see --llm).")
    ] = "extractive",
    llm: Annotated[
        str | None,
        typer.Option(
            "--llm", help="Chat model of --aggregator llm: openai[:MODEL] (default) or llama-cpp:PATH (implies llm)."
        ),
    ] = None,
    aggregation: Annotated[
        str, typer.Option("--aggregation", help="eager (per insert, the paper) or deferred (once per session).")
    ] = "eager",
    questions: Annotated[
        int | None, typer.Option("--questions", help="At most this many questions per conversation (smoke runs).")
    ] = None,
    sessions: Annotated[
        int | None,
        typer.Option(
            "--sessions", help="Only each conversation's first N sessions, and the questions answered in them."
        ),
    ] = None,
    variants: Annotated[bool, typer.Option("--variants", help="Also run the tuning variants of the defaults.")] = False,
    raptor: Annotated[bool, typer.Option("--raptor/--no-raptor", help="Include the RAPTOR-style row.")] = True,
    paper: Annotated[
        bool,
        typer.Option("--paper/--no-paper", help="Include the paper's configuration (its own tree, ~10 calls/insert)."),
    ] = True,
    qa: Annotated[
        bool, typer.Option("--qa/--no-qa", help="LLM reader + judge accuracy when a model is configured.")
    ] = True,
    qa_budget: Annotated[int, typer.Option("--qa-budget", help="Context words given to the QA reader.")] = 500,
    keep_trees: Annotated[
        Path | None,
        typer.Option(
            "--keep-trees",
            help="Save every memtree tree built into this folder (SQLite + a JSON sidecar); trees already "
            "there are read, so an interrupted run resumes. Keep it out of the repository (CC BY-NC data).",
        ),
    ] = None,
    trees: Annotated[
        Path | None,
        typer.Option(
            "--trees",
            help="Score the memtree rows on trees saved by --keep-trees in this folder instead of building "
            "them; a missing tree is an error.",
        ),
    ] = None,
    out: Annotated[Path, typer.Option("--out", help="Directory for the report.")] = Path("benchmarks/results"),
    name: Annotated[str, typer.Option("--name", help="File stem of the report.")] = "locomo",
) -> None:
    """Evidence recall on LoCoMo for flat dense, BM25, memtree (collapsed, traversal, the paper's
    ranking) and a RAPTOR-style tree; writes Markdown, JSON and a PNG plot."""
    require_bench_extra()
    from dataclasses import replace

    from memtree_bench.locomo import first_sessions, load_locomo, select_conversations
    from memtree_bench.locomo_bench import LocomoSettings, run_locomo_bench
    from memtree_bench.locomo_report import write_locomo_report
    from memtree_bench.report import machine_info, machine_lines

    chosen_llm = parse_llm(llm)
    if chosen_llm is not None:
        if aggregator not in ("extractive", "llm"):
            raise CliError(f"unknown --aggregator {aggregator!r}; choose extractive or llm")
        aggregator = "llm"
    settings = LocomoSettings(
        budgets=_budgets(budgets),
        embedder=embedder,
        aggregator=aggregator,
        aggregation=aggregation,
        llm=chosen_llm,
        variants=variants,
        raptor=raptor,
        paper=paper,
        qa_budget=qa_budget,
        keep_trees=str(keep_trees) if keep_trees is not None else None,
        trees=str(trees) if trees is not None else None,
    )
    if trees is not None and not trees.is_dir():
        raise CliError(f"--trees {trees}: no such folder; build the trees first with --keep-trees {trees}")
    if questions is not None and questions <= 0:
        raise CliError(f"--questions must be a positive number, got {questions}")
    chosen = select_conversations(load_locomo(data), conversations)
    if sessions is not None:
        if sessions <= 0:
            raise CliError(f"--sessions must be a positive number, got {sessions}")
        chosen = [first_sessions(c, sessions) for c in chosen]
    if questions is not None:
        chosen = [replace(c, questions=c.questions[:questions]) for c in chosen]
    chosen_embedder = parse_embedder(embedder)
    if chosen_embedder is None:
        raise CliError("--embedder is empty; use local, openai or hashing")
    qa_models = _qa_models() if qa else None
    # The machine and the code as they are when the run starts.
    info = machine_info(extra_versions=("sentence_transformers", "torch", "rank_bm25", "sklearn"))
    results = run_locomo_bench(chosen, settings, embedder=chosen_embedder, progress=_progress)
    qa_table = _run_qa(results, qa_models, qa_budget) if qa_models else None
    info["embedder"] = chosen_embedder.name
    info["aggregator"] = f"{aggregator}{f' {chosen_llm}' if chosen_llm else ''} ({aggregation})"
    paths = write_locomo_report(results, chosen, settings.budgets, machine_lines(info), out, stem=name, qa=qa_table)
    for result in results:
        line = "  ".join(f"{b}: {result.recall(b):.3f}" for b in settings.budgets)
        print(f"{result.name:40s} {line}")
    print("wrote " + ", ".join(str(path) for path in paths))


def _progress(total: int, label: str) -> Any:
    from tqdm import tqdm

    bar = tqdm(total=total, desc=label, unit="step", file=sys.stderr, disable=not sys.stderr.isatty())
    return bar.update


def _qa_models() -> Any:
    from memtree_bench.qa import qa_models_from_env

    models = qa_models_from_env()
    if models is None:
        err.print("memtree: no model configured (OPENAI_API_KEY / OPENAI_BASE_URL); skipping QA accuracy")
    return models


def _run_qa(results: Any, models: Any, budget: int) -> dict[str, Any]:
    from memtree_bench.qa import QAEvaluator, QAItem

    reader, judge = models
    evaluator = QAEvaluator(reader, judge)
    table: dict[str, Any] = {"budget": budget, "model": getattr(reader, "model", "?"), "methods": {}}
    for result in results:
        items = [QAItem(s.question, s.answer, s.contexts[budget], s.category) for s in result.scores]
        report = evaluator.evaluate(items)
        table["methods"][result.name] = {
            "overall": report.accuracy,
            "per_category": {str(c): score.accuracy for c, score in report.by_category.items()},
            "judge_failures": report.judge_failures,
            "reader_failures": report.reader_failures,
            "tokens": report.prompt_tokens + report.completion_tokens,
        }
    return table
