"""MemTreeMemoryMiddleware inside real create_agent runs (only the model is scripted)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import pytest
from gated import GatedAggregator, gated_memory, summaries_cover_exactly_their_leaves
from langchain.agents import create_agent
from langchain.agents.structured_output import ProviderStrategy, ToolStrategy
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from lc_fakes import PromptRecorder, hashing_memory, scripted
from pydantic import BaseModel

from langchain_memtree import MEMORY_HEADER, OVERVIEW_HEADER, MemTreeMemoryMiddleware, format_memories, format_overview
from memtree import HashingEmbedder, MemTree, MemTreeConfig, RetrievedNode


def seeded() -> MemTree:
    memory = hashing_memory()
    memory.add("User: My greyhound is called Pepper.\nAssistant: Lovely name!", timestamp="2024-04-28")
    memory.add("User: I work night shifts as a nurse.\nAssistant: That sounds tiring.", timestamp="2024-05-20")
    memory.add("User: Leo cooked ramen with yuzu.\nAssistant: Delicious.", timestamp="2024-06-02")
    return memory


def system_text(recorder: PromptRecorder, call: int = 0) -> str:
    first = recorder.calls[call][0]
    assert isinstance(first, SystemMessage)
    return first.text


def dated(hit: RetrievedNode) -> str:
    assert hit.time is not None
    return f"({'' if hit.is_leaf else 'up to '}{hit.time.date().isoformat()}) "


def test_a_summary_is_dated_by_its_latest_event_and_says_so() -> None:
    memory = hashing_memory()
    memory.add("User: Pepper the greyhound loves the beach.\nAssistant: Fun!", timestamp="2024-04-28")
    memory.add("User: Pepper the greyhound loves the park.\nAssistant: Nice!", timestamp="2024-06-02")
    memory.add("User: I work night shifts.\nAssistant: Tiring.", timestamp="2024-05-01")
    # Dense ranking puts the summary first (hybrid ranking discounts summaries, and
    # here ranks the two Pepper leaves above it), and its text is asked for (by default
    # a summary hit brings its leaves instead): this test is about how it is dated.
    hits = memory.retrieve("Pepper the greyhound loves", k=5, lexical_weight=0.0, summary_hits="text")
    assert [hit.is_leaf for hit in hits] == [False, True]  # the two Pepper rounds' summary, then a leaf
    assert format_memories(hits) == (
        f"{MEMORY_HEADER}\n"
        "- (up to 2024-06-02) User: Pepper the greyhound loves the beach.\n  Assistant: Fun!\n"
        "  User: Pepper the greyhound loves the park.\n  Assistant: Nice!\n"
        "- (2024-05-01) User: I work night shifts.\n  Assistant: Tiring."
    )


def test_the_model_receives_the_relevant_memories_in_its_system_message() -> None:
    memory = seeded()
    middleware = MemTreeMemoryMiddleware(memory=memory, namespace=memory.namespace, k=2, token_budget=200, record=False)
    agent = create_agent(
        scripted("Pepper."), tools=[], system_prompt="You are Maya's assistant.", middleware=[middleware]
    )
    recorder = PromptRecorder()
    agent.invoke({"messages": [HumanMessage("What is my greyhound called?")]}, config={"callbacks": [recorder]})
    expected_hits = memory.retrieve("What is my greyhound called?", k=2, token_budget=200)
    assert expected_hits[0].text.startswith("User: My greyhound is called Pepper.")
    bullets = "\n".join(f"- {dated(hit)}" + hit.context.replace("\n", "\n  ") for hit in expected_hits)
    assert system_text(recorder) == f"You are Maya's assistant.\n\n{MEMORY_HEADER}\n{bullets}"
    assert system_text(recorder).startswith(
        "You are Maya's assistant.\n\n## Relevant memories from earlier conversations\n"
        "- (2024-04-28) User: My greyhound is called Pepper.\n  Assistant: Lovely name!"
    )
    assert [m.text for m in recorder.calls[0][1:]] == ["What is my greyhound called?"]


def test_the_memory_section_stays_within_the_token_budget() -> None:
    memory = seeded()
    agent = create_agent(
        scripted("ok"),
        tools=[],
        middleware=[
            MemTreeMemoryMiddleware(memory=memory, namespace=memory.namespace, k=5, token_budget=12, record=False)
        ],
    )
    recorder = PromptRecorder()
    agent.invoke({"messages": [HumanMessage("greyhound nurse ramen")]}, config={"callbacks": [recorder]})
    section = system_text(recorder)  # no system prompt: the section is the whole system message
    assert section.startswith(MEMORY_HEADER + "\n- ")
    hits = memory.retrieve("greyhound nurse ramen", k=5, token_budget=12)
    assert sum(memory.config.token_counter(hit.context) for hit in hits) <= 12
    assert section == MEMORY_HEADER + "\n" + "\n".join(f"- {dated(h)}" + h.context.replace("\n", "\n  ") for h in hits)


def test_each_answered_turn_is_recorded_once_and_recalled_in_the_next_run() -> None:
    memory = hashing_memory()

    @tool
    def weather(city: str) -> str:
        """Current weather."""
        return f"12°C and rain in {city}"

    model = scripted(
        AIMessage("", tool_calls=[{"name": "weather", "args": {"city": "Oslo"}, "id": "w1"}]),
        AIMessage("It is 12°C and raining in Oslo, take your umbrella."),
        AIMessage("You asked about Oslo."),
    )
    middleware = MemTreeMemoryMiddleware(memory=memory, namespace=("users", "maya"), clock=lambda: "2024-09-01")
    agent = create_agent(model, tools=[weather], middleware=[middleware], checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "t1"}}
    agent.invoke({"messages": [HumanMessage("What's the weather in Oslo?")]}, config=config)
    maya = memory.sibling(("users", "maya"))
    assert [leaf.text for leaf in maya.leaves()] == [
        "User: What's the weather in Oslo?\nAssistant: It is 12°C and raining in Oslo, take your umbrella."
    ]  # the tool-calling turn is not an answer: one memory for the round
    assert len(memory) == 0  # nothing leaked into the default namespace
    recorder = PromptRecorder()
    agent.invoke(
        {"messages": [HumanMessage("Which city's weather did I ask about?")]},
        config={**config, "callbacks": [recorder]},
    )
    assert system_text(recorder) == (
        f"{MEMORY_HEADER}\n- (2024-09-01) User: What's the weather in Oslo?\n"
        "  Assistant: It is 12°C and raining in Oslo, take your umbrella."
    )
    assert len(maya) == 2
    state = agent.get_state(config).values
    middleware.after_model(state, None)  # type: ignore[arg-type]  # a replayed hook changes nothing
    assert len(maya) == 2


class Answer(BaseModel):
    """The pet's name and how sure the assistant is."""

    name: str
    sure: bool


