"""Texts to remember, read from a file: plain text (one item per line or per
paragraph) or JSONL (one ``{"text": ..., "timestamp": ..., "metadata": ...}`` per line).

Everything is read and checked before anything is stored, so a bad file stores
nothing: every bad line is reported with its number, and the caller decides
whether to stop (the default) or to skip those lines (``--skip-bad``).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from memtree.inputs import Item, make_item

FileFormat = Literal["auto", "lines", "paragraphs", "jsonl"]
FILE_FORMATS: tuple[str, ...] = ("auto", "lines", "paragraphs", "jsonl")
JSONL_SUFFIXES = (".jsonl", ".ndjson")
JSONL_FIELDS = ("text", "timestamp", "metadata", "source_id")


class InputFileError(ValueError):
    """A file cannot be read as items: missing, unreadable, not UTF-8, or empty."""


@dataclass(frozen=True)
class LineProblem:
    """Why the item starting on ``line`` cannot be stored."""

    line: int
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


@dataclass
class ReadItems:
    """The items a file holds, and the problems of the lines that are not items."""

    items: list[Item] = field(default_factory=list)
    problems: list[LineProblem] = field(default_factory=list)


def cannot_read(name: str, error: OSError, wanted: str = "a text or JSONL file") -> InputFileError:
    """Why the input file ``name`` could not be opened, in words (``wanted``: what to give instead of a folder)."""
    if isinstance(error, FileNotFoundError):
        return InputFileError(f"{name}: no such file")
    if isinstance(error, IsADirectoryError):
        return InputFileError(f"{name} is a folder; give the path of {wanted}")
    if isinstance(error, PermissionError):
        return InputFileError(f"{name}: permission denied; check the file's permissions (ls -l {name})")
    return InputFileError(f"{name}: cannot be read ({error.strerror or error})")


def not_utf8(name: str, data: bytes, error: UnicodeDecodeError) -> InputFileError:
    """``name`` holds bytes that are not UTF-8 (``data``: the file's bytes)."""
    return InputFileError(
        f"{name} is not UTF-8 text (byte 0x{data[error.start]:02x} at offset {error.start}); "
        "convert it, e.g. with iconv -t UTF-8"
    )


def read_text_file(path: str) -> str:
    """The text of ``path`` (``-`` is standard input), decoded as UTF-8 (a BOM is dropped)."""
    name = "standard input" if path == "-" else path
    try:
        data = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    except OSError as error:
        raise cannot_read(name, error) from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise not_utf8(name, data, error) from None


def resolve_format(path: str, file_format: FileFormat) -> FileFormat:
    """``auto`` is ``jsonl`` for ``.jsonl`` / ``.ndjson`` files and ``lines`` otherwise."""
    if file_format not in FILE_FORMATS:
        raise ValueError(f"unknown file format {file_format!r}; choose one of {', '.join(FILE_FORMATS)}")
    if file_format != "auto":
        return file_format
    return "jsonl" if path.lower().endswith(JSONL_SUFFIXES) else "lines"


def read_items(
    path: str,
    file_format: FileFormat = "auto",
    *,
    metadata: Mapping[str, Any] | None = None,
    timestamp: str | None = None,
) -> ReadItems:
    """Read and check every item of a file.

    ``metadata`` and ``timestamp`` apply to every item; a JSONL line's own
    ``metadata`` keys and ``timestamp`` take precedence over them.
    Raises :class:`InputFileError` when the file cannot be read or holds no item.
    """
    chosen = resolve_format(path, file_format)
    text = read_text_file(path)
    out = ReadItems()
    units = _jsonl_records(text) if chosen == "jsonl" else _text_units(text, chosen == "paragraphs")
    for line, record in units:
        try:
            if isinstance(record, LineProblem):
                raise ValueError(record.message)
            merged = {**(metadata or {}), **(record.get("metadata") or {})}
            when = record.get("timestamp", timestamp)
            out.items.append(make_item(record["text"], merged, when, record.get("source_id")))
        except (TypeError, ValueError) as error:
            out.problems.append(LineProblem(line, str(error)))
    if not out.items and not out.problems:
        name = "standard input" if path == "-" else path
        raise InputFileError(f"{name} holds nothing to remember (it is empty or only blank lines)")
    return out


def _text_units(text: str, paragraphs: bool) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(first line number, {"text": ...})`` per non-blank line or per paragraph."""
    lines = text.splitlines()
    if not paragraphs:
        for number, line in enumerate(lines, start=1):
            if line.strip():
                yield number, {"text": line.strip()}
        return
    block: list[str] = []
    start = 0
    for number, line in enumerate([*lines, ""], start=1):
        if line.strip():
            if not block:
                start = number
            block.append(line.rstrip())
        elif block:
            yield start, {"text": "\n".join(block).strip()}
            block = []


def _jsonl_records(text: str) -> Iterator[tuple[int, dict[str, Any] | LineProblem]]:
    """``(line number, record or problem)`` per non-blank JSONL line."""
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            yield number, LineProblem(number, f"not valid JSON: {error.msg} (column {error.colno})")
            continue
        if not isinstance(record, dict):
            yield number, LineProblem(number, f'expected a JSON object with a "text" field, got {_json_kind(record)}')
            continue
        unknown = sorted(set(record) - set(JSONL_FIELDS))
        if unknown:
            names = ", ".join(f'"{name}"' for name in unknown)
            yield number, LineProblem(number, f"unknown field {names}; the fields are {', '.join(JSONL_FIELDS)}")
            continue
        if "text" not in record:
            yield number, LineProblem(number, 'no "text" field')
            continue
        if record.get("metadata") is not None and not isinstance(record["metadata"], dict):
            yield number, LineProblem(number, f'"metadata" must be a JSON object, got {json.dumps(record["metadata"])}')
            continue
        yield number, record


def _json_kind(value: object) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, (int, float)):
        return "a number"
    return "null"
