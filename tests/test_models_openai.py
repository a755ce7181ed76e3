"""OpenAI models against a local OpenAI-compatible server: the real openai client,
batching and long inputs, keys and URLs from the environment, retries on every fault,
stale marking and repair, path-parallel calls, and the costs reported in stats()."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import path_to_root
from openai_server import FakeOpenAIServer, default_reply

from memtree import ExtractiveAggregator, HashingEmbedder, LLMAggregator, LocalEmbedder, MemoryBackend, MemTree
from memtree import MemTreeConfig as Config
from memtree.models import MissingAPIKeyError, OpenAIChatModel, OpenAIEmbedder
from memtree.models import resolve as resolve_module
from memtree.retry import RetryPolicy

FAST = RetryPolicy(max_attempts=4, initial_delay=0.0, timeout=10.0)

NOTES = [
    "Mira repaired the old bicycle in the garage",
    "Mira painted the old bicycle bright red",
    "Mira rode the red bicycle to the lake",
    "Mira locked the red bicycle at the lake",
    "Mira lost the key of the bicycle lock",
    "Mira found the key of the bicycle lock in her coat",
    "Mira sold the red bicycle to her neighbour",
]


def server_memory(server: FakeOpenAIServer, retry: RetryPolicy = FAST, **config: object) -> MemTree:
    """A memory on the fake server whose texts all descend as deep as they can, so an
    insert rewrites several summaries."""
    options = {"theta0": -1.0, "near_duplicate": 1.0, **config}
    return MemTree(
        embedder=OpenAIEmbedder(**server.client_options(), dimensions=32, retry=retry),
        llm=OpenAIChatModel(**server.client_options(), retry=retry),
        config=Config(**options),  # type: ignore[arg-type]
    )


def test_embedder_returns_the_servers_vectors_in_order_and_batches_within_limits(
    openai_server: FakeOpenAIServer,
) -> None:
    embedder = OpenAIEmbedder(**openai_server.client_options(), dimensions=32, batch_size=3, retry=FAST)
    texts = [f"note number {i} about tea" for i in range(7)]
    np.testing.assert_allclose(embedder.embed(texts), HashingEmbedder(32).embed(texts), atol=1e-6)
    assert openai_server.count("embeddings") == 3
    assert [text for r in openai_server.requests for text in r.body["input"]] == texts  # nothing dropped
    assert {(r.body["model"], r.body["dimensions"]) for r in openai_server.requests} == {("text-embedding-3-small", 32)}
    np.testing.assert_allclose(embedder.embed_query(texts[2]), HashingEmbedder(32).embed([texts[2]])[0], atol=1e-6)

    openai_server.reset()
    by_words = OpenAIEmbedder(
        **openai_server.client_options(), max_request_tokens=10, token_counter=lambda t: len(t.split())
    )
    by_words.embed(["a b c d", "e f g h", "i j k"])
    assert [r.body["input"] for r in openai_server.requests] == [["a b c d", "e f g h"], ["i j k"]]


def test_long_inputs_are_split_and_averaged_or_truncated_with_a_warning(
    openai_server: FakeOpenAIServer, caplog: pytest.LogCaptureFixture
) -> None:
    count = lambda text: len(text.split())  # noqa: E731
    long_text = "one two three four five six seven eight nine ten"
    pieces = ["one two three four", "five six seven eight", "nine ten"]
    embedder = OpenAIEmbedder(**openai_server.client_options(), dimensions=32, max_input_tokens=4, token_counter=count)
    with caplog.at_level("WARNING", logger="memtree.models.openai"):
        vectors = embedder.embed([long_text, "short text"])
    assert "exceeds the 4-token input limit; embedding it as 3 pieces and averaging" in caplog.text
    assert openai_server.requests[0].body["input"] == [*pieces, "short text"]
    hashed = HashingEmbedder(32).embed(pieces)
    expected = 4 * hashed[0] + 4 * hashed[1] + 2 * hashed[2]
    np.testing.assert_allclose(vectors[0], expected / np.linalg.norm(expected), atol=1e-6)
    np.testing.assert_allclose(vectors[1], HashingEmbedder(32).embed(["short text"])[0], atol=1e-6)

    openai_server.reset()
    truncating = OpenAIEmbedder(
        **openai_server.client_options(), max_input_tokens=4, token_counter=count, long_inputs="truncate"
    )
    truncating.embed([long_text])
    assert openai_server.requests[0].body["input"] == pieces[:1]


def test_key_and_base_url_come_from_the_environment(
    openai_server: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "key-from-env")
    monkeypatch.setenv("OPENAI_BASE_URL", openai_server.url)
    assert OpenAIChatModel(retry=FAST).complete("hello there").text == "Reply: hello there"
    assert OpenAIEmbedder(retry=FAST).embed(["hello"]).shape == (1, openai_server.dimension)
    assert {r.headers["authorization"] for r in openai_server.requests} == {"Bearer key-from-env"}


def test_asking_for_openai_without_a_key_fails_before_any_work() -> None:
    store = MemoryBackend()
    for build in (
        lambda: OpenAIEmbedder(),
        lambda: OpenAIChatModel(),
        lambda: MemTree(embedder="openai", store=store),
        lambda: MemTree(embedder=HashingEmbedder(), llm="openai:gpt-4o", store=store),
    ):
        with pytest.raises(MissingAPIKeyError, match="set OPENAI_API_KEY or pass api_key="):
            build()
    assert store.list_namespaces() == []


def test_an_api_key_in_the_environment_never_chooses_openai(
    openai_server: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A key set for the user's chat model must not turn a memory into a paid one:
    left out, the models are offline; OpenAI is used when asked for by name."""
    monkeypatch.setattr(resolve_module, "_announced", set())
    monkeypatch.setenv("OPENAI_API_KEY", openai_server.api_key)
    monkeypatch.setenv("OPENAI_BASE_URL", openai_server.url)
    with caplog.at_level("INFO", logger="memtree"):
        memory, _again = MemTree(), MemTree()
    assert isinstance(memory.embedder, LocalEmbedder) and isinstance(memory.aggregator, ExtractiveAggregator)
    assert caplog.text.count("embedding offline with all-MiniLM-L6-v2") == 1  # logged once
    assert "OpenAI" not in caplog.text
    asked = MemTree(embedder="openai", llm="openai")
    assert isinstance(asked.embedder, OpenAIEmbedder) and asked.embedder.model == "text-embedding-3-small"
    assert isinstance(asked.aggregator, LLMAggregator) and isinstance(asked.aggregator.model, OpenAIChatModel)
    asked.add("Mira rode the red bicycle to the lake")
    asked.add("Mira rode the red bicycle to the park")
    assert openai_server.count("embeddings") >= 2 and openai_server.count("chat") >= 1