def test_a_structured_answer_through_a_tool_is_recorded_once() -> None:
    memory = hashing_memory()

    @tool
    def lookup(topic: str) -> str:
        """Look a topic up in the user's notes."""
        return "Maya's greyhound is Pepper."

    model = scripted(
        AIMessage("", tool_calls=[{"name": "lookup", "args": {"topic": "dog"}, "id": "l1"}]),
        AIMessage("Found it.", tool_calls=[{"name": "Answer", "args": {"name": "Pepper", "sure": True}, "id": "s1"}]),
        AIMessage("", tool_calls=[{"name": "Answer", "args": {"name": "Miso", "sure": False}, "id": "s2"}]),
    )
    middleware = MemTreeMemoryMiddleware(memory=memory, namespace=memory.namespace, clock=lambda: "2024-09-01")
    agent = create_agent(
        model,
        tools=[lookup],
        response_format=ToolStrategy(Answer),
        middleware=[middleware],
        checkpointer=InMemorySaver(),
    )
    config = {"configurable": {"thread_id": "t1"}}
    result = agent.invoke({"messages": [HumanMessage("What is my dog called?")]}, config=config)
    assert result["structured_response"] == Answer(name="Pepper", sure=True)
    assert [type(m).__name__ for m in result["messages"]][-2:] == ["AIMessage", "ToolMessage"]
    assert [leaf.text for leaf in memory.leaves()] == [
        'User: What is my dog called?\nAssistant: Found it.\n{"name": "Pepper", "sure": true}'
    ]  # the lookup turn is not an answer; the structured one is, once
    assert memory.leaves()[0].source_id == result["messages"][-2].id
    middleware.after_model(agent.get_state(config).values, None)  # type: ignore[arg-type]  # a replay
    assert len(memory) == 1

    result = agent.invoke({"messages": [HumanMessage("And my cat?")]}, config=config)
    assert result["structured_response"] == Answer(name="Miso", sure=False)
    latest = memory.leaves()[-1].text
    assert latest == 'User: And my cat?\nAssistant: {"name": "Miso", "sure": false}'
    assert len(memory) == 2


