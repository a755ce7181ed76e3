"""``memtree demo`` runs offline in a subprocess and prints the tree and answers."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from memtree.demo import load_demo_conversation


def test_demo_conversation_is_about_sixty_dated_turns() -> None:
    turns, questions = load_demo_conversation()
    assert 55 <= len(turns) <= 75 and len(questions) == 3
    assert len({turn.session for turn in turns}) >= 5
    assert all(turn.timestamp.startswith("2024-") for turn in turns)


@pytest.mark.slow
def test_demo_runs_offline_and_answers() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI")}
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        NO_PROXY="*",
        HTTP_PROXY="http://127.0.0.1:9",
        HTTPS_PROXY="http://127.0.0.1:9",
    )
    done = subprocess.run(
        [sys.executable, "-m", "memtree", "demo"], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "Remembering 69 turns from 6 sessions" in out
    assert out.count("[d1 ·") >= 2 and "leaves]" in out  # the indented tree
    q1, q2, q3 = out.split("\nQ: ")[1:]
    assert "Pepper" in q1 and "bicycles" in q1
    assert "ramen" in q2
    assert "knee" in q3
    assert "Traceback" not in done.stderr
