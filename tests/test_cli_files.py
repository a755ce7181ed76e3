"""The ``memtree`` command and the files it touches, in subprocesses: memories the
user cannot write, damaged memories, inputs the user cannot read, outputs that
cannot be written, and readers that go away (``memtree export | head``).

Every refusal is one clear line, exit status 1, no traceback, and leaves the files
as they were. Permission checks run the command as ``nobody`` when the tests run as
root (root reads and writes any file), so CI sees them too.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import stat
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_runner import as_json, command_line, environment, memtree, ok, refused, unprivileged_unavailable
from tree_facts import FACTS

SIDECARS = ("-wal", "-shm", "-journal")


@functools.cache
def _no_unprivileged_user() -> str | None:
    return unprivileged_unavailable()


@pytest.fixture
def shared() -> Iterator[Path]:
    """A folder the unprivileged user can reach (pytest's temporary folders are private to their owner)."""
    reason = _no_unprivileged_user()
    if reason:
        pytest.skip(reason)
    folder = Path(tempfile.mkdtemp(prefix="memtree-cli-"))
    folder.chmod(0o755)
    try:
        yield folder
    finally:
        for path in [folder, *folder.rglob("*")]:
            if path.is_dir():
                path.chmod(0o755)
        shutil.rmtree(folder)


def listing(folder: Path) -> dict[str, bytes]:
    """Every file of ``folder`` with its bytes: what "left untouched" compares."""
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir())}


def make_memory(db: Path, *texts: str) -> None:
    ok(memtree("add", *(texts or FACTS), db=db))
    assert not any(db.with_name(db.name + suffix).exists() for suffix in SIDECARS), "closed cleanly: no WAL left"


# -- a memory the user cannot write -----------------------------------------------------


def test_a_read_only_memory_is_read_as_it_is_and_never_changed(shared: Path) -> None:
    folder = shared / "ro"
    folder.mkdir()
    db = folder / "memory.db"
    make_memory(db)
    db.chmod(0o444)
    folder.chmod(0o555)
    before = listing(folder)

    stats = as_json(memtree("stats", "--json", db=db, unprivileged=True))
    assert stats["leaves"] == len(FACTS)
    hits = as_json(memtree("query", "greyhound bicycles", "--json", "-k", "2", db=db, unprivileged=True))
    assert hits[0]["text"] == "Pepper the greyhound is scared of bicycles."
    assert "Pepper" in ok(memtree("show", db=db, unprivileged=True)).stdout
    backup = ok(memtree("export", db=db, unprivileged=True)).stdout
    assert json.loads(backup.splitlines()[0])["nodes"] == stats["nodes"] + 1

    for command in (["add", "one more"], ["repair"], ["import", "-"]):
        message = refused(memtree(*command, db=db, stdin=backup, unprivileged=True), "read-only for you")
        assert "needs write access" in message and "`memtree query`, `show`, `stats` and `export`" in message
    refused(memtree("export", folder / "b.jsonl", db=db, unprivileged=True), f"the folder {folder} is read-only")
    assert listing(folder) == before, "nothing written, not even SQLite's -wal and -shm files"


def test_reading_another_users_memory_leaves_no_files_that_would_block_its_owner(shared: Path) -> None:
    """In a folder everyone may write, a read by another user used to leave -wal and -shm
    files owned by that user, which stopped the owner from writing."""
    folder = shared / "team"
    folder.mkdir()
    folder.chmod(0o777)
    db = folder / "memory.db"
    make_memory(db)
    db.chmod(0o444)
    before = listing(folder)
    assert as_json(memtree("stats", "--json", db=db, unprivileged=True))["leaves"] == len(FACTS)
    assert listing(folder) == before
    db.chmod(0o644)
    ok(memtree("add", "The owner can still write.", db=db))
    assert as_json(memtree("stats", "--json", db=db))["leaves"] == len(FACTS) + 1


def test_a_new_memory_in_a_read_only_folder_is_refused_before_anything_is_done(shared: Path) -> None:
    folder = shared / "locked"
    folder.mkdir()
    folder.chmod(0o555)
    db = folder / "new.db"
    message = refused(memtree("add", "hello", db=db, unprivileged=True), f"cannot create {db}")
    assert f"the folder {folder} is read-only" in message and "--db" in message
    assert list(folder.iterdir()) == []


def test_a_memory_the_user_cannot_read(shared: Path) -> None:
    db = shared / "private.db"
    make_memory(db, "A private note.")
    db.chmod(0o600)
    refused(memtree("stats", db=db, unprivileged=True), f"cannot read {db}: permission denied")


# -- a damaged memory ---------------------------------------------------------------------


