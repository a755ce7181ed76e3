"""Children keep one order — creation time, then id — live, after a reopen and after
an import, so pictures, outlines and traversal ties do not change between processes."""

from __future__ import annotations

from pathlib import Path

from memtree import HashingEmbedder, MemTree, MemTreeConfig

TEXTS = [
    f"Note {i}: {topic} detail number {i}." for i, topic in enumerate(["garden", "piano", "travel", "cooking"] * 12)
]


def shape(memory: MemTree) -> dict[str, list[str]]:
    return {node.text: [memory.get(child).text for child in node.children] for node in memory.walk()}


def children_are_in_creation_order(memory: MemTree) -> bool:
    for node in memory.walk():
        keys = [(memory.get(child).created_at, child) for child in node.children]
        if keys != sorted(keys):
            return False
    return True


def test_reopen_and_import_list_children_exactly_as_before(tmp_path: Path) -> None:
    config = MemTreeConfig(theta0=0.2)
    path = tmp_path / "memory.db"
    with MemTree.open(path, embedder=HashingEmbedder(64), config=config) as memory:
        memory.add_many(TEXTS)
        memory.delete(memory.leaves()[3].id)
        before = shape(memory)
        outline = memory.format_tree()
        assert children_are_in_creation_order(memory)
        memory.export_jsonl(tmp_path / "backup.jsonl")
    with MemTree.open(path, embedder=HashingEmbedder(64), config=config) as memory:
        assert shape(memory) == before and memory.format_tree() == outline
    with MemTree.open(tmp_path / "copy.db", embedder=HashingEmbedder(64), config=config) as copy:
        copy.import_jsonl(tmp_path / "backup.jsonl")
        assert shape(copy) == before and children_are_in_creation_order(copy)
