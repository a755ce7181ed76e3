"""The ``memtree`` command: the app, its global options and ``demo``.

The other commands live in ``memtree/commands/`` (one small module each) and are
registered below; sub-apps (``bench``, from the repository's ``memtree_bench``) are
added with ``app.add_typer``.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import typer

from memtree import viz
from memtree.commands import add, backup, check, compact, query, repair, show, stats
from memtree.commands.bench import add_bench
from memtree.commands.common import CliError, LlmOption, cli_errors, parse_llm, set_verbose
from memtree.commands.files import os_problem, output_problem
from memtree.minilm import blas_on_one_thread_for_this_process

app = typer.Typer(
    help="memtree: long-term memory for LLM applications as a dynamic tree.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def main_options(verbose: bool = typer.Option(False, "--verbose", "-v", help="Log what memtree does.")) -> None:
    level = logging.INFO if verbose else logging.WARNING
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    set_verbose(verbose)


@app.command()
@cli_errors
def demo(
    k: int = typer.Option(4, "-k", help="Results per question."),
    budget: int = typer.Option(160, "--budget", help="Token budget per answer context."),
    depth: int = typer.Option(3, "--depth", help="Deepest level of the tree to print."),
    html: str | None = typer.Option(
        None, "--html", help="Also write the tree as a page to browse, with the questions' results highlighted."
    ),
    llm: LlmOption = None,
) -> None:
    """Build a memory from a sample conversation offline, print its tree and answer three questions."""
    from memtree.demo import demo_memory, load_demo_conversation, run_demo

    problem = output_problem(html, "demo.html") if html is not None else None
    if problem:
        raise CliError(problem)
    with demo_memory(parse_llm(llm)) as memory:
        run_demo(memory, sys.stdout, k=k, token_budget=budget, max_depth=depth)
        if html is not None:
            _, questions = load_demo_conversation()
            page = viz.to_html(memory, queries=questions, k=k, expand_depth=2, title="memtree demo")
            try:
                Path(html).write_text(page, encoding="utf-8")
            except OSError as error:
                raise CliError(os_problem(html, error)) from None
            print(f"\nWrote the tree to {html}: open it in a browser.")


app.command()(add.add)
app.command()(query.query)
app.command()(show.show)
app.command()(stats.stats)
app.command()(backup.export)
app.command(name="import")(backup.import_)
app.command()(repair.repair)
app.command()(check.check)
app.command()(compact.compact)
add_bench(app)


def main() -> None:
    """Entry point of the ``memtree`` console script."""
    blas_on_one_thread_for_this_process()  # small products: extra BLAS threads only spin
    app()


if __name__ == "__main__":
    main()
