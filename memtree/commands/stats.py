"""``memtree stats``: the size and shape of a memory's tree."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from memtree.commands.common import (
    DEFAULT_DB,
    DbOption,
    EmbedderOption,
    JsonOption,
    NamespaceOption,
    cli_errors,
    namespace_text,
    open_memory,
    print_json,
)
from memtree.stats import TreeStats


def shape_rows(stats: TreeStats) -> list[tuple[str, str]]:
    """The shape figures worth reading in a terminal (costs are per process, so left to --json)."""
    histogram = ", ".join(f"{depth}: {count}" for depth, count in stats.depth_histogram.items()) or "-"
    return [
        ("leaves (texts remembered)", str(stats.leaves)),
        ("summaries", str(stats.summaries)),
        ("stale summaries", f"{stats.stale}" + (" (run `memtree repair`)" if stats.stale else "")),
        ("max depth", str(stats.max_depth)),
        ("mean leaf depth", f"{stats.mean_leaf_depth:.2f}"),
        ("children per summary", f"{stats.branching:.2f}"),
        ("root children", str(stats.root_children)),
        ("largest root child", f"{stats.largest_root_share:.0%} of the leaves"),
        ("nodes per depth", histogram),
        ("θ0 (routing threshold)", f"{stats.theta0:.3f}"),
    ]


@cli_errors
def stats(
    db: DbOption = DEFAULT_DB,
    namespace: NamespaceOption = "default",
    embedder: EmbedderOption = None,
    as_json: JsonOption = False,
) -> None:
    """Size and shape of the tree: leaves, summaries, depth, branching, stale nodes, namespaces."""
    with open_memory(db, namespace, embedder) as memory:
        figures = memory.stats()
        namespaces = [namespace_text(key) for key in memory.namespaces()]
        name = namespace_text(memory.namespace)
        model = memory.embedder.name
    if as_json:
        data: dict[str, Any] = {"db": db, "namespace": name, "namespaces": namespaces, "embedder": model}
        data.update(figures.as_dict())
        print_json(data)
        return
    table = Table(title=escape(f"{db} [{name}]"), show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    for label, value in shape_rows(figures):
        table.add_row(label, value)
    table.add_row("namespaces in this database", ", ".join(namespaces) or "-")
    Console(highlight=False).print(table)
