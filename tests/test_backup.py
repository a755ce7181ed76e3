"""JSONL export/import: exact round trips, clear refusals, salvage with skip_bad."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_stores import FACTS, canonical, snapshot

from memtree import HashingEmbedder, MemoryBackend, MemTree, MemTreeConfig, SQLiteBackend
from memtree.embed import Matrix
from memtree.node import JSONDict
from memtree.store import ChangeBatch, NamespaceKey, NamespaceSnapshot

CONFIG = MemTreeConfig(theta0=0.2)
MORE = [
    "Dana's niece visits every July.",
    "Eli bought rosin for his cello bow.",
    "The honey jars have blue lids.",
    "Bergen gets a lot of rain in autumn.",
    "Dana extracts honey in late August.",
]


class RecordingEmbedder(HashingEmbedder):
    """Hashing embeddings that remember every text they were asked to embed."""

    def __init__(self) -> None:
        super().__init__(64)
        self.seen: list[str] = []

    def embed(self, texts: Sequence[str]) -> Matrix:
        self.seen.extend(texts)
        return super().embed(texts)


def make(store: object = None, namespace: str = "default", embedder: HashingEmbedder | None = None) -> MemTree:
    return MemTree(store=store, namespace=namespace, embedder=embedder or HashingEmbedder(64), config=CONFIG)  # type: ignore[arg-type]


@pytest.fixture
def source() -> MemTree:
    memory = make(MemoryBackend(), namespace="source")
    ids = memory.add_many(
        FACTS + MORE,
        metadata=[{"i": i, "who": 'Zoë "Z" O\'Neil'} for i in range(len(FACTS + MORE))],
        timestamps=[1_700_000_000 + 3600 * i for i in range(len(FACTS + MORE))],
        source_ids=[f"msg-{i}" for i in range(len(FACTS + MORE))],
    )
    memory.delete(ids[3])
    memory.store.put_records(memory.namespace, "messages", {"2": {"text": "second"}, "1": {"text": "first"}})
    memory.store.put_records(memory.namespace, "profile", {"name": {"value": "Dana"}})
    return memory


def exported(memory: MemTree) -> list[str]:
    buffer = io.StringIO()
    memory.export_jsonl(buffer)
    return buffer.getvalue().splitlines(keepends=True)


def assert_untouched(memory: MemTree) -> None:
    assert len(memory) == 0 and list(memory.walk()) == []
    assert memory.store.record_kinds(memory.namespace) == []


# -- round trips ------------------------------------------------------------------------------


def test_a_backup_restores_the_exact_tree_records_and_answers(source: MemTree, tmp_path: Path) -> None:
    path = tmp_path / "backup.jsonl"
    written = source.export_jsonl(path)
    assert written == len(list(source.walk()))
    assert [p.name for p in tmp_path.iterdir()] == ["backup.jsonl"]  # no temporary file left behind
    header = json.loads(path.read_text(encoding="utf-8").splitlines()[0])
    assert header["format"] == "memtree-jsonl" and header["version"] == 1
    assert (header["namespace"], header["dimension"], header["embedder"]) == (["source"], 64, "HashingEmbedder(64)")
    assert (header["nodes"], header["records"]) == (written, 3)

    store = SQLiteBackend(tmp_path / "restored.db")
    embedder = RecordingEmbedder()
    restored = make(store, namespace=("restored", "copy"), embedder=embedder)
    assert restored.import_jsonl(path) == written
    assert embedder.seen == []  # nothing was embedded again
    assert snapshot(restored) == snapshot(source)
    for query in ["Where does Dana sell honey?", "cello teacher", "rain in Bergen"]:
        assert canonical(restored, query) == canonical(source, query)
    assert restored.check_integrity() == []
    assert list(store.get_records(restored.namespace, "messages")) == ["2", "1"]
    assert store.get_records(restored.namespace, "profile") == {"name": {"value": "Dana"}}
    assert restored.find(source_id="msg-5") == source.find(source_id="msg-5")
    store.close()
    with make(SQLiteBackend(tmp_path / "restored.db"), namespace=("restored", "copy")) as reopened:
        assert snapshot(reopened) == snapshot(source)
        reopened.store.close()


def test_the_file_is_human_readable(source: MemTree) -> None:
    lines = exported(source)
    node_lines = [json.loads(line) for line in lines[1:] if '"type": "node"' in line]
    assert node_lines[0]["id"] == "root" and node_lines[0]["embedding"] is None
    leaf = next(n for n in node_lines if n["is_leaf"] and n["metadata"].get("i") == 0)
    assert leaf["text"] == FACTS[0] and leaf["source_id"] == "msg-0" and leaf["metadata"]["who"] == 'Zoë "Z" O\'Neil'
    vector = np.frombuffer(base64.b64decode(leaf["embedding"]), "<f4")
    assert vector.shape == (64,) and np.array_equal(vector, source.get(leaf["id"]).embedding)
    assert "Zoë" in "".join(lines)  # unicode stays readable, not \\u-escaped


def test_an_empty_memory_round_trips(tmp_path: Path) -> None:
    lines = exported(make())
    assert len(lines) == 1 and json.loads(lines[0])["nodes"] == 0
    target = make()
    assert target.import_jsonl(io.StringIO("".join(lines))) == 0
    assert len(target) == 0


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 40)), min_size=1, max_size=25))
def test_any_sequence_of_adds_and_deletes_round_trips(steps: list[tuple[bool, int]]) -> None:
    memory = make()
    for add, number in steps:
        leaves = memory.leaves()
        if add or not leaves:
            memory.add(f"note {number} about {['bees', 'cello', 'honey', 'rain'][number % 4]} and {number % 7}")
        else:
            memory.delete(leaves[number % len(leaves)].id)
    copy = make()
    copy.import_jsonl(io.StringIO("".join(exported(memory))))
    assert snapshot(copy) == snapshot(memory)
    assert copy.check_integrity() == []


def test_import_refuses_a_namespace_that_is_not_empty(source: MemTree) -> None:
    target = make()
    target.add("already here")
    before = snapshot(target)
    with pytest.raises(ValueError, match=r"namespace \('default',\) is not empty \(1 leaves\).*delete_namespace"):
        target.import_jsonl(io.StringIO("".join(exported(source))))
    assert snapshot(target) == before
    records_only = make(MemoryBackend())
    records_only.store.put_records(records_only.namespace, "messages", {"1": {"text": "hi"}})
    with pytest.raises(ValueError, match=r"records \(messages\)"):
        records_only.import_jsonl(io.StringIO("".join(exported(source))))


# -- malformed files --------------------------------------------------------------------------

Edit = Callable[[list[str]], list[str]]


def first_line(lines: list[str], predicate: Callable[[dict], bool]) -> int:  # type: ignore[type-arg]
    return next(i for i, line in enumerate(lines) if i and predicate(json.loads(line)))


def change(predicate: Callable[[dict], bool], **fields: object) -> Edit:  # type: ignore[type-arg]
    def edit(lines: list[str]) -> list[str]:
        i = first_line(lines, predicate)
        value = json.loads(lines[i])
        for name, new in fields.items():
            if new is DELETE:
                del value[name]
            else:
                value[name] = new
        return [*lines[:i], json.dumps(value) + "\n", *lines[i + 1 :]]

    return edit


DELETE = object()


def is_leaf(value: dict) -> bool:  # type: ignore[type-arg]
    return value.get("type") == "node" and value["is_leaf"]


def is_summary(value: dict) -> bool:  # type: ignore[type-arg]
    return value.get("type") == "node" and not value["is_leaf"] and value["id"] != "root"


def replace_line(index: int, text: str) -> Edit:
    return lambda lines: [*lines[:index], text, *lines[index + 1 :]]


def header(**fields: object) -> Edit:
    def edit(lines: list[str]) -> list[str]:
        value = json.loads(lines[0])
        value.update(fields)
        return [json.dumps(value) + "\n", *lines[1:]]

    return edit


SHORT_VECTOR = base64.b64encode(np.ones(16, "<f4").tobytes()).decode()
LONG_VECTOR = base64.b64encode((np.ones(64, "<f4") * 0.5).tobytes()).decode()


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda lines: [], r"^line 1: the file is empty"),
        (replace_line(0, "{not json\n"), r"^line 1: the header is not valid JSON"),
        (header(format="something-else"), r"^line 1: not a memtree-jsonl backup"),
        (header(version=2), r"^line 1: this backup has format version 2, newer than this memtree reads \(1\)"),
        (header(dimension="big"), r"^line 1: dimension must be a positive integer"),
        (header(namespace=[]), r"^line 1: namespace is not valid"),
        (replace_line(2, '{"type": "node", "id": \n'), r"^line 3: not valid JSON"),
        (replace_line(2, "[1, 2]\n"), r"^line 3: expected a JSON object, got list"),
        (replace_line(2, '{"type": "edge"}\n'), r'^line 3: "type" must be "node", "record" or "version"'),
        (change(is_leaf, embedding="***"), r"^line \d+: embedding is not valid base64"),
        (change(is_leaf, embedding=SHORT_VECTOR), r"^line \d+: embedding holds 16 float32 values.*dimension 64"),
        (change(is_leaf, embedding=LONG_VECTOR), r"^line \d+: embedding is not unit length"),
        (change(is_leaf, color="blue"), r"^line \d+: unknown node field\(s\) color"),
        (change(is_leaf, depth=DELETE), r"^line \d+: node is missing depth"),
        (change(is_leaf, depth=-1), r"^line \d+: depth must be a non-negative integer"),
        (change(is_leaf, text="   "), r"^line \d+: node \w+: text is empty"),
        (change(is_leaf, metadata=[1]), r"^line \d+: node \w+: metadata must be a dict"),
        (change(is_leaf, created_at="yesterday"), r"^line \d+: created_at must be a finite number"),
        (change(is_leaf, parent="nobody"), r"^line \d+: node \w+: its parent nobody is not in the file"),
        (change(is_summary, leaf_count=999), r"^line \d+: node \w+: leaf_count 999 but its children hold"),
        (change(is_leaf, id="root"), r"^line \d+: the root must have parent null"),
        (lambda lines: [*lines, lines[3]], r"^line \d+: node id '\w+' already appeared on line 4"),
        (lambda lines: [line for i, line in enumerate(lines) if i != len(lines) - 4], r"announces \d+ nodes but"),
        (change(lambda v: v.get("type") == "record", value=[1]), r"^line \d+: record 'messages'/'2': value must be"),
        (lambda lines: [*lines[:2], lines[2].replace("0.0", "NaN", 1), *lines[3:]], r"^line \d+:"),
    ],
)
def test_a_malformed_backup_is_refused_with_its_line_and_nothing_is_imported(
    source: MemTree, edit: Edit, message: str
) -> None:
    target = make(MemoryBackend())
    with pytest.raises(ValueError, match=message):
        target.import_jsonl(io.StringIO("".join(edit(exported(source)))))
    assert_untouched(target)


def test_nan_and_infinity_are_not_numbers_here(source: MemTree) -> None:
    lines = exported(source)
    i = first_line(lines, is_leaf)
    value = json.loads(lines[i])
    broken = json.dumps(value).replace(f'"created_at": {json.dumps(value["created_at"])}', '"created_at": NaN')
    with pytest.raises(ValueError, match=rf"^line {i + 1}: not valid JSON \(NaN is not allowed\)"):
        make().import_jsonl(io.StringIO("".join([*lines[:i], broken + "\n", *lines[i + 1 :]])))


def test_a_bad_header_cannot_be_skipped(source: MemTree) -> None:
    target = make()
    with pytest.raises(ValueError, match=r"^line 1:"):
        target.import_jsonl(io.StringIO("".join(header(format="x")(exported(source)))), skip_bad=True)
    assert_untouched(target)


@pytest.mark.parametrize(
    ("dimension", "message"),
    [
        (32, r"^line 1: the header says dimension 32 but every embedding in the file holds 64 values"),
        (None, r"^line 1: the header says dimension null but every embedding in the file holds 64 values"),
    ],
)
def test_a_header_with_the_wrong_dimension_is_fatal_even_with_skip_bad(
    source: MemTree, dimension: int | None, message: str
) -> None:
    """A wrong header makes every node line look bad: skipping them all used to report
    success and fix the namespace to the header's size, so every later add failed."""
    target = make()
    with pytest.raises(ValueError, match=message) as raised:
        target.import_jsonl(io.StringIO("".join(header(dimension=dimension)(exported(source)))), skip_bad=True)
    assert "skip_bad cannot skip the header" in str(raised.value)
    assert_untouched(target)
    target.add("The memory still takes 64-dimensional embeddings.")
    assert target.check_integrity() == []


