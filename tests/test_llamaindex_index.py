"""MemTreeIndex against real llama-index-core classes: build, insert, delete, refresh, engines."""

from __future__ import annotations

import json
import logging
import time
from datetime import timedelta

import pytest
from llama_index.core import Document, Settings
from llama_index.core.chat_engine.types import ChatMode
from llama_index.core.embeddings import MockEmbedding
from llama_index.core.llms import MockLLM
from llama_index.core.schema import TextNode
from llamaindex_corpus import DOCUMENTS, WordsEmbedding, documents, make_memory, sentence_splitter

from llamaindex_memtree import MemTreeIndex
from llamaindex_memtree import settings as settings_module
from llamaindex_memtree.settings import models_from_settings
from memtree import HashingEmbedder, MemTree, MemTreeConfig
from memtree.text import fold, split_sentences


def build(memory: MemTree | None = None, **kwargs: object) -> MemTreeIndex:
    return MemTreeIndex.from_documents(
        documents(),
        memory=memory if memory is not None else make_memory(),
        transformations=[sentence_splitter()],
        **kwargs,
    )


def all_sentences(memory: MemTree) -> set[str]:
    """Every sentence of every node, leaves and summaries."""
    return {fold(s) for node in memory.walk() if not node.is_root for s in split_sentences(node.text)}


def leaf_texts(memory: MemTree) -> list[str]:
    return [leaf.text for leaf in memory.leaves()]


def test_from_documents_makes_one_leaf_per_node_in_order_with_id_and_metadata() -> None:
    index = build()
    memory = index.memory
    leaves = memory.leaves()
    stored = index.docstore.get_nodes([leaf.source_id for leaf in leaves])
    assert [node.node_id for node in stored] == [leaf.source_id for leaf in leaves]
    assert [leaf.text for leaf in leaves] == [node.get_content() for node in stored]
    assert [leaf.metadata for leaf in leaves] == [node.metadata for node in stored]
    # inserted in document order, each document's chunks in their order
    assert [node.ref_doc_id for node in stored] == [doc_id for doc_id in DOCUMENTS for _ in range(2)]
    assert " ".join(leaf_texts(memory)) == " ".join(DOCUMENTS.values())
    assert memory.stats().max_depth >= 2  # topics grew summaries
    assert memory.check_integrity() == []


def test_constructor_from_nodes_keeps_ids_metadata_and_order() -> None:
    nodes = [
        TextNode(id_=f"n{i}", text=text, metadata={"position": i})
        for i, text in enumerate(["Pepper the greyhound fears bicycles.", "Leo ate ramen.", "Pepper loves rivers."])
    ]
    index = MemTreeIndex(nodes, memory=make_memory())
    leaves = index.memory.leaves()
    assert [(leaf.source_id, leaf.text, leaf.metadata) for leaf in leaves] == [
        (node.node_id, node.text, node.metadata) for node in nodes
    ]
    assert index.docstore.get_node("n1").get_content() == "Leo ate ramen."


def test_empty_documents_and_nodes_are_skipped_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="llamaindex_memtree"):
        index = MemTreeIndex.from_documents(
            [Document(text="Leo ate ramen in Kyoto.", doc_id="a"), Document(text="  \n", doc_id="blank")],
            memory=make_memory(),
        )
        index.insert(Document(text="", doc_id="empty"))
        index.insert_nodes([TextNode(id_="void", text=" ")])
    assert leaf_texts(index.memory) == ["Leo ate ramen in Kyoto."]
    messages = [record.getMessage() for record in caplog.records]
    assert "skipping document 'blank': its text is empty" in messages
    assert "skipping document 'empty': its text is empty" in messages
    assert "skipping node 'void': its text is empty" in messages
    assert set(index.ref_doc_info) == {"a"}
    assert index.docstore.get_node("void", raise_error=False) is None


