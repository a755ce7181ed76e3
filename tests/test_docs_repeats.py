"""No docs page says the same thing twice (issue 25 row 11: two pages carried a
paragraph and a whole list twice, from merges)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = sorted((Path(__file__).resolve().parents[1] / "docs").glob("*.md"))


def sentences(page: Path) -> list[str]:
    """The page's prose sentences of 80+ characters (code blocks and tables left out),
    whitespace folded."""
    prose = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.DOTALL)
    prose = "\n".join(line for line in prose.splitlines() if not line.lstrip().startswith("|"))
    parts = re.split(r"(?<=[.!?])\s+|\n\s*\n", prose)
    folded = (" ".join(part.split()) for part in parts)
    return [sentence for sentence in folded if len(sentence) >= 80]


@pytest.mark.parametrize("page", DOCS, ids=[page.name for page in DOCS])
def test_no_sentence_is_repeated_on_a_page(page: Path) -> None:
    seen: set[str] = set()
    repeated = []
    for sentence in sentences(page):
        if sentence in seen:
            repeated.append(sentence[:100])
        seen.add(sentence)
    assert not repeated, f"{page.name} repeats: {repeated}"
