"""``memtree check``: report what is wrong in a memory, changing nothing."""

from __future__ import annotations

from typing import Any

import typer

from memtree.commands.common import (
    DEFAULT_DB,
    CliError,
    DbOption,
    EmbedderOption,
    JsonOption,
    cli_errors,
    namespace_text,
    open_memory,
    parse_namespace,
    print_json,
)

OnlyNamespaceOption = typer.Option(
    None, "--namespace", "-n", help="Check only this tree (`users/alice`); default: every namespace in the database."
)


@cli_errors
def check(
    db: DbOption = DEFAULT_DB,
    namespace: str | None = OnlyNamespaceOption,
    embedder: EmbedderOption = None,
    as_json: JsonOption = False,
) -> None:
    """Check every tree without changing anything (a SQLite file is opened read-only).

    Reports each broken invariant of a tree and its index, each source whose leaves
    differ from the record that wrote them (a LangGraph store item and its leaves),
    and stale summaries. Exits with status 1 if anything is broken; `memtree repair`
    fixes what it reports.
    """
    first = "default" if namespace is None else namespace
    report: dict[str, dict[str, Any]] = {}
    with open_memory(db, first, embedder, read_only=True) as memory:
        keys = [parse_namespace(namespace)] if namespace is not None else memory.namespaces()
        for key in keys:
            tree = memory.sibling(key)
            report[namespace_text(key)] = {"problems": tree.check_integrity(), "stale": tree.stats().stale}
    broken = {name: found["problems"] for name, found in report.items() if found["problems"]}
    if as_json:
        print_json({"db": db, "namespaces": report, "sound": not broken})
        if broken:
            raise typer.Exit(1)
        return
    for name, found in report.items():
        stale = found["stale"]
        note = f"; {stale} stale summar{'y' if stale == 1 else 'ies'} (`memtree repair` rewrites them)" if stale else ""
        verdict = f"{len(found['problems'])} problem(s)" if found["problems"] else "sound"
        typer.echo(f"{name}: {verdict}{note}")
    if broken:
        listing = "\n".join(f"  - {name}: {problem}" for name, problems in broken.items() for problem in problems)
        count = sum(len(problems) for problems in broken.values())
        raise CliError(f"{count} problem(s) in {len(broken)} namespace(s); `memtree repair` fixes them:\n{listing}")
    if not report:
        typer.echo(f"{db} holds no namespace yet.")