def test_a_structured_answer_from_the_provider_is_recorded_once() -> None:
    memory = hashing_memory()
    agent = create_agent(
        scripted('{"name": "Pepper", "sure": true}'),
        tools=[],
        response_format=ProviderStrategy(Answer),
        middleware=[MemTreeMemoryMiddleware(memory=memory, namespace=memory.namespace)],
    )
    result = agent.invoke({"messages": [HumanMessage("What is my dog called?")]})
    assert result["structured_response"] == Answer(name="Pepper", sure=True)
    assert [leaf.text for leaf in memory.leaves()] == [
        'User: What is my dog called?\nAssistant: {"name": "Pepper", "sure": true}'
    ]


@dataclass
class UserContext:
    user_id: str


def test_the_namespace_can_follow_the_runtime_context() -> None:
    memory = hashing_memory()
    memory.sibling(("users", "leo")).add("User: My cat is Miso.\nAssistant: Cute.")
    middleware = MemTreeMemoryMiddleware(
        memory=memory, namespace=lambda runtime: ("users", runtime.context.user_id), k=3
    )
    agent = create_agent(
        scripted("Noted.", "Noted again."), tools=[], middleware=[middleware], context_schema=UserContext
    )
    recorder = PromptRecorder()
    agent.invoke(
        {"messages": [HumanMessage("My cat is called Tiger.")]},
        config={"callbacks": [recorder]},
        context=UserContext(user_id="maya"),
    )
    assert recorder.calls[0][0].type == "human"  # maya has no memories yet: the prompt is untouched
    assert [leaf.text for leaf in memory.sibling(("users", "maya")).leaves()] == [
        "User: My cat is called Tiger.\nAssistant: Noted."
    ]
    agent.invoke(
        {"messages": [HumanMessage("What is my cat called?")]},
        config={"callbacks": [recorder]},
        context=UserContext(user_id="leo"),
    )
    assert "My cat is Miso." in system_text(recorder, 1) and "Tiger" not in system_text(recorder, 1)


async def test_async_runs_recall_and_record_the_same_way() -> None:
    memory = seeded()
    agent = create_agent(
        scripted("Pepper."),
        tools=[],
        system_prompt="Be brief.",
        middleware=[MemTreeMemoryMiddleware(memory=memory, namespace=memory.namespace, k=1)],
    )
    recorder = PromptRecorder()
    await agent.ainvoke({"messages": [HumanMessage("What is my greyhound called?")]}, config={"callbacks": [recorder]})
    assert system_text(recorder) == (
        f"Be brief.\n\n{MEMORY_HEADER}\n- (2024-04-28) User: My greyhound is called Pepper.\n  Assistant: Lovely name!"
    )
    assert memory.leaves()[-1].text == "User: What is my greyhound called?\nAssistant: Pepper."


def test_block_system_messages_get_a_text_block() -> None:
    memory = seeded()
    system = SystemMessage(content=[{"type": "text", "text": "Rules."}])
    agent = create_agent(
        scripted("ok"),
        tools=[],
        system_prompt=system,
        middleware=[MemTreeMemoryMiddleware(memory=memory, namespace=memory.namespace, k=1, record=False)],
    )
    recorder = PromptRecorder()
    agent.invoke({"messages": [HumanMessage("greyhound")]}, config={"callbacks": [recorder]})
    content = recorder.calls[0][0].content
    assert isinstance(content, list) and content[0] == {"type": "text", "text": "Rules."}
    assert content[1]["text"].startswith(MEMORY_HEADER + "\n- (2024-04-28) User: My greyhound is called Pepper.")


def test_bad_options_fail_at_construction() -> None:
    memory = hashing_memory()
    with pytest.raises(ValueError, match="k must be an integer >= 1"):
        MemTreeMemoryMiddleware(memory=memory, namespace=memory.namespace, k=0)
    with pytest.raises(ValueError, match="token_budget must be an integer >= 1"):
        MemTreeMemoryMiddleware(memory=memory, namespace=memory.namespace, token_budget=-5)
    with pytest.raises(ValueError, match="unknown mode 'beam'"):
        MemTreeMemoryMiddleware(memory=memory, namespace=memory.namespace, mode="beam")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="namespace must be a non-empty"):
        MemTreeMemoryMiddleware(memory=memory, namespace=())
    with pytest.raises(TypeError, match=r"memory must be a memtree\.MemTree"):
        MemTreeMemoryMiddleware(memory=None)  # type: ignore[arg-type]