def test_a_backup_that_stored_nothing_records_no_dimension(source: MemTree) -> None:
    """Every node line unreadable (and none embedded at the header's size): nothing is
    imported, and the header's dimension (32, not this memory's 64) is not recorded."""
    lines = header(dimension=32)(exported(source))
    garbled = [line if i < 2 or '"type": "node"' not in line else "garbage\n" for i, line in enumerate(lines)]
    target = make()
    with pytest.warns(UserWarning, match="these lines were skipped"):
        target.import_jsonl(io.StringIO("".join(garbled)), skip_bad=True)
    assert len(target) == 0
    assert target.store.read_changes(target.namespace, 0).info.dimension is None
    target.add("A first memory after an import that brought nothing.")
    assert len(target) == 1 and target.check_integrity() == []


# -- salvage ------------------------------------------------------------------------------------


def test_skip_bad_reattaches_leaves_that_lost_their_summary_without_embedding_them(source: MemTree) -> None:
    lines = exported(source)
    lost = first_line(lines, is_summary)
    lost_id = json.loads(lines[lost])["id"]
    damaged = [*lines[:lost], "garbage\n", *lines[lost + 1 :]]
    embedder = RecordingEmbedder()
    target = make(embedder=embedder)
    with pytest.warns(UserWarning, match=rf"line {lost + 1}: not valid JSON(.|\n)*these lines were skipped"):
        target.import_jsonl(io.StringIO("".join(damaged)), skip_bad=True)
    leaves = {leaf.id: leaf for leaf in source.leaves()}
    got = {leaf.id: leaf for leaf in target.leaves()}
    assert got.keys() == leaves.keys()  # no leaf lost, same ids
    for leaf_id, leaf in leaves.items():
        mine = got[leaf_id]
        assert (mine.text, mine.metadata, mine.timestamp, mine.source_id) == (
            leaf.text,
            leaf.metadata,
            leaf.timestamp,
            leaf.source_id,
        )
        assert np.array_equal(mine.embedding, leaf.embedding)  # type: ignore[arg-type]
    assert not set(embedder.seen) & {leaf.text for leaf in leaves.values()}  # leaves were not embedded again
    assert lost_id not in {node.id for node in target.walk()}
    assert target.check_integrity() == []
    assert list(target.store.get_records(target.namespace, "messages")) == ["2", "1"]


