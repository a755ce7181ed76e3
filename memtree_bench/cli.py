"""``memtree bench``: the benchmarks, each a sub-command writing a report to a folder.

:mod:`memtree.commands.bench` adds this app to the ``memtree`` command when the
package can be imported. The heavy imports (FAISS, matplotlib, the harnesses)
happen inside each command so ``memtree --help`` stays fast, and each command first
checks the ``bench`` extra's dependencies so a missing one is named, with the fix.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from memtree.commands.common import CliError, cli_errors
from memtree_bench.cli_locomo import locomo
from memtree_bench.cli_overview import overview
from memtree_bench.deps import require_bench_extra

bench_app = typer.Typer(
    help="Run a benchmark and write its report (Markdown, JSON, PNG) under --out.",
    no_args_is_help=True,
)

DEFAULT_OUT = "benchmarks/results"


@bench_app.command()
@cli_errors
def scale(
    sizes: str = typer.Option(
        "10000,100000,1000000", "--sizes", help="Tree sizes in nodes, comma-separated (100k and 1M work too)."
    ),
    trees: str = typer.Option(
        "/work/trees/scale", "--trees", help="Folder for the benchmark's databases (gigabytes at 1M: not in the repo)."
    ),
    queries: int = typer.Option(200, "--queries", help="Questions timed per size."),
    adds: int = typer.Option(200, "--adds", help="Single adds timed per size."),
    reopens: int = typer.Option(3, "--reopens", help="Fresh-process reopens per way (segments, rows) per size."),
    growth: int = typer.Option(
        20_000, "--growth", help="Nodes a new tree grows to by single adds, for the add-cost ratio (0: skip)."
    ),
    baseline_max: int = typer.Option(
        100_000, "--baseline-max", help="Largest size at which FAISS's IVF and HNSW are built for comparison."
    ),
    locomo: str = typer.Option(
        "", "--locomo", help="JSON of benchmarks/locomo_identical.py, for the LoCoMo row of the goals table."
    ),
    out: str = typer.Option(DEFAULT_OUT, "--out", help="Folder for scale.md, scale.json and scale.png."),
) -> None:
    """Memories of 10k to 1M nodes built, reopened (fresh processes: mapped segments against reading the rows) and
    queried (approximate against exact against FAISS brute force) through the public API, plus the cost of an add
    as the tree grows; synthetic notes with topics, no model."""
    require_bench_extra()
    from memtree_bench.report import machine_info
    from memtree_bench.scale import ScaleSettings, parse_sizes, run_scale
    from memtree_bench.scale_report import write_scale_report

    try:
        parsed_sizes = parse_sizes(sizes)
    except ValueError as error:
        raise CliError(f"--sizes: {error}") from None
    try:
        settings = ScaleSettings(
            sizes=parsed_sizes,
            trees=Path(trees),
            queries=queries,
            adds=adds,
            reopens=reopens,
            growth=growth,
            baseline_max=baseline_max,
        )
    except ValueError as error:
        raise CliError(_option_names(str(error))) from None
    check = json.loads(Path(locomo).read_text(encoding="utf-8")) if locomo else None
    info = machine_info()
    report = run_scale(settings)
    paths = write_scale_report(report, Path(out), info, check)
    for result in report.results:
        print(
            f"N={result.nodes:>9,}  hybrid p50 {result.queries['hybrid']['p50'] * 1e3:7.2f} ms "
            f"(exact {result.queries['hybrid_exact']['p50'] * 1e3:7.2f} ms, recall {result.recall['hybrid']:.3f})  "
            f"add p50 {result.adds['p50'] * 1e3:6.1f} ms"
        )
    print("Wrote " + ", ".join(str(path) for path in paths))


_OPTIONS = {"baseline_max": "--baseline-max"}


def _option_names(message: str) -> str:
    """A settings error in the words of the command line (``dimension`` -> ``--dim``)."""
    for field, option in _OPTIONS.items():
        if message.startswith(field):
            return option + message[len(field) :]
    return "--" + message


bench_app.command()(locomo)
bench_app.command()(overview)