# -- summaries outside the turn -------------------------------------------------------

EXCHANGES = [
    ("My greyhound Pepper loves the beach.", "Pepper sounds happy at the beach."),
    ("My greyhound Pepper hates bicycles.", "Many greyhounds fear bicycles."),
    ("Pepper the greyhound sleeps all day.", "Greyhounds are famous sleepers."),
    ("I bake sourdough bread on Sundays.", "Sunday sourdough bread sounds lovely."),
]


def chat(middleware: MemTreeMemoryMiddleware) -> list[str]:
    """One agent run per exchange; the texts the memory should hold afterwards."""
    agent = create_agent(scripted(*(answer for _, answer in EXCHANGES)), tools=[], middleware=[middleware])
    for question, _ in EXCHANGES:
        agent.invoke({"messages": [HumanMessage(question)]})
    return [f"User: {question}\nAssistant: {answer}" for question, answer in EXCHANGES]


def test_by_default_a_turn_waits_for_no_summary_and_its_exchange_is_searchable_when_it_ends() -> None:
    aggregator = GatedAggregator()  # the memory's model: every call waits while the gate is closed
    memory = gated_memory(aggregator)
    middleware = MemTreeMemoryMiddleware(memory=memory, namespace=memory.namespace, clock=lambda: "2024-09-01")
    expected = chat(middleware)  # returns: no turn waited for the (blocked) model
    assert aggregator.calls == 0
    assert sorted(leaf.text for leaf in memory.leaves()) == sorted(expected)
    for text in expected:
        assert memory.retrieve(text, k=1, leaves_only=True)[0].text == text
    assert memory.stats().stale > 0
    aggregator.gate.set()
    assert middleware.wait_for_summaries(timeout=30)
    assert memory.stats().stale == 0 and aggregator.calls > 0
    assert summaries_cover_exactly_their_leaves(memory)
    memory.close()


def test_deferred_summaries_are_written_once_at_the_end_of_the_session() -> None:
    aggregator = GatedAggregator(open_gate=True)
    memory = gated_memory(aggregator)
    maya = memory.sibling(("users", "maya"))
    middleware = MemTreeMemoryMiddleware(memory=memory, namespace=("users", "maya"), aggregation="deferred")
    expected = chat(middleware)
    assert aggregator.calls == 0  # no summary written during the session
    assert sorted(leaf.text for leaf in maya.leaves()) == sorted(expected)
    stale = maya.stats().stale
    assert stale > 0
    assert middleware.flush() == stale  # the end of the session: each summary written once
    assert aggregator.calls == stale
    assert maya.stats().stale == 0
    assert summaries_cover_exactly_their_leaves(maya)
    memory.close()


def test_eager_summaries_are_written_inside_the_turn() -> None:
    aggregator = GatedAggregator(open_gate=True)
    memory = gated_memory(aggregator)
    expected = chat(MemTreeMemoryMiddleware(memory=memory, namespace=memory.namespace, aggregation="eager"))
    assert sorted(leaf.text for leaf in memory.leaves()) == sorted(expected)
    assert memory.stats().stale == 0 and aggregator.calls > 0
    assert summaries_cover_exactly_their_leaves(memory)


def test_an_unknown_aggregation_choice_fails_at_construction() -> None:
    with pytest.raises(ValueError, match="aggregation must be one of: eager, deferred, background; got 'lazy'"):
        MemTreeMemoryMiddleware(memory=hashing_memory(), aggregation="lazy")  # type: ignore[arg-type]


def test_an_unrelated_question_gets_no_memory_section() -> None:
    memory = seeded()
    middleware = MemTreeMemoryMiddleware(memory=memory, namespace=memory.namespace, record=False, min_similarity=0.4)
    agent = create_agent(
        scripted("51.", "Pepper."), tools=[], system_prompt="You are Maya's assistant.", middleware=[middleware]
    )
    recorder = PromptRecorder()
    agent.invoke({"messages": [HumanMessage("What is 17 times 3?")]}, config={"callbacks": [recorder]})
    assert system_text(recorder) == "You are Maya's assistant."  # no memory section, not even its header
    agent.invoke({"messages": [HumanMessage("What is my greyhound called?")]}, config={"callbacks": [recorder]})
    assert "User: My greyhound is called Pepper." in system_text(recorder, call=1)


