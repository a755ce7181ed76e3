"""The LoCoMo harness: data loading, the metric, and `memtree bench locomo` end to end
on a small conversation written here (and on one real conversation when the data is present)."""

from __future__ import annotations

import importlib.metadata
import json
import os
from pathlib import Path

import pytest

from memtree.config import MemTreeConfig
from memtree.text import fold, split_sentences
from memtree_bench.locomo import Turn, first_sessions, load_locomo, select_conversations
from memtree_bench.locomo_report import render_markdown_file
from memtree_bench.metrics import answer_recall, context_at_budget, contexts_at_budgets, evidence_recall
from tests.cli_runner import memtree, ok, refused
from tests.locomo_sample import SESSIONS

LOCOMO = Path(
    os.environ.get("MEMTREE_LOCOMO", Path(__file__).resolve().parents[2] / "shared" / "data" / "locomo10.json")
)
"""Where the tests find LoCoMo: ``../shared/data`` beside the repository, or ``$MEMTREE_LOCOMO``."""

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


def test_a_slice_keeps_the_first_sessions_and_the_questions_answered_in_them(small_locomo: Path) -> None:
    (conversation,) = load_locomo(small_locomo)
    first = first_sessions(conversation, 1)
    assert [t.dia_id for t in first.turns] == ["D1:1", "D1:2", "D1:3"]
    # "What did Miso do?" also needs D2:2, so only the cat's name is asked of session 1.
    assert [q.question for q in first.questions] == ["What is the name of Ana's cat?"]
    assert set(first.turn_by_id) == {"D1:1", "D1:2", "D1:3"}
    assert first_sessions(conversation, 5) == conversation
    with pytest.raises(ValueError, match="sessions must be a positive number of sessions, got 0"):
        first_sessions(conversation, 0)


def test_bench_locomo_slice_without_the_paper_row(small_locomo: Path, tmp_path: Path) -> None:
    ok(
        memtree(
            "bench", "locomo", "--data", small_locomo, "--embedder", "hashing", "--budgets", "1000",
            "--sessions", "1", "--no-paper", "--no-raptor", "--no-qa", "--out", tmp_path, "--name", "s1",
            embedder=None,
        )
    )  # fmt: skip
    report = json.loads((tmp_path / "s1.json").read_text())["results"]
    assert list(report) == [
        "flat dense",
        "BM25",
        "flat hybrid",
        "memtree",
        "memtree, summaries as text",
        "memtree, leaves only",
        "memtree traversal",
    ]
    assert report["memtree"]["questions"] == 1 and report["flat hybrid"]["shape"]["nodes"] == 3
    refused(
        memtree("bench", "locomo", "--data", small_locomo, "--sessions", "0", embedder=None),
        "--sessions must be a positive number, got 0",
    )


