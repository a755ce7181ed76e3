"""``memtree repair``: rewrite stale summaries, then check the tree's invariants."""

from __future__ import annotations

import typer

from memtree.commands.common import (
    DEFAULT_DB,
    CliError,
    DbOption,
    EmbedderOption,
    JsonOption,
    LlmOption,
    NamespaceOption,
    cli_errors,
    open_memory,
    print_json,
)


@cli_errors
def repair(
    db: DbOption = DEFAULT_DB,
    namespace: NamespaceOption = "default",
    embedder: EmbedderOption = None,
    llm: LlmOption = None,
    as_json: JsonOption = False,
) -> None:
    """Rewrite the summaries a failed model call left stale, then check the tree.

    Exits with status 1 if summaries are still stale (the model failed again) or the
    tree breaks an invariant (each problem is listed).
    """
    with open_memory(db, namespace, embedder, writes=True, llm=llm) as memory:
        fixed = memory.repair()
        still_stale = memory.stats().stale
        problems = memory.check_integrity()
    if as_json:
        print_json({"repaired": fixed, "still_stale": still_stale, "problems": problems})
        if still_stale or problems:
            raise typer.Exit(1)
        return
    typer.echo(f"Repaired {fixed} stale summar{'y' if fixed == 1 else 'ies'}.")
    if still_stale:
        typer.echo(f"{still_stale} summaries are still stale: the model failed again; check it and retry.")
    if problems:
        listing = "\n".join(f"  - {problem}" for problem in problems)
        raise CliError(f"the tree breaks {len(problems)} invariant(s):\n{listing}")
    if still_stale:
        raise typer.Exit(1)
    typer.echo("The tree is sound.")
