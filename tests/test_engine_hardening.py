"""Issue 17's defects, each reproduced as the issue describes it (rows D1, D2, D4, D5, D6, D10)."""

from __future__ import annotations

import json
import sqlite3
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from cli_runner import memtree

from memtree import HashingEmbedder, MemTree, MemTreeConfig, viz
from memtree.node import time_text

# -- D1: timestamps outside Python's datetime range ------------------------------------------------

OUT_OF_RANGE = [1e20, "9999-12-31T23:59:59-05:00", -1e15]


def _memory(**kwargs: object) -> MemTree:
    return MemTree(embedder=HashingEmbedder(64), config=MemTreeConfig(theta0=0.1), **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("timestamp", OUT_OF_RANGE)
def test_a_timestamp_no_date_can_hold_is_refused_at_add(timestamp: object) -> None:
    memory = _memory()
    with pytest.raises(ValueError, match=r"is outside the dates Python can represent \(years 1 to 9999 UTC\)"):
        memory.add("Alice adopted a cat.", timestamp=timestamp)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="outside the dates Python can represent"):
        memory.add_many(["a", "b"], timestamps=[None, timestamp])  # type: ignore[list-item]
    assert len(memory) == 0


def test_a_millisecond_epoch_is_refused_and_named() -> None:
    memory = _memory()
    milliseconds = time.time() * 1000
    with pytest.raises(ValueError, match="it looks like milliseconds since the epoch: divide it by 1000"):
        memory.add("Alice adopted a cat.", timestamp=milliseconds)
    with pytest.raises(ValueError) as caught:
        memory.add("Alice adopted a cat.", timestamp=1e20)
    assert "milliseconds" not in str(caught.value)  # 1e17 s is no date either
    assert memory.add("Alice adopted a cat.", timestamp=milliseconds / 1000)  # seconds are fine
    assert memory.add("The oldest day.", timestamp=datetime(1, 1, 1, tzinfo=UTC))
    assert memory.add("The last day.", timestamp="9999-12-31T23:59:59+00:00")


def _store_raw_time(db: Path, timestamp: float) -> str:
    """A SQLite memory in which one leaf (and so its summaries) holds ``timestamp``, as
    an older memtree could store it."""
    with MemTree.open(db, embedder=HashingEmbedder(64), config=MemTreeConfig(theta0=0.1)) as memory:
        ids = memory.add_many(
            ["Alice adopted a cat named Miso.", "Alice's cat likes tuna.", "Bob plays the cello."],
            timestamps=["2024-05-01", "2024-05-02", "2024-05-03"],
        )
    with sqlite3.connect(db) as connection:
        connection.execute("UPDATE memtree_nodes SET event_time = ? WHERE event_time IS NOT NULL", (timestamp,))
    return ids[0]


@pytest.mark.parametrize("stored", [1e20, time.time() * 1000])
def test_reading_never_fails_because_of_one_stored_time(tmp_path: Path, stored: float) -> None:
    db = tmp_path / "old.db"
    leaf = _store_raw_time(db, stored)
    raw = repr(stored)
    memory = MemTree.open(db, embedder=HashingEmbedder(64))
    hits = memory.retrieve("Alice's cat", k=3)
    assert hits and hits[0].timestamp == stored and hits[0].time is None
    assert time_text(stored) == raw and time_text(0.0) == "1970-01-01T00:00:00+00:00"
    assert raw in viz.to_html(memory)
    assert raw in viz.to_mermaid(memory) and raw in viz.to_dot(memory)
    assert memory.get(leaf).time is None

    from langchain_memtree import MemTreeRetriever as LangChainRetriever
    from llamaindex_memtree import MemTreeRetriever as LlamaIndexRetriever

    documents = LangChainRetriever(memory=memory, k=3).invoke("Alice's cat")
    assert documents and {doc.metadata["timestamp"] for doc in documents} == {raw}
    nodes = LlamaIndexRetriever(memory, similarity_top_k=3).retrieve("Alice's cat")
    assert nodes and {node.node.metadata["timestamp"] for node in nodes} == {raw}
    memory.close()

    query = memtree("query", "Alice's cat", "--json", db=db)
    assert query.returncode == 0, query.stderr
    assert {hit["time"] for hit in json.loads(query.stdout)} == {raw}
    page = memtree("show", "--format", "html", db=db)
    assert page.returncode == 0, page.stderr
    assert raw in page.stdout


