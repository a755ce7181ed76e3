"""MemTree.overview: a person, a topic or a time span covered breadth first, in time
order, each part dated; and retrieve routing overview requests to it."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Sequence
from datetime import UTC, datetime

import pytest

from memtree import Aggregator, HashingEmbedder, MemTree, MemTreeConfig
from memtree.intent import overview_request
from memtree.node import Vector
from memtree.overview import Settings, answer_overview, check_overview
from memtree.text import count_tokens

NOW = datetime(2024, 7, 1, tzinfo=UTC)

CHAT = [
    ("2024-04-28", "28 April 2024 Maya: We adopted a rescue greyhound called Pepper from the shelter in Porto."),
    ("2024-04-28", "28 April 2024 Leo: A greyhound for a marathon runner, that is perfect."),
    ("2024-04-28", "28 April 2024 Maya: Thanks!"),
    ("2024-05-12", "12 May 2024 Leo: I painted a plate with red and green enamel at a Kutani workshop in Kanazawa."),
    ("2024-05-12", "12 May 2024 Maya: Wow."),
    ("2024-05-12", "12 May 2024 Maya: My manager Farid wants me to present the waiting-time dashboard to the board."),
    ("2024-06-16", "16 June 2024 Maya: Pepper is scared of bicycles, so our walks avoid the cycle path by the river."),
    ("2024-06-16", "16 June 2024 Leo: My sister Clara is getting married in September in the Douro valley."),
    ("2024-06-16", "16 June 2024 Leo: Cool."),
]


def chat_memory(**config: object) -> MemTree:
    memory = MemTree(embedder=HashingEmbedder(128), config=MemTreeConfig(theta0=0.3, **config))  # type: ignore[arg-type]
    for day, text in CHAT:
        memory.add(text, timestamp=day)
    return memory


def test_an_overview_of_everything_gives_the_informative_memories_of_each_day_in_time_order() -> None:
    memory = chat_memory()
    parts = memory.overview(token_budget=80)
    assert parts and all(part.answered_by == "overview" for part in parts)
    times = [part.timestamp for part in parts]
    assert times == sorted(times)  # time order
    assert {part.time.date().isoformat() for part in parts if part.time} == {"2024-04-28", "2024-05-12", "2024-06-16"}
    texts = [part.text for part in parts]
    assert not {"28 April 2024 Maya: Thanks!", "12 May 2024 Maya: Wow.", "16 June 2024 Leo: Cool."} & set(texts)
    assert sum(count_tokens(part.context) for part in parts) <= 80


def test_an_overview_about_a_speaker_gives_what_that_speaker_said() -> None:
    memory = chat_memory()
    parts = memory.overview("Maya", token_budget=200)
    assert parts and all(": Maya:" not in part.text and " Maya: " in part.text for part in parts)
    assert "Leo" not in " ".join(part.text.split(": ", 1)[0] for part in parts)


def test_an_overview_of_a_time_span_reads_only_that_span() -> None:
    memory = chat_memory()
    parts = memory.overview(since="2024-05-01", until="2024-05-31", token_budget=500)
    assert {part.text for part in parts} == {text for day, text in CHAT if day.startswith("2024-05")}


def test_an_overview_about_a_topic_keeps_to_it() -> None:
    memory = chat_memory()
    parts = memory.overview("Pepper the greyhound", token_budget=500)
    assert parts and all("Pepper" in part.text or "greyhound" in part.text for part in parts)


def test_parts_without_a_date_in_their_text_are_dated() -> None:
    memory = MemTree(embedder=HashingEmbedder(64))
    memory.add("Maya adopted a rescue greyhound called Pepper.", timestamp="2024-04-28")
    memory.add("Pepper is scared of bicycles.", timestamp="2024-06-16")
    memory.add("Leo likes ramen.")  # no time: no date
    contexts = [part.context for part in memory.overview()]
    assert "2024-04-28: Maya adopted a rescue greyhound called Pepper." in contexts
    assert "2024-06-16: Pepper is scared of bicycles." in contexts
    assert "Leo likes ramen." in contexts
    assert contexts[-1] == "Leo likes ramen."  # undated parts come last


def test_k_caps_the_parts_and_an_empty_memory_gives_none() -> None:
    memory = chat_memory()
    assert len(memory.overview(k=2, token_budget=1000)) == 2
    assert MemTree(embedder=HashingEmbedder(64)).overview("anything") == []


def test_expired_memories_are_never_part_of_an_overview() -> None:
    memory = chat_memory()
    secret = memory.add("30 June 2024 Maya: my one-time code is 483920.", timestamp="2024-06-30", ttl=60)
    assert any(part.id == secret for part in memory.overview("Maya", token_budget=1000))
    memory._writer.set_expiry([secret], 1.0)  # expired in 1970: no sleeping in tests
    assert all(part.id != secret for part in memory.overview("Maya", token_budget=1000))


@pytest.mark.parametrize(
    ("options", "name"),
    [
        ({"k": 0}, "k"),
        ({"token_budget": -5}, "token_budget"),
        ({"since": "2024-06-01", "until": "2024-05-01"}, "since"),
        ({"since": "not a date"}, "since"),
        ({"where": {"x": {"$bad": 1}}}, "unknown operator"),
    ],
)
def test_bad_options_are_refused_by_name(options: dict[str, object], name: str) -> None:
    with pytest.raises((TypeError, ValueError), match=name):
        chat_memory().overview(**options)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="about"):
        chat_memory().overview(42)  # type: ignore[arg-type]


class ProseAggregator(Aggregator):
    """A stand-in for a model: its summaries are prose no leaf holds."""

    calls_model = True  # type: ignore[assignment]

    def aggregate(self, summary: str, new_texts: Sequence[str], count: int, *, centroid: Vector | None = None) -> str:
        words = {word.strip(".,:!?") for text in [summary, *new_texts] for word in text.split()}
        names = sorted(word for word in words if word.istitle() and len(word) > 2)
        return "In short, " + ", ".join(names[:12]) + " talked about pets, pottery, work and a wedding."


def test_a_model_summary_of_the_scope_stands_in_for_its_leaves() -> None:
    memory = MemTree(embedder=HashingEmbedder(16), aggregator=ProseAggregator(), config=MemTreeConfig(theta0=-1.0))
    for day, text in CHAT:
        memory.add(text, timestamp=day)
    assert memory.stats().summaries >= 1
    parts = memory.overview(token_budget=60)
    summaries = [part for part in parts if not part.is_leaf]
    assert summaries, [part.text for part in parts]
    assert re.match(r"\d{4}-\d\d-\d\d – \d{4}-\d\d-\d\d: In short,", summaries[0].context)  # first and last day
    assert set(summaries[0].leaf_ids) <= {node.id for node in memory.leaves()}


def test_retrieve_answers_an_overview_request_with_an_overview_and_says_so() -> None:
    memory = chat_memory()
    routed = memory.retrieve("What do you know about Maya?", k=5, token_budget=200)
    assert routed and {hit.answered_by for hit in routed} == {"overview"}
    assert [hit.id for hit in routed] == [part.id for part in memory.overview("Maya", token_budget=200)]
    looked_up = memory.retrieve("What do you know about Maya?", k=5, token_budget=200, route_overviews=False)
    assert {hit.answered_by for hit in looked_up} == {"retrieve"}
    off = chat_memory(route_overviews=False).retrieve("What do you know about Maya?", k=5)
    assert {hit.answered_by for hit in off} == {"retrieve"}
    assert {hit.answered_by for hit in memory.retrieve("What is Pepper scared of?")} == {"retrieve"}


def test_a_routed_recap_of_a_day_reads_that_day() -> None:
    memory = chat_memory()
    hits = memory.retrieve("What did Maya and Leo talk about on 12 May 2024?", token_budget=500, now=NOW)
    assert {hit.text for hit in hits} == {text for day, text in CHAT if day == "2024-05-12"}
    hits = memory.retrieve("What happened last month?", token_budget=500, now=NOW)
    assert {hit.time.date().isoformat() for hit in hits if hit.time} == {"2024-06-16"}


def test_the_async_paths_answer_the_same() -> None:
    memory = chat_memory()
    assert [p.id for p in asyncio.run(memory.aoverview("Maya", token_budget=100))] == [
        p.id for p in memory.overview("Maya", token_budget=100)
    ]
    routed = asyncio.run(memory.aretrieve("Summarise everything", token_budget=100))
    assert routed and {hit.answered_by for hit in routed} == {"overview"}


@pytest.mark.parametrize(
    ("query", "about", "span"),
    [
        ("What do you know about Caroline?", "Caroline", None),
        ("Can you tell me about Pepper?", "Pepper", None),
        ("Summarise my trip to Japan", "my trip to Japan", None),
        ("Recap our last chat", None, None),
        ("What did we talk about on 9 June?", None, "9 June"),
        ("What happened to Caroline in May 2023?", "Caroline", "May 2023"),
        ("What happened with Melanie's family in July 2023?", "Melanie's family", "July 2023"),
        ("What did Caroline and Melanie talk about on 8 May 2023?", "Caroline and Melanie", "8 May 2023"),
        ("Give me an overview of Leo's pottery", "Leo's pottery", None),
        ("what have we talked about so far?", None, None),
    ],
)
def test_overview_requests_are_recognised_with_their_subject_and_time(
    query: str, about: str | None, span: str | None
) -> None:
    request = overview_request(query, NOW)
    assert request is not None
    assert request.about == about
    assert (request.span.text if request.span else None) == span


@pytest.mark.parametrize(
    "query", ["What is Maya's dog afraid of?", "What activities does Melanie partake in?", "When did Leo go to Japan?"]
)
def test_lookups_are_not_overview_requests(query: str) -> None:
    assert overview_request(query, NOW) is None


def test_a_recap_of_the_last_chat_reads_the_latest_day_and_always_answers_every_query() -> None:
    memory = chat_memory()
    hits = memory.retrieve("Recap our last chat", token_budget=500)
    assert {hit.text for hit in hits} == {text for day, text in CHAT if day == "2024-06-16"}  # all of it fits
    always = memory.retrieve("Pepper", route_overviews="always", token_budget=500)
    assert always and {hit.answered_by for hit in always} == {"overview"}
    assert all("Pepper" in hit.text for hit in always)
    with pytest.raises(TypeError, match="route_overviews"):
        memory.retrieve("Pepper", route_overviews="sometimes")  # type: ignore[typeddict-item]


def test_the_date_is_said_once_for_the_parts_of_one_day() -> None:
    memory = MemTree(embedder=HashingEmbedder(64))
    memory.add("Maya adopted a rescue greyhound called Pepper from the shelter.", timestamp="2024-04-28T10:00:00")
    memory.add("Leo painted a plate with red and green enamel in Kanazawa.", timestamp="2024-04-28T11:00:00")
    memory.add(
        "1:56 pm on 8 May, 2024 Maya: My manager Farid wants me to present the dashboard.", timestamp="2024-05-08"
    )
    memory.add("1:56 pm on 8 May, 2024 Leo: My sister Clara is getting married in September.", timestamp="2024-05-08")
    contexts = [part.context for part in memory.overview(token_budget=500)]
    assert contexts == [
        "2024-04-28: Maya adopted a rescue greyhound called Pepper from the shelter.",
        "Leo painted a plate with red and green enamel in Kanazawa.",
        "2024-05-08: Maya: My manager Farid wants me to present the dashboard.",  # a transcript's date, short
        "Leo: My sister Clara is getting married in September.",  # and said once
    ]


def test_a_transcript_turn_s_date_is_said_as_its_day_and_the_budget_counts_what_is_delivered() -> None:
    """``1:56 pm on 8 May, 2024 Maya: ...`` is delivered as ``2024-05-08: Maya: ...``
    (one word for six), and the choice counts that: a budget that holds every turn as
    delivered gets every turn, though it would not hold them as stored."""
    memory = MemTree(embedder=HashingEmbedder(64), config=MemTreeConfig(token_counter=lambda text: len(text.split())))
    turns = [
        (f"2024-05-{day:02d}", f"1:56 pm on {day} May, 2024 Maya: {news}")
        for day, news in [
            (8, "My manager Farid wants me to present the dashboard."),
            (15, "We adopted a rescue greyhound called Pepper."),
            (22, "I signed up for a pottery class in Porto."),
            (29, "My sister Clara is getting married in September."),
        ]
    ]
    for day, text in turns:
        memory.add(text, timestamp=day)
    stored = sum(len(text.split()) for _, text in turns)  # 64 words
    delivered = stored - 5 * len(turns)  # 44 words: counted as stored, three turns would end the choice
    parts = memory.overview("Maya", token_budget=delivered)
    assert [part.context for part in parts] == [
        "2024-05-08: Maya: My manager Farid wants me to present the dashboard.",
        "2024-05-15: Maya: We adopted a rescue greyhound called Pepper.",
        "2024-05-22: Maya: I signed up for a pottery class in Porto.",
        "2024-05-29: Maya: My sister Clara is getting married in September.",
    ]


def test_an_overview_prefers_a_memory_that_says_something_new() -> None:
    """A second memory repeating the first one's words tells less than one about
    something else, though on its own it is worth more."""
    memory = MemTree(embedder=HashingEmbedder(64), config=MemTreeConfig(token_counter=lambda text: len(text.split())))
    memory.add("Maya: I adopted a rescue greyhound called Pepper from the Porto shelter.", timestamp="2024-05-01")
    memory.add(
        "Maya: My rescue greyhound Pepper from the Porto shelter, I adopted him, called him Pepper.",
        timestamp="2024-05-02",
    )
    memory.add("Maya: I joined a choir.", timestamp="2024-05-03")
    parts = memory.overview("Maya", token_budget=19)  # the first and the choir, as delivered
    assert [part.context.split(": ", 1)[0] for part in parts] == ["2024-05-01", "2024-05-03"]


def test_a_question_about_what_someone_discussed_with_whom_is_a_lookup() -> None:
    assert overview_request("What did Calvin discuss with the cool artist he met at the gala?", NOW) is None
    assert overview_request("What did Jolene and Deb discuss as a strategy for studying?", NOW) is None
    request = overview_request("What did we discuss about the wedding?", NOW)
    assert request is not None and request.about == "the wedding"


def test_an_overview_never_reads_a_summary_that_still_holds_an_expired_memory() -> None:
    """Before a sweep, a summary above an expired leaf may still say what it said;
    the overview masks it as retrieve does (memtree.redaction.unreadable)."""

    def prose(prompt: str) -> str:  # a model's summary: it restates, it does not quote
        return "Maya named " + ", ".join(sorted(set(re.findall(r"zq\w+zq", prompt)))) + "."

    memory = MemTree(embedder=HashingEmbedder(64), llm=prose, config=MemTreeConfig(theta0=0.0))
    for day, word in enumerate(["alpha", "bravo", "charlie", "delta", "echo", "foxtrot"]):
        text = f"Maya: on day {day} I told Leo a long story about my garden, my bike and the word zq{word}zq."
        memory.add(text, timestamp=f"2024-01-0{day + 1}", ttl=0.3 if word == "bravo" else None)
    assert any("zqbravozq" in node.text for node in memory._state.nodes.values() if not node.is_leaf)
    expires = time.time() + 0.3
    while time.time() <= expires:  # the real clock must pass the expiry (no upper bound: not a timing test)
        time.sleep(0.05)
    query = check_overview(memory.config, None, {"token_budget": 500})
    for settings in (Settings(), Settings(summary_share=0.5), Settings(summary_share=None, summary_sentences=True)):
        parts = answer_overview(memory._replica, query, memory.embed_query, settings)
        assert parts and not any("zqbravozq" in part.text for part in parts)
    assert not any("zqbravozq" in part.text for part in memory.overview(token_budget=500))
