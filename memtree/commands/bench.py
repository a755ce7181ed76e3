"""``memtree bench``: finds the benchmark harness, or says how to get it.

The harness (:mod:`memtree_bench`: LoCoMo, RAPTOR baseline, QA, scale) is not part
of the memtree-llm wheel, so a user's install carries no evaluation code. It lives
beside ``memtree/`` in the repository and runs from a checkout installed with the
``bench`` extra (``pip install -e ".[bench]"``), which brings its dependencies.
An editable install maps only the wheel's packages, so the checkout's root is put
on ``sys.path`` (at the end, shadowing nothing) when the harness is found there.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import typer

from memtree.commands.common import fail

BENCH_INSTALL = (
    "the benchmarks ship with the memtree repository, not the memtree-llm wheel: "
    'clone it and run `pip install -e ".[bench]"` in the checkout'
)


def _harness_on_path() -> bool:
    """Whether ``memtree_bench`` can be imported, after looking beside this package."""
    if importlib.util.find_spec("memtree_bench") is not None:
        return True
    root = Path(__file__).resolve().parents[2]
    if (root / "memtree_bench" / "__init__.py").is_file():
        sys.path.append(str(root))
        return importlib.util.find_spec("memtree_bench") is not None
    return False


def add_bench(app: typer.Typer) -> None:
    """Add ``bench`` to the ``memtree`` app: the harness's sub-app, or, without the
    harness, a command that takes any arguments and names the install."""
    if _harness_on_path():
        from memtree_bench.cli import bench_app

        app.add_typer(bench_app, name="bench")
        return

    @app.command(
        name="bench",
        help="Run a benchmark (needs the repository's memtree_bench package).",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )
    def unavailable() -> None:
        raise fail(f"memtree bench: {BENCH_INSTALL}")