def damage(db: Path, offset: int, length: int) -> None:
    with db.open("r+b") as file:
        file.seek(offset)
        file.write(b"garbage!" * (length // 8))


@pytest.mark.parametrize(("where", "offset"), [("the schema page", 100), ("the data pages", 4096)])
def test_a_damaged_memory_is_named_damaged_with_the_way_back(tmp_path: Path, where: str, offset: int) -> None:
    db = tmp_path / "memory.db"
    make_memory(db)
    damage(db, offset, db.stat().st_size - offset if offset >= 4096 else 256)
    before = db.read_bytes()
    for command in (["stats"], ["query", "greyhound"], ["show"], ["export"], ["add", "one more"]):
        message = refused(memtree(*command, db=db), f"{db} is damaged", "memtree import", "memtree export")
        assert "bug" not in message and "not a memtree memory" not in message, (where, command, message)
    assert db.read_bytes() == before


def test_reading_commands_refuse_an_empty_file_and_leave_it_empty(tmp_path: Path) -> None:
    """``query``, ``show``, ``stats`` and ``export`` never write: on a 0-byte file they used
    to create memtree's tables in it (40,960 bytes). ``add`` may still make it a memory."""
    db = tmp_path / "empty.db"
    db.touch()
    for command in (["query", "greyhound"], ["show"], ["stats"], ["export"], ["export", tmp_path / "b.jsonl"]):
        message = refused(memtree(*command, db=db), f"{db}: empty file, not a memtree database")
        assert "bug" not in message, (command, message)
        assert db.stat().st_size == 0, command
        assert sorted(path.name for path in tmp_path.iterdir()) == ["empty.db"], command
    ok(memtree("add", "Maya adopted a greyhound.", db=db))
    assert as_json(memtree("stats", "--json", db=db))["leaves"] == 1


def test_repair_and_compact_refuse_an_empty_file_and_leave_it_empty(tmp_path: Path) -> None:
    """They change an existing memory; on a 0-byte file they used to make a database of it
    (compact then reported "49,152 bytes before") (issue 39 row 10)."""
    db = tmp_path / "empty.db"
    db.touch()
    for command in (["repair"], ["compact"], ["repair", "--json"], ["compact", "--json"]):
        message = refused(memtree(*command, db=db), f"{db}: empty file, not a memtree database", "memtree repair")
        assert "bug" not in message, (command, message)
        assert db.stat().st_size == 0, command
        assert sorted(path.name for path in tmp_path.iterdir()) == ["empty.db"], command


def test_check_reads_a_postgresql_memory_and_writes_nothing(postgres_dsn: str) -> None:
    """``memtree check --db postgresql://...`` used to say "no memory file at postgresql:/..."
    (its read-only path always opened SQLite) (issue 39 row 7)."""
    refused(memtree("check", db=postgres_dsn), "holds no memtree memory yet")  # and made no tables
    psycopg = pytest.importorskip("psycopg")
    with psycopg.connect(postgres_dsn) as connection:
        tables = connection.execute("SELECT count(*) FROM pg_tables WHERE tablename LIKE 'memtree_%'").fetchone()
    assert tables == (0,)
    ok(memtree("add", "Maya adopted a greyhound.", "-n", "users/maya", db=postgres_dsn))
    ok(memtree("add", "Leo plays the cello.", "-n", "users/leo", db=postgres_dsn))
    report = as_json(memtree("check", "--json", db=postgres_dsn))
    assert report["sound"] is True and sorted(report["namespaces"]) == ["users/leo", "users/maya"]
    assert "sound" in ok(memtree("check", "-n", "users/maya", db=postgres_dsn)).stdout


# -- inputs the user cannot read, and imports that fail ----------------------------------------


def test_unreadable_inputs_are_named_and_no_database_is_created(shared: Path) -> None:
    db = shared / "m.db"
    for name in ("locked.txt", "locked.jsonl"):
        locked = shared / name
        locked.write_text('{"text": "secret"}\n', encoding="utf-8")
        locked.chmod(0)
        refused(memtree("add", "--file", locked, db=db, unprivileged=True), f"{locked}: permission denied")
        message = refused(memtree("import", locked, db=db, unprivileged=True), f"{locked}: permission denied")
        assert "Errno" not in message
    assert not db.exists(), "a failed add or import must not create the database"


def test_a_failed_import_creates_no_database(tmp_path: Path) -> None:
    texts = tmp_path / "texts.jsonl"  # add's format, not a backup
    texts.write_text('{"text": "Maya adopted a greyhound."}\n', encoding="utf-8")
    db = tmp_path / "new.db"
    message = refused(memtree("import", texts, db=db), "not a memtree-jsonl backup", f"memtree add --file {texts}")
    assert not db.exists()
    latin = tmp_path / "latin1.jsonl"
    latin.write_bytes('{"text": "café"}\n'.encode("latin-1"))
    refused(memtree("import", latin, db=db), "is not UTF-8 text")
    refused(memtree("import", tmp_path, db=db), "is a folder")
    assert not db.exists() and "Errno" not in message


def backup_with_a_bad_line(source: Path, folder: Path) -> Path:
    backup = folder / "backup.jsonl"
    ok(memtree("export", backup, db=source))
    lines = backup.read_text(encoding="utf-8").splitlines()
    lines.insert(2, "{not json")
    damaged = folder / "damaged.jsonl"
    damaged.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return damaged


def test_import_speaks_the_command_lines_language(tmp_path: Path) -> None:
    source = tmp_path / "source.db"
    make_memory(source)
    damaged = backup_with_a_bad_line(source, tmp_path)
    target = tmp_path / "target.db"
    message = refused(memtree("import", damaged, db=target), "line 3", "--skip-bad")
    assert "skip_bad=True" not in message
    assert not target.exists()

    done = ok(memtree("import", damaged, "--skip-bad", db=target))
    assert "Imported" in done.stdout
    assert done.stderr.startswith(f"memtree: warning: skipped bad lines of {damaged} (--skip-bad):\n  line 3: ")
    assert "UserWarning" not in done.stderr and ".py:" not in done.stderr
    assert as_json(memtree("stats", "--json", db=target))["leaves"] == len(FACTS)

    before = target.read_bytes()
    message = refused(memtree("import", tmp_path / "backup.jsonl", db=target), "is not empty", "--namespace", "--db")
    assert "delete_namespace" not in message
    assert target.read_bytes() == before
    ok(memtree("import", tmp_path / "backup.jsonl", "--namespace", "copy", db=target))

    other = ok(memtree("import", tmp_path / "backup.jsonl", db=tmp_path / "other.db", embedder="hashing:32"))
    assert other.stderr.startswith("memtree: warning: the backup was made with HashingEmbedder(64)")
    assert "--embedder" in other.stderr and "UserWarning" not in other.stderr


def test_import_skip_bad_refuses_a_header_with_the_wrong_embedding_size(tmp_path: Path) -> None:
    """Every node line looked bad, --skip-bad skipped them all, reported success and fixed
    the namespace to the header's size: every later add failed."""
    source = tmp_path / "source.db"
    make_memory(source)
    backup = tmp_path / "backup.jsonl"
    ok(memtree("export", backup, db=source))
    lines = backup.read_text(encoding="utf-8").splitlines(keepends=True)
    header = json.loads(lines[0])
    header["dimension"] = 32  # the memory embeds with hashing:64
    edited = tmp_path / "edited.jsonl"
    edited.write_text(json.dumps(header) + "\n" + "".join(lines[1:]), encoding="utf-8")
    target = tmp_path / "target.db"
    message = refused(
        memtree("import", edited, "--skip-bad", db=target),
        f"{edited}: line 1: the header says dimension 32 but every embedding in the file holds 64 values",
        "--skip-bad cannot skip the header",
    )
    assert " skip_bad " not in message  # the command line's words, not the engine's
    assert not target.exists()
    ok(memtree("add", "A fresh memory.", db=target))


# -- outputs ------------------------------------------------------------------------------


def test_outputs_that_cannot_be_written_are_named_before_any_work(tmp_path: Path) -> None:
    db = tmp_path / "m.db"
    make_memory(db)
    missing = tmp_path / "no-such-folder"
    message = refused(memtree("export", missing / "x.jsonl", db=db), f"cannot write {missing / 'x.jsonl'}")
    assert "does not exist" in message and ".tmp" not in message
    message = refused(memtree("show", "--out", missing / "x.png", db=db), f"cannot write {missing / 'x.png'}")
    assert "does not exist" in message and "Errno" not in message
    refused(memtree("show", "--out", tmp_path, "--format", "svg", db=db), "is a folder")
    refused(memtree("demo", "--html", missing / "demo.html"), f"cannot write {missing / 'demo.html'}")
    assert not missing.exists()


def without_export_time(text: str) -> list[str]:
    lines = text.splitlines()
    return [lines[0].split('"exported_at"')[0], *lines[1:]]


def test_export_writes_through_pipes_devices_and_links_and_keeps_modes(tmp_path: Path) -> None:
    """``memtree export PATH`` acts as ``> PATH``: a named pipe is written to (not replaced by
    a file), so is a device, a symbolic link keeps pointing at its target, which gets the
    backup, and an existing file keeps its mode."""
    db = tmp_path / "m.db"
    make_memory(db)
    expected = without_export_time(ok(memtree("export", "-", db=db)).stdout)

    pipe = tmp_path / "backup.pipe"
    os.mkfifo(pipe)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(pipe.read_bytes()), daemon=True)
    reader.start()
    ok(memtree("export", pipe, db=db))
    reader.join(timeout=60)
    assert stat.S_ISFIFO(pipe.lstat().st_mode) and without_export_time(received[0].decode()) == expected

    null = tmp_path / "null"  # a private /dev/null: never aim a test that may regress at the real one
    try:
        os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except PermissionError:
        pass  # not root: the pipe above covers writing through
    else:
        ok(memtree("export", null, db=db))
        assert stat.S_ISCHR(null.lstat().st_mode)
        full = tmp_path / "full"  # a private /dev/full: every write fails with "no space left"
        os.mknod(full, 0o666 | stat.S_IFCHR, os.makedev(1, 7))
        refused(memtree("export", full, db=db), f"cannot write {full}: No space left on device")
        assert stat.S_ISCHR(full.lstat().st_mode), "a failed export must not replace the device either"

    target = tmp_path / "backups" / "latest.jsonl"
    target.parent.mkdir()
    target.write_text("old\n", encoding="utf-8")
    target.chmod(0o644)
    link = tmp_path / "link.jsonl"
    link.symlink_to(target)
    ok(memtree("export", link, db=db))
    assert link.is_symlink() and without_export_time(target.read_text(encoding="utf-8")) == expected
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert [path.name for path in target.parent.iterdir()] == ["latest.jsonl"]


def test_export_to_a_device_needs_no_writable_folder(shared: Path) -> None:
    """``/dev`` is read-only for a user, but ``/dev/null`` is writable: no temporary file
    is made beside a device, so the export is not refused."""
    db = shared / "m.db"
    make_memory(db)
    done = ok(memtree("export", os.devnull, db=db, unprivileged=True))
    assert f"to {os.devnull}" in done.stderr
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A memory whose export (≈250 kB) is bigger than a pipe holds, with a tree several levels deep."""
    folder = tmp_path_factory.mktemp("big")
    words = [
        "river",
        "mountain",
        "coffee",
        "piano",
        "violin",
        "garden",
        "greyhound",
        "bicycle",
        "train",
        "market",
        "lisbon",
        "kyoto",
    ]
    notes = folder / "notes.txt"
    lines = [" ".join(words[(i * 7 + j * 5) % len(words)] for j in range(6)) + f" (note {i})" for i in range(200)]
    notes.write_text("\n".join(lines) + "\n", encoding="utf-8")
    db = folder / "memory.db"
    ok(memtree("add", "--file", notes, "--no-progress", db=db))
    return db


def test_a_reader_that_goes_away_ends_the_command_quietly(big: Path) -> None:
    """``memtree export | head -c 100``: no "Broken pipe" error, and the status of a Unix
    tool killed by SIGPIPE (141). ``show`` writes its picture in one call, which the
    kernel may cut short without an error: then it ends with 0, quietly too."""
    for args, statuses in ((["export"], {141}), (["show", "--format", "html"], {0, 141})):
        process = subprocess.Popen(
            command_line(*args, db=big), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=environment(), bufsize=0
        )
        assert process.stdout is not None and process.stderr is not None
        first = process.stdout.read(100)  # like head -c 100: the rest of the output is never read
        process.stdout.close()
        errors = process.stderr.read().decode()
        status = process.wait(timeout=120)
        assert len(first) == 100
        assert status in statuses, (args, status, errors)
        assert "error" not in errors and "Traceback" not in errors and "Broken pipe" not in errors, errors


def test_show_counts_the_nodes_it_drew(big: Path, tmp_path: Path) -> None:
    stats = as_json(memtree("stats", "--json", db=big))
    per_depth = {int(depth): count for depth, count in stats["depth_histogram"].items()}
    assert max(per_depth) > 2, "the tree should be deeper than the picture"
    shallow = per_depth[1] + per_depth[2]
    done = ok(memtree("show", "--depth", "2", "--out", tmp_path / "d2.dot", db=big))
    assert f"picture of {shallow} of {stats['nodes']} nodes (down to depth 2)" in done.stderr
    done = ok(memtree("show", "--out", tmp_path / "all.dot", db=big))
    assert f"picture of {stats['nodes']} nodes to" in done.stderr


def test_an_empty_query_asks_for_words_to_look_for(big: Path) -> None:
    for question in ("", "   "):
        message = refused(memtree("query", question, db=big), "the query is empty", "memtree query")
        assert "remember" not in message
