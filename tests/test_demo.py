"""``memtree demo`` runs offline in a subprocess and prints the tree and what it retrieves."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from memtree.demo import load_demo_conversation


def test_demo_conversation_is_about_sixty_dated_turns() -> None:
    turns, questions = load_demo_conversation()
    assert 55 <= len(turns) <= 75 and len(questions) == 3
    assert len({turn.session for turn in turns}) >= 5
    assert all(turn.timestamp.startswith("2024-") for turn in turns)


@pytest.mark.slow
def test_demo_runs_offline_and_answers(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI")}
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        NO_PROXY="*",
        HTTP_PROXY="http://127.0.0.1:9",
        HTTPS_PROXY="http://127.0.0.1:9",
    )
    done = subprocess.run(
        [sys.executable, "-m", "memtree", "demo", "--html", str(tmp_path / "demo.html")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "Remembering 69 turns from 6 sessions" in out
    assert out.count("[summary of ") >= 2  # the indented tree
    assert "θ0" not in out and not re.search(r"\[d\d", out)  # no internal jargon
    summaries = [line for line in out.splitlines() if "[summary of " in line]
    assert all(" · " not in line for line in summaries)  # labels read as phrases, not "a, b, c" keyword fields
    assert any(re.search(r"\] (Leo|Maya)( and (Leo|Maya))?, \d+ \w+ 2024", line) for line in summaries)
    assert "it does not write an answer" in out  # says plainly what it shows
    q1, q2, q3 = out.split("\nQ: ")[1:]
    assert "A rescue greyhound called Pepper." in q1 and "She is scared of bicycles" in q1
    assert "Did everything go smoothly?" not in q1 and "What kind of ramen?" not in q1  # no filler as answers
    assert "best ramen of my life" in q2 and "chicken broth with yuzu" in q2 and "Pepper" not in q2
    assert "I hurt my left knee" in q3
    assert "Traceback" not in done.stderr
    page = (tmp_path / "demo.html").read_text(encoding="utf-8")
    data = json.loads(re.search(r'id="memtree-data">(.*?)</script>', page, re.S).group(1))  # type: ignore[union-attr]
    assert len(data["queries"]) == 3 and all(query["hits"] for query in data["queries"])
    assert data["stats"]["leaves"] == 69
