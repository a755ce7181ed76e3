"""The LoCoMo harness: data loading, the metric, and `memtree bench locomo` end to end
on a small conversation written here (and on one real conversation when the data is present)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memtree.eval.locomo import load_locomo, select_conversations
from memtree.eval.metrics import answer_recall, context_at_budget, contexts_at_budgets, evidence_recall
from tests.cli_runner import memtree, ok, refused

LOCOMO = Path(__file__).resolve().parents[2] / "shared" / "data" / "locomo10.json"

SESSIONS = {
    "session_1_date_time": "1:56 pm on 8 May, 2023",
    "session_1": [
        {"speaker": "Ana", "dia_id": "D1:1", "text": "I adopted a grey cat named Miso. She sleeps on my piano."},
        {"speaker": "Ben", "dia_id": "D1:2", "text": "Lovely! I started training for the Berlin marathon."},
        {"speaker": "Ana", "dia_id": "D1:3", "text": "Good luck with the training."},
    ],
    "session_2_date_time": "10:04 am on 20 June, 2023",
    "session_2": [
        {"speaker": "Ben", "dia_id": "D2:1", "text": "I hurt my knee on a long run last week."},
        {"speaker": "Ana", "dia_id": "D2:2", "text": "Oh no. Miso knocked over my tea this morning."},
        {"speaker": "Ben", "dia_id": "D2:3", "text": "Cats! I will rest the knee until July."},
    ],
}
QA = [
    {"question": "What is the name of Ana's cat?", "answer": "Miso", "evidence": ["D1:1"], "category": 4},
    {"question": "When did Ben hurt his knee?", "answer": "June 2023", "evidence": ["D2:01"], "category": 2},
    {"question": "What did Miso do?", "answer": "knocked over tea", "evidence": ["D1:1; D2:2"], "category": 1},
    {"question": "Would Ben run in July?", "answer": 2023, "evidence": ["D2:3", "D9:9"], "category": 3},
    {"question": "Unknown evidence", "answer": "x", "evidence": ["D7:1"], "category": 4},
    {"question": "Adversarial", "adversarial_answer": "no", "evidence": ["D1:1"], "category": 5},
]


@pytest.fixture
def small_locomo(tmp_path: Path) -> Path:
    path = tmp_path / "locomo_small.json"
    conversation = {"speaker_a": "Ana", "speaker_b": "Ben", **SESSIONS}
    path.write_text(json.dumps([{"sample_id": "tiny-1", "conversation": conversation, "qa": QA}]), encoding="utf-8")
    return path


def test_loading_normalizes_evidence_and_drops_what_has_none(small_locomo: Path) -> None:
    (conversation,) = load_locomo(small_locomo)
    assert [t.dia_id for t in conversation.turns] == ["D1:1", "D1:2", "D1:3", "D2:1", "D2:2", "D2:3"]
    assert (
        conversation.turns[0].text
        == "1:56 pm on 8 May, 2023 Ana: I adopted a grey cat named Miso. She sleeps on my piano."
    )
    assert [q.evidence for q in conversation.questions] == [("D1:1",), ("D2:1",), ("D1:1", "D2:2"), ("D2:3",)]
    assert [q.category for q in conversation.questions] == [4, 2, 1, 3]  # category 5 is not a retrieval question
    assert conversation.questions[3].answer == "2023" and conversation.dropped_questions == 1


def test_evidence_recall_counts_sentences_found_verbatim() -> None:
    turn = "I adopted a grey cat named Miso. She sleeps on my piano."
    assert evidence_recall([turn], "blah i ADOPTED a grey   cat named Miso. other") == 0.5
    assert evidence_recall([turn, "Cats!"], turn + " cats!") == 1.0
    assert evidence_recall([turn, "Cats!"], "she sleeps on my piano.") == 0.25
    assert answer_recall("Miso", "a cat named miso") == 1.0 and answer_recall("Pepper", "a cat named miso") == 0.0


def test_budget_cuts_whitespace_words_in_rank_order() -> None:
    texts = ["one two three", "four five", "six"]
    assert context_at_budget(texts, 4) == "one two three four"
    assert contexts_at_budgets(texts, [1, 5, 100]) == {
        1: "one",
        5: "one two three four five",
        100: "one two three four five six",
    }
    with pytest.raises(ValueError, match="budget must be a positive number of words, got 0"):
        context_at_budget(texts, 0)


def test_conversation_selection(small_locomo: Path) -> None:
    conversations = load_locomo(small_locomo)
    assert select_conversations(conversations, "0") == conversations
    with pytest.raises(ValueError, match="conversation 1 does not exist; the file has 0-0"):
        select_conversations(conversations, "0-3")
    with pytest.raises(ValueError, match="bad conversation selection 'x'"):
        select_conversations(conversations, "x")


def test_bench_locomo_writes_the_report_and_loses_no_turn(small_locomo: Path, tmp_path: Path) -> None:
    out = tmp_path / "results"
    done = ok(
        memtree(
            "bench",
            "locomo",
            "--data",
            small_locomo,
            "--embedder",
            "hashing",
            "--budgets",
            "5,20,1000",
            "--out",
            out,
            "--name",
            "tiny",
            "--no-qa",
            embedder=None,
        )
    )
    assert "wrote" in done.stdout
    report = json.loads((out / "tiny.json").read_text())["results"]
    expected = {"flat dense", "BM25", "memtree", "memtree traversal", "memtree paper (dense collapsed)"}
    assert expected <= set(report)
    for name in expected - {"memtree traversal"}:
        # A budget larger than the whole conversation holds every turn: recall is exactly 1.
        assert report[name]["recall"]["1000"] == 1.0, name
        assert report[name]["questions"] == 4
        assert report[name]["recall"]["5"] <= report[name]["recall"]["20"] <= 1.0
    assert report["memtree"]["embedding_calls_per_insert"] > 1  # leaves and re-written summaries
    markdown = (out / "tiny.md").read_text()
    assert (
        "| memtree paper (dense collapsed) |" in markdown and "## Evidence recall, multi-hop (category 1)" in markdown
    )
    assert "| command |" in markdown and (out / "tiny.png").read_bytes().startswith(b"\x89PNG")


def test_bench_locomo_bad_input(small_locomo: Path, tmp_path: Path) -> None:
    refused(memtree("bench", "locomo", "--data", tmp_path / "nope.json", embedder=None), "LoCoMo data not found")
    refused(
        memtree("bench", "locomo", "--data", small_locomo, "--budgets", "500,abc", embedder=None),
        "--budgets takes word counts",
    )
    refused(
        memtree("bench", "locomo", "--data", small_locomo, "--conversations", "4", embedder=None),
        "conversation 4 does not exist",
    )
    bad = tmp_path / "bad.json"
    bad.write_text('{"not": "locomo"}', encoding="utf-8")
    refused(memtree("bench", "locomo", "--data", bad, embedder=None), "is not LoCoMo data")


@pytest.mark.skipif(not LOCOMO.exists(), reason=f"LoCoMo data not at {LOCOMO} (evaluation data, not bundled)")
def test_bench_locomo_on_a_slice_of_the_real_data(tmp_path: Path) -> None:
    ok(
        memtree(
            "bench",
            "locomo",
            "--data",
            LOCOMO,
            "--conversations",
            "0",
            "--questions",
            "6",
            "--embedder",
            "hashing",
            "--no-qa",
            "--out",
            tmp_path,
            "--name",
            "slice",
            embedder=None,
        )
    )
    report = json.loads((tmp_path / "slice.json").read_text())["results"]
    assert report["memtree"]["questions"] == 6 and report["memtree"]["shape"]["nodes"] > 419


def scripted_reply(prompt: str) -> str:
    """Reader: says "Miso" when the excerpts mention Miso. Judge: 1 for an exact match."""
    if prompt.startswith("You grade answers"):
        gold = prompt.split("Gold answer: ", 1)[1].split("\n", 1)[0].strip().lower()
        answer = prompt.split("Answer to grade: ", 1)[1].split("\n", 1)[0].strip().lower()
        return "1" if gold == answer else "0"
    context = prompt.split("Memory excerpts:", 1)[1].split("Question:", 1)[0]
    return "Miso" if "Miso" in context else "NO_ANSWER"


def test_bench_locomo_qa_with_a_configured_model(small_locomo: Path, tmp_path: Path) -> None:
    from tests.openai_server import FakeOpenAIServer

    with FakeOpenAIServer(reply=scripted_reply) as server:
        ok(
            memtree(
                "bench", "locomo", "--data", small_locomo, "--embedder", "hashing", "--budgets", "20,1000",
                "--qa-budget", "1000", "--no-raptor", "--out", tmp_path, "--name", "qa", embedder=None,
                env={"OPENAI_BASE_URL": server.url, "OPENAI_API_KEY": server.api_key},
            )
        )  # fmt: skip
        # 5 methods x 4 questions, each one reader and one judge call.
        assert server.count("chat") == 5 * 4 * 2
    qa = json.loads((tmp_path / "qa.json").read_text())["qa"]
    assert qa["budget"] == 1000 and set(qa["methods"]) >= {"flat dense", "memtree"}
    for row in qa["methods"].values():
        # Every context holds the whole conversation; only the cat question's gold answer is "Miso".
        assert row["overall"] == 0.25 and row["judge_failures"] == 0
        assert row["per_category"] == {"1": 0.0, "2": 0.0, "3": 0.0, "4": 1.0}
    assert "## QA accuracy (LLM reader and judge, context at 1000 words" in (tmp_path / "qa.md").read_text()