def test_import_refuses_a_time_no_date_can_hold(tmp_path: Path) -> None:
    source = _memory()
    source.add("Alice adopted a cat named Miso.", timestamp="2024-05-01")
    backup = tmp_path / "backup.jsonl"
    source.export_jsonl(backup)
    lines = backup.read_text().splitlines()
    leaf_line = next(i for i, line in enumerate(lines) if '"is_leaf": true' in line or '"is_leaf":true' in line)
    record = json.loads(lines[leaf_line])
    record["timestamp"] = time.time() * 1000
    lines[leaf_line] = json.dumps(record)
    backup.write_text("\n".join(lines) + "\n")

    target = _memory()
    with pytest.raises(ValueError, match=f"node {record['id']}: timestamp .* looks like milliseconds"):
        target.import_jsonl(backup)
    assert len(target) == 0
    db = tmp_path / "target.db"
    done = memtree("import", backup, db=db)
    assert done.returncode != 0
    assert "looks like milliseconds" in done.stderr


# -- D2: a model reply that cannot be stored ------------------------------------------------------


@pytest.mark.parametrize("bad", ["lone surrogate \ud800 here", "a NUL \x00 byte"])
@pytest.mark.parametrize("backend", ["memory", "sqlite", "postgres"])
def test_a_reply_that_cannot_be_stored_is_an_aggregation_failure(
    bad: str, backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    from memtree.llm import CallableChatModel
    from memtree.retry import NO_RETRIES

    replies = iter([bad] * 100)
    model = CallableChatModel(lambda prompt: next(replies), retry=NO_RETRIES)
    config = MemTreeConfig(theta0=0.1)
    if backend == "memory":
        memory = MemTree(embedder=HashingEmbedder(64), llm=model, config=config)
    else:
        location = tmp_path / "m.db" if backend == "sqlite" else request.getfixturevalue("postgres_dsn")
        memory = MemTree.open(location, embedder=HashingEmbedder(64), llm=model, config=config)
    texts = [f"Alice's cat number {i} likes tuna and naps." for i in range(10)]
    with memory:
        ids = [memory.add(text) for text in texts]
        assert len(set(ids)) == 10 and sorted(leaf.text for leaf in memory.leaves()) == sorted(texts)
        summaries = [node for node in memory.walk() if not node.is_leaf and not node.is_root]
        assert summaries and all(node.stale for node in summaries)
        assert not any("\x00" in node.text or "\ud800" in node.text for node in memory.walk())
        assert memory.check_integrity() == []
        assert memory.stats().aggregation_failures >= 1
        backup = tmp_path / "backup.jsonl"
        memory.export_jsonl(backup)
    again = MemTree(embedder=HashingEmbedder(64))
    again.import_jsonl(backup)
    assert sorted(leaf.text for leaf in again.leaves()) == sorted(texts)


# -- D4: a duplicate is the same text, metadata and source id -------------------------------------


def test_the_same_text_for_another_tenant_is_another_memory() -> None:
    memory = _memory()
    tenant_a = memory.add("The meeting moved to Friday.", metadata={"tenant": "A"})
    tenant_b = memory.add("The meeting moved to Friday.", metadata={"tenant": "B"})
    assert tenant_b != tenant_a
    assert memory.get(tenant_b).metadata == {"tenant": "B"}
    memory.delete(tenant_b)  # deleting B's memory leaves A's
    assert [(leaf.id, leaf.metadata) for leaf in memory.leaves()] == [(tenant_a, {"tenant": "A"})]
    # the same text, metadata (in any key order) and source id is a duplicate
    first = memory.add("Lunch at noon.", metadata={"a": 1, "b": [1, 2]}, source_id="m-1")
    assert memory.add("Lunch at noon.", metadata={"b": [1, 2], "a": 1}, source_id="m-1") == first
    assert memory.add_many(["Lunch at noon."], metadata=[{"a": 1, "b": [1, 2]}], source_ids=["m-1"]) == [first]
    others = [
        memory.add("Lunch at noon.", metadata={"a": 1, "b": [1, 2]}, source_id="m-2"),
        memory.add("Lunch at noon.", metadata={"a": 1, "b": [1, 2]}),
        memory.add("Lunch at noon.", metadata={"a": 2, "b": [1, 2]}, source_id="m-1"),
    ]
    assert len({first, *others}) == 4
    # they are near-duplicate siblings: one summary holds them all
    parents = {memory.get(node_id).parent for node_id in [first, *others]}
    assert len(parents) == 1


def test_a_memory_block_shared_by_sessions_keeps_each_sessions_message() -> None:
    import asyncio

    from llama_index.core.base.llms.types import ChatMessage

    from llamaindex_memtree import MemTreeMemoryBlock

    block = MemTreeMemoryBlock(memory=_memory(), token_limit=200, similarity_top_k=4)

    def said(text: str, session: str) -> ChatMessage:
        return ChatMessage(role="user", content=text, additional_kwargs={"session_id": session})

    asyncio.run(block.aput([said("I moved to Lisbon in May.", "A")]))
    asyncio.run(block.aput([said("I moved to Lisbon in May.", "B")]))
    assert sorted(leaf.metadata["session_id"] for leaf in block.memory.leaves()) == ["A", "B"]
    question = [ChatMessage(role="user", content="Where did I move?")]
    assert asyncio.run(block.aget(question, session_id="B")) == "user: I moved to Lisbon in May."
    assert asyncio.run(block.aget(question, session_id="A")) == "user: I moved to Lisbon in May."


# -- D6: huge finite embedding values --------------------------------------------------------------


class _Scaled(HashingEmbedder):
    """Hashing directions multiplied by a huge (finite) factor."""

    def __init__(self, factor: float) -> None:
        super().__init__(64)
        self.factor = factor

    def embed(self, texts):  # type: ignore[no-untyped-def]
        import numpy as np

        return HashingEmbedder.embed(self, texts).astype(np.float64) * self.factor


@pytest.mark.parametrize("factor", [1e20, 3e38, 1e300, 1e-300])
def test_huge_finite_embeddings_keep_their_direction(factor: float) -> None:
    import numpy as np

    memory = MemTree(embedder=_Scaled(factor), config=MemTreeConfig(theta0=0.1))
    ids = memory.add_many(["apples are red", "bananas are yellow", "apples grow on trees"])
    assert memory.check_integrity() == []
    expected = HashingEmbedder(64).embed(["apples are red"])[0]
    assert np.allclose(memory.get(ids[0]).embedding, expected, atol=1e-6)  # type: ignore[arg-type]
    assert memory.retrieve("apples are red", k=1, leaves_only=True)[0].id == ids[0]


def test_a_remote_embedder_with_huge_values_is_normalized_too() -> None:
    import numpy as np

    from memtree.models.base import EmbeddingBatch, RemoteEmbedder

    class Huge(RemoteEmbedder):
        def _embed_batch(self, texts: list[str], timeout: float | None) -> EmbeddingBatch:
            return EmbeddingBatch(HashingEmbedder(64).embed(texts).astype(np.float64) * 3e38)

    vectors = Huge().embed(["apples are red", "bananas"])
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0)
    memory = MemTree(embedder=Huge(), config=MemTreeConfig(theta0=0.1))
    memory.add_many(["apples are red", "bananas are yellow", "apples grow on trees"])
    assert memory.check_integrity() == []