def test_insert_adds_the_documents_nodes_and_ref_doc_info_lists_them() -> None:
    index = build()
    before = len(index.memory)
    index.insert(Document(text="Maya taught Pepper the greyhound to sit. Pepper sits for treats.", doc_id="dog-4"))
    assert len(index.memory) == before + 1  # one chunk at the default chunk size
    info = index.ref_doc_info
    assert set(info) == {*DOCUMENTS, "dog-4"}
    leaf = index.memory.get(index.memory.find(source_id=info["dog-4"].node_ids[0])[0])
    assert leaf.text == "Maya taught Pepper the greyhound to sit. Pepper sits for treats."


def test_delete_ref_doc_removes_its_leaves_and_every_trace_in_summaries() -> None:
    index = build()
    memory = index.memory
    gone = {fold(s) for s in split_sentences(DOCUMENTS["dog-2"])}
    assert gone <= all_sentences(memory)
    node_ids = index.ref_doc_info["dog-2"].node_ids
    calls = memory.stats().aggregation_calls
    index.delete_ref_doc("dog-2", delete_from_docstore=True)
    summaries = sum(1 for node in memory.walk() if not node.is_root and not node.is_leaf)
    assert 0 < memory.stats().aggregation_calls - calls <= summaries  # one change, each summary rewritten once
    assert all(memory.find(source_id=node_id) == [] for node_id in node_ids)
    assert not gone & all_sentences(memory)  # no summary keeps the deleted text
    assert len(memory) == 12
    assert "dog-2" not in index.ref_doc_info
    assert index.docstore.get_node(node_ids[0], raise_error=False) is None
    assert memory.check_integrity() == []
    # the other documents are untouched
    assert " ".join(leaf_texts(memory)) == " ".join(t for d, t in DOCUMENTS.items() if d != "dog-2")


async def test_adelete_ref_doc_and_ainsert_use_the_async_engine() -> None:
    index = build()
    await index.adelete_ref_doc("ramen-1", delete_from_docstore=True)
    assert "ramen-1" not in index.ref_doc_info
    await index.ainsert(Document(text="Leo found a ramen bar in Osaka.", doc_id="ramen-3"))
    assert "Leo found a ramen bar in Osaka." in leaf_texts(index.memory)
    assert index.memory.check_integrity() == []


def test_update_ref_doc_replaces_the_documents_leaves() -> None:
    index = build()
    first, second = index.ref_doc_info["hike-1"].node_ids
    (first_leaf,) = index.memory.find(source_id=first)
    index.update_ref_doc(Document(text="Ana hiked the Camino in Spain.", doc_id="hike-1", metadata={"topic": "hike"}))
    texts = leaf_texts(index.memory)
    assert "Ana hiked the Camino in Spain." in texts
    assert "Ana hiked the Rota Vicentina trail in Portugal." not in texts
    assert fold("The trail follows the Atlantic cliffs.") not in all_sentences(index.memory)
    # The one new node keeps the first old node's id and leaf; the second old node is gone.
    assert index.ref_doc_info["hike-1"].node_ids == [first]
    assert index.memory.find(source_id=first) == [first_leaf] and index.memory.find(source_id=second) == []
    assert index.docstore.get_node(first).get_content() == "Ana hiked the Camino in Spain."
    assert [v.text for v in index.memory.history(first_leaf)] == ["Ana hiked the Rota Vicentina trail in Portugal."]
    assert index.memory.check_integrity() == []


def test_update_ref_doc_with_more_nodes_keeps_the_old_ids_and_adds_new_ones() -> None:
    index = build()
    old_ids = list(index.ref_doc_info["hike-2"].node_ids)
    text = "Ana packed plasters. The cliffs trail ends in a village. She slept by the harbour."
    index.update_ref_doc(Document(text=text, doc_id="hike-2", metadata={"topic": "hike"}))
    new_ids = index.ref_doc_info["hike-2"].node_ids
    assert new_ids[:2] == old_ids and len(new_ids) == 3
    contents = [index.docstore.get_node(node_id).get_content() for node_id in new_ids]
    assert contents == ["Ana packed plasters.", "The cliffs trail ends in a village.", "She slept by the harbour."]
    assert [index.memory.get(index.memory.find(source_id=n)[0]).text for n in new_ids] == contents
    assert index.memory.check_integrity() == []


