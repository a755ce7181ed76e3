"""What every benchmark report shares: the machine it ran on, percentiles, Markdown
tables, JSON and matplotlib figures.

A benchmark number means little without the machine, the versions and the command
that produced it, so every report starts with :func:`machine_info` rendered by
:func:`machine_lines`. The helpers know nothing about any one benchmark.
"""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
from collections.abc import Iterable, Sequence
from contextlib import suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from matplotlib.figure import Figure

REPOSITORY = Path(__file__).resolve().parents[1]


def machine_info(command: Sequence[str] | None = None, *, extra_versions: Iterable[str] = ()) -> dict[str, str]:
    """The machine, software versions, date and command line of this run.

    ``command`` defaults to this process's ``sys.argv``; ``extra_versions`` names more
    importable modules whose installed version to record (``"matplotlib"``, ``"rank_bm25"``…).
    ``memtree commit`` ends in ``-dirty`` when tracked files differ from that commit.
    """
    import faiss

    import memtree

    info = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": _command_line(command),
        "cpu": _cpu_model(),
        "cores": str(os.cpu_count() or "unknown"),
        "ram": _total_ram(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "faiss": faiss.__version__,
        "memtree": memtree.__version__,
        "memtree commit": git_commit(),
        "load": load_average(),
    }
    for name in extra_versions:
        info[name] = _version_of(name)
    return info


def load_average() -> str:
    """The 1, 5 and 15 minute load averages (the machine may be shared)."""
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        return "unknown"
    return f"{one:.2f}, {five:.2f}, {fifteen:.2f}"


def machine_lines(info: dict[str, str]) -> list[str]:
    """``info`` as a two-column Markdown table."""
    lines = ["| | |", "|---|---|"]
    lines += [f"| {key} | {_cell(value)} |" for key, value in info.items()]
    return lines


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[object]], *, numeric_from: int = 1) -> list[str]:
    """A Markdown table; columns from ``numeric_from`` on are right-aligned."""
    align = ["---" if i < numeric_from else "---:" for i in range(len(headers))]
    lines = [f"| {' | '.join(headers)} |", f"|{'|'.join(align)}|"]
    lines += [f"| {' | '.join(_cell(str(value)) for value in row)} |" for row in rows]
    return lines


def percentiles(samples: Sequence[float]) -> dict[str, float]:
    """p50, p95, mean, min and max of ``samples`` (which must not be empty)."""
    if not samples:
        raise ValueError("percentiles of no samples")
    values = np.asarray(samples, dtype=np.float64)
    return {
        "p50": float(np.percentile(values, 50)),
        "p95": float(np.percentile(values, 95)),
        "mean": float(values.mean()),
        "min": float(values.min()),
        "max": float(values.max()),
        "count": len(values),
    }


def write_json(path: Path, data: Any) -> None:
    """``data`` as indented UTF-8 JSON."""
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def write_markdown(path: Path, lines: Iterable[str]) -> None:
    path.write_text("\n".join(lines).rstrip("\n") + "\n", encoding="utf-8")


def new_figure(columns: int = 1, *, width: float = 5.5, height: float = 4.2) -> tuple[Figure, list[Any]]:
    """A figure with ``columns`` side-by-side axes, drawn off-screen (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, columns, figsize=(width * columns, height), squeeze=False)
    return figure, list(axes[0])


def save_figure(figure: Figure, path: Path) -> None:
    import matplotlib.pyplot as plt

    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def _command_line(command: Sequence[str] | None) -> str:
    if command is not None:
        return " ".join(command)
    program = Path(sys.argv[0]).name
    if program == "__main__.py":  # python -m memtree
        program = "memtree"
    return " ".join([program, *sys.argv[1:]])


def _cpu_model() -> str:
    with suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _total_ram() -> str:
    with suppress(OSError, ValueError), open("/proc/meminfo", encoding="utf-8") as meminfo:
        for line in meminfo:
            if line.startswith("MemTotal:"):
                return f"{int(line.split()[1]) / 1024**2:.1f} GiB"
    return "unknown"


def git_commit() -> str:
    """The checkout's short commit, ``-dirty`` when tracked files differ from it."""

    def git(*arguments: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["git", "-C", str(REPOSITORY), *arguments], capture_output=True, text=True, timeout=10, check=False
        )

    with suppress(OSError, subprocess.SubprocessError):
        done = git("rev-parse", "--short", "HEAD")
        if done.returncode == 0:
            dirty = git("status", "--porcelain", "--untracked-files=no").stdout.strip()
            return done.stdout.strip() + ("-dirty" if dirty else "")
    return "unknown"


def _version_of(name: str) -> str:
    """The installed version of the package that provides module ``name``, from its
    distribution's metadata (``rank_bm25`` has no ``__version__``; ``sklearn`` is
    installed as ``scikit-learn``), else the module's ``__version__``."""
    for distribution in importlib.metadata.packages_distributions().get(name, [name]):
        with suppress(importlib.metadata.PackageNotFoundError):
            return importlib.metadata.version(distribution)
    try:
        module = __import__(name)
    except ImportError:
        return "not installed"
    return str(getattr(module, "__version__", "unknown"))


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")
