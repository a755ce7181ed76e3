"""``memtree compact``: drop the dead rows deletes and updates leave, and shrink the file."""

from __future__ import annotations

import typer

from memtree.commands.common import DEFAULT_DB, DbOption, JsonOption, cli_errors, open_memory, print_json


@cli_errors
def compact(db: DbOption = DEFAULT_DB, as_json: JsonOption = False) -> None:
    """Drop the tombstones of deleted nodes in every namespace and give their space
    back (SQLite: VACUUM; PostgreSQL: VACUUM). Safe while other processes use the
    memory: they reload a compacted namespace on their next read.
    """
    with open_memory(db, "default", None, writes=True) as memory:  # compaction embeds nothing
        report = memory.compact()
    if as_json:
        print_json(
            {
                "rows_dropped": report.rows_dropped,
                "namespaces": report.namespaces,
                "bytes_before": report.bytes_before,
                "bytes_after": report.bytes_after,
            }
        )
        return
    typer.echo(f"Dropped {report.rows_dropped} dead rows in {report.namespaces} namespace(s).")
    if report.bytes_before is not None and report.bytes_after is not None:
        typer.echo(f"Size on disk: {_size(report.bytes_before)} before, {_size(report.bytes_after)} after.")


def _size(count: int) -> str:
    return f"{count / 1e6:.1f} MB" if count >= 100_000 else f"{count:,} bytes"
