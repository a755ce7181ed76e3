"""The relevance gate (``min_similarity``) and newer-first ordering (``same_subject``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import TableEmbedder

from memtree import HashingEmbedder, MemTree, MemTreeConfig, retrieval
from memtree.recency import SIBLINGS
from memtree.retrieval import RELEVANCE_FLOOR, relevance_floor
from memtree.text import preview

ROOT = Path(__file__).resolve().parents[1]

# Hand-built vectors: three memories on three axes, a question on the dog's axis,
# and an arithmetic question nearly orthogonal to all of them.
TABLE = {
    "My greyhound is called Pepper.": [1.0, 0.0, 0.0, 0.05],
    "I work night shifts as a nurse.": [0.0, 1.0, 0.0, 0.05],
    "Leo cooked ramen with yuzu.": [0.0, 0.0, 1.0, 0.05],
    "What is my dog called?": [0.9, 0.1, 0.0, 0.1],
    "What is 17 times 3?": [0.05, 0.05, 0.05, 1.0],
}


def table_memory() -> MemTree:
    memory = MemTree(embedder=TableEmbedder(TABLE), config=MemTreeConfig(theta0=0.99, max_threshold=0.99))
    for text in list(TABLE)[:3]:
        memory.add(text)
    return memory


def test_the_gate_gives_an_unrelated_question_nothing_and_keeps_the_relevant_memory() -> None:
    memory = table_memory()
    assert len(memory.retrieve("What is 17 times 3?", k=3)) == 3  # ungated: k results whatever the query
    assert memory.retrieve("What is 17 times 3?", k=3, min_similarity=0.3) == []
    hits = memory.retrieve("What is my dog called?", k=3, min_similarity=0.3)
    assert [hit.text for hit in hits] == ["My greyhound is called Pepper."]


def test_the_gate_is_on_cosine_not_on_the_hybrid_score() -> None:
    # "is" is shared by the arithmetic question and a memory: the best word match
    # gets the whole BM25 share of the hybrid score, the cosine stays low.
    memory = table_memory()
    hybrid = memory.retrieve("What is 17 times 3?", k=3)
    assert max(hit.score for hit in hybrid) > 0.0
    assert memory.retrieve("What is 17 times 3?", k=3, min_similarity=0.2) == []


def test_a_gate_that_lets_nothing_through_does_not_search_the_whole_memory() -> None:
    memory = MemTree(embedder=HashingEmbedder(64), config=MemTreeConfig(theta0=0.2))
    memory.add_many([f"note {i} about topic {i % 7} and item {i}" for i in range(120)])
    ranked: list[int] = []
    original = __import__("memtree.retrieval", fromlist=["rank_collapsed"]).rank_collapsed

    def counting(*args: object, **kwargs: object) -> object:
        ranked.append(int(args[3]))  # type: ignore[call-overload]
        return original(*args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("memtree.retrieval.rank_collapsed", counting)
        assert memory.retrieve("note about topic", k=3, min_similarity=0.999) == []
    assert len(ranked) == 1  # one ranking, not four-fold widenings up to every node


@pytest.mark.parametrize("bad", [float("nan"), "high", True])
def test_a_bad_floor_is_refused_by_name(bad: object) -> None:
    memory = table_memory()
    with pytest.raises((TypeError, ValueError), match="min_similarity"):
        memory.retrieve("What is my dog called?", min_similarity=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="min_similarity"):
        MemTreeConfig(min_similarity=1.5)


def test_the_calibrated_floor_is_handed_out_for_the_model_it_was_measured_on_only() -> None:
    assert relevance_floor("LocalEmbedder(sentence-transformers/all-MiniLM-L6-v2)") == RELEVANCE_FLOOR
    assert relevance_floor("LocalEmbedder(all-MiniLM-L6-v2)") == RELEVANCE_FLOOR
    assert relevance_floor("OpenAIEmbedder(text-embedding-3-small)") is None
    assert MemTree(embedder=HashingEmbedder(32)).relevance_floor is None


UPDATE = {
    "I live in Lisbon near the river.": [1.0, 0.2, 0.0],
    "I moved to Porto last month.": [0.8, 0.6, 0.0],
    "Where do I live in Lisbon or elsewhere?": [1.0, 0.3, 0.0],
    "The weather was bad.": [0.0, 0.0, 1.0],
}


def test_a_newer_memory_about_the_same_subject_comes_first() -> None:
    memory = MemTree(embedder=TableEmbedder(UPDATE), config=MemTreeConfig(theta0=0.99, max_threshold=0.99))
    memory.add("I live in Lisbon near the river.", timestamp="2024-01-05")
    memory.add("The weather was bad.", timestamp="2024-03-01")
    memory.add("I moved to Porto last month.", timestamp="2024-06-01")
    question = "Where do I live in Lisbon or elsewhere?"
    plain = [hit.text for hit in memory.retrieve(question, k=3)]
    assert plain[:2] == ["I live in Lisbon near the river.", "I moved to Porto last month."]
    newer = [hit.text for hit in memory.retrieve(question, k=3, same_subject=0.8)]
    assert newer[:2] == ["I moved to Porto last month.", "I live in Lisbon near the river."]
    assert sorted(newer) == sorted(plain)  # only the order changes
    unrelated = [hit.text for hit in memory.retrieve(question, k=3, same_subject=0.99)]
    assert unrelated == plain  # not similar enough, and not siblings: no move


def test_siblings_are_about_the_same_subject() -> None:
    memory = MemTree(embedder=TableEmbedder(UPDATE), config=MemTreeConfig(theta0=0.5, max_threshold=0.99))
    memory.add("I live in Lisbon near the river.", timestamp="2024-01-05")
    memory.add("I moved to Porto last month.", timestamp="2024-06-01")
    memory.add("The weather was bad.", timestamp="2024-03-01")
    leaves = memory.retrieve("Where do I live in Lisbon or elsewhere?", k=3, leaves_only=True, same_subject=SIBLINGS)
    assert [hit.text for hit in leaves][:2] == ["I moved to Porto last month.", "I live in Lisbon near the river."]
    assert retrieval.SIBLINGS is SIBLINGS  # the name users imported from memtree.retrieval before


def test_preview_cuts_at_a_word_boundary() -> None:
    text = "14 January 2024 – 20 October 2024 · Leo, Maya · lisbon, full, marathon, finally 14 January 2024 Maya"
    words = {word.rstrip(",") for word in text.split()}
    for width in range(12, len(text)):
        shown = preview(text, width)
        assert len(shown) <= width
        assert {word.rstrip(",") for word in shown.removesuffix("…").split()} <= words, (width, shown)
    assert preview("a" * 100, 20) == "a" * 19 + "…"  # one long word is still cut inside


def test_the_written_sets_are_big_enough_and_not_repeated() -> None:
    unrelated = json.loads((ROOT / "benchmarks" / "data" / "unrelated_questions.json").read_text(encoding="utf-8"))
    questions = [q for kind, items in unrelated.items() if kind != "about" for q in items]
    assert len(questions) >= 100 and len(set(questions)) == len(questions)
    updates = json.loads((ROOT / "benchmarks" / "data" / "knowledge_updates.json").read_text(encoding="utf-8"))
    assert len(updates["updates"]) >= 30
    assert all(item["old"] != item["new"] and item["question"] for item in updates["updates"])


def test_a_newer_leaf_a_summary_brought_in_moves_above_an_older_one_it_covers() -> None:
    # By default a summary hit delivers its leaves, each with its own score, which can be
    # far below the older fact's: brought in by a summary that holds the older fact too,
    # the newer one was delivered for that summary's match, so the score margin does not
    # keep it below.
    from memtree.node import RetrievedNode
    from memtree.recency import newer_first

    memory = MemTree(embedder=TableEmbedder(UPDATE), config=MemTreeConfig(theta0=0.5, max_threshold=0.99))
    lisbon = memory.add("I live in Lisbon near the river.", timestamp="2024-01-05")
    porto = memory.add("I moved to Porto last month.", timestamp="2024-06-01")
    summary = memory.get(lisbon).parent
    assert summary is not None and memory.get(porto).parent == summary

    def result(node_id: str, score: float, found_by: str | None) -> RetrievedNode:
        node = memory.get(node_id)
        return RetrievedNode(node_id, node.text, score, node.depth, True, node.timestamp, {}, (node_id,),
                             found_by=found_by, context=node.text)  # fmt: skip

    replica = memory._replica
    with replica.lock.read():
        brought = [result(lisbon, 0.9, None), result(porto, 0.2, summary)]
        newer_first(replica.index, replica.state, brought, SIBLINGS)
        assert [hit.id for hit in brought] == [porto, lisbon]
        ranked_alone = [result(lisbon, 0.9, None), result(porto, 0.2, None)]
        newer_first(replica.index, replica.state, ranked_alone, SIBLINGS)
        assert [hit.id for hit in ranked_alone] == [lisbon, porto]  # 0.7 below: no move
    memory.close()
