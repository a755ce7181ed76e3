"""Segments: index files a reopen maps instead of rebuilding. A reopen from them
equals a reopen from the rows; a kill at any step of writing one loses and
corrupts nothing; a damaged, foreign or outdated one is never used."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from segment_worker import NAMESPACE, note, open_memory
from test_crash_safety import ENV

from memtree import HashingEmbedder, MemTree, MemTreeConfig
from memtree import segment as segment_module
from memtree.checkpoint import SegmentFolder
from memtree.segment import Segment, SegmentError

WORKER = str(Path(__file__).with_name("segment_worker.py"))
ROWS_ONLY = MemTreeConfig(theta0=0.3, ann_min_nodes=None, segment_min_nodes=None)


def fill(location: str, count: int, prefix: str = "w0", index_dir: str = "") -> None:
    done = subprocess.run(
        [sys.executable, WORKER, "insert", location, index_dir, prefix, str(count)],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr


def picture(memory: MemTree) -> dict[str, object]:
    """Everything a reader sees of a tree, for comparing two ways of opening it."""
    nodes = {
        node.id: (node.text, node.parent, tuple(node.children), node.leaf_count, node.depth, node.metadata, node.stale)
        for node in memory.walk()
    }
    queries = ("garden violin", "coffee harbor", "tomato mountain lantern")
    # Scores, not ids: notes of the same words tie, and which of two tied nodes makes
    # the cut depends on the order of the rows, which a segment may change.
    ranked = {query: [round(hit.score, 5) for hit in memory.retrieve(query, k=8, exact=True)] for query in queries}
    filtered = [
        round(hit.score, 5)
        for hit in memory.retrieve("river", k=5, exact=True, where={"writer": "w0"}, time_range=(3, 50))
    ]
    stats = memory.stats()
    shape = (stats.depth_histogram, stats.leaves, stats.summaries, stats.stale, stats.branching, stats.mean_leaf_depth)
    return {"nodes": nodes, "ranked": ranked, "filtered": filtered, "shape": shape}


def by_rows(location: str) -> dict[str, object]:
    with MemTree.open(location, namespace=NAMESPACE, embedder=HashingEmbedder(32), config=ROWS_ONLY) as memory:
        return picture(memory)


def segments_of(location: str) -> list[Path]:
    folder = Path(f"{location}-index")
    return sorted(path for path in folder.rglob("seg-*") if path.is_dir())


def test_a_reopen_from_a_segment_equals_one_from_the_rows(tmp_path: Path) -> None:
    location = str(tmp_path / "m.db")
    fill(location, 150)
    assert segments_of(location), "150 notes past a threshold of 60 nodes write a segment"
    with open_memory(location, "") as memory:
        memory.delete(memory.find(source_id="none") or memory.leaves()[3].id)
        leaf = memory.leaves()[5]
        memory.update(leaf.id, "the garden violin was moved to the harbor")
        memory.add(note("w0", 500), metadata={"writer": "w0", "n": 500}, timestamp=9.0, ttl=3600)
    with open_memory(location, "") as memory:
        assert memory._replica.state.nodes.segment is not None  # mapped, not read from rows
        assert memory.check_integrity() == []
        mapped = picture(memory)
    assert mapped == by_rows(location)


@pytest.mark.slow
@pytest.mark.parametrize("step", [0, 1, 2, 9, 24, 41])
def test_a_kill_while_a_segment_is_written_loses_nothing(tmp_path: Path, step: int) -> None:
    location = str(tmp_path / "m.db")
    fill(location, 80)
    before = segments_of(location)
    died = subprocess.run(
        [sys.executable, WORKER, "kill-writing", location, "", str(step)],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=600,
    )
    assert died.returncode == -signal.SIGKILL, died.stderr
    leftovers = [path for path in Path(f"{location}-index").rglob("tmp-*")]
    assert step == 0 or leftovers  # it died inside a write: a temporary folder stays behind
    with open_memory(location, "") as memory:
        assert memory.check_integrity() == []
        mapped = picture(memory)
    assert mapped == by_rows(location)  # the same tree, whichever segment (if any) was mapped
    fill(location, 60, prefix="w1")  # the next writer writes a segment and clears what the dead one left
    assert not [path for path in Path(f"{location}-index").rglob("tmp-*")]
    assert len(segments_of(location)) == 1 and segments_of(location) != before
    with open_memory(location, "") as memory:
        assert memory.check_integrity() == [] and len(memory) >= 140


@pytest.mark.slow
def test_a_reopen_after_a_writer_is_killed_finds_every_acknowledged_note(tmp_path: Path) -> None:
    location = str(tmp_path / "m.db")
    writer = subprocess.Popen(
        [sys.executable, WORKER, "insert", location, "", "w0", "100000"], stdout=subprocess.PIPE, text=True, env=ENV
    )
    assert writer.stdout is not None
    acknowledged = {}
    for line in writer.stdout:
        number, leaf_id = line.split()
        acknowledged[leaf_id] = note("w0", int(number))
        if len(acknowledged) == 230:  # several segments written by now, one likely in progress
            writer.send_signal(signal.SIGKILL)
            break
    writer.wait(timeout=60)
    with open_memory(location, "") as memory:
        texts = {leaf.id: leaf.text for leaf in memory.leaves()}
        assert memory.check_integrity() == []
        mapped = picture(memory)
    assert {leaf_id: texts.get(leaf_id) for leaf_id in acknowledged} == acknowledged
    assert mapped == by_rows(location)


def test_a_damaged_segment_is_not_used(tmp_path: Path) -> None:
    location = str(tmp_path / "m.db")
    fill(location, 120)
    (newest,) = segments_of(location)
    column = newest / "depth.npy"  # a small file: its checksum is checked on open
    data = bytearray(column.read_bytes())
    data[-1] ^= 0xFF
    column.write_bytes(bytes(data))
    with pytest.raises(SegmentError, match="checksum"):
        Segment.open(newest)
    with open_memory(location, "") as memory:
        assert memory._replica.state.nodes.segment is None  # read from the rows instead
        assert picture(memory) == by_rows(location)


def test_damaged_embeddings_are_found_by_the_check_and_never_copied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    location = str(tmp_path / "m.db")
    fill(location, 120)
    (newest,) = segments_of(location)
    vectors = np.load(newest / "vectors.npy", mmap_mode="r+")
    vectors[3] = -vectors[3]
    vectors.flush()
    del vectors
    monkeypatch.setattr(segment_module, "CHECKED_AT_OPEN", 0)  # as for a large file: not read at open
    with open_memory(location, "") as memory:
        memory._replica.checkpoints = None
        assert memory._replica.state.nodes.segment is not None
        assert any("vectors.npy fails its checksum" in problem for problem in memory.check_integrity())
    monkeypatch.undo()
    fill(location, 60, prefix="w1")  # the next segment writer finds it, and reads the tree from the rows
    with open_memory(location, "") as memory:
        assert memory.check_integrity() == []
        assert picture(memory) == by_rows(location)


def test_segments_of_another_generation_or_database_are_not_used(tmp_path: Path) -> None:
    location = str(tmp_path / "m.db")
    fill(location, 120)
    with open_memory(location, "") as memory:
        memory.delete(memory.leaves()[0].id)
        memory.compact()  # a new generation: the old segment no longer fits
    with open_memory(location, "") as memory:
        segment = memory._replica.state.nodes.segment
        assert segment is None or segment.generation == memory._replica.state.generation
        assert picture(memory) == by_rows(location)
    copy = tmp_path / "copy.db"
    shutil.copy(location, copy)  # a copy (as a restored backup is) is another database file
    shutil.copytree(f"{location}-index", f"{copy}-index")
    with open_memory(str(copy), "") as memory:
        assert memory._replica.state.nodes.segment is None
    folder = SegmentFolder(next(Path(f"{copy}-index").iterdir()), True, (NAMESPACE,), "sqlite:0:0")
    assert folder.newest(memory._replica.state.generation or "", 10**9) is None


@pytest.mark.slow
def test_two_sqlite_writers_and_a_filtered_reader(tmp_path: Path) -> None:
    run_two_writers_and_a_reader(str(tmp_path / "shared.db"), "")


@pytest.mark.slow
def test_two_postgres_writers_and_a_filtered_reader(postgres_dsn: str, tmp_path: Path) -> None:
    run_two_writers_and_a_reader(postgres_dsn, str(tmp_path / "index"))


def run_two_writers_and_a_reader(location: str, index_dir: str, per_writer: int = 150) -> None:
    """Two processes add notes while a third queries with filters: every acknowledged
    note is there at the end, and no result the reader got broke its filter, while
    segments were written and adopted and the search went approximate."""
    import json

    total = 2 * per_writer
    watcher = subprocess.Popen(
        [sys.executable, WORKER, "watch", location, index_dir, str(total)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    assert watcher.stdout is not None and watcher.stdout.readline().strip() == "ready"
    writers = [
        subprocess.Popen(
            [sys.executable, WORKER, "insert", location, index_dir, f"w{i}", str(per_writer)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=ENV,
        )
        for i in range(2)
    ]
    acknowledged = {}
    for number, writer in enumerate(writers):
        out, errors = writer.communicate(timeout=900)
        assert writer.returncode == 0, errors
        for line in out.splitlines():
            index, leaf_id = line.split()
            acknowledged[leaf_id] = note(f"w{number}", int(index))
    out, errors = watcher.communicate(timeout=900)
    assert watcher.returncode == 0, errors
    seen = json.loads(out.strip().splitlines()[-1])
    assert seen["violations"] == [] and seen["problems"] == []
    assert seen["counts"][-1] == total and seen["approximate"]
    with open_memory(location, index_dir) as memory:
        assert {leaf.id: leaf.text for leaf in memory.leaves()} == acknowledged
        assert memory.check_integrity() == []
    if index_dir:
        assert list(Path(index_dir).rglob("seg-*")), "the PostgreSQL processes kept segments in index_dir"
