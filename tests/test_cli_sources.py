"""Reading items from text and JSONL files for ``memtree add --file``."""

from __future__ import annotations

from pathlib import Path

import pytest

from memtree.commands.sources import InputFileError, read_items


def write(tmp_path: Path, name: str, data: bytes) -> str:
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


def test_lines_skip_blank_lines_and_strip_a_bom_and_crlf(tmp_path: Path) -> None:
    path = write(tmp_path, "notes.txt", "\ufeffone\r\n\r\n  two  \r\nthree".encode())
    found = read_items(path, metadata={"from": "notes"}, timestamp="2024-01-02")
    assert [item.text for item in found.items] == ["one", "two", "three"]
    assert all(item.metadata == {"from": "notes"} and item.timestamp is not None for item in found.items)


def test_paragraphs_keep_their_lines_and_report_their_first_line(tmp_path: Path) -> None:
    path = write(tmp_path, "essay.txt", b"a1\na2\n\n\nb1\x00\n\nc1\n")
    found = read_items(path, "paragraphs")
    assert [item.text for item in found.items] == ["a1\na2", "c1"]
    assert [(problem.line, "NUL" in problem.message) for problem in found.problems] == [(5, True)]


def test_jsonl_line_values_override_the_defaults(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "turns.jsonl",
        b'{"text": "x", "metadata": {"who": "Leo"}, "timestamp": 5}\n{"text": "y", "source_id": "m2"}\n',
    )
    first, second = read_items(path, metadata={"who": "?", "batch": 1}, timestamp="2024-01-01").items
    assert first.metadata == {"who": "Leo", "batch": 1} and first.timestamp == 5.0
    assert second.metadata == {"who": "?", "batch": 1} and second.source_id == "m2"


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (b'"just a string"', "got a string"),
        (b"42", "got a number"),
        (b"null", "got null"),
        (b'{"text": 3}', "text must be a str"),
        (b'{"text": "x", "metadata": "no"}', '"metadata" must be a JSON object'),
        (b'{"text": "x", "source_id": 7}', "source_id must be a str"),
        (b'{"text": "x", "timestamp": "soon"}', "not an ISO 8601"),
    ],
)
def test_each_bad_jsonl_line_is_named(tmp_path: Path, line: bytes, message: str) -> None:
    found = read_items(write(tmp_path, "x.jsonl", b'{"text": "fine"}\n' + line + b"\n"))
    assert len(found.items) == 1
    (problem,) = found.problems
    assert problem.line == 2 and message in problem.message


def test_unreadable_inputs(tmp_path: Path) -> None:
    with pytest.raises(InputFileError, match="no such file"):
        read_items(str(tmp_path / "missing.txt"))
    with pytest.raises(InputFileError, match="holds nothing"):
        read_items(write(tmp_path, "blank.jsonl", b"\n  \n"))
    with pytest.raises(ValueError, match="unknown file format"):
        read_items(write(tmp_path, "a.txt", b"a"), "csv")  # type: ignore[arg-type]
