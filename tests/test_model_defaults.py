"""No implicit paid models: the environment never chooses a model, a new memory is
offline unless the caller names one, and an existing memory opens with the
embedder that built it; another embedder is a named error saying what to pass."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_runner import as_json, memtree, ok
from openai_server import FakeOpenAIServer

from memtree import EmbedderMismatchError, ExtractiveAggregator, HashingEmbedder, LocalEmbedder, MemTree
from memtree.models import OpenAIEmbedder

FACTS = ["Maya adopted a greyhound called Pepper.", "Pepper is scared of bicycles.", "Leo ate ramen in Kyoto."]


def test_a_new_memory_is_offline_whatever_the_environment_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-for-the-users-chat-model")
    memory = MemTree()
    assert isinstance(memory.embedder, LocalEmbedder) and isinstance(memory.aggregator, ExtractiveAggregator)


def test_an_existing_memory_opens_with_the_embedder_that_built_it(tmp_path: Path) -> None:
    path = tmp_path / "memory.db"
    with MemTree.open(path, embedder=HashingEmbedder(32)) as built:
        built.add_many(FACTS)
    with MemTree.open(path) as reopened:  # no embedder passed: the stored one, not the default model
        assert reopened.embedder.name == reopened.stored_embedder == "HashingEmbedder(32)"
        assert reopened.retrieve("Pepper bicycles", k=1, min_similarity=None)[0].text == FACTS[1]
    with pytest.raises(EmbedderMismatchError, match=r"built with HashingEmbedder\(32\), but embedder= is") as info:
        MemTree.open(path, embedder=HashingEmbedder(64))
    assert "Leave embedder out to use the stored one" in str(info.value)
    with MemTree.open(path, namespace="another") as fresh:  # a new namespace takes the default
        assert isinstance(fresh.embedder, LocalEmbedder)


def test_a_mismatch_names_the_embedder_to_pass(tmp_path: Path) -> None:
    memory = MemTree(embedder=LocalEmbedder())
    memory.add(FACTS[0])
    with pytest.raises(EmbedderMismatchError, match="pass embedder='local'"):
        MemTree(store=memory.store, embedder=HashingEmbedder(384))


def test_an_openai_memory_reopens_with_its_own_model_and_needs_its_key_only_to_embed(
    tmp_path: Path, openai_server: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "openai.db"
    monkeypatch.setenv("OPENAI_BASE_URL", openai_server.url)
    monkeypatch.setenv("OPENAI_API_KEY", openai_server.api_key)
    with MemTree.open(path, embedder=OpenAIEmbedder("text-embedding-3-small", dimensions=32)) as built:
        built.add_many(FACTS)
    with MemTree.open(path) as reopened:
        assert isinstance(reopened.embedder, OpenAIEmbedder) and reopened.embedder.dimensions == 32
        assert reopened.retrieve("Pepper", k=1, min_similarity=None)
    monkeypatch.delenv("OPENAI_API_KEY")
    with MemTree.open(path) as keyless:  # what embeds nothing still works
        assert len(keyless) == 3 and keyless.stats().leaves == 3
        with pytest.raises(RuntimeError, match=r"built with OpenAIEmbedder\(text-embedding-3-small, dimensions=32\)"):
            keyless.retrieve("Pepper")


@pytest.mark.slow
def test_the_cli_queries_an_offline_memory_offline_with_a_key_set(tmp_path: Path) -> None:
    """``OPENAI_API_KEY=x memtree query`` on a memory built offline used to switch to
    OpenAI and fail with a connection error after retries."""
    db = str(tmp_path / "small.db")
    ok(memtree("add", "--embedder", "hashing:64", *FACTS, db=db))
    dead = {"OPENAI_API_KEY": "x", "OPENAI_BASE_URL": "http://127.0.0.1:9/v1"}  # nothing listens there
    found = as_json(ok(memtree("query", "What is Pepper scared of?", "--json", db=db, embedder=None, env=dead)))
    assert found and any("bicycles" in hit["text"] for hit in found)