# -- D10: rough edges get named errors -------------------------------------------------------------


def test_a_surrogate_in_source_id_is_a_named_value_error() -> None:
    memory = _memory()
    with pytest.raises(ValueError, match=r"source_id is not valid Unicode \(surrogates not allowed at 3\)"):
        memory.add("hello there", source_id="msg\ud800")
    assert len(memory) == 0


def test_metadata_nested_thousands_deep_is_a_named_value_error() -> None:
    deep: dict[str, object] = {}
    inner = deep
    for _ in range(5000):
        inner["x"] = {}
        inner = inner["x"]  # type: ignore[assignment]
    memory = _memory()
    with pytest.raises(ValueError, match="metadata nests more than 64 levels of dicts and lists; flatten it"):
        memory.add("hello there", metadata=deep)
    cycle: list[object] = []
    cycle.append(cycle)
    with pytest.raises(ValueError, match="nests more than 64 levels"):
        memory.add("hello there", metadata={"loop": cycle})
    fine: dict[str, object] = {"x": 1}
    for _ in range(60):
        fine = {"x": fine}
    assert memory.add("hello there", metadata=fine)


def test_a_nan_query_vector_is_blamed_on_the_vector_not_the_embedder() -> None:
    import numpy as np

    memory = _memory()
    memory.add("apples are red")
    vector = memory.embed_query("apples")
    vector[3] = np.nan
    with pytest.raises(ValueError, match=r"^query_embedding contains NaN or infinite values$"):
        memory.retrieve("apples", query_embedding=vector)
    with pytest.raises(ValueError, match="query_embedding must be one vector"):
        memory.retrieve("apples", query_embedding=[[0.1] * 64, [0.2] * 64])
    with pytest.raises(ValueError, match="embedding dimension 3 does not match this memory's 64"):
        memory.retrieve("apples", query_embedding=[0.1, 0.2, 0.3])


