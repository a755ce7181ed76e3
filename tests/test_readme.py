"""The README's Python examples run as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)


def test_readme_has_examples() -> None:
    assert len(BLOCKS) >= 2


@pytest.mark.slow
@pytest.mark.parametrize("number", range(len(BLOCKS)))
def test_readme_example_runs(number: int, capsys: pytest.CaptureFixture[str]) -> None:
    exec(compile(BLOCKS[number], f"README.md example {number + 1}", "exec"), {"__name__": "__readme__"})
    assert capsys.readouterr().out or number > 0


def test_ci_runs_the_readme_test_command() -> None:
    commands = re.findall(r"```bash\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    test_command = next(c.strip() for c in commands if "pytest" in c)
    ci = (README.parent / ".ci" / "run").read_text(encoding="utf-8")
    assert test_command in ci


def test_every_example_that_builds_an_agent_also_runs_it() -> None:
    """An agent built and never called can hide a model that cannot bind its tools."""
    agents = [
        (number, name) for number, block in enumerate(BLOCKS) for name in re.findall(r"(\w+) = create_agent\(", block)
    ]
    assert len(agents) >= 3  # the middleware example and both store examples
    for number, name in agents:
        assert re.search(rf"\b{name}\.(a?invoke|a?stream)\(", BLOCKS[number]), (
            f"README example {number + 1} never runs {name}"
        )