def test_stats_count_calls_tokens_and_retries_as_the_server_saw_them(openai_server: FakeOpenAIServer) -> None:
    memory = server_memory(openai_server)
    for note in NOTES[:5]:
        memory.add(note)
    stats = memory.stats()
    prompts = openai_server.prompts()
    embedded = [text for r in openai_server.requests if r.endpoint == "embeddings" for text in r.body["input"]]
    assert stats.llm_calls == len(prompts) == stats.extra["llm_requests"]
    assert stats.prompt_tokens == sum(len(prompt.split()) for prompt in prompts)
    assert stats.completion_tokens == sum(len(default_reply(prompt).split()) for prompt in prompts)
    assert stats.embedding_tokens == sum(len(text.split()) for text in embedded)
    assert stats.embedding_calls == openai_server.count("embeddings") == stats.extra["embedding_requests"]
    assert stats.retries == 0
    assert stats.llm_calls_per_insert == pytest.approx(stats.llm_calls / 5)
    assert stats.prompt_tokens_per_insert == pytest.approx(stats.prompt_tokens / 5)
    assert stats.as_dict()["completion_tokens_per_insert"] == pytest.approx(stats.completion_tokens / 5)

    openai_server.fail_next("429", endpoint="chat", retry_after_ms=1)
    openai_server.fail_next("500", endpoint="embeddings")
    memory.add(NOTES[5])
    stats = memory.stats()
    assert stats.retries == 2 and stats.stale == 0
    assert stats.extra["llm_requests"] == stats.llm_calls + 1


@pytest.mark.parametrize("fault", ["429", "500", "503", "malformed", "empty", "stall"])
def test_every_transient_fault_is_retried_and_the_insert_completes(openai_server: FakeOpenAIServer, fault: str) -> None:
    retry = RetryPolicy(max_attempts=3, initial_delay=0.0, timeout=0.5)
    memory = server_memory(openai_server, retry)
    for note in NOTES[:3]:
        memory.add(note)
    openai_server.fail_next(fault, endpoint="chat")
    openai_server.fail_next(fault, endpoint="embeddings")
    leaf = memory.add(NOTES[3])
    openai_server.release()
    stats = memory.stats()
    assert stats.retries == 2
    assert stats.stale == 0 and stats.aggregation_failures == 0
    assert memory.get(leaf).text == NOTES[3] and len(memory) == 4
    assert memory.check_integrity() == []


