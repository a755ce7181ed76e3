"""``compact()`` leaves no deleted text on disk: not in the database file (``VACUUM``)
and not in the index files (segments) beside it, which used to hold a deleted leaf's
text, metadata and words until some later segment replaced them. The memory answers
as before, reopens from the new segment, and a reader that mapped the old one goes on."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_runner import memtree, ok
from segment_worker import CONFIG, NAMESPACE, note
from test_segments import by_rows, picture

from memtree import HashingEmbedder, MemTree, PostgresBackend

SECRET = "zanzibarquokka"
"""A word only the deleted leaf has (its text and its metadata)."""
SPARED = "kilimanjarowombat"
"""A word of a leaf that stays."""


def open_memory(location: str, index_dir: str = "", namespace: str = NAMESPACE, **kwargs: object) -> MemTree:
    embedder = HashingEmbedder(32)
    if index_dir:
        store = PostgresBackend(location, index_dir=index_dir)
        memory = MemTree(store=store, namespace=namespace, embedder=embedder, config=CONFIG, **kwargs)  # type: ignore[arg-type]
        memory._owns_store = True
        return memory
    return MemTree.open(location, namespace=namespace, embedder=embedder, config=CONFIG, **kwargs)  # type: ignore[arg-type]


def build(location: str, index_dir: str = "", namespace: str = NAMESPACE) -> None:
    """120 notes and two distinctive ones, closed: a segment holds them all."""
    with open_memory(location, index_dir, namespace) as memory:
        for number in range(120):
            memory.add(note("w0", number), metadata={"writer": "w0", "n": number}, timestamp=float(number))
        memory.add(f"The {SECRET} diary says the garden violin is hidden.", metadata={"tag": f"{SECRET}-tag"})
        memory.add(f"The {SPARED} letter mentions the harbor coffee.", metadata={"tag": "spared"})


def files_holding(word: str, *places: Path) -> list[Path]:
    """Every file under ``places`` (files or folders) whose bytes hold ``word``."""
    found = []
    for place in places:
        files = [place] if place.is_file() else [path for path in place.rglob("*") if path.is_file()]
        found += [path for path in files if word.encode() in path.read_bytes()]
    return found


def secret_leaf(memory: MemTree) -> str:
    return next(leaf.id for leaf in memory.leaves() if SECRET in leaf.text)


def on_disk(location: str, index_dir: str) -> list[Path]:
    """The database file (SQLite, with its write-ahead log) and the index files."""
    if index_dir:
        return [Path(index_dir)]
    places = [Path(location), Path(f"{location}-index")]
    return places + [path for path in (Path(f"{location}-wal"),) if path.exists()]


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_after_compact_no_file_holds_a_deleted_text(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if backend == "postgres":
        location, index_dir = request.getfixturevalue("postgres_dsn"), str(tmp_path / "index")
    else:
        location, index_dir = str(tmp_path / "m.db"), ""
    build(location, index_dir)
    with open_memory(location, index_dir) as memory:
        assert memory._replica.state.nodes.segment is not None  # mapped
        assert files_holding(SECRET, Path(index_dir or f"{location}-index"))  # what the test is about
        memory.delete(secret_leaf(memory))
        before = picture(memory)
        report = memory.compact()
        assert report.rows_dropped >= 1
        assert files_holding(SECRET, *on_disk(location, index_dir)) == []
        assert files_holding(SPARED, *on_disk(location, index_dir))  # the search looks where the texts are
        assert picture(memory) == before
        assert memory.check_integrity() == []
    with open_memory(location, index_dir) as memory:
        segment = memory._replica.state.nodes.segment
        assert segment is not None and segment.generation == memory._replica.state.generation
        assert picture(memory) == before
        assert memory.check_integrity() == []
    if not index_dir:
        assert before == by_rows(location)
    assert files_holding(SECRET, *on_disk(location, index_dir)) == []


def test_a_segment_written_after_a_delete_keeps_no_word_of_the_deleted_text(tmp_path: Path) -> None:
    """The BM25 vocabulary a segment carried forward kept every word it ever had; a
    segment written after a delete (here at close) now has only the words of live texts."""
    location = str(tmp_path / "m.db")
    build(location)
    with open_memory(location) as memory:
        memory.delete(secret_leaf(memory))
        memory.update(next(leaf.id for leaf in memory.leaves() if SPARED in leaf.text), "The letter was burnt.")
    index = Path(f"{location}-index")
    with open_memory(location) as memory:
        assert memory._replica.state.nodes.segment is not None
        assert memory._replica.state.nodes.segment.seq == memory._replica.state.seq  # written after the delete
        assert files_holding(SECRET, index) == [] and files_holding(SPARED, index) == []
        assert [hit.text for hit in memory.retrieve("burnt letter", k=1, leaves_only=True)] == ["The letter was burnt."]
        assert memory.check_integrity() == []


def test_a_reader_that_mapped_the_old_segment_goes_on_after_compact(tmp_path: Path) -> None:
    location = str(tmp_path / "m.db")
    build(location)
    with open_memory(location) as writer:
        writer.delete(secret_leaf(writer))
        expected = picture(writer)
        lagging = open_memory(location, refresh_interval=1e9)  # looks at the store only when told
        following = open_memory(location)  # looks before every read
        old = lagging._replica.state.nodes.segment
        assert old is not None and following._replica.state.nodes.segment is not None
        writer.compact()
        assert not old.path.exists()  # removed while mapped
        assert picture(lagging) == expected  # reads its map of the removed files
        assert picture(following) == expected
        assert following._replica.state.nodes.segment is not None
        assert following._replica.state.nodes.segment.path.exists()  # moved to the new one
        lagging.refresh(force=True)
        assert picture(lagging) == expected
        assert lagging._replica.state.nodes.segment is not None
        assert lagging._replica.state.nodes.segment.path == following._replica.state.nodes.segment.path
        assert lagging.check_integrity() == [] and following.check_integrity() == []
        lagging.close()
        following.close()


def test_the_compact_command_leaves_no_deleted_text_in_any_namespace(tmp_path: Path) -> None:
    """``memtree compact`` (which opens the namespace ``default``) clears its index
    files, and removes other namespaces' segments the compaction made useless."""
    location = str(tmp_path / "m.db")
    for namespace in ("default", "other"):
        build(location, namespace=namespace)
        with open_memory(location, namespace=namespace) as memory:
            memory.delete(secret_leaf(memory))
            memory._replica.wrote = False  # no segment at close: the old one holds the deleted text
    assert files_holding(SECRET, Path(f"{location}-index"))
    ok(memtree("compact", db=Path(location)))
    assert files_holding(SECRET, *on_disk(location, "")) == []
    for namespace in ("default", "other"):
        with open_memory(location, namespace=namespace) as memory:
            assert all(SECRET not in leaf.text for leaf in memory.leaves()) and len(memory.leaves()) == 121
            assert memory.check_integrity() == []
