"""MemTreeIndex persistence: StorageContext round trips, and trees in the engine's durable stores."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
from llama_index.core import Document, Settings, StorageContext, SummaryIndex, load_index_from_storage
from llama_index.core.schema import TextNode
from llamaindex_corpus import WordsEmbedding, documents, sentence_splitter

from llamaindex_memtree import MemTreeIndex
from memtree import EmbedderMismatchError, HashingEmbedder, MemTree, MemTreeConfig, viz

QUESTIONS = ["Is Pepper scared of bicycles?", "Where did Leo eat ramen?", "What does the cliffs trail end in?"]
CONFIG = MemTreeConfig(deduplicate=False)


def results(index: MemTreeIndex) -> list[list[tuple[str, float, str, dict]]]:
    """Everything a retrieval gives back, for several questions (``leaf_ids`` as a
    set: their order follows the order of siblings, see :func:`tree`)."""
    retriever = index.as_retriever(similarity_top_k=6)
    return [
        [
            (
                r.node.node_id,
                round(r.score or 0.0, 6),
                r.node.get_content(),
                {**r.node.metadata, "leaf_ids": set(r.node.metadata["leaf_ids"])},
            )
            for r in retriever.retrieve(q)
        ]
        for q in QUESTIONS
    ]


def tree(memory: MemTree) -> dict:
    """The whole tree, children in id order (a reopened store may list siblings in
    another order; the tree is the same)."""

    def canonical(node: dict) -> dict:
        return {**node, "children": sorted((canonical(c) for c in node["children"]), key=lambda c: c["id"])}

    return canonical(viz.to_dict(memory))


@pytest.fixture(scope="module")
def index(local_embedder) -> MemTreeIndex:
    """Built once; tests persist it and change only what they load back."""
    memory = MemTree(embedder=local_embedder, config=CONFIG)
    return MemTreeIndex.from_documents(documents(), memory=memory, transformations=[sentence_splitter()])


def test_persist_and_load_give_back_the_same_tree_nodes_and_results(
    index: MemTreeIndex, local_embedder, tmp_path: Path
) -> None:
    index.storage_context.persist(tmp_path)
    storage = StorageContext.from_defaults(persist_dir=str(tmp_path))
    loaded = load_index_from_storage(storage, memory=MemTree(embedder=local_embedder, config=CONFIG))
    assert isinstance(loaded, MemTreeIndex)
    assert loaded.index_id == index.index_id
    assert tree(loaded.memory) == tree(index.memory)
    assert loaded.memory.check_integrity() == []
    assert loaded.ref_doc_info == index.ref_doc_info
    assert loaded.docstore.docs.keys() == index.docstore.docs.keys()
    assert results(loaded) == results(index)


def test_storage_context_to_dict_and_back_carries_the_tree(index: MemTreeIndex, local_embedder) -> None:
    storage = StorageContext.from_dict(json.loads(json.dumps(index.storage_context.to_dict())))
    loaded = load_index_from_storage(storage, memory=MemTree(embedder=local_embedder, config=CONFIG))
    assert tree(loaded.memory) == tree(index.memory)
    assert results(loaded) == results(index)


def test_a_loaded_index_keeps_working_and_persists_again(index: MemTreeIndex, local_embedder, tmp_path: Path) -> None:
    index.storage_context.persist(tmp_path / "first")
    loaded = MemTreeIndex.from_persist_dir(tmp_path / "first", memory=MemTree(embedder=local_embedder, config=CONFIG))
    loaded.insert(Document(text="Ana swam at the fishing village.", doc_id="hike-3", metadata={"topic": "hike"}))
    loaded.delete_ref_doc("ramen-1", delete_from_docstore=True)
    loaded.storage_context.persist(tmp_path / "second")
    again = MemTreeIndex.from_persist_dir(tmp_path / "second", memory=MemTree(embedder=local_embedder, config=CONFIG))
    assert tree(again.memory) == tree(loaded.memory)
    assert set(again.ref_doc_info) == set(loaded.ref_doc_info) == (set(index.ref_doc_info) - {"ramen-1"}) | {"hike-3"}
    assert results(again) == results(loaded)


def test_default_models_round_trip_without_arguments(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(Settings, "_embed_model", None)
    monkeypatch.setattr(Settings, "_llm", None)
    built = MemTreeIndex.from_documents(documents()[:3], transformations=[sentence_splitter()])
    built.storage_context.persist(tmp_path)
    loaded = load_index_from_storage(StorageContext.from_defaults(persist_dir=str(tmp_path)))
    assert tree(loaded.memory) == tree(built.memory)
    assert results(loaded) == results(built)


def test_the_tree_is_saved_beside_the_docstore_as_the_engines_jsonl_export(index: MemTreeIndex, tmp_path: Path) -> None:
    index.storage_context.persist(tmp_path)
    struct = json.loads(
        json.loads((tmp_path / "index_store.json").read_text())["index_store/data"][index.index_id]["__data__"]
    )
    assert struct["store"] == "MemoryBackend" and struct["namespace"] == ["default"]
    assert struct["snapshot"] == "memtree_tree"
    snapshot = tmp_path / "memtree_tree__vector_store.json"
    lines = json.loads(snapshot.read_text())["metadata_dict"]["memtree.jsonl"]["lines"]
    leaf_texts = {json.loads(line).get("text") for line in lines}
    assert {leaf.text for leaf in index.memory.leaves()} <= leaf_texts


def test_loading_a_directory_of_another_index_type_is_a_clear_error(tmp_path: Path) -> None:
    SummaryIndex([TextNode(text="Pepper fears bicycles.")]).storage_context.persist(tmp_path)
    with pytest.raises(ValueError, match=r"holds a SummaryIndex \(index type 'list'\), not a MemTreeIndex"):
        MemTreeIndex.from_persist_dir(tmp_path)
    storage = StorageContext.from_defaults(persist_dir=str(tmp_path))
    with pytest.raises(TypeError, match=r"this storage holds a SummaryIndex \(index type 'list'\), not a MemTreeIndex"):
        MemTreeIndex(index_struct=storage.index_store.index_structs()[0], storage_context=storage)


def test_a_missing_snapshot_or_a_full_memory_is_a_clear_error(
    index: MemTreeIndex, local_embedder, tmp_path: Path
) -> None:
    index.storage_context.persist(tmp_path)
    with pytest.raises(ValueError, match="already holds 14 leaves; pass an empty memory"):
        MemTreeIndex.from_persist_dir(tmp_path, memory=index.memory)
    (tmp_path / "memtree_tree__vector_store.json").unlink()
    with pytest.raises(ValueError, match="holds a MemTreeIndex but not its tree"):
        MemTreeIndex.from_persist_dir(tmp_path, memory=MemTree(embedder=local_embedder, config=CONFIG))


def test_index_over_a_sqlite_tree_reopens_it(local_embedder, tmp_path: Path) -> None:
    path = tmp_path / "memory.db"
    with MemTree.open(path, namespace=("docs", "corpus"), embedder=local_embedder, config=CONFIG) as memory:
        index = MemTreeIndex.from_documents(documents()[:4], memory=memory, transformations=[sentence_splitter()])
        index.storage_context.persist(tmp_path / "storage")
        before = tree(memory), results(index)
    assert not list((tmp_path / "storage").glob("memtree*"))  # the tree is in the database, not copied
    storage = StorageContext.from_defaults(persist_dir=str(tmp_path / "storage"))
    with pytest.raises(ValueError, match=r"keeps its tree in a SQLiteBackend \(namespace \('docs', 'corpus'\)\)"):
        load_index_from_storage(storage)
    with (
        MemTree.open(path, namespace="other", embedder=local_embedder, config=CONFIG) as wrong,
        pytest.raises(ValueError, match=r"pass memory.with_namespace\(\('docs', 'corpus'\)\)"),
    ):
        load_index_from_storage(storage, memory=wrong)
    with pytest.raises(EmbedderMismatchError, match=r"built with LocalEmbedder.*pass embedder='local'"):
        MemTree.open(path, namespace=("docs", "corpus"), embedder=HashingEmbedder(384), config=CONFIG)
    with MemTree.open(path, namespace=("docs", "corpus"), embedder=local_embedder, config=CONFIG) as reopened:
        assert reopened.stored_embedder == local_embedder.name
        loaded = load_index_from_storage(storage, memory=reopened)
        assert (tree(loaded.memory), results(loaded)) == before
        loaded.delete_ref_doc("dog-1")
        assert len(reopened) == 6


@pytest.mark.slow
def test_index_over_a_postgres_tree(local_embedder, postgres_dsn: str, tmp_path: Path) -> None:
    with MemTree.open(postgres_dsn, namespace="corpus", embedder=local_embedder, config=CONFIG) as memory:
        index = MemTreeIndex.from_documents(documents()[:4], memory=memory, transformations=[sentence_splitter()])
        index.storage_context.persist(tmp_path)
        before = tree(memory), results(index)
    with MemTree.open(postgres_dsn, namespace="corpus", embedder=local_embedder, config=CONFIG) as reopened:
        loaded = MemTreeIndex.from_persist_dir(tmp_path, memory=reopened)
        assert (tree(loaded.memory), results(loaded)) == before
        assert loaded.memory.check_integrity() == []


CUSTOM = MemTreeConfig(theta0=0.2, deduplicate=False, k=3, mode="traversal", beam=2, lexical_weight=0.0)


def default_results(index: MemTreeIndex) -> list[list[tuple[str, float]]]:
    """Retrieval with no options: the memory's config decides k, mode and the rest."""
    return [[(r.node.node_id, round(r.score or 0.0, 6)) for r in index.as_retriever().retrieve(q)] for q in QUESTIONS]