def test_when_retries_run_out_the_leaf_is_kept_its_ancestors_stale_never_emptied_and_repair_fixes_them(
    openai_server: FakeOpenAIServer,
) -> None:
    memory = server_memory(openai_server, RetryPolicy(max_attempts=2, initial_delay=0.0, timeout=10.0))
    for note in NOTES[:4]:
        memory.add(note)
    before = {node.id: node.text for node in memory.walk()}
    openai_server.fail_next("empty", times=1000, endpoint="chat")  # the model only ever answers ""
    leaf = memory.add(NOTES[4])
    assert memory.get(leaf).text == NOTES[4]
    path = path_to_root(memory, leaf)
    assert len(path) >= 3
    for node_id in path:
        node = memory.get(node_id)
        assert node.stale and node.text.strip()
        assert node.text == before[node_id] if node_id in before else NOTES[4] in node.text
    stats = memory.stats()
    assert stats.stale == len(path) and stats.aggregation_failures == len(path)
    assert stats.retries == len(path)  # one retry each, then given up
    assert memory.check_integrity() == []

    openai_server.reset()  # the model recovers
    assert memory.repair() == len(path)
    assert memory.stats().stale == 0
    assert all(NOTES[4].split()[0] in memory.get(node_id).text for node_id in path)


def test_a_bad_request_is_not_retried(openai_server: FakeOpenAIServer) -> None:
    memory = server_memory(openai_server)
    for note in NOTES[:3]:
        memory.add(note)
    openai_server.fail_next("400", endpoint="chat")
    memory.add(NOTES[3])
    stats = memory.stats()
    assert openai_server.count("chat", status=400) == 1
    assert stats.retries == 0 and stats.stale == 1 and len(memory) == 4


def insert_width(server: FakeOpenAIServer) -> int:
    """How many summaries the last of NOTES rewrites (the server's replies are
    deterministic, so a dry run on another memory gives the same tree)."""
    dry = server_memory(server)
    for note in NOTES[:-1]:
        dry.add(note)
    width = len(path_to_root(dry, dry.add(NOTES[-1])))
    server.reset()
    return width


def test_the_summaries_of_one_insert_are_written_concurrently(openai_server: FakeOpenAIServer) -> None:
    width = insert_width(openai_server)
    assert width >= 4
    memory = server_memory(openai_server)
    for note in NOTES[:-1]:
        memory.add(note)
    openai_server.reset()
    openai_server.gate(width)  # each call waits until all `width` are in flight
    memory.add(NOTES[-1])
    assert openai_server.max_in_flight == width
    assert openai_server.count("chat", status=500) == 0 and memory.stats().stale == 0


async def test_async_inserts_write_summaries_concurrently_and_retry(openai_server: FakeOpenAIServer) -> None:
    width = insert_width(openai_server)
    memory = server_memory(openai_server)
    await memory.aadd_many(NOTES[:-1])
    openai_server.reset()
    openai_server.gate(width)
    openai_server.fail_next("429", endpoint="embeddings", retry_after_ms=1)
    leaf = await memory.aadd(NOTES[-1])
    assert openai_server.max_in_flight == width
    stats = memory.stats()
    assert stats.stale == 0 and stats.retries == 1
    hits = await memory.aretrieve(NOTES[-1], k=1)
    assert hits[0].id == leaf


def test_max_concurrency_one_is_the_papers_sequential_procedure(openai_server: FakeOpenAIServer) -> None:
    memory = server_memory(openai_server, max_concurrency=1)
    for note in NOTES:
        memory.add(note)
    assert openai_server.max_in_flight == 1
    assert memory.stats().aggregation_calls_per_insert > 1


def test_opening_a_file_with_openai_but_no_key_creates_no_file(tmp_path) -> None:
    for options in ({"embedder": "openai"}, {"embedder": HashingEmbedder(), "llm": "openai"}):
        with pytest.raises(MissingAPIKeyError, match="set OPENAI_API_KEY"):
            MemTree.open(tmp_path / "memory.db", **options)
        assert list(tmp_path.iterdir()) == []