async def test_aupdate_ref_doc_keeps_ids_like_update_ref_doc() -> None:
    index = build()
    first, _ = index.ref_doc_info["hike-1"].node_ids
    (leaf,) = index.memory.find(source_id=first)
    await index.aupdate_ref_doc(Document(text="Ana hiked the Camino in Spain.", doc_id="hike-1"))
    assert index.ref_doc_info["hike-1"].node_ids == [first] and index.memory.find(source_id=first) == [leaf]
    assert index.memory.get(leaf).text == "Ana hiked the Camino in Spain."


def test_refresh_ref_docs_touches_only_changed_and_new_documents() -> None:
    index = build()
    memory = index.memory
    untouched = {leaf.id for leaf in memory.leaves() if leaf.metadata["topic"] != "ramen"}
    changed = documents()
    changed[3] = Document(text="Leo now prefers shoyu ramen.", doc_id="ramen-1", metadata={"topic": "ramen"})
    fresh = Document(text="Ana swam at the fishing village.", doc_id="hike-3", metadata={"topic": "hike"})
    refreshed = index.refresh_ref_docs([*changed, fresh])
    assert refreshed == [False, False, False, True, False, False, False, True]
    assert untouched <= {leaf.id for leaf in memory.leaves()}  # unchanged documents kept their leaves
    texts = leaf_texts(memory)
    assert "Leo now prefers shoyu ramen." in texts and "Ana swam at the fishing village." in texts
    assert "Leo ate tonkotsu ramen in Kyoto." not in texts


def test_insert_nodes_updates_a_changed_node_and_skips_an_unchanged_one() -> None:
    index = MemTreeIndex([TextNode(id_="n", text="Pepper fears bicycles.", metadata={"v": 1})], memory=make_memory())
    first = index.memory.find(source_id="n")
    index.insert_nodes([TextNode(id_="n", text="Pepper fears bicycles.", metadata={"v": 1})])
    assert index.memory.find(source_id="n") == first
    index.insert_nodes([TextNode(id_="n", text="Pepper fears bicycles.", metadata={"v": 2})])
    (updated,) = index.memory.find(source_id="n")
    assert updated == first[0]  # the same leaf, updated; its earlier version is kept
    assert index.memory.get(updated).metadata == {"v": 2}
    assert [v.metadata for v in index.memory.history(updated)] == [{"v": 1}]
    assert len(index.memory) == 1


def test_bad_metadata_is_refused_before_anything_is_stored() -> None:
    index = build()
    before = [leaf.id for leaf in index.memory.leaves()]
    bad = TextNode(id_="bad", text="Pepper chased a squirrel.", metadata={"when": object()})
    with pytest.raises(TypeError, match="node 'bad': metadata must be JSON-serializable"):
        index.insert_nodes([TextNode(id_="ok", text="Pepper slept all day."), bad])
    assert [leaf.id for leaf in index.memory.leaves()] == before
    assert index.docstore.get_node("ok", raise_error=False) is None


def test_timestamp_key_gives_leaves_their_event_time() -> None:
    nodes = [
        TextNode(id_="a", text="Ana hiked in Portugal.", metadata={"date": "2024-03-01"}),
        TextNode(id_="b", text="Ana hiked in Spain.", metadata={"date": "2024-06-01"}),
    ]
    index = MemTreeIndex(nodes, memory=make_memory(), timestamp_key="date")
    assert [leaf.time.date().isoformat() for leaf in index.memory.leaves()] == ["2024-03-01", "2024-06-01"]
    retriever = index.as_retriever(time_range=("2024-05-01", None), leaves_only=True)
    assert [hit.node.node_id for hit in retriever.retrieve("Where did Ana hike?")] == ["b"]
    with pytest.raises(ValueError, match="node 'c': timestamp 'soon' is not an ISO 8601"):
        index.insert_nodes([TextNode(id_="c", text="Ana rested.", metadata={"date": "soon"})])


