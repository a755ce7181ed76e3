"""Digest summaries: a heading that says when, who and what, then central sentences."""

from __future__ import annotations

from memtree import HashingEmbedder, MemTree
from memtree.digest import DigestAggregator, Heading, parse_heading, speaker_of
from memtree.text import date_of, fold

TURNS = [
    "14 January 2024 Maya: I signed up for the Lisbon marathon in October.",
    "22 February 2024 Maya: I got the job! The logistics job.",
    "15 January 2024 Leo: A marathon? Your coach must be strict.",
]


def digest() -> DigestAggregator:
    return DigestAggregator(HashingEmbedder(64))


def test_date_and_speaker_are_read_from_a_chat_turn() -> None:
    assert date_of(TURNS[0]) == "14 January 2024"
    assert date_of("1:56 pm on 8 May, 2023 Caroline: hi") == "8 May, 2023"
    assert speaker_of(TURNS[2]) == "Leo"
    assert date_of("no date here") is None and speaker_of("no speaker here") is None


def test_a_heading_renders_and_parses_back() -> None:
    heading = Heading("14 January 2024", "22 February 2024", ("Maya", "Leo"), ("marathon", "job"))
    line = heading.render()
    assert line == "14 January 2024 – 22 February 2024 · Maya, Leo · marathon, job"
    assert parse_heading(line) == heading
    assert Heading(None, None, (), ("roses",)).render() == "- · - · roses"
    assert parse_heading("- · - · roses") == Heading(None, None, (), ("roses",))
    assert Heading(None, None, (), ()).render() == ""
    assert parse_heading("14 January 2024 Maya: I got the job!") is None
    assert parse_heading("a · b") is None  # a leaf's own text is not taken for a heading


def test_splitting_a_leaf_gives_the_span_people_terms_and_all_sentences_that_fit() -> None:
    summary = digest().aggregate(TURNS[0], [TURNS[1]], 1)
    assert summary == (
        "14 January 2024 – 22 February 2024 · Maya · job, lisbon, logistics, marathon\n"
        "14 January 2024 Maya: I signed up for the Lisbon marathon in October.\n"
        "22 February 2024 Maya: I got the job!\n"
        "The logistics job."
    )


def test_folding_in_a_turn_keeps_the_span_adds_the_speaker_and_keeps_the_budget() -> None:
    aggregator = digest()
    first = aggregator.aggregate(TURNS[0], [TURNS[1]], 1)
    second = aggregator.aggregate(first, [TURNS[2]], 2)
    heading, *body = second.splitlines()
    assert heading == "14 January 2024 – 22 February 2024 · Maya, Leo · marathon, job, lisbon, logistics"
    assert len(" ".join(body).split()) <= aggregator.word_budget(3) - len(heading.split())
    assert body and all(any(fold(line) in fold(turn) for turn in TURNS) for line in body)


def test_every_word_of_a_digest_comes_from_a_leaf() -> None:
    summary = digest().aggregate("", TURNS, 0)
    leaf_words = {word.strip(".,!?:").lower() for turn in TURNS for word in turn.split()}
    for word in summary.replace("·", " ").replace("–", " ").replace(",", " ").split():
        assert word.strip(".,!?:").lower() in leaf_words, word


def test_texts_without_dates_or_speakers_get_terms_only() -> None:
    texts = ["The roses in the garden need water.", "Water the garden roses every morning."]
    summary = digest().aggregate("", texts, 0)
    assert summary.splitlines()[0] == "- · - · garden, roses, water, morning"


def test_a_memory_with_digest_summaries_retrieves_its_turns() -> None:
    from memtree import MemTreeConfig

    config = MemTreeConfig(theta0=0.0)
    with MemTree(embedder=HashingEmbedder(64), aggregator=DigestAggregator(), config=config) as memory:
        for turn in TURNS:
            memory.add(turn)
        summaries = [n for n in memory.walk() if not n.is_leaf and n.id != "root"]
        assert summaries and all(parse_heading(n.text.splitlines()[0]) for n in summaries)
        hits = memory.retrieve("Lisbon marathon", k=3)
        assert hits[0].is_leaf and hits[0].text == TURNS[0]