def test_summary_quality_counts_new_words_and_invented_facts() -> None:
    from memtree import HashingEmbedder, LLMAggregator, MemTree, MemTreeConfig
    from memtree_bench.summary_quality import summary_quality

    def build(reply: str) -> MemTree:
        memory = MemTree(
            embedder=HashingEmbedder(64),
            aggregator=LLMAggregator(lambda prompt: reply),
            config=MemTreeConfig(theta0=-1.0),
        )
        memory.add("8 May, 2023 Ana: I adopted a grey cat named Miso.")
        memory.add("8 May, 2023 Ben: I started training for the Berlin marathon.")
        return memory

    faithful = summary_quality(build("On 8 May 2023 Ana adopted Miso, a grey cat; Ben started marathon training."))
    assert faithful == {
        "summaries": 1.0,
        "abstraction": 0.0,
        "novel_word_share": 0.0,
        "invention": 0.0,
        "invented_facts": 0.0,
    }
    rewritten = summary_quality(build("Ana welcomed a kitten while Ben prepared for a race in Berlin."))
    assert rewritten["abstraction"] == 1.0 and rewritten["invention"] == 0.0
    assert rewritten["novel_word_share"] == pytest.approx(4 / 5)  # welcomed, kitten, prepared, race; not berlin
    invented = summary_quality(build("In 2021 Ana and Zoe adopted Miso."))
    assert invented["invention"] == 1.0 and invented["invented_facts"] == 2.0  # 2021 and Zoe
    assert summary_quality(MemTree(embedder=HashingEmbedder(64)))["summaries"] == 0.0


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
    payload = json.loads((out / "tiny.json").read_text())
    report = payload["results"]
    expected = [
        "flat dense",
        "BM25",
        "flat hybrid",
        "memtree",
        "memtree, summaries as text",
        "memtree, leaves only",
        "memtree traversal",
        "memtree paper",
        "RAPTOR-style (offline)",
    ]
    assert list(report) == expected  # no variant rows without --variants
    for name in set(expected) - {"memtree traversal"}:
        # A budget larger than the whole conversation holds every turn: recall is exactly 1.
        assert report[name]["recall"]["1000"] == 1.0, name
        assert report[name]["questions"] == 4
        assert report[name]["recall"]["5"] <= report[name]["recall"]["20"] <= 1.0
        # The one single-hop question's answer ("Miso") is in the whole conversation.
        assert report[name]["answer_recall_by_category"]["4"]["1000"] == 1.0, name
        assert report[name]["answer_recall_by_category"]["1"]["1000"] == 0.0, name  # "knocked over tea" is not
        assert report[name]["answer_recall"]["1000"] == 0.5, name  # the two pooled
    assert report["memtree"]["embedding_calls_per_insert"] == 1  # summaries' vectors come from their sentences
    assert report["memtree paper"]["embedding_calls_per_insert"] > 1  # leaves and re-embedded summaries
    for name in ("flat dense", "memtree", "memtree paper"):  # process CPU per insert, beside the wall clock
        assert 0 < report[name]["insert_ms"]["cpu_mean"] < 60_000, name
    assert report["memtree traversal"]["insert_ms"] == report["memtree"]["insert_ms"]  # one tree, one cost
    flat = report["flat hybrid"]
    assert flat["shape"]["nodes"] == 6 and flat["shape"]["max_depth"] == 1 and flat["aggregation_calls_per_insert"] == 0
    for name in ("flat dense", "BM25", "flat hybrid"):  # three flat lists of the 6 turns, described alike
        assert report[name]["shape"] == {"nodes": 6, "max_depth": 1, "mean_depth": 1, "branching": 0}, name
    markdown = (out / "tiny.md").read_text()
    assert "| memtree paper |" in markdown and "## Evidence recall, multi-hop (category 1)" in markdown
    assert "## Answer recall (gold answer string in the context), single-hop (category 4)" in markdown
    assert "## memtree's defaults against flat hybrid" in markdown
    quality = report["memtree"]["summary_quality"]  # extractive summaries copy every word: nothing new, nothing made up
    assert quality["summaries"] >= 1 and quality["abstraction"] == 0.0 and quality["invention"] == 0.0
    assert "## Summary quality" in markdown and "| memtree paper |" in markdown.split("## Summary quality")[1]
    assert "| command |" in markdown and (out / "tiny.png").read_bytes().startswith(b"\x89PNG")
    # The Markdown is rendered from the JSON alone: what one says, the other says.
    assert render_markdown_file(payload, "tiny") == markdown
    versions = dict(line.strip("|").split("|")[:2] for line in payload["environment"][2:])
    assert versions[" rank_bm25 "].strip() == importlib.metadata.version("rank-bm25")