def test_a_load_without_memory_gets_the_memory_config_back(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(Settings, "_embed_model", WordsEmbedding())
    monkeypatch.setattr(Settings, "_llm", None)
    memory = MemTree(embedder=Settings._embed_model, config=CUSTOM)
    built = MemTreeIndex.from_documents(documents(), memory=memory, transformations=[sentence_splitter()])
    built.storage_context.persist(tmp_path / "first")
    loaded = load_index_from_storage(StorageContext.from_defaults(persist_dir=str(tmp_path / "first")))
    assert loaded.memory.config == CUSTOM
    assert default_results(loaded) == default_results(built)
    assert all(0 < len(ranking) <= 3 for ranking in default_results(loaded))  # k=3, not the default 10
    # a memory passed in keeps its own config, and the next persist records that one
    own = MemTreeConfig(deduplicate=False, k=5)
    reloaded = MemTreeIndex.from_persist_dir(tmp_path / "first", memory=MemTree(embedder=WordsEmbedding(), config=own))
    assert reloaded.memory.config == own
    reloaded.storage_context.persist(tmp_path / "second")
    assert MemTreeIndex.from_persist_dir(tmp_path / "second").memory.config == own


def test_a_tree_embedded_by_another_model_is_refused_at_load(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(Settings, "_embed_model", None)
    monkeypatch.setattr(Settings, "_llm", None)
    memory = MemTree(embedder=HashingEmbedder(64), config=CONFIG)
    built = MemTreeIndex.from_documents(documents()[:3], memory=memory, transformations=[sentence_splitter()])
    built.storage_context.persist(tmp_path)
    storage = StorageContext.from_defaults(persist_dir=str(tmp_path))
    # no memory= and no Settings.embed_model: the offline default (384 dimensions) cannot read it
    with pytest.raises(
        ValueError,
        match=r"embedded with HashingEmbedder\(64\) \(64 dimensions\), but the memory to load it into embeds with "
        r"LocalEmbedder\(.*\); set Settings.embed_model to the model the index was built with before loading, "
        r"or pass memory=MemTree\(embedder=<that model>, config=...\)",
    ):
        load_index_from_storage(storage)
    with pytest.raises(ValueError, match=r"embeds with HashingEmbedder\(32\)"):
        MemTreeIndex.from_persist_dir(tmp_path, memory=MemTree(embedder=HashingEmbedder(32), config=CONFIG))
    loaded = MemTreeIndex.from_persist_dir(tmp_path, memory=MemTree(embedder=HashingEmbedder(64), config=CONFIG))
    assert results(loaded) == results(built)


def test_a_struct_written_before_configs_were_stored_loads_with_the_index_default(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(Settings, "_embed_model", WordsEmbedding())
    monkeypatch.setattr(Settings, "_llm", None)
    memory = MemTree(embedder=Settings._embed_model, config=CUSTOM)
    built = MemTreeIndex.from_documents(documents()[:2], memory=memory, transformations=[sentence_splitter()])
    built.storage_context.persist(tmp_path)
    path = tmp_path / "index_store.json"
    stored = json.loads(path.read_text())
    entry = stored["index_store/data"][built.index_id]
    struct = json.loads(entry["__data__"])
    for name in ("config", "leaf_count", "source_ids"):  # what an older version wrote lacks them
        del struct[name]
    entry["__data__"] = json.dumps(struct)
    path.write_text(json.dumps(stored))
    loaded = MemTreeIndex.from_persist_dir(tmp_path)
    assert loaded.memory.config == MemTreeConfig(deduplicate=False) and len(loaded.memory) == 4


def test_a_config_recorded_with_the_old_name_of_min_score_loads(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``MemTreeConfig.retrieve_threshold`` is ``min_score`` now; an index persisted
    before keeps its score cut."""
    monkeypatch.setattr(Settings, "_embed_model", WordsEmbedding())
    monkeypatch.setattr(Settings, "_llm", None)
    built = MemTreeIndex.from_documents(documents()[:2], memory=MemTree(embedder=Settings._embed_model, config=CUSTOM))
    built.storage_context.persist(tmp_path)
    path = tmp_path / "index_store.json"
    stored = json.loads(path.read_text())
    entry = stored["index_store/data"][built.index_id]
    struct = json.loads(entry["__data__"])
    del struct["config"]["min_score"]
    struct["config"]["retrieve_threshold"] = 0.25
    entry["__data__"] = json.dumps(struct)
    path.write_text(json.dumps(stored))
    with caplog.at_level("WARNING", logger="llamaindex_memtree"):
        loaded = MemTreeIndex.from_persist_dir(tmp_path)
    assert loaded.memory.config.min_score == 0.25 and "ignoring" not in caplog.text


def test_the_struct_samples_nodes_the_tree_still_holds() -> None:
    index = MemTreeIndex.from_documents(
        documents(), memory=MemTree(embedder=HashingEmbedder(64), config=CONFIG), transformations=[sentence_splitter()]
    )
    struct = index.index_struct
    assert struct.leaf_count == 14 and len(struct.source_ids) == 8
    for doc_id in ("dog-1", "dog-2", "dog-3", "ramen-1"):  # every sampled node's document
        index.delete_ref_doc(doc_id)
    assert struct.leaf_count == len(index.memory) == 6
    assert len(struct.source_ids) == 6 and all(index.memory.find(source_id=s) for s in struct.source_ids)


def test_reopening_a_durable_index_with_a_memory_that_lacks_its_tree_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def open_memory(name: str) -> MemTree:
        return MemTree.open(tmp_path / name, namespace="docs", embedder=HashingEmbedder(64), config=CONFIG)

    with open_memory("memory.db") as memory:
        index = MemTreeIndex.from_documents(documents(), memory=memory, transformations=[sentence_splitter()])
        index.storage_context.persist(tmp_path / "storage")
        before = results(index)
    with open_memory("copy.db") as copy:  # the same texts, indexed again: other node ids
        MemTreeIndex.from_documents(documents(), memory=copy, transformations=[sentence_splitter()])
    storage = StorageContext.from_defaults(persist_dir=str(tmp_path / "storage"))
    fresh = MemTree(namespace="docs", embedder=HashingEmbedder(64), config=CONFIG)
    with pytest.raises(
        ValueError,
        match=r"the memory given \(MemoryBackend, namespace \('docs',\)\) does not hold this MemTreeIndex's tree: "
        r"the index was built in a SQLiteBackend and had 14 leaves, the memory holds 0 .*"
        r"pass the memory the index was built in, e.g. MemTree.open\(<the same SQLite path or PostgreSQL DSN>, "
        r"namespace=\('docs',\)\)",
    ):
        load_index_from_storage(storage, memory=fresh)
    for name, held in (("empty.db", 0), ("copy.db", 14)):
        with open_memory(name) as wrong, pytest.raises(ValueError, match=f"the memory holds {held} and none of"):
            load_index_from_storage(storage, memory=wrong)
    with open_memory("memory.db") as memory:
        assert results(load_index_from_storage(storage, memory=memory)) == before
        # the tree changed after the persist (another writer removed a node): loaded, with a warning
        memory.delete(memory.find(source_id=index.index_struct.source_ids[0]))
        with caplog.at_level(logging.WARNING, logger="llamaindex_memtree"):
            loaded = load_index_from_storage(storage, memory=memory)
        assert any("lacks 1 of 8 sampled nodes" in record.getMessage() for record in caplog.records)
        assert len(loaded.memory) == 13


OLD_LAYOUT = Path(__file__).parent / "data" / "llamaindex_persist_before_rename"
"""A directory persisted by the previous release (index type ``"memtree"``, tree in
``memtree-<uuid>__vector_store.json``): two documents, 4 leaves, HashingEmbedder(32)."""


def old_layout_memory() -> MemTree:
    return MemTree(embedder=HashingEmbedder(32), config=MemTreeConfig(theta0=0.2, deduplicate=False))


def test_a_directory_persisted_before_the_rename_still_loads_and_persists_anew(tmp_path: Path) -> None:
    assert [path.name for path in OLD_LAYOUT.glob("memtree*")] == [
        "memtree-50e876280b46432db344c2cf00ee81c1__vector_store.json"
    ]
    storage = StorageContext.from_defaults(persist_dir=str(OLD_LAYOUT))
    loaded = load_index_from_storage(storage, memory=old_layout_memory())
    assert isinstance(loaded, MemTreeIndex) and loaded.index_id == "notes"
    assert sorted(leaf.text for leaf in loaded.memory.leaves()) == [
        "Leo ate tonkotsu ramen in Kyoto.",
        "Maya adopted a rescue greyhound called Pepper.",
        "Pepper the greyhound is scared of bicycles.",
        "The ramen broth in Kyoto was rich.",
    ]
    hits = loaded.as_retriever(similarity_top_k=1, leaves_only=True).retrieve("ramen broth Kyoto")
    assert hits[0].node.get_content() == "The ramen broth in Kyoto was rich."
    assert hits[0].node.ref_doc_id == "ramen"  # the docstore node, relationships intact
    again = MemTreeIndex.from_persist_dir(OLD_LAYOUT, memory=old_layout_memory())
    assert tree(again.memory) == tree(loaded.memory)
    # persisted again (in place of the old one), it keeps the old key: the struct names its file
    loaded.storage_context.persist(tmp_path)
    assert (tmp_path / "memtree-50e876280b46432db344c2cf00ee81c1__vector_store.json").exists()
    data = json.loads((tmp_path / "index_store.json").read_text())["index_store/data"]["notes"]
    assert data["__type__"] == "memtree (import llamaindex_memtree before loading)"
    reloaded = load_index_from_storage(
        StorageContext.from_defaults(persist_dir=str(tmp_path)), memory=old_layout_memory()
    )
    assert tree(reloaded.memory) == tree(loaded.memory)


def test_two_indexes_in_one_storage_context_get_numbered_tree_files(tmp_path: Path) -> None:
    storage = StorageContext.from_defaults()
    first = MemTreeIndex.from_documents(
        [Document(text="Pepper fears bicycles.")], storage_context=storage, memory=old_layout_memory()
    )
    second = MemTreeIndex.from_documents(
        [Document(text="Leo ate ramen.")], storage_context=storage, memory=old_layout_memory()
    )
    storage.persist(tmp_path)
    assert sorted(path.name for path in tmp_path.glob("memtree*")) == [
        "memtree_tree_2__vector_store.json",
        "memtree_tree__vector_store.json",
    ]
    loaded = StorageContext.from_defaults(persist_dir=str(tmp_path))
    for built in (first, second):
        back = load_index_from_storage(loaded, index_id=built.index_id, memory=old_layout_memory())
        assert [leaf.text for leaf in back.memory.leaves()] == [leaf.text for leaf in built.memory.leaves()]


LOAD_WITHOUT_IMPORT = """
import sys
from llama_index.core import StorageContext, load_index_from_storage
try:
    load_index_from_storage(StorageContext.from_defaults(persist_dir=sys.argv[1]))
except KeyError as error:
    print(type(error).__name__, error)
"""


@pytest.mark.parametrize("layout", ["current", "before the rename"])
def test_loading_without_importing_the_package_names_the_missing_import(layout: str, tmp_path: Path) -> None:
    """LlamaIndex has no plugin registry for index types: the KeyError it raises shows
    only the type string, so the string says what to do."""
    if layout == "current":
        index = MemTreeIndex.from_documents([Document(text="Pepper fears bicycles.")], memory=old_layout_memory())
        index.storage_context.persist(tmp_path)
        expected = "KeyError 'memtree (import llamaindex_memtree before loading)'"
    else:
        tmp_path = OLD_LAYOUT
        expected = "KeyError 'memtree'"  # what earlier versions wrote cannot say more
    done = subprocess.run(
        [sys.executable, "-c", LOAD_WITHOUT_IMPORT, str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert done.stdout.strip() == expected, done.stderr