def test_deduplicating_memory_is_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="llamaindex_memtree"):
        MemTreeIndex([], memory=MemTree(embedder=HashingEmbedder(64)))
    assert any("config.deduplicate=True" in record.getMessage() for record in caplog.records)


def test_identical_chunks_of_two_documents_stay_separate() -> None:
    index = MemTreeIndex.from_documents(
        [Document(text="Same words here.", doc_id="a"), Document(text="Same words here.", doc_id="b")],
        memory=make_memory(),
    )
    index.delete_ref_doc("a")
    assert leaf_texts(index.memory) == ["Same words here."]
    assert set(index.ref_doc_info) == {"b"}


def test_query_engine_answers_from_the_tree_with_mock_llm() -> None:
    index = build()
    engine = index.as_query_engine(llm=MockLLM(), similarity_top_k=3, response_mode="compact")
    response = engine.query("Why is Pepper the greyhound scared of bicycles?")
    # MockLLM echoes its prompt: the retrieved context reached the answer step
    assert "Pepper the greyhound is scared of bicycles." in str(response)
    assert len(response.source_nodes) == 3
    assert response.source_nodes[0].node.metadata["depth"] >= 1


def test_chat_engines_work_as_with_any_index() -> None:
    index = build()
    for mode in (ChatMode.CONTEXT, ChatMode.CONDENSE_PLUS_CONTEXT, ChatMode.CONDENSE_QUESTION):
        engine = index.as_chat_engine(chat_mode=mode, llm=MockLLM(), similarity_top_k=2)
        reply = engine.chat("Where did Leo eat ramen?")
        assert "Kyoto" in str(reply), mode
        assert reply.source_nodes, mode


def test_as_retriever_passes_mode_top_k_and_budget_to_the_engine() -> None:
    index = build()
    retriever = index.as_retriever(mode="traversal", similarity_top_k=2, token_budget=30, response_mode="compact")
    assert (retriever.mode, retriever.similarity_top_k, retriever.token_budget) == ("traversal", 2, 30)
    results = retriever.retrieve("ramen in Kyoto")
    assert 0 < len(results) <= 2
    with pytest.raises(ValueError, match="unknown mode 'sideways'"):
        index.as_retriever(mode="sideways").retrieve("ramen")


def test_as_retriever_refuses_unknown_keywords_and_names_the_accepted_ones() -> None:
    index = build()
    with pytest.raises(TypeError, match=r"unknown keyword argument\(s\) 'top_k'; .*take mode, similarity_top_k, "):
        index.as_retriever(top_k=1)
    with pytest.raises(TypeError, match=r"'similarity_topk', 'vector_store_query_mode'"):
        index.as_query_engine(llm=MockLLM(), similarity_topk=1, vector_store_query_mode="hybrid")
    with pytest.raises(TypeError, match=r"'top_k'"):
        index.as_chat_engine(chat_mode=ChatMode.CONTEXT, llm=MockLLM(), top_k=1)
    # what the engines take passes through to them
    engine = index.as_query_engine(llm=MockLLM(), similarity_top_k=1, response_mode="compact", streaming=False)
    assert len(engine.query("Where did Leo eat ramen?").source_nodes) == 1
    for mode in (ChatMode.SIMPLE, ChatMode.CONTEXT):
        chat = index.as_chat_engine(chat_mode=mode, llm=MockLLM(), system_prompt="Be brief.", similarity_top_k=1)
        assert "Kyoto" in str(chat.chat("Where did Leo eat ramen?")) or mode == ChatMode.SIMPLE


