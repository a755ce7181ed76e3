"""MemTreeMemoryMiddleware keeps each user's memories apart by default (LangGraph /
LangMem namespace templates), across a restart, on SQLite and PostgreSQL; a run
with no user id is refused rather than given a memory shared with everyone."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import HumanMessage
from lc_fakes import PromptRecorder, scripted

from langchain_memtree import MemTreeMemoryMiddleware
from langchain_memtree.namespaces import DEFAULT_NAMESPACE, NamespaceTemplate
from memtree import HashingEmbedder, MemTree, MemTreeConfig


@dataclass
class UserContext:
    user_id: str


def open_memory(location: str) -> MemTree:
    return MemTree.open(location, embedder=HashingEmbedder(64), config=MemTreeConfig(theta0=0.2))


def told(recorder: PromptRecorder) -> str:
    """Everything the model was shown in its last call."""
    return "\n".join(message.text for message in recorder.calls[-1])


def ask(memory: MemTree, user: str | None, question: str, answer: str = "Noted.", **agent_options: Any) -> str:
    """One run of a fresh agent (as after a restart) for ``user``; what the model saw."""
    agent = create_agent(
        scripted(answer),
        tools=[],
        middleware=[MemTreeMemoryMiddleware(memory=memory, k=3, aggregation="eager", **agent_options)],
        context_schema=UserContext,
    )
    recorder = PromptRecorder()
    context = UserContext(user_id=user) if user is not None else None
    agent.invoke({"messages": [HumanMessage(question)]}, config={"callbacks": [recorder]}, context=context)
    return told(recorder)


def two_users_and_a_restart(location: str) -> None:
    memory = open_memory(location)
    ask(memory, "maya", "My greyhound Pepper is scared of bicycles.", "Poor Pepper!")
    ask(memory, "maya", "My sister Rosa lives in Porto.", "Porto is lovely.")
    leo_saw = ask(memory, "leo", "What is my dog afraid of?", "I don't know yet.")
    assert "Pepper" not in leo_saw and "bicycles" not in leo_saw  # maya's memories never reach leo
    assert sorted(memory.namespaces()) == [("memories", "leo"), ("memories", "maya")]
    memory.close()

    reopened = open_memory(location)  # a restart: a new process would see the same
    maya_saw = ask(reopened, "maya", "What is my greyhound scared of?", "Bicycles.")
    assert "My greyhound Pepper is scared of bicycles." in maya_saw
    leo_saw = ask(reopened, "leo", "Where does my sister live?", "You have not told me.")
    assert "Rosa" not in leo_saw and "Porto" not in leo_saw and "What is my dog afraid of?" in leo_saw
    assert len(reopened.sibling(("memories", "maya"))) == 3 and len(reopened.sibling(("memories", "leo"))) == 2
    assert len(reopened) == 0  # nothing in the memory's own namespace
    reopened.close()


def test_two_users_are_kept_apart_by_default_across_a_restart_on_sqlite(tmp_path: Path) -> None:
    two_users_and_a_restart(str(tmp_path / "agent.db"))


def test_two_users_are_kept_apart_by_default_across_a_restart_on_postgres(postgres_dsn: str) -> None:
    two_users_and_a_restart(postgres_dsn)


def test_a_run_with_no_user_id_is_refused_with_the_ways_to_choose(tmp_path: Path) -> None:
    memory = open_memory(str(tmp_path / "agent.db"))
    default = r"\('memories', '\{user_id\}'\) \(the default: one namespace per user\)"
    with pytest.raises(ValueError, match=default) as info:
        ask(memory, None, "What is my dog afraid of?")
    message = str(info.value)
    assert "context={'user_id': ...}" in message and "configurable" in message and "namespace=('shared',)" in message
    assert memory.namespaces() == []  # nothing was recorded anywhere


def test_the_user_id_can_come_from_the_config_as_in_langmem(tmp_path: Path) -> None:
    memory = open_memory(str(tmp_path / "agent.db"))
    agent = create_agent(scripted("Noted."), tools=[], middleware=[MemTreeMemoryMiddleware(memory=memory)])
    agent.invoke({"messages": [HumanMessage("I like dark mode.")]}, config={"configurable": {"user_id": "u-123"}})
    assert [leaf.text for leaf in memory.sibling(("memories", "u-123")).leaves()] == [
        "User: I like dark mode.\nAssistant: Noted."
    ]


def test_a_template_of_your_own_and_a_shared_namespace_asked_for_explicitly(tmp_path: Path) -> None:
    memory = open_memory(str(tmp_path / "agent.db"))
    ask(memory, "maya", "I keep bees.", namespace=("org", "acme", "{user_id}"))
    assert memory.namespaces() == [("org", "acme", "maya")]
    ask(memory, "maya", "The office closes at six.", namespace=("shared",))
    assert "The office closes at six." in ask(memory, "leo", "When does the office close?", namespace=("shared",))


def test_a_template_names_a_field_the_run_lacks() -> None:
    template = NamespaceTemplate(("memories", "{org_id}", "{user_id}"))
    with pytest.raises(ValueError, match="needs org_id, user_id"):
        template(None)
    assert NamespaceTemplate(DEFAULT_NAMESPACE).fields == ["user_id"]


async def test_async_runs_are_kept_apart_the_same_way(tmp_path: Path) -> None:
    memory = open_memory(str(tmp_path / "agent.db"))
    agent = create_agent(
        scripted("Noted.", "I don't know."), tools=[], middleware=[MemTreeMemoryMiddleware(memory=memory)]
    )
    await agent.ainvoke(
        {"messages": [HumanMessage("My greyhound Pepper fears bicycles.")]}, context={"user_id": "maya"}
    )
    recorder = PromptRecorder()
    await agent.ainvoke(
        {"messages": [HumanMessage("What does my greyhound fear?")]},
        config={"callbacks": [recorder], "configurable": {"user_id": "leo"}},
    )
    assert "Pepper" not in told(recorder)
    assert memory.namespaces() == [("memories", "leo"), ("memories", "maya")]
