"""Run the ``memtree`` command in a subprocess, as a user would."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

FAST_EMBEDDER = "hashing:64"
"""Instant, deterministic embeddings for CLI tests (word overlap, not meaning)."""


UNPRIVILEGED = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
"""Run as ``nobody`` (uid 65534): root reads and writes any file, so permission
problems are only seen by an unprivileged user (CI runs the tests as root)."""


def environment(embedder: str | None = FAST_EMBEDDER, env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a ``memtree`` subprocess: a wide terminal, no colours, no user settings."""
    environment = {key: value for key, value in os.environ.items() if not key.startswith(("MEMTREE_", "OPENAI"))}
    environment.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", COLUMNS="200", NO_COLOR="1", TERM="dumb")
    if embedder is not None:
        environment["MEMTREE_EMBEDDER"] = embedder
    environment.update(env or {})
    return environment


def command_line(*args: str | Path, db: Path | None = None, unprivileged: bool = False) -> list[str]:
    """``python -m memtree ARGS [--db DB]``, run as ``nobody`` when ``unprivileged`` and root."""
    command = [sys.executable, "-m", "memtree", *map(str, args)]
    if db is not None:
        command += ["--db", str(db)]
    if unprivileged and os.geteuid() == 0:
        command = UNPRIVILEGED + command
    return command


def unprivileged_unavailable() -> str | None:
    """Why commands cannot be run as an unprivileged user here (``None``: they can)."""
    if os.geteuid() != 0:
        return None  # already unprivileged
    if shutil.which("setpriv") is None:
        return "running as root and setpriv (util-linux) is not installed: cannot test as an unprivileged user"
    probe = subprocess.run(
        [*UNPRIVILEGED, sys.executable, "-c", "import memtree.cli"],
        capture_output=True,
        env=environment(),
        timeout=120,
        check=False,
    )
    if probe.returncode != 0:
        return f"python cannot run as uid 65534 here: {probe.stderr.decode(errors='replace').strip()[-300:]}"
    return None


def memtree(
    *args: str | Path,
    db: Path | None = None,
    stdin: str | bytes | None = None,
    embedder: str | None = FAST_EMBEDDER,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    unprivileged: bool = False,
) -> subprocess.CompletedProcess[str]:
    """``python -m memtree ARGS [--db DB]`` with a wide terminal and no colours
    (as ``nobody`` when ``unprivileged`` and the tests run as root)."""
    command = command_line(*args, db=db, unprivileged=unprivileged)
    data = stdin.encode() if isinstance(stdin, str) else stdin
    done = subprocess.run(
        command, input=data, capture_output=True, env=environment(embedder, env), cwd=cwd, timeout=300, check=False
    )
    return subprocess.CompletedProcess(
        done.args, done.returncode, done.stdout.decode("utf-8", "replace"), done.stderr.decode("utf-8", "replace")
    )


def ok(done: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    """``done`` after checking it succeeded without a traceback."""
    assert done.returncode == 0, f"exit {done.returncode}\nstdout: {done.stdout}\nstderr: {done.stderr}"
    assert "Traceback" not in done.stderr
    return done


def refused(done: subprocess.CompletedProcess[str], *fragments: str) -> str:
    """The error line of a command that must fail cleanly (exit 1, no traceback)."""
    assert done.returncode == 1, f"exit {done.returncode}\nstdout: {done.stdout}\nstderr: {done.stderr}"
    assert "Traceback" not in done.stderr and "Traceback" not in done.stdout
    assert "memtree: error:" in done.stderr
    for fragment in fragments:
        assert fragment in done.stderr, f"{fragment!r} not in {done.stderr!r}"
    return done.stderr


def as_json(done: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(ok(done).stdout)
