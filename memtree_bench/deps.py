"""The ``bench`` extra's dependencies, checked before a benchmark starts."""

from __future__ import annotations

import importlib.util

from memtree.commands.common import CliError

BENCH_MODULES = ("matplotlib", "tqdm", "rank_bm25", "sklearn", "threadpoolctl")
"""Modules the harness imports, as the ``bench`` extra of pyproject.toml installs them."""


def require_bench_extra() -> None:
    """Raise :class:`CliError` naming the missing modules and the extra that brings them."""
    missing = [name for name in BENCH_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        raise CliError(
            f"the benchmarks need {', '.join(missing)}, which this environment lacks; "
            'install the bench extra: pip install -e ".[bench]"'
        )