def test_min_score_nan_is_refused() -> None:
    memory = _memory()
    memory.add("apples are red")
    with pytest.raises(ValueError, match="min_score is NaN, which no score can be compared with"):
        memory.retrieve("apples", min_score=float("nan"))
    with pytest.raises(TypeError, match="min_score must be a number, got str"):
        memory.retrieve("apples", min_score="0.5")  # type: ignore[arg-type]
    assert memory.retrieve("apples", min_score=-1)


@pytest.mark.parametrize("text", ["\u200b", "\u200b\u200c\u200d\u2060\ufeff", " \u200b\n\u200d "])
def test_text_of_only_zero_width_characters_is_empty(text: str) -> None:
    memory = _memory()
    with pytest.raises(ValueError, match=r"text is empty or whitespace-only \(zero-width characters count as space\)"):
        memory.add(text)
    with pytest.raises(ValueError, match="query is empty or whitespace-only"):
        memory.retrieve(text)
    assert memory.add("caf\u00e9\u200b au lait")  # a zero-width character inside words is kept


def test_stats_shows_nested_and_slashed_namespaces_apart(tmp_path: Path) -> None:
    db = tmp_path / "m.db"
    with MemTree.open(db, embedder=HashingEmbedder(64)) as memory:
        memory.with_namespace("a/b").add("one slashed name")
        memory.with_namespace(("a", "b")).add("a nested name")
    done = memtree("stats", "--json", db=db)
    assert done.returncode == 0, done.stderr
    assert sorted(json.loads(done.stdout)["namespaces"]) == ["a/b", "a\\/b"]
    table = memtree("stats", db=db)
    assert "a\\/b" in table.stdout
    slashed = memtree("query", "slashed", "--json", "--namespace", "a\\/b", db=db)
    assert [hit["text"] for hit in json.loads(slashed.stdout)] == ["one slashed name"]
    nested = memtree("query", "nested", "--json", "--namespace", "a/b", db=db)
    assert [hit["text"] for hit in json.loads(nested.stdout)] == ["a nested name"]


# -- D5: a failing or hanging model ----------------------------------------------------------------


class _Model:
    """A chat model function that merges the prompt's entries, or fails, or hangs, on demand."""

    def __init__(self) -> None:
        import threading

        self.mode = "ok"
        self.calls = 0
        self.lock = threading.Lock()
        self.arrived = threading.Condition()
        self.expected = 0
        self.met: list[bool] = []
        self.release = threading.Event()

    def __call__(self, prompt: str) -> str:
        with self.lock:
            self.calls += 1
        if self.mode == "fail":
            raise ConnectionError("the model is down")
        if self.mode == "gate":  # fail once every expected call is in flight at the same time
            with self.arrived:
                self.expected -= 1
                self.arrived.notify_all()
                self.met.append(self.arrived.wait_for(lambda: self.expected <= 0, timeout=5))
            raise ConnectionError("the model is down")
        if self.mode == "hang":
            self.release.wait(30)
            raise ConnectionError("the model gave up")
        return " ".join(line[2:] for line in prompt.splitlines() if line.startswith("- "))[:400]


