"""``memtree bench``: the benchmarks, each a sub-command writing a report to a folder.

:mod:`memtree.commands.bench` adds this app to the ``memtree`` command when the
package can be imported. The heavy imports (FAISS, matplotlib, the harnesses)
happen inside each command so ``memtree --help`` stays fast, and each command first
checks the ``bench`` extra's dependencies so a missing one is named, with the fix.
"""

from __future__ import annotations

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
        "10000,100000,1000000", "--sizes", help="Numbers of vectors to index, comma-separated (100k and 1M work too)."
    ),
    dim: int = typer.Option(384, "--dim", help="Vector dimension (384 = all-MiniLM-L6-v2)."),
    queries: int = typer.Option(300, "--queries", help="Top-10 queries to time per size (fewer if the time runs out)."),
    inserts: int = typer.Option(300, "--inserts", help="Inserts to time per size (fewer if the time runs out)."),
    rebuilds: int = typer.Option(20, "--rebuilds", help="Full index rebuilds to time per size (at least 3)."),
    seconds: float = typer.Option(
        60.0, "--seconds", help="Time budget of each measurement per size; repetitions stop early when it is spent."
    ),
    threads: int = typer.Option(
        0, "--threads", help="FAISS and NumPy (BLAS) threads; 0 keeps their default (one per core)."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the random vectors."),
    out: str = typer.Option(DEFAULT_OUT, "--out", help="Folder for scale.md, scale.json and scale.png."),
) -> None:
    """Index upkeep per insert (vector + BM25) and collapsed top-10 query time (default hybrid and dense) versus N,
    on random unit vectors and Zipf-distributed texts (no model), against FAISS brute force and a full rebuild."""
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
            dimension=dim,
            queries=queries,
            inserts=inserts,
            rebuilds=rebuilds,
            seconds_per_measurement=seconds,
            seed=seed,
            threads=threads,
        )
    except ValueError as error:
        raise CliError(_option_names(str(error))) from None
    info = machine_info()
    report = run_scale(settings)
    paths = write_scale_report(report, Path(out), info)
    for result in report.results:
        print(
            f"N={result.n:>9,}  upkeep p50 {result.upkeep['p50'] * 1e6:8.0f} µs  "
            f"rebuild p50 {result.rebuild['p50'] * 1e3:9.2f} ms  "
            f"hybrid p50 {result.query_hybrid['p50'] * 1e3:8.2f} ms ({result.hybrid_paired_ratio:.2f}×)  "
            f"dense p50 {result.query_dense['p50'] * 1e3:8.2f} ms ({result.dense_paired_ratio:.2f}×)  "
            f"floor p50 {result.query_faiss['p50'] * 1e3:8.2f} ms"
        )
    print("Wrote " + ", ".join(str(path) for path in paths))


_OPTIONS = {"dimension": "--dim", "seconds_per_measurement": "--seconds"}


def _option_names(message: str) -> str:
    """A settings error in the words of the command line (``dimension`` -> ``--dim``)."""
    for field, option in _OPTIONS.items():
        if message.startswith(field):
            return option + message[len(field) :]
    return "--" + message


bench_app.command()(locomo)
bench_app.command()(overview)
