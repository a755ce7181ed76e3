"""The Python examples of the README and of every page in docs/ run as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
BLOCKS = [
    (page, number, block)
    for page in PAGES
    for number, block in enumerate(re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), re.S))
]


def test_readme_has_examples() -> None:
    assert sum(1 for page, _, _ in BLOCKS if page == README) >= 3


def test_docs_pages_exist_and_are_linked_from_the_readme() -> None:
    text = README.read_text(encoding="utf-8")
    expected = {
        "engine",
        "models-and-ingestion",
        "storage-and-failure-semantics",
        "langchain",
        "llamaindex",
        "cli-and-pictures",
        "benchmarks",
        "design",
    }
    assert {page.stem for page in PAGES[1:]} == expected
    assert all(f"(docs/{name}.md)" in text for name in expected)
    assert len(text.splitlines()) <= 200  # what it is, two commands, three quickstarts, one table, links


@pytest.mark.slow
@pytest.mark.parametrize(
    ("page", "number", "block"), BLOCKS, ids=[f"{page.name}-{number + 1}" for page, number, _ in BLOCKS]
)
def test_example_runs(page: Path, number: int, block: str, capsys: pytest.CaptureFixture[str]) -> None:
    exec(compile(block, f"{page.name} example {number + 1}", "exec"), {"__name__": "__readme__"})
    out = capsys.readouterr().out
    assert out or page != README or number > 0  # the first README example shows output
    if page == README and number == 0:  # the quickstart's promise: the dog's fear is among the top 2
        assert "What is Maya's dog afraid of? -> [" in out and "Pepper is scared of bicycles." in out.splitlines()[0]


def test_ci_runs_the_readme_test_command() -> None:
    commands = re.findall(r"```bash\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    test_command = next(c.strip() for c in commands if "pytest" in c)
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert test_command in ci


def test_every_example_that_builds_an_agent_also_runs_it() -> None:
    """An agent built and never called can hide a model that cannot bind its tools."""
    agents = [
        (page, number, block, name)
        for page, number, block in BLOCKS
        for name in re.findall(r"(\w+) = create_agent\(", block)
    ]
    assert len(agents) >= 3  # the middleware example and both store examples
    for page, number, block, name in agents:
        assert re.search(rf"\b{name}\.(a?invoke|a?stream)\(", block), (
            f"{page.name} example {number + 1} never runs {name}"
        )