def test_report_rows_follow_the_paper_and_the_flat_baseline() -> None:
    """The paper's row builds its own tree with the paper's settings and ranks as the
    paper does; flat hybrid is a tree that never groups; memtree's rows share one tree."""
    from memtree.embed import HashingEmbedder
    from memtree_bench.locomo_bench import LocomoSettings, method_factories

    methods = {
        m.name: m
        for m in (factory() for factory in method_factories(LocomoSettings(raptor=False), HashingEmbedder(32)))
    }
    paper = methods["memtree paper"].builder.config  # type: ignore[attr-defined]
    assert (paper.theta0, paper.decay, paper.parent_embedding, paper.lexical_weight) == (0.4, 0.5, "text", 0.0)
    assert paper.drop_repeated_sentences is False and paper.summary_hits == "text"
    shared = {
        methods[name].builder  # type: ignore[attr-defined]
        for name in ("memtree", "memtree, summaries as text", "memtree, leaves only", "memtree traversal")
    }
    assert len(shared) == 1 and methods["memtree paper"].builder not in shared  # type: ignore[attr-defined]
    assert methods["memtree, leaves only"].retrieve_options == {"leaves_only": True}  # type: ignore[attr-defined]
    flat = methods["flat hybrid"].builder  # type: ignore[attr-defined]
    assert flat.config.lexical_weight == MemTreeConfig().lexical_weight and flat not in shared
    turns = [
        Turn(f"D1:{i}", 1, "Ana", "8 May, 2023", None, text)
        for i, text in enumerate(["I adopted a cat.", "I adopted a cat.", "I adopted a grey cat.", "Berlin is big."])
    ]
    memory, cost = flat.build(turns)
    assert [leaf.depth for leaf in memory.leaves()] == [1, 1, 1, 1]  # twins and near-twins kept, all flat
    assert cost.aggregation_calls == 0 and memory.stats().nodes == 4


def test_raptor_row_packs_like_memtree() -> None:
    """The RAPTOR-style row drops sentences an earlier hit already gave, as memtree's rows do."""
    pytest.importorskip("sklearn")
    from memtree.aggregate import ExtractiveAggregator
    from memtree.embed import HashingEmbedder
    from memtree_bench.methods import RaptorMethod, deduplicated

    assert deduplicated(["A cat. A dog.", "A dog.", "A DOG. A bird.", "x\ny"]) == ["A cat. A dog.", "A bird.", "x\ny"]
    phrases = ["we hiked in the mountains", "my sister adopted a kitten", "the bakery sells sourdough"]
    turns = [
        Turn(f"D{i // 6 + 1}:{i % 6 + 1}", i // 6 + 1, "Ana", "8 May, 2023", None, f"{phrases[i % 3]} on day {i}.")
        for i in range(36)
    ]
    method = RaptorMethod(HashingEmbedder(64), lambda: ExtractiveAggregator())
    method.ingest(turns)
    assert method.tree.shape()["summaries"] > 0  # summaries repeat their leaves' sentences
    texts = method.ranked_texts("sister kitten", 10_000)
    sentences = [fold(s) for text in texts for s in split_sentences(text)]
    assert len(sentences) == len(set(sentences)) == 36  # every turn once, nothing twice


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
    """The harness on real LoCoMo data, cut to the first sessions of conversation 0 (the
    tiny conversation above covers the paper's and RAPTOR's rows)."""
    ok(
        memtree(
            "bench", "locomo", "--data", LOCOMO, "--conversations", "0", "--sessions", "3", "--questions", "6",
            "--embedder", "hashing", "--no-qa", "--no-paper", "--no-raptor", "--out", tmp_path, "--name", "slice",
            embedder=None,
        )
    )  # fmt: skip
    payload = json.loads((tmp_path / "slice.json").read_text())
    report = payload["results"]
    turns = payload["data"]["turns"]
    assert turns == len(first_sessions(load_locomo(LOCOMO)[0], 3).turns) and 40 < turns < 419
    assert report["memtree"]["questions"] == 6 and report["memtree"]["shape"]["nodes"] > turns
    assert report["flat hybrid"]["shape"]["nodes"] == turns


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
        # 8 methods (no RAPTOR) x 4 questions, each one reader and one judge call.
        assert server.count("chat") == 8 * 4 * 2
    qa = json.loads((tmp_path / "qa.json").read_text())["qa"]
    assert qa["budget"] == 1000 and set(qa["methods"]) >= {"flat dense", "memtree"}
    for row in qa["methods"].values():
        # Every context holds the whole conversation; only the cat question's gold answer is "Miso".
        assert row["overall"] == 0.25 and row["judge_failures"] == 0
        assert row["per_category"] == {"1": 0.0, "2": 0.0, "3": 0.0, "4": 1.0}
    assert "## QA accuracy (LLM reader and judge, context at 1000 words" in (tmp_path / "qa.md").read_text()
