"""Files that are not memtree memories, given to every command and to ``MemTree.open``:
each is refused with one clear line and left byte-identical (nothing written into it,
no ``-wal``, ``-shm`` or journal left beside it).

The commands run in process (typer's runner), so the whole matrix costs seconds; the
subprocess tests in test_cli_files.py cover the real command line's exits.
"""

from __future__ import annotations

import gzip
import hashlib
import re
import sqlite3
import struct
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from memtree import HashingEmbedder, MemTree, MemTreeConfig
from memtree.cli import app

CONFIG = MemTreeConfig(theta0=0.2)
FACTS = ["Maya adopted a greyhound named Pepper.", "Leo ate ramen in Kyoto.", "Ana plays the cello on Sundays."]


def memtree_file(path: Path) -> Path:
    with MemTree.open(path, embedder=HashingEmbedder(64), config=CONFIG) as memory:
        memory.add_many([f"{fact} (note {i})" for i in range(15) for fact in FACTS])
    return path


def png(path: Path) -> Path:
    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
    chunk = b"IHDR" + header
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n" + struct.pack(">I", len(header)) + chunk + struct.pack(">I", zlib.crc32(chunk))
    )
    return path


def other_application(path: Path) -> Path:
    connection = sqlite3.connect(path)
    connection.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
    connection.execute("INSERT INTO users (name) VALUES ('ada')")
    connection.commit()
    connection.close()
    return path


def truncated(size: int) -> Callable[[Path], Path]:
    def make(path: Path) -> Path:
        memtree_file(path)
        with path.open("r+b") as file:
            file.truncate(size if size > 0 else path.stat().st_size // 2)
        return path

    return make


def written(data: bytes) -> Callable[[Path], Path]:
    def make(path: Path) -> Path:
        path.write_bytes(data)
        return path

    return make


def backup_as_db(path: Path) -> Path:
    with MemTree(embedder=HashingEmbedder(64), config=CONFIG) as memory:
        memory.add_many(FACTS)
        memory.export_jsonl(path)
    return path


def gzipped_memory(path: Path) -> Path:
    source = memtree_file(path.with_name("source.db"))
    path.write_bytes(gzip.compress(source.read_bytes(), mtime=0))
    source.unlink()
    return path


def folder(path: Path) -> Path:
    path.mkdir()
    (path / "inside.txt").write_text("a file in the folder\n", encoding="utf-8")
    return path


DAMAGED = r"is damaged|not a memtree memory"
"""A memtree file cut short: the command line calls it damaged (and names the way back);
``MemTree.open`` may find it unreadable before it finds it damaged."""

FOREIGN: dict[str, tuple[Callable[[Path], Path], str]] = {
    "a text file": (written(b"my precious notes, not a database\n" * 200), "not a memtree memory"),
    "one byte": (written(b"x"), "not a memtree memory"),
    "a PNG image": (png, "not a memtree memory"),
    "a JSON document": (written(b'{"memories": ["not", "a", "database"]}\n'), "not a memtree memory"),
    "a memtree JSONL backup": (backup_as_db, "not a memtree memory"),
    "a gzipped memtree memory": (gzipped_memory, "not a memtree memory"),
    "another application's SQLite database": (other_application, r"another application \(table users\)"),
    "a memtree memory cut in half": (truncated(0), DAMAGED),
    "a memtree memory cut inside its first page": (truncated(1000), DAMAGED),
    "a folder": (folder, "is a folder"),
}
EMPTY = "an empty (0-byte) file"
"""Refused by the commands that only read; ``add``, ``import`` and ``MemTree.open`` make
such a file a memory, as they make a new one (test_store_safety.py)."""

READ_COMMANDS = [["query", "greyhound"], ["show"], ["show", "--format", "html"], ["stats"], ["export"]]
WRITE_COMMANDS = [["add", "one more note"], ["import", "BACKUP"], ["repair"]]


def fingerprint(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` with a hash of its bytes: what "byte-identical" compares."""
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def run(*args: str) -> tuple[int, str]:
    done = CliRunner().invoke(app, [*args, "--embedder", "hashing:64"])
    return done.exit_code, done.output


@pytest.fixture
def backup(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return backup_as_db(tmp_path_factory.mktemp("backup") / "backup.jsonl")


@pytest.mark.parametrize("case", [*FOREIGN, EMPTY])
def test_every_command_refuses_a_foreign_file_and_leaves_it_byte_identical(
    tmp_path: Path, backup: Path, case: str
) -> None:
    make, reason = FOREIGN.get(case, (written(b""), "empty file, not a memtree database"))
    work = tmp_path / "work"
    work.mkdir()
    path = make(work / "memory.db")
    before = fingerprint(work)
    assert before, "the case made something to protect"
    commands = [*READ_COMMANDS, ["export", str(tmp_path / "out.jsonl")]]
    if case != EMPTY:
        commands += WRITE_COMMANDS
    for command in commands:
        args = [str(backup) if arg == "BACKUP" else arg for arg in command]
        status, output = run(*args, "--db", str(path))
        assert status == 1, (case, command, output)
        assert "memtree: error:" in output and re.search(reason, output), (case, command, output)
        assert "Traceback" not in output and "bug" not in output, (case, command, output)
        assert fingerprint(work) == before, (case, command)
    assert not (tmp_path / "out.jsonl").exists(), "a refused export writes no output"


@pytest.mark.parametrize("case", [case for case in FOREIGN if case != "a folder"])
def test_memtree_open_refuses_a_foreign_file_and_leaves_it_byte_identical(tmp_path: Path, case: str) -> None:
    make, reason = FOREIGN[case]
    path = make(tmp_path / "memory.db")
    before = fingerprint(tmp_path)
    with pytest.raises(ValueError, match=reason):
        MemTree.open(path, embedder=HashingEmbedder(64), config=CONFIG)
    assert fingerprint(tmp_path) == before


def test_memtree_open_refuses_a_folder_naming_it(tmp_path: Path) -> None:
    path = folder(tmp_path / "memories")
    before = fingerprint(tmp_path)
    with pytest.raises((ValueError, OSError), match="memories"):
        MemTree.open(path, embedder=HashingEmbedder(64), config=CONFIG)
    assert fingerprint(tmp_path) == before
