"""Durable memories opened by the LlamaIndex adapters use ``Settings``' models, and a
store built by another model is refused."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from llama_index.core import Document, Settings, StorageContext, load_index_from_storage
from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.embeddings import MockEmbedding
from llama_index.core.llms import MockLLM
from llamaindex_corpus import WordsEmbedding

from llamaindex_memtree import MemTreeIndex, MemTreeMemoryBlock, open_memory
from memtree import HashingEmbedder, MemTree, MemTreeConfig

NOTES = ["Pepper the greyhound is scared of bicycles.", "Leo ate tonkotsu ramen in Kyoto."]


@pytest.fixture
def words(monkeypatch: pytest.MonkeyPatch) -> WordsEmbedding:
    """``Settings.embed_model`` set to an offline model; ``Settings.llm`` not set."""
    embed = WordsEmbedding()
    monkeypatch.setattr(Settings, "_embed_model", embed)
    monkeypatch.setattr(Settings, "_llm", None)
    return embed


def test_open_memory_embeds_and_summarizes_with_the_settings_models(
    monkeypatch: pytest.MonkeyPatch, words: WordsEmbedding, tmp_path: Path
) -> None:
    llm = MockLLM(max_tokens=12)
    monkeypatch.setattr(Settings, "_llm", llm)
    with open_memory(tmp_path / "chat.db", config=MemTreeConfig(theta0=0.1)) as memory:
        assert memory.embedder.embedding is words  # type: ignore[attr-defined]
        assert memory.aggregator.calls_model
        memory.add_many([*NOTES, "Pepper the greyhound naps after her walk."])
        assert memory.dimension == 64 and memory.stats().llm_calls > 0
    with open_memory(tmp_path / "chat.db") as memory:  # reopened: same model, same tree
        assert memory.stored_embedder == memory.embedder.name
        assert memory.retrieve("ramen in Kyoto", k=1, leaves_only=True)[0].text == NOTES[1]


def test_models_passed_to_open_memory_win_over_settings(words: WordsEmbedding, tmp_path: Path) -> None:
    with open_memory(tmp_path / "own.db", embedder=HashingEmbedder(32), llm=lambda prompt: "summary") as memory:
        assert memory.embedder.name == HashingEmbedder(32).name
        assert memory.aggregator.calls_model


def test_open_memory_without_settings_models_takes_the_engine_defaults(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(Settings, "_embed_model", None)
    monkeypatch.setattr(Settings, "_llm", None)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with open_memory(tmp_path / "plain.db") as memory:
        assert type(memory.embedder).__name__ == "LocalEmbedder"
        assert type(memory.aggregator).__name__ == "ExtractiveAggregator"
    assert Settings._embed_model is None  # LlamaIndex's lazy OpenAI default was never resolved


def test_a_store_built_by_another_model_is_refused(
    monkeypatch: pytest.MonkeyPatch, words: WordsEmbedding, tmp_path: Path
) -> None:
    path = tmp_path / "chat.db"
    with open_memory(path) as memory:
        memory.add_many(NOTES)
        built_with = memory.embedder.name
    monkeypatch.setattr(Settings, "_embed_model", MockEmbedding(embed_dim=8))
    with pytest.raises(ValueError) as caught:
        open_memory(path)
    message = str(caught.value)
    assert f"holds vectors of {built_with}, but Settings.embed_model is LlamaIndexEmbedder(" in message
    assert "Set Settings.embed_model to the model the memory was built with, or pass embedder=" in message
    with pytest.raises(ValueError, match=r"but the embedder= given is HashingEmbedder"):
        open_memory(path, embedder=HashingEmbedder(64))
    with pytest.raises(ValueError, match="holds vectors of"):
        MemTreeMemoryBlock(memory=str(path))
    monkeypatch.setattr(Settings, "_embed_model", words)
    with open_memory(path) as memory:  # nothing was written by the refused opens
        assert sorted(leaf.text for leaf in memory.leaves()) == sorted(NOTES)


def test_a_memory_block_given_a_path_remembers_across_runs_with_the_settings_model(
    words: WordsEmbedding, tmp_path: Path
) -> None:
    path = str(tmp_path / "chat.db")
    block = MemTreeMemoryBlock(memory=path, token_limit=100)
    assert block.memory.embedder.embedding is words  # type: ignore[attr-defined]
    asyncio.run(block.aput([ChatMessage(role="user", content=text) for text in NOTES]))
    block.memory.close()
    again = MemTreeMemoryBlock(memory=path, token_limit=100, session_scoped=False)
    found = asyncio.run(again.aget([ChatMessage(role="user", content="Which dog fears bicycles?")]))
    assert found.splitlines()[0] == f"user: {NOTES[0]}"
    again.memory.close()


def test_an_index_given_a_path_builds_there_and_reopens_in_its_namespace(words: WordsEmbedding, tmp_path: Path) -> None:
    path = tmp_path / "docs.db"
    config = MemTreeConfig(deduplicate=False, k=3)
    memory = open_memory(path, namespace=("docs", "notes"), config=config)
    index = MemTreeIndex.from_documents([Document(text=text) for text in NOTES], memory=memory)
    index.storage_context.persist(tmp_path / "storage")
    memory.close()
    storage = StorageContext.from_defaults(persist_dir=str(tmp_path / "storage"))
    loaded = load_index_from_storage(storage, memory=str(path))  # namespace and config from the index
    assert isinstance(loaded, MemTreeIndex)
    assert loaded.memory.namespace == ("docs", "notes") and loaded.memory.config.k == 3
    assert loaded.memory.embedder.embedding is words  # type: ignore[attr-defined]
    hits = loaded.as_retriever(similarity_top_k=1, leaves_only=True).retrieve("ramen in Kyoto")
    assert hits[0].node.get_content() == NOTES[1]
    loaded.memory.close()
    fresh = MemTreeIndex.from_documents([Document(text=NOTES[0])], memory=str(tmp_path / "new.db"))
    assert fresh.memory.namespace == ("default",) and fresh.memory.config.deduplicate is False
    fresh.memory.close()
    with MemTree.open(tmp_path / "new.db") as other:  # no model passed: it stands for the one that built it
        assert other.stored_embedder == other.embedder.name == words_name(words)


def words_name(embed: WordsEmbedding) -> str:
    return MemTree(embedder=embed).embedder.name
