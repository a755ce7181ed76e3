"""Time expressions in queries: resolved to a range against a reference time, and a
query without one ranks exactly as with the parsing off."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memtree import HashingEmbedder, MemTree, MemTreeConfig
from memtree.time_expressions import might_name_a_time, time_span

NOW = datetime(2023, 10, 22, 13, 0, tzinfo=UTC)


def bounds(query: str, now: datetime = NOW) -> tuple[str | None, str | None] | None:
    span = time_span(query, now)
    if span is None:
        return None

    def show(seconds: float | None) -> str | None:
        return None if seconds is None else datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M:%S")

    return show(span.start), show(span.end)


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("What happened with Melanie in July 2023?", ("2023-07-01 00:00:00", "2023-07-31 23:59:59")),
        ("What happened on 8 May, 2023?", ("2023-05-08 00:00:00", "2023-05-08 23:59:59")),
        ("Who did Maria have dinner with on May 3, 2023?", ("2023-05-03 00:00:00", "2023-05-03 23:59:59")),
        ("Recap 2023-05-08", ("2023-05-08 00:00:00", "2023-05-08 23:59:59")),
        ("What did Caroline do in 2022?", ("2022-01-01 00:00:00", "2022-12-31 23:59:59")),
        ("What did we talk about on 9 June?", ("2023-06-09 00:00:00", "2023-06-09 23:59:59")),  # the past June
        ("What happened between May and July 2023?", ("2023-05-01 00:00:00", "2023-07-31 23:59:59")),
    ],
)
def test_absolute_expressions_become_the_day_month_or_year_they_name(query: str, expected: tuple[str, str]) -> None:
    assert bounds(query) == expected


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("What did we do yesterday?", ("2023-10-21 00:00:00", "2023-10-21 23:59:59")),
        ("What did I do last week?", ("2023-10-09 00:00:00", "2023-10-15 23:59:59")),  # Monday to Sunday
        ("What did Caroline do 2 weeks ago?", ("2023-10-02 00:00:00", "2023-10-08 23:59:59")),
        ("What happened last month?", ("2023-09-01 00:00:00", "2023-09-30 23:59:59")),
    ],
)
def test_relative_expressions_count_back_from_the_reference_time(query: str, expected: tuple[str, str]) -> None:
    assert bounds(query) == expected
    assert bounds(query, datetime(2024, 3, 6, tzinfo=UTC)) != expected  # another "now", another range


def test_a_word_before_a_time_opens_one_side() -> None:
    assert bounds("What did we talk about since March?") == ("2023-03-01 00:00:00", None)
    assert bounds("What did Maria do before April 10, 2023?") == (None, "2023-04-10 23:59:59")  # the day is in


def test_a_relative_time_beside_a_date_counts_from_the_date() -> None:
    assert bounds("What did Joanna just finish last Friday on 23 January, 2022?") == (
        "2022-01-23 00:00:00",
        "2022-01-23 23:59:59",
    )


@pytest.mark.parametrize(
    "query",
    ["What is Maya's dog afraid of?", "What may Caroline do?", "March for rights", "I ran a 5K in 25 minutes", ""],
)
def test_words_that_only_look_like_times_name_none(query: str) -> None:
    assert time_span(query, NOW) is None


def test_a_query_without_time_words_is_not_parsed_at_all() -> None:
    assert not might_name_a_time("What is Maya's dog afraid of?")
    assert might_name_a_time("What happened in May?") and might_name_a_time("a week ago")


def test_the_reference_time_defaults_to_now_and_a_bad_one_is_refused_by_name() -> None:
    span = time_span("What did we do yesterday?")
    assert span is not None and span.start is not None
    assert datetime.now(UTC).timestamp() - 2 * 86400 < span.start < datetime.now(UTC).timestamp()
    with pytest.raises(ValueError, match="now"):
        time_span("yesterday", "not a date")


TEXTS = [
    "Alice adopted a grey cat named Miso.",
    "Bob started training for the Berlin marathon.",
    "Alice's cat Miso likes to sleep on the piano.",
    "Bob injured his knee during a long run.",
    "Carol moved to Lisbon for a job in a bakery.",
]


def memory_of_dated_notes() -> MemTree:
    memory = MemTree(embedder=HashingEmbedder(64), config=MemTreeConfig(theta0=0.2))
    for number, text in enumerate(TEXTS):
        memory.add(text, timestamp=f"2023-{number + 3:02d}-10")
    return memory


MEMORY = memory_of_dated_notes()
QUERY_WORDS = ["cat", "marathon", "Alice", "Bob", "knee", "piano", "Lisbon", "bakery", "the", "a", "what", "did"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(QUERY_WORDS), min_size=1))
def test_a_query_with_no_time_expression_ranks_exactly_as_with_the_parsing_off(words: list[str]) -> None:
    query = " ".join(words)
    on = MEMORY.retrieve(query, k=4, now=NOW)
    off = MEMORY.retrieve(query, k=4, parse_times=False)
    assert [(hit.id, hit.score) for hit in on] == [(hit.id, hit.score) for hit in off]


def test_the_range_a_query_names_ranks_its_memories_higher_but_hides_nothing() -> None:
    query = "What did Bob do in June 2023?"  # June: the knee (the fourth note)
    plain = MEMORY.retrieve(query, k=5, parse_times=False)
    timed = MEMORY.retrieve(query, k=5, now=NOW)
    assert timed[0].text == "Bob injured his knee during a long run."
    assert {hit.id for hit in timed} == {hit.id for hit in plain}  # a boost, not a filter
    assert MemTree(embedder=HashingEmbedder(64), config=MemTreeConfig(parse_times=False)).config.parse_times is False
    given_range = MEMORY.retrieve(query, k=5, time_range=("2023-03-01", "2023-03-31"))
    assert [hit.text for hit in given_range] == ["Alice adopted a grey cat named Miso."]  # the caller's range wins
