"""`memtree bench overview`: questions built from any file in LoCoMo's schema, the fact
coverage rule, and the command end to end on a small conversation written here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memtree_bench.coverage import Fact, content_words, score_context
from memtree_bench.overview_questions import annotated
from memtree_bench.overview_report import paired_interval
from tests.cli_runner import memtree, ok
from tests.locomo_sample import SESSIONS

CONVERSATION = {"speaker_a": "Ana", "speaker_b": "Ben", **SESSIONS}
ANNOTATIONS = {
    "observation": {
        "session_1_observation": {
            "Ana": [["Ana adopted a grey cat named Miso who sleeps on her piano.", "D1:01"]],
            "Ben": [["Ben is training for the Berlin marathon.", "D1:2"]],
        },
        "session_2_observation": {
            "Ben": [["Ben hurt his knee on a long run and will rest it until July.", "D2:1, D2:3"]],
            "Ana": [["Ana's cat Miso knocked over her tea.", ["D2:2", "D9:9"]]],
        },
    },
    "event_summary": {
        "events_session_1": {"Ana": ["Ana adopts a cat named Miso."], "Ben": [], "date": "8 May, 2023"},
        "events_session_2": {"Ben": ["Ben injures his knee while running."], "Ana": [], "date": "20 June, 2023"},
    },
    "session_summary": {"session_1_summary": "Ana and Ben talked about a cat and a marathon."},
}
QA = [
    {"question": "What pets and hobbies does Ana have?", "answer": "a cat, piano", "evidence": ["D1:1"], "category": 1},
    {"question": "What did Ben hurt?", "answer": "knee", "evidence": ["D2:1"], "category": 4},
]


def write(path: Path, *, annotations: bool = True) -> Path:
    item = {"sample_id": "tiny-1", "conversation": CONVERSATION, "qa": QA, **(ANNOTATIONS if annotations else {})}
    path.write_text(json.dumps([item]), encoding="utf-8")
    return path


def test_the_families_come_from_the_annotations(tmp_path: Path) -> None:
    conversation = annotated(json.loads(write(tmp_path / "a.json").read_text())[0])
    by_family = {}
    for question in conversation.questions:
        by_family.setdefault(question.family, []).append(question)
    assert [q.question for q in by_family["person"]] == ["What do you know about Ana?", "What do you know about Ben?"]
    assert [len(q.facts) for q in by_family["person"]] == [2, 2]
    assert [q.question for q in by_family["day"]] == [
        "What did Ana and Ben talk about on 8 May 2023?",
        "What did Ana and Ben talk about on 20 June 2023?",
    ]
    assert {fact.kind for fact in by_family["day"][0].facts} == {"observation", "event"}
    months = [q.question for q in by_family["month"]]
    assert months == [
        "What happened to Ana in May 2023?",
        "What happened to Ben in May 2023?",
        "What happened to Ana in June 2023?",
        "What happened to Ben in June 2023?",
    ]
    (multi_hop,) = by_family["multi-hop"]  # category 1 only
    assert multi_hop.facts == (
        Fact(("Ana adopted a grey cat named Miso who sleeps on her piano.",), ("D1:1",), "evidence"),
    )
    knee = next(f for f in by_family["person"][1].facts if "knee" in f.wordings[0])
    assert knee.evidence == ("D2:1", "D2:3")  # ids read as LoCoMo's evidence is: one string, several ids
    tea = next(f for f in by_family["person"][0].facts if "tea" in f.wordings[0])
    assert tea.evidence == ("D2:2",)  # an id of no turn is dropped
    assert by_family["person"][0].scope.speaker == "Ana" and by_family["month"][0].scope.start is not None


def test_a_file_without_annotations_still_gives_its_multi_hop_questions(tmp_path: Path) -> None:
    conversation = annotated(json.loads(write(tmp_path / "b.json", annotations=False).read_text())[0])
    assert [q.family for q in conversation.questions] == ["multi-hop"]


def test_fact_coverage_counts_delivered_turns_and_restated_facts_alike() -> None:
    utterances = {"D1:1": "I adopted a grey cat named Miso. She sleeps on my piano.", "D1:2": "I run."}
    cat = Fact(("Ana adopted a grey cat named Miso who sleeps on her piano.",), ("D1:1",))
    assert score_context("She sleeps on my piano.", [cat], utterances, ["Ana", "Ben"]).coverage == 0.5  # half the turn
    restated = score_context("Ana has a grey cat, Miso, who sleeps on the piano.", [cat], utterances, ["Ana"])
    assert restated.coverage == 1.0 and restated.restated == 1 and restated.evidence_recall == 0.0
    assert score_context("Ana and Ben.", [cat], utterances, ["Ana", "Ben"]).coverage == 0.0  # names do not count
    event = Fact(("Ana adopts a cat named Miso.",), (), "event")
    got = score_context("Ana adopted Miso, a cat.", [cat, event], utterances, ["Ana"])
    assert got.coverage == 0.5 and got.evidence_recall == 0.0  # the event is restated; the fact's 60% is not reached
    assert content_words("Painting and painted paintings!") == frozenset({"paint"})
    with pytest.raises(ValueError, match="gold fact"):
        score_context("x", [], utterances, [])


def test_the_paired_interval_holds_its_mean_and_weighs_families_alike() -> None:
    point, low, high = paired_interval([[0.1, 0.3, 0.2], [1.0]])
    assert point == pytest.approx(0.6) and low <= point <= high
    assert paired_interval([[0.0, 0.0]]) == (0.0, 0.0, 0.0)


def test_bench_overview_writes_its_report_from_a_small_conversation(tmp_path: Path) -> None:
    data = write(tmp_path / "small.json")
    out = tmp_path / "out"
    done = ok(
        memtree(
            "bench", "overview", "--data", data, "--trees", tmp_path / "trees", "--embedder", "hashing",
            "--tuning", "none", "--budgets", "50,100", "--out", out, "--name", "small",
        )
    )  # fmt: skip
    assert "wrote" in done.stdout
    report = (out / "small.md").read_text()
    assert "## Goals: held out conversations, extractive trees" in report
    for row in ("random sample of the asked turns", "flat hybrid, time filter + MMR", "memtree overview"):
        assert row in report
    numbers = json.loads((out / "small.json").read_text())
    assert numbers["questions"]["held out"]["extractive"] == {"person": 2, "day": 2, "month": 4, "multi-hop": 1}
    assert "tiny" not in json.dumps(numbers["means"])  # means only: no question text is written
    assert sorted(p.suffix for p in (tmp_path / "trees").iterdir() if p.suffix == ".db") == [".db", ".db"]