def test_documents_and_nodes_of_another_type_are_a_clear_type_error() -> None:
    with pytest.raises(TypeError, match=r"documents must be llama_index Document objects, got str at position 0"):
        MemTreeIndex.from_documents(["Pepper fears bicycles."], memory=make_memory())
    index = build()
    with pytest.raises(TypeError, match=r"got dict at position 0; wrap texts as llama_index.core.Document"):
        index.insert({"text": "Pepper fears bicycles."})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"nodes must be llama_index nodes .* got str at position 1"):
        index.insert_nodes([TextNode(text="Pepper naps."), "Pepper fears bicycles."])  # type: ignore[list-item]
    assert "Pepper naps." not in leaf_texts(index.memory)


def test_settings_models_are_used_only_when_the_user_set_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Settings, "_embed_model", None)
    monkeypatch.setattr(Settings, "_llm", None)
    assert models_from_settings() == {}
    assert Settings._embed_model is None and Settings._llm is None  # nothing was resolved
    embed, llm = MockEmbedding(embed_dim=8), MockLLM(max_tokens=12)
    monkeypatch.setattr(Settings, "_embed_model", embed)
    monkeypatch.setattr(Settings, "_llm", llm)
    assert models_from_settings() == {"embedder": embed, "llm": llm}


def switch_off_settings_models(monkeypatch: pytest.MonkeyPatch) -> None:
    """``Settings.llm = None`` and ``Settings.embed_model = None``, through LlamaIndex's
    own setters (restored after the test), with the once-only log reset."""
    monkeypatch.setattr(Settings, "_embed_model", None)
    monkeypatch.setattr(Settings, "_llm", None)
    monkeypatch.setattr(settings_module, "_logged", set())
    Settings.llm = None
    Settings.embed_model = None
    assert type(Settings._llm) is MockLLM and type(Settings._embed_model) is MockEmbedding


def test_models_switched_off_on_settings_give_the_offline_defaults(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    switch_off_settings_models(monkeypatch)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-not-used")  # switched off means offline, not the OpenAI default
    with caplog.at_level(logging.INFO, logger="llamaindex_memtree.settings"):
        index = MemTreeIndex.from_documents(documents(), transformations=[sentence_splitter()])
        MemTreeIndex([])  # a second memory: the choice is logged once
    memory = index.memory
    assert type(memory.embedder).__name__ == "LocalEmbedder" and memory.dimension == 384
    assert type(memory.aggregator).__name__ == "ExtractiveAggregator" and memory.stats().llm_calls == 0
    stats = memory.stats()
    # 14 sentences: more than one summary's worth (a first batch is grouped by clustering)
    assert stats.leaves == 14 and stats.summaries > 0 and stats.max_depth >= 2
    leaf_sentences = {fold(s) for leaf in memory.leaves() for s in split_sentences(leaf.text)}
    assert all_sentences(memory) == leaf_sentences  # summaries are extractive, not an echoed prompt
    messages = [record.getMessage() for record in caplog.records]
    assert sum("Settings.llm is switched off" in m and "ExtractiveAggregator" in m for m in messages) == 1
    assert sum("Settings.embed_model is switched off" in m and "LocalEmbedder" in m for m in messages) == 1


def test_a_mock_llm_passed_on_purpose_still_writes_the_summaries(monkeypatch: pytest.MonkeyPatch) -> None:
    switch_off_settings_models(monkeypatch)
    memory = MemTree(embedder=HashingEmbedder(256), llm=MockLLM(), config=MemTreeConfig(theta0=0.2, deduplicate=False))
    index = build(memory)
    assert index.memory is memory and memory.aggregator.calls_model
    assert memory.stats().llm_calls > 0
    leaf_sentences = {fold(s) for leaf in memory.leaves() for s in split_sentences(leaf.text)}
    assert all_sentences(memory) - leaf_sentences  # MockLLM's echoes: text no leaf has
    # a MockLLM set on Settings with options of its own is the user's choice too
    monkeypatch.setattr(Settings, "_llm", MockLLM(max_tokens=12))
    assert isinstance(models_from_settings()["llm"], MockLLM)


def test_index_builds_with_the_models_set_on_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    embed, llm = WordsEmbedding(), MockLLM(max_tokens=12)
    monkeypatch.setattr(Settings, "_embed_model", embed)
    monkeypatch.setattr(Settings, "_llm", llm)
    index = MemTreeIndex.from_documents(documents(), transformations=[sentence_splitter()])
    memory = index.memory
    assert memory.embedder.embedding is embed  # type: ignore[attr-defined]
    assert memory.aggregator.calls_model
    assert memory.dimension == 64
    stats = memory.stats()
    assert stats.leaves == 14 and stats.summaries > 0 and stats.llm_calls > 0  # MockLLM wrote the summaries
    assert index.as_retriever(similarity_top_k=2).retrieve("Pepper")


def test_default_memory_is_offline_and_keeps_duplicates_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Settings, "_embed_model", None)
    monkeypatch.setattr(Settings, "_llm", None)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    index = MemTreeIndex([])
    assert type(index.memory.embedder).__name__ == "LocalEmbedder"
    assert type(index.memory.aggregator).__name__ == "ExtractiveAggregator"
    assert index.memory.config == MemTreeConfig(deduplicate=False)