def test_the_gate_defaults_to_the_memory_s_own_relevance_policy() -> None:
    memory = seeded()
    asked: list[object] = []
    original = memory.retrieve

    def recording(query: str, **options: object) -> list[RetrievedNode]:
        asked.append(options.get("min_similarity"))
        return original(query, **options)  # type: ignore[arg-type]

    memory.retrieve = recording  # type: ignore[method-assign]
    agent = create_agent(
        scripted("ok"),
        tools=[],
        middleware=[MemTreeMemoryMiddleware(memory=memory, namespace=memory.namespace, record=False)],
    )
    agent.invoke({"messages": [HumanMessage("What is 17 times 3?")]})
    assert asked == ["auto"]  # the memory's policy: its config's floor, by default its embedder's calibrated one
    with pytest.raises(ValueError, match="min_similarity"):
        MemTreeMemoryMiddleware(memory=memory, namespace=memory.namespace, min_similarity=float("nan"))


def test_recorded_exchanges_expire_with_the_memorys_default_ttl() -> None:
    # Chat memories that should not outlive a retention period: the memory's (or the
    # user's namespace's) default_ttl applies to every exchange the middleware records.
    memory = MemTree(embedder=HashingEmbedder(64), config=MemTreeConfig(theta0=0.2, default_ttl=3600))
    middleware = MemTreeMemoryMiddleware(memory=memory, namespace=memory.namespace, aggregation="eager")
    agent = create_agent(scripted("Noted: Pepper."), tools=[], middleware=[middleware])
    before = time.time()
    agent.invoke({"messages": [HumanMessage("My dog is called Pepper.")]})
    (leaf,) = memory.leaves()
    assert leaf.expires_at is not None and before + 3600 <= leaf.expires_at <= time.time() + 3600
    memory.close()


def test_a_message_asking_for_an_overview_gets_the_memory_s_overview_in_time_order() -> None:
    memory = seeded()
    middleware = MemTreeMemoryMiddleware(memory=memory, namespace=memory.namespace, token_budget=200, record=False)
    agent = create_agent(scripted("You have a greyhound."), tools=[], middleware=[middleware])
    recorder = PromptRecorder()
    agent.invoke({"messages": [HumanMessage("What do you know about me?")]}, config={"callbacks": [recorder]})
    parts = memory.overview(token_budget=200)
    assert [part.answered_by for part in parts] == ["overview"] * 3
    assert system_text(recorder) == format_overview(parts)
    assert system_text(recorder).startswith(
        f"{OVERVIEW_HEADER}\n- 2024-04-28: User: My greyhound is called Pepper.\n  Assistant: Lovely name!\n"
        "- 2024-05-20: User: I work night shifts as a nurse."
    )
    off = MemTreeMemoryMiddleware(memory=memory, namespace=memory.namespace, record=False, route_overviews=False)
    recorder = PromptRecorder()
    create_agent(scripted("ok"), tools=[], middleware=[off]).invoke(
        {"messages": [HumanMessage("What do you know about my greyhound?")]}, config={"callbacks": [recorder]}
    )
    assert system_text(recorder).startswith(MEMORY_HEADER)
    with pytest.raises(TypeError, match="route_overviews"):
        MemTreeMemoryMiddleware(memory=memory, route_overviews="sometimes")  # type: ignore[arg-type]


def test_a_recap_of_a_relative_day_counts_back_from_the_middleware_s_clock() -> None:
    memory = seeded()
    middleware = MemTreeMemoryMiddleware(
        memory=memory, namespace=memory.namespace, record=False, clock=lambda: "2024-05-21T09:00:00+00:00"
    )
    recorder = PromptRecorder()
    create_agent(scripted("ok"), tools=[], middleware=[middleware]).invoke(
        {"messages": [HumanMessage("What did we talk about yesterday?")]}, config={"callbacks": [recorder]}
    )
    assert system_text(recorder) == (
        f"{OVERVIEW_HEADER}\n- 2024-05-20: User: I work night shifts as a nurse.\n  Assistant: That sounds tiring."
    )