def test_skip_bad_drops_only_the_bad_leaf_and_keeps_intact_branches_as_they_were(source: MemTree) -> None:
    lines = exported(source)
    bad = first_line(lines, is_leaf)
    bad_id = json.loads(lines[bad])["id"]
    damaged = change(lambda v: v.get("id") == bad_id, embedding="***")(lines)
    target = make()
    with pytest.warns(UserWarning, match=rf"line {bad + 1}: embedding is not valid base64"):
        target.import_jsonl(io.StringIO("".join(damaged)), skip_bad=True)
    assert {leaf.id for leaf in target.leaves()} == {leaf.id for leaf in source.leaves()} - {bad_id}
    original = snapshot(source)
    damaged_branch = {node.id for node in source.walk() if bad_id in source.leaf_ids_under(node.id)}
    kept = {node_id for node_id in snapshot(target) if node_id in original and node_id not in damaged_branch}
    assert kept  # other branches survived...
    for node_id in kept - {"root"}:
        if not original[node_id][3]:  # ...summaries exactly as they were
            assert snapshot(target)[node_id][:11] == original[node_id][:11]
    assert target.check_integrity() == []


# -- backups taken while others write ----------------------------------------------------------


def write_step(memory: MemTree, number: int) -> None:
    """One unit of a writer's work: a leaf, then a record naming it (two transactions)."""
    memory.add(f"writer note {number:04d}")
    memory.store.put_records(memory.namespace, "log", {f"{number:04d}": {"n": number}})