def _model_memory(model: _Model, policy: object) -> MemTree:
    from memtree.llm import CallableChatModel

    llm = CallableChatModel(model, retry=policy)  # type: ignore[arg-type]
    return MemTree(embedder=HashingEmbedder(64), llm=llm, config=MemTreeConfig(theta0=0.3, deduplicate=False))


def test_stale_summaries_on_one_path_are_retried_concurrently() -> None:
    from conftest import path_to_root

    from memtree.retry import RetryPolicy

    model = _Model()
    memory = _model_memory(model, RetryPolicy(max_attempts=1, breaker_failures=0))
    ids = memory.add_many([f"Alice's cat Miso likes tuna fish {i}" for i in range(12)])
    deepest = max(ids, key=lambda node_id: len(path_to_root(memory, node_id)))
    text = memory.get(deepest).text
    model.mode = "fail"
    failed = memory.add(text)
    path = path_to_root(memory, failed)
    assert len(path) >= 3 and all(memory.get(node_id).stale for node_id in path)

    model.mode, model.expected = "gate", len(path)
    again = memory.add(text)
    assert path_to_root(memory, again) == path  # the same stale path, rewritten again
    assert model.met == [True] * len(path)  # every stale summary's call was in flight at once
    assert all(memory.get(node_id).stale for node_id in path)

    model.mode, calls = "ok", model.calls
    last = memory.add(text)
    assert path_to_root(memory, last) == path
    assert model.calls - calls == len(path)  # one call per summary: rebuilt whole in one round
    assert not any(node.stale for node in memory.walk())
    assert memory.check_integrity() == []


def test_a_circuit_breaker_stops_calling_a_failing_model_and_repair_works_when_it_is_back() -> None:
    from memtree.retry import RetryPolicy

    model = _Model()
    policy = RetryPolicy(max_attempts=2, initial_delay=0.0, breaker_failures=3, breaker_cooldown=60.0)
    memory = _model_memory(model, policy)
    now = [1000.0]
    breaker = memory.aggregator.model.breaker  # type: ignore[attr-defined]
    breaker.clock = lambda: now[0]
    memory.add_many([f"Alice's cat Miso likes tuna fish {i}" for i in range(6)])
    model.mode = "fail"
    for i in range(6):
        memory.add(f"Bob's dog Rex chases the red ball {i}")
    assert breaker.is_open()
    calls = model.calls
    ids = [memory.add(f"Carol's parrot Kiwi sings at dawn {i}") for i in range(10)]
    assert model.calls == calls  # the open breaker costs an add no model call
    assert len(memory) == 22 and all(memory.get(node_id).is_leaf for node_id in ids)
    assert any(node.stale for node in memory.walk())
    assert memory.repair() == 0 and model.calls == calls  # still open: nothing is called, nothing lost

    model.mode = "ok"
    now[0] += 61.0  # the cooldown passes; the model is back
    assert memory.repair() > 0
    assert not any(node.stale for node in memory.walk())
    assert memory.check_integrity() == []
    assert not breaker.is_open()


def test_a_hanging_model_leaves_a_bounded_number_of_threads() -> None:
    import threading

    from memtree.retry import MAX_OVERRUNNING_CALLS, RetryPolicy, overrunning_calls

    model = _Model()
    memory = _model_memory(model, RetryPolicy(max_attempts=3, initial_delay=0.0, timeout=0.05, breaker_failures=0))
    name = memory.aggregator.model.name  # type: ignore[attr-defined]
    memory.add_many([f"Alice's cat Miso likes tuna fish {i}" for i in range(4)])
    model.mode = "hang"
    try:
        ids = [memory.add(f"Bob's dog Rex chases the red ball {i}") for i in range(12)]
        assert len(set(ids)) == 12 and len(memory) == 16
        hanging = [t for t in threading.enumerate() if t.name == "memtree-model-call"]
        # at most the limit, plus the calls already in flight when it was reached
        bound = MAX_OVERRUNNING_CALLS + memory.config.max_concurrency
        assert MAX_OVERRUNNING_CALLS <= overrunning_calls(name) <= bound
        assert len(hanging) <= bound
    finally:
        model.release.set()
    for thread in hanging:
        thread.join(10)
    assert overrunning_calls(name) == 0
