"""``memtree bench overview``: overviews, time spans and aggregates, scored on LoCoMo's annotations."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from memtree.commands.common import CliError, cli_errors
from memtree_bench.deps import require_bench_extra


@cli_errors
def overview(
    data: Annotated[
        Path, typer.Option("--data", help="A file in LoCoMo's schema with its annotations (locomo10.json: CC BY-NC).")
    ],
    trees: Annotated[
        Path,
        typer.Option(
            "--trees",
            help="Folder of extractive trees (memtree bench locomo --keep-trees format); missing ones are built "
            "into it. Keep it out of the repository (derived from the data).",
        ),
    ],
    model_trees: Annotated[
        Path | None,
        typer.Option("--model-trees", help="Folder of model-written trees to read too (never built here)."),
    ] = None,
    model_name: Annotated[
        str,
        typer.Option("--model", help="The model in the model-written trees' recipe, as --llm named it (file name)."),
    ] = "llama-cpp:qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    conversations: Annotated[
        str, typer.Option("--conversations", help="Which conversations: all, 0-9, 0,3,5 or 2.")
    ] = "all",
    tuning: Annotated[
        str,
        typer.Option("--tuning", help="The conversations the defaults were tuned on (reported apart): 0-4, or none."),
    ] = "0-4",
    budgets: Annotated[str, typer.Option("--budgets", help="Word budgets, comma separated.")] = "250,500,1000,2000",
    raptor: Annotated[
        bool,
        typer.Option("--raptor/--no-raptor", help="Include the RAPTOR-style row (builds a tree per conversation)."),
    ] = True,
    model_only: Annotated[
        bool, typer.Option("--model-only", help="Score only the model-written trees (with --model-trees).")
    ] = False,
    embedder: Annotated[
        str, typer.Option("--embedder", help="local, or hashing (not semantic; for smoke runs).")
    ] = "local",
    out: Annotated[Path, typer.Option("--out", help="Directory for the report.")] = Path("benchmarks/results"),
    name: Annotated[str, typer.Option("--name", help="File stem of the report.")] = "overview",
) -> None:
    """Fact coverage and evidence recall of person overviews, day and month recaps and LoCoMo's multi-hop
    questions, for memtree's overview and retrieve against flat hybrid (with a time filter, with MMR), a
    RAPTOR-style tree and a random sample of the asked turns; writes Markdown and JSON."""
    require_bench_extra()
    from memtree_bench.cli_locomo import _budgets
    from memtree_bench.locomo import read_locomo
    from memtree_bench.locomo_bench import make_embedder
    from memtree_bench.methods import CachedEmbedder
    from memtree_bench.overview_bench import OverviewSettings, run_overview
    from memtree_bench.overview_methods import Raptor, default_rows
    from memtree_bench.overview_report import write_overview_report
    from memtree_bench.report import machine_info, machine_lines

    raw = read_locomo(data)
    chosen = _indices(conversations, len(raw), "--conversations")
    tuned = frozenset() if tuning.strip().lower() == "none" else frozenset(_indices(tuning, len(raw), "--tuning"))
    if model_trees is not None and not model_trees.is_dir():
        raise CliError(f"--model-trees {model_trees}: no such folder")
    settings = OverviewSettings(
        budgets=_budgets(budgets),
        trees=str(trees),
        model_trees=str(model_trees) if model_trees is not None else None,
        model=model_name,
        tuning=tuned,
        extractive=not model_only,
    )
    if model_only and model_trees is None:
        raise CliError("--model-only scores the model-written trees: name their folder with --model-trees")
    info = machine_info(extra_versions=("dateparser", "nltk", "sklearn"))
    if embedder not in ("local", "hashing"):
        raise CliError(f"--embedder must be local or hashing, got {embedder!r}")
    model = CachedEmbedder(make_embedder(embedder))
    rows = [row for row in default_rows() if raptor or not isinstance(row, Raptor)]
    run = run_overview([(i, raw[i]) for i in chosen], settings, model, rows, progress=_say)
    info["embedder"] = model.name
    paths = write_overview_report(run, machine_lines(info), out, stem=name)
    print("wrote " + ", ".join(str(path) for path in paths))


def _indices(spec: str, total: int, option: str) -> list[int]:
    """``all``, ``0-9``, ``0,3,5`` or ``2``: indices into the file."""
    if spec.strip().lower() == "all":
        return list(range(total))
    chosen: list[int] = []
    try:
        for part in (p.strip() for p in spec.split(",") if p.strip()):
            low, _, high = part.partition("-")
            chosen.extend(range(int(low), int(high or low) + 1))
    except ValueError:
        raise CliError(f"{option} {spec!r}: use e.g. 0-9 or 0,3,5") from None
    wrong = [index for index in chosen if not 0 <= index < total]
    if not chosen or wrong:
        raise CliError(f"{option} {spec!r}: the file has conversations 0-{total - 1}")
    return list(dict.fromkeys(chosen))


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