def leaf_and_record_numbers(lines: list[str]) -> tuple[set[str], set[str]]:
    items = [json.loads(line) for line in lines[1:]]
    leaves = {item["text"].split()[-1] for item in items if item["type"] == "node" and item["is_leaf"]}
    records = {item["key"] for item in items if item["type"] == "record" and item["kind"] == "log"}
    return leaves, records


class InterleavingStore(MemoryBackend):
    """Another writer completes a step before every read: anything reading the
    namespace in two calls sees two different moments."""

    def __init__(self) -> None:
        super().__init__()
        self.writer: MemTree | None = None
        self.steps = 0
        self._stepping = False

    def _step(self) -> None:
        if self.writer is None or self._stepping:
            return
        self._stepping = True  # the writer's own reads do not step again
        try:
            write_step(self.writer, self.steps)
            self.steps += 1
        finally:
            self._stepping = False

    def read_changes(self, namespace: NamespaceKey, since: int) -> ChangeBatch:
        self._step()
        return super().read_changes(namespace, since)

    def head(self, namespace: NamespaceKey) -> tuple[int, str]:
        self._step()
        return super().head(namespace)

    def record_kinds(self, namespace: NamespaceKey) -> list[str]:
        self._step()
        return super().record_kinds(namespace)

    def get_records(self, namespace: NamespaceKey, kind: str, keys: Sequence[str] | None = None) -> dict[str, JSONDict]:
        self._step()
        return super().get_records(namespace, kind, keys)

    def read_snapshot(self, namespace: NamespaceKey, since: int = 0) -> NamespaceSnapshot:
        self._step()
        return super().read_snapshot(namespace, since)