def test_deferred_aggregation_stores_the_same_leaves_for_fewer_llm_calls() -> None:
    def build_with(aggregation: str | None) -> MemTree:
        memory = MemTree(
            embedder=HashingEmbedder(256),
            llm=lambda prompt: "A summary of these notes.",
            # summaries placed by their leaves' mean, so both trees route alike
            config=MemTreeConfig(theta0=0.2, deduplicate=False, parent_embedding="mean"),
        )
        # the first batch is grouped by clustering whatever the mode; later ones are routed
        index = MemTreeIndex.from_documents(
            documents()[:1], memory=memory, transformations=[sentence_splitter()], aggregation=aggregation
        )
        index.insert_nodes(sentence_splitter().get_nodes_from_documents(documents()[1:]))
        return memory

    eager, deferred = build_with(None), build_with("deferred")
    assert [leaf.text for leaf in deferred.leaves()] == [leaf.text for leaf in eager.leaves()]
    assert 0 < deferred.stats().llm_calls < eager.stats().llm_calls
    assert deferred.stats().pending == 0 and deferred.check_integrity() == []
    with pytest.raises(ValueError, match="aggregation must be one of eager, deferred"):
        MemTreeIndex([], memory=make_memory(), aggregation="lazy")


def test_nodes_expire_with_the_memorys_default_ttl() -> None:
    # A retention period for indexed nodes is the memory's default_ttl: every node the
    # index inserts expires that long after, and the index keeps the setting when saved.
    memory = MemTree(
        embedder=HashingEmbedder(64), config=MemTreeConfig(theta0=0.2, deduplicate=False, default_ttl=3600)
    )
    before = time.time()
    index = MemTreeIndex([TextNode(id_="n", text="Pepper fears bicycles.")], memory=memory)
    (leaf,) = index.memory.leaves()
    assert leaf.expires_at is not None and before + 3600 <= leaf.expires_at <= time.time() + 3600
    assert index.index_struct.config["default_ttl"] == 3600
    # A timedelta retention is stored as seconds, so the index can be saved as JSON.
    week = MemTree(embedder=HashingEmbedder(64), config=MemTreeConfig(deduplicate=False, default_ttl=timedelta(days=7)))
    struct = MemTreeIndex([TextNode(id_="m", text="Pepper fears bicycles.")], memory=week).index_struct
    assert json.loads(json.dumps(struct.to_dict()))["config"]["default_ttl"] == 7 * 86400
