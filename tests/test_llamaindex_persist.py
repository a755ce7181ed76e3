"""MemTreeIndex persistence: StorageContext round trips, and trees in the engine's durable stores."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from llama_index.core import Document, Settings, StorageContext, SummaryIndex, load_index_from_storage
from llama_index.core.schema import TextNode
from llamaindex_corpus import documents, sentence_splitter

from llamaindex_memtree import MemTreeIndex
from memtree import MemTree, MemTreeConfig

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

    return canonical(memory.to_dict())


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
    assert struct["store"] == "InMemoryStore" and struct["namespace"] == ["default"]
    snapshot = tmp_path / f"{struct['snapshot']}__vector_store.json"
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
    for snapshot in tmp_path.glob("memtree-*__vector_store.json"):
        snapshot.unlink()
    with pytest.raises(ValueError, match="holds a MemTreeIndex but not its tree"):
        MemTreeIndex.from_persist_dir(tmp_path, memory=MemTree(embedder=local_embedder, config=CONFIG))


def test_index_over_a_sqlite_tree_reopens_it(local_embedder, tmp_path: Path) -> None:
    path = tmp_path / "memory.db"
    with MemTree.open(path, namespace=("docs", "corpus"), embedder=local_embedder, config=CONFIG) as memory:
        index = MemTreeIndex.from_documents(documents()[:4], memory=memory, transformations=[sentence_splitter()])
        index.storage_context.persist(tmp_path / "storage")
        before = tree(memory), results(index)
    assert not list((tmp_path / "storage").glob("memtree-*"))  # the tree is in the database, not copied
    storage = StorageContext.from_defaults(persist_dir=str(tmp_path / "storage"))
    with pytest.raises(ValueError, match=r"keeps its tree in a SQLiteStore \(namespace \('docs', 'corpus'\)\)"):
        load_index_from_storage(storage)
    with (
        MemTree.open(path, namespace="other", embedder=local_embedder, config=CONFIG) as wrong,
        pytest.raises(ValueError, match=r"pass memory.with_namespace\(\('docs', 'corpus'\)\)"),
    ):
        load_index_from_storage(storage, memory=wrong)
    with MemTree.open(path, namespace=("docs", "corpus"), embedder=local_embedder, config=CONFIG) as reopened:
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