def test_a_backup_pairs_the_tree_with_the_records_of_the_same_moment() -> None:
    store = InterleavingStore()
    memory = make(store, namespace="shared")
    store.writer = make(store, namespace="shared")
    for _ in range(3):
        leaves, records = leaf_and_record_numbers(exported(memory))
        assert store.steps > 0 and leaves == records  # every step a writer finished, both halves


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_backups_during_concurrent_writes_are_consistent(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    import threading

    from memtree import PostgresBackend

    def open_store() -> SQLiteBackend | PostgresBackend:
        if backend == "sqlite":
            return SQLiteBackend(tmp_path / "memory.db")
        return PostgresBackend(dsn)

    dsn = request.getfixturevalue("postgres_dsn") if backend == "postgres" else ""
    writer = make(open_store(), namespace="shared")
    reader = make(open_store(), namespace="shared")
    failures: list[BaseException] = []

    def write() -> None:
        try:
            for number in range(40):
                write_step(writer, number)
        except BaseException as error:  # noqa: BLE001 - reported by the main thread
            failures.append(error)

    thread = threading.Thread(target=write)
    thread.start()
    backups = 0
    try:
        while thread.is_alive() or backups == 0:
            leaves, records = leaf_and_record_numbers(exported(reader))
            # The writer adds a leaf, then its record: a moment holds every record's
            # leaf and at most one leaf still waiting for its record.
            assert records <= leaves and len(leaves) - len(records) <= 1
            backups += 1
    finally:
        thread.join()
        writer.store.close()
        reader.store.close()
    assert failures == []
    assert backups > 1
