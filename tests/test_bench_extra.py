"""`memtree bench` without the harness or its dependencies says what to install."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from memtree.commands.common import CliError
from memtree_bench import deps

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_bench_without_the_harness_names_the_install(tmp_path: Path) -> None:
    """An install of the library alone (the wheel: memtree/ without memtree_bench/)."""
    shutil.copytree(ROOT / "memtree", tmp_path / "memtree", ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "HF_HUB_OFFLINE": "1"}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "memtree", *args]
        return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)

    done = run("bench", "scale", "--sizes", "1000")
    assert done.returncode == 1
    message = " ".join(done.stderr.split())
    assert "memtree: error: memtree bench: the benchmarks ship with the memtree repository" in message
    assert 'pip install -e ".[bench]"' in message
    assert "Traceback" not in done.stderr
    listed = run("--help")
    assert listed.returncode == 0 and "bench" in listed.stdout


def test_a_missing_bench_dependency_is_named_with_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(deps, "BENCH_MODULES", ("tqdm", "memtree_no_such_module"))
    with pytest.raises(CliError) as raised:
        deps.require_bench_extra()
    assert str(raised.value) == (
        "the benchmarks need memtree_no_such_module, which this environment lacks; "
        'install the bench extra: pip install -e ".[bench]"'
    )
    monkeypatch.setattr(deps, "BENCH_MODULES", ("tqdm",))
    deps.require_bench_extra()  # present: nothing raised


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs git and a checkout")
def test_reports_record_the_checkouts_commit() -> None:
    """Every committed result names the commit that produced it; the harness looks for
    the repository beside memtree_bench/, where a checkout keeps it."""
    from memtree_bench.report import machine_info

    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    recorded = machine_info(["test"])["memtree commit"]
    assert recorded.removesuffix("-dirty") == head
