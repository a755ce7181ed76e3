"""The adapters on durable stores: everything survives closing and reopening."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage
from lc_fakes import PromptRecorder, conversation, scripted, values_json_lacks

from langchain_memtree import MEMORY_HEADER, MemTreeChatMessageHistory, MemTreeMemoryMiddleware, MemTreeStore
from memtree import HashingEmbedder, MemTree, MemTreeConfig


def open_memory(location: str | Path) -> MemTree:
    return MemTree.open(location, embedder=HashingEmbedder(64), config=MemTreeConfig(theta0=0.2))


MESSAGES = conversation()[:-1]  # ends with a user message still waiting for its answer


def round_trip_history(location: str | Path) -> None:
    with open_memory(location) as memory:
        MemTreeChatMessageHistory(memory, session_id="maya").add_messages(MESSAGES)
    with open_memory(location) as memory:
        history = MemTreeChatMessageHistory(memory, session_id="maya")
        assert history.messages == MESSAGES
        assert [leaf.text for leaf in history.memory.leaves()] == [
            "Maya: What's the weather in Oslo?\nAssistant: Let me check.\nAssistant: It is 12°C and raining in Oslo."
        ]
        history.add_ai_message(AIMessage("What a handsome greyhound!", id="a3"))  # completes the pending round
    with open_memory(location) as memory:
        history = MemTreeChatMessageHistory(memory, session_id="maya")
        assert [m.id for m in history.messages] == ["s1", "h1", "a1", "t1", "a2", "h2", "a3"]
        assert [leaf.text for leaf in history.memory.leaves()][
            -1
        ] == "Maya: Here is my greyhound Pepper.\nAssistant: What a handsome greyhound!"
        history.clear()
    with open_memory(location) as memory:
        history = MemTreeChatMessageHistory(memory, session_id="maya")
        assert history.messages == [] and len(history.memory) == 0


def round_trip_store(location: str | Path) -> None:
    with open_memory(location) as memory:
        store = MemTreeStore(memory, index={"fields": ["text"]})
        store.put(("memories", "maya"), "dog", {"text": "Maya's greyhound is called Pepper.", "year": 2024})
        store.put(("memories", "maya"), "job", {"text": "Maya works night shifts as a nurse.", "year": 2023})
        store.put(("memories", "leo"), "secret", {"text": "Leo hides the key."}, index=False)
        before = store.get(("memories", "maya"), "dog")
    with open_memory(location) as memory:
        store = MemTreeStore(memory, index={"fields": ["text"]})
        assert store.get(("memories", "maya"), "dog") == before
        assert store.list_namespaces() == [("memories", "leo"), ("memories", "maya")]
        found = store.search(("memories",), query="Maya's greyhound is called Pepper.", limit=3)
        assert [(i.namespace, i.key) for i in found] == [
            (("memories", "maya"), "dog"),
            (("memories", "maya"), "job"),
            (("memories", "leo"), "secret"),
        ]
        assert found[-1].score is None
        store.delete(("memories", "leo"), "secret")
    with open_memory(location) as memory:
        assert MemTreeStore(memory).list_namespaces() == [("memories", "maya")]


def test_history_round_trips_after_reopening_sqlite(tmp_path: Path) -> None:
    round_trip_history(tmp_path / "memory.db")


def test_store_items_and_search_survive_reopening_sqlite(tmp_path: Path) -> None:
    round_trip_store(tmp_path / "memory.db")


def test_middleware_recalls_what_an_earlier_process_recorded(tmp_path: Path) -> None:
    path = tmp_path / "memory.db"
    with open_memory(path) as memory:
        middleware = MemTreeMemoryMiddleware(memory=memory, namespace=("users", "maya"), clock=lambda: "2024-05-01")
        agent = create_agent(scripted("Pepper is a lovely name."), tools=[], middleware=[middleware])
        agent.invoke({"messages": [HumanMessage("My greyhound is called Pepper.")]})
    with open_memory(path) as memory:
        middleware = MemTreeMemoryMiddleware(memory=memory, namespace=("users", "maya"), record=False)
        agent = create_agent(scripted("Pepper."), tools=[], middleware=[middleware])
        recorder = PromptRecorder()
        agent.invoke({"messages": [HumanMessage("What is my dog called?")]}, config={"callbacks": [recorder]})
    assert recorder.calls[0][0].text == (
        f"{MEMORY_HEADER}\n- (2024-05-01) User: My greyhound is called Pepper.\n  Assistant: Pepper is a lovely name."
    )


def test_history_and_store_on_postgresql(postgres_dsn: str) -> None:
    round_trip_history(postgres_dsn)
    round_trip_store(postgres_dsn)
    with open_memory(postgres_dsn) as memory:
        MemTreeChatMessageHistory(memory, session_id="odd").add_messages(values_json_lacks())
    with open_memory(postgres_dsn) as memory:
        assert MemTreeChatMessageHistory(memory, session_id="odd").messages == values_json_lacks()


def test_messages_that_json_cannot_carry_come_back_exactly_from_sqlite(tmp_path: Path) -> None:
    odd = [
        HumanMessage("nul \x00, lone \udc80 and a literal \\u0000", id="odd"),
        AIMessage("Noted.", id="ok"),
    ]
    with open_memory(tmp_path / "memory.db") as memory:
        MemTreeChatMessageHistory(memory, session_id="odd").add_messages(odd)
    with open_memory(tmp_path / "memory.db") as memory:
        history = MemTreeChatMessageHistory(memory, session_id="odd")
        assert history.messages == odd
        assert [leaf.text for leaf in history.memory.leaves()] == [
            "User: nul , lone ? and a literal \\u0000\nAssistant: Noted."
        ]


def test_bytes_datetimes_and_tuples_come_back_exactly_from_sqlite(tmp_path: Path) -> None:
    messages = values_json_lacks()
    with open_memory(tmp_path / "memory.db") as memory:
        MemTreeChatMessageHistory(memory, session_id="odd").add_messages(messages)
    with open_memory(tmp_path / "memory.db") as memory:
        history = MemTreeChatMessageHistory(memory, session_id="odd")
        back = history.messages
        assert back == messages
        assert back[0].content[2]["base64"] == b"\x89PNG\r\n\x1a\n\x00\xff\xfe"  # type: ignore[index]
        assert back[0].additional_kwargs["sent_at"] == datetime(2024, 5, 1, 10, 30, tzinfo=UTC)
        assert type(back[0].additional_kwargs["pair"]) is tuple
        assert [leaf.text for leaf in history.memory.leaves()] == [
            "User: Listen to Pepper barking.\nAssistant: What a loud dog!"
        ]
