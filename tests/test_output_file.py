"""``export_jsonl(PATH)`` writes as ``> PATH`` would: through to pipes and devices, through
symbolic links, keeping an existing file's mode and giving a new one the umask's, and
never leaving half a backup in a regular file."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from memtree import HashingEmbedder, MemTree
from memtree.output_file import write_output


@pytest.fixture
def memory() -> Iterator[MemTree]:
    with MemTree(embedder=HashingEmbedder(32)) as tree:
        tree.add_many(["Maya adopted a greyhound named Pepper.", "Leo ate ramen in Kyoto.", "Ana plays the cello."])
        yield tree


def backup_text(memory: MemTree, tmp_path: Path) -> str:
    reference = tmp_path / "reference.jsonl"
    memory.export_jsonl(reference)
    text = reference.read_text(encoding="utf-8")
    reference.unlink()
    return text


def without_time(text: str) -> list[str]:
    """The backup's lines, the header's export time cut off (two exports differ only there)."""
    lines = text.splitlines()
    return [lines[0].split('"exported_at"')[0], *lines[1:]]


def test_a_named_pipe_is_written_through_not_replaced(memory: MemTree, tmp_path: Path) -> None:
    pipe = tmp_path / "backup.pipe"
    os.mkfifo(pipe)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(pipe.read_bytes()), daemon=True)
    reader.start()
    memory.export_jsonl(pipe)
    reader.join(timeout=30)
    assert not reader.is_alive(), "the reader never saw the end of the backup"
    assert stat.S_ISFIFO(pipe.lstat().st_mode), "the pipe was replaced by a regular file"
    assert without_time(received[0].decode("utf-8")) == without_time(backup_text(memory, tmp_path))
    assert sorted(path.name for path in tmp_path.iterdir()) == ["backup.pipe"]


def null_device(folder: Path) -> Path:
    """A private copy of ``/dev/null`` (the same character device, 1:3) in ``folder``.

    The tests never aim at the real ``/dev/null``: the defect they guard against
    replaced the device with a regular file, which as root would break the machine.
    """
    node = folder / "null"
    try:
        os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("creating a device node needs root (CAP_MKNOD)")
    return node


def test_a_device_is_written_through_never_replaced(memory: MemTree, tmp_path: Path) -> None:
    null = null_device(tmp_path)
    before = null.lstat()
    memory.export_jsonl(null)
    after = null.lstat()
    assert stat.S_ISCHR(after.st_mode), "the device was replaced by a regular file"
    assert (after.st_ino, after.st_rdev) == (before.st_ino, before.st_rdev)


def test_a_symbolic_link_stays_a_link_and_its_target_gets_the_backup(memory: MemTree, tmp_path: Path) -> None:
    folder = tmp_path / "real"
    folder.mkdir()
    target = folder / "backup.jsonl"
    target.write_text("an older backup\n", encoding="utf-8")
    target.chmod(0o640)
    link = tmp_path / "latest.jsonl"
    link.symlink_to(target)
    memory.export_jsonl(link)
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert without_time(target.read_text(encoding="utf-8")) == without_time(backup_text(memory, tmp_path))
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert sorted(path.name for path in folder.iterdir()) == ["backup.jsonl"]  # no temporary file left

    dangling = tmp_path / "next.jsonl"
    dangling.symlink_to(folder / "new.jsonl")  # as `> next.jsonl` would, the target is created
    memory.export_jsonl(dangling)
    assert dangling.is_symlink() and (folder / "new.jsonl").read_text(encoding="utf-8").startswith('{"format"')


@pytest.mark.parametrize("mode", [0o644, 0o600, 0o664])
def test_an_existing_file_keeps_its_mode(memory: MemTree, tmp_path: Path, mode: int) -> None:
    path = tmp_path / "backup.jsonl"
    path.write_text("old\n", encoding="utf-8")
    path.chmod(mode)
    memory.export_jsonl(path)
    assert stat.S_IMODE(path.stat().st_mode) == mode
    assert path.read_text(encoding="utf-8").startswith('{"format"')


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_a_new_file_gets_the_umask(memory: MemTree, tmp_path: Path, umask: int, mode: int) -> None:
    path = tmp_path / "backup.jsonl"
    previous = os.umask(umask)
    try:
        memory.export_jsonl(path)
    finally:
        os.umask(previous)
    assert stat.S_IMODE(path.stat().st_mode) == mode


def test_an_interrupted_write_leaves_the_old_file_whole(tmp_path: Path) -> None:
    path = tmp_path / "backup.jsonl"
    path.write_text("the previous backup\n", encoding="utf-8")
    path.chmod(0o644)

    def lines() -> Iterator[str]:
        yield "the first line of a new backup\n"
        raise KeyboardInterrupt  # as when the user presses Ctrl-C midway

    with pytest.raises(KeyboardInterrupt):
        write_output(path, lines())
    assert path.read_text(encoding="utf-8") == "the previous backup\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["backup.jsonl"], "the temporary file was removed"


def test_dev_stdout_appends_to_the_file_the_shell_opened(memory: MemTree, tmp_path: Path) -> None:
    """``export /dev/stdout >> log`` adds to ``log`` (reopening it must not truncate it or replace it)."""
    log = tmp_path / "log.txt"
    log.write_text("earlier output\n", encoding="utf-8")
    code = (
        "import sys\n"
        "from memtree import HashingEmbedder, MemTree\n"
        "with MemTree(embedder=HashingEmbedder(32)) as memory:\n"
        "    memory.add('Leo ate ramen in Kyoto.')\n"
        "    memory.export_jsonl('/dev/stdout')\n"
    )
    inode = log.stat().st_ino
    with log.open("a") as output:
        subprocess.run([sys.executable, "-c", code], stdout=output, check=True, timeout=120)
    lines = log.read_text(encoding="utf-8").splitlines()
    assert lines[0] == "earlier output" and lines[1].startswith('{"format": "memtree-jsonl"')
    assert log.stat().st_ino == inode
