"""MemTreeChatMessageHistory: an exact log, exchanges remembered in the session's tree."""

from __future__ import annotations

import base64
import inspect
import itertools
import json
import logging
import re
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    message_to_dict,
)
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.runnables.history import RunnableWithMessageHistory
from lc_fakes import PromptRecorder, conversation, hashing_memory, scripted, values_json_lacks

from langchain_memtree import MemTreeChatMessageHistory, MemTreeRetriever
from langchain_memtree.history import MESSAGES
from langchain_memtree.messages import Granularity, speaker
from memtree import HashingEmbedder, MemoryBackend, MemTree, MemTreeConfig
from memtree.embed import Matrix


def leaf_texts(memory: MemTree) -> list[str]:
    return [leaf.text for leaf in memory.leaves()]


def test_messages_come_back_exactly_in_order_and_rounds_are_remembered() -> None:
    history = MemTreeChatMessageHistory(hashing_memory(), session_id="maya")
    messages = conversation()
    history.add_messages(messages[:4])
    history.add_messages(messages[4:])
    assert history.messages == messages  # types, ids, names, content blocks, tool calls
    assert [type(m) for m in history.messages] == [type(m) for m in messages]
    assert leaf_texts(history.memory) == [
        "Maya: What's the weather in Oslo?\nAssistant: Let me check.\nAssistant: It is 12°C and raining in Oslo.",
        "Maya: Here is my greyhound Pepper.\nAssistant: Pepper looks lovely!",
    ]
    first = history.memory.leaves()[0]
    assert first.metadata == {"session_id": "maya", "message_ids": ["s1", "h1", "a1", "t1", "a2"]}


def test_a_round_added_in_two_calls_is_one_memory_even_across_handles() -> None:
    store = MemoryBackend()
    memory = hashing_memory(store=store)
    MemTreeChatMessageHistory(memory, session_id="s").add_user_message("I moved to Lisbon in March.")
    assert len(MemTreeChatMessageHistory(memory, session_id="s").memory) == 0  # waits for the answer
    reopened = hashing_memory(store=store)  # another process, same store
    MemTreeChatMessageHistory(reopened, session_id="s").add_ai_message("Lisbon is a great city!")
    history = MemTreeChatMessageHistory(hashing_memory(store=store), session_id="s")
    assert leaf_texts(history.memory) == ["User: I moved to Lisbon in March.\nAssistant: Lisbon is a great city!"]
    assert [m.text for m in history.messages] == ["I moved to Lisbon in March.", "Lisbon is a great city!"]


def test_message_granularity_remembers_each_message_with_text() -> None:
    history = MemTreeChatMessageHistory(hashing_memory(), session_id="maya", granularity="message")
    history.add_messages(conversation())
    assert leaf_texts(history.memory) == [
        "Maya: What's the weather in Oslo?",
        "Assistant: Let me check.",
        "Assistant: It is 12°C and raining in Oslo.",
        "Maya: Here is my greyhound Pepper.",
        "Assistant: Pepper looks lovely!",
    ]  # the system prompt and the tool result stay in the log only


@pytest.mark.parametrize("granularity", ["round", "message"])
def test_chat_messages_count_as_the_kind_their_role_names(granularity: Granularity) -> None:
    generic = [
        ChatMessage("Be brief.", role="system", id="s"),
        ChatMessage("I like green tea.", role="user", id="u1"),
        ChatMessage("Noted.", role="assistant", id="a1"),
        ChatMessage("And coffee in the morning.", role="human", id="u2"),
        ChatMessage("Tool output", role="tool", id="t"),
        ChatMessage("Noted too.", role="AI", id="a2"),
        ChatMessage("Once upon a time.", role="narrator", id="n"),
    ]
    typed = [
        SystemMessage("Be brief."),
        HumanMessage("I like green tea."),
        AIMessage("Noted."),
        HumanMessage("And coffee in the morning."),
        ToolMessage("Tool output", tool_call_id="c"),
        AIMessage("Noted too."),
    ]
    history = MemTreeChatMessageHistory(hashing_memory(), session_id="chat", granularity=granularity)
    history.add_messages(generic)
    as_typed = MemTreeChatMessageHistory(hashing_memory(), session_id="chat", granularity=granularity)
    as_typed.add_messages(typed)
    assert history.messages == generic
    expected = leaf_texts(as_typed.memory)  # the same memories as the typed messages give
    narrator = ["Narrator: Once upon a time."] if granularity == "message" else []
    assert leaf_texts(history.memory) == expected + narrator
    said = ["User: I like green tea.", "Assistant: Noted.", "User: And coffee in the morning.", "Assistant: Noted too."]
    assert expected == (["\n".join(said[:2]), "\n".join(said[2:])] if granularity == "round" else said)
    if granularity == "round":  # the unknown role waits with the next round
        history.add_messages([ChatMessage("Bye", role="user"), ChatMessage("Bye!", role="assistant")])
        assert leaf_texts(history.memory)[-1] == "Narrator: Once upon a time.\nUser: Bye\nAssistant: Bye!"


def test_content_without_text_is_logged_not_remembered_and_never_raises(caplog: pytest.LogCaptureFixture) -> None:
    history = MemTreeChatMessageHistory(hashing_memory(), session_id="odd", granularity="message")
    odd = [
        HumanMessage(content=[{"type": "image_url", "image_url": {"url": "https://example.org/cat.png"}}], id="img"),
        HumanMessage("", id="empty"),
        HumanMessage("   \n ", id="blank"),
        AIMessage("", id="calls", tool_calls=[{"name": "lookup", "args": {}, "id": "c9"}]),
        HumanMessage("nul\x00 inside and a lone \udc80 surrogate", id="dirty"),
    ]
    with caplog.at_level(logging.DEBUG, logger="langchain_memtree"):
        history.add_messages(odd)
    assert history.messages == odd
    assert leaf_texts(history.memory) == ["User: nul inside and a lone ? surrogate"]
    # the log holds only what every durable store accepts: no NUL, valid UTF-8
    logged = json.dumps(history.memory.store.get_records(history.namespace, MESSAGES), ensure_ascii=False)
    assert "\\u0000" not in logged and logged.encode("utf-8")
    assert "image_url" in caplog.text and "lookup" in caplog.text


def test_values_json_lacks_are_logged_as_tagged_plain_json_and_come_back_exactly() -> None:
    history = MemTreeChatMessageHistory(hashing_memory(), session_id="odd", granularity="message")
    plain = HumanMessage("Plain words.", id="plain")
    dirty = HumanMessage("nul\x00 and bytes", id="dirty", additional_kwargs={"raw": b"\x00\xff"})
    messages = [*values_json_lacks(), plain, dirty]
    history.add_messages(messages)
    assert history.messages == messages
    assert history.messages[0].content[1]["base64"] == b"RIFF-valid-utf8"  # type: ignore[index]  # still bytes
    records = list(history.memory.store.get_records(history.namespace, MESSAGES).values())
    json.loads(json.dumps(records, allow_nan=False))  # plain JSON, nothing else
    assert records[2] == message_to_dict(plain)  # what needs no tag is stored as LangChain writes it
    assert set(records[0]) == {"tagged_json"} and set(records[3]) == {"escaped_json_base64"}
    data = records[0]["tagged_json"]["data"]
    png = base64.b64encode(b"\x89PNG\r\n\x1a\n\x00\xff\xfe").decode()
    assert data["content"][2]["base64"] == {"$memtree": "bytes", "value": png}
    extras = data["additional_kwargs"]  # has a "$memtree" key of its own: stored as pairs
    assert extras["$memtree"] == "dict" and ["$memtree", "mine"] in extras["value"]
    assert ["sent_at", {"$memtree": "datetime", "value": "2024-05-01T10:30:00+00:00"}] in extras["value"]
    assert leaf_texts(history.memory)[:2] == ["User: Listen to Pepper barking.", "Assistant: What a loud dog!"]


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False),
    st.text(),
    st.binary(),
    st.datetimes(timezones=st.none() | st.timezones()),
    st.dates(),
    st.times(timezones=st.none() | st.timezones()),
)
nested = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text(max_size=8) | st.integers() | st.just("$memtree"), inner, max_size=3)
    ),
    max_leaves=12,
)


@settings(max_examples=80, deadline=None)
@given(extras=st.dictionaries(st.text(max_size=8), nested, max_size=4))
def test_any_mix_of_such_values_survives_the_log(extras: dict[str, object]) -> None:
    message = AIMessage("ok", id="m", additional_kwargs=extras)
    history = MemTreeChatMessageHistory(hashing_memory(), session_id="s", granularity="message")
    history.add_messages([message])
    back = history.messages[0].additional_kwargs
    assert back == extras and repr(back) == repr(extras)  # same types too (tuple stays tuple, bytes bytes)


def test_clear_forgets_log_pending_and_tree_of_that_session_only() -> None:
    memory = hashing_memory()
    maya = MemTreeChatMessageHistory(memory, session_id="maya")
    leo = MemTreeChatMessageHistory(memory, session_id="leo")
    maya.add_messages(conversation())
    maya.add_user_message("pending question")
    leo.add_messages([HumanMessage("Leo likes ramen."), AIMessage("Yum.")])
    maya.clear()
    assert maya.messages == [] and len(maya.memory) == 0
    maya.add_ai_message("A fresh start.")  # the cleared pending question is not revived
    assert leaf_texts(maya.memory) == ["Assistant: A fresh start."]
    assert len(leo.messages) == 2 and leaf_texts(leo.memory) == ["User: Leo likes ramen.\nAssistant: Yum."]
    assert memory.namespaces() == [("chat", "leo"), ("chat", "maya")]


async def test_async_variants_match_the_sync_ones() -> None:
    sync = MemTreeChatMessageHistory(hashing_memory(), session_id="a")
    other = MemTreeChatMessageHistory(hashing_memory(), session_id="a")
    sync.add_messages(conversation())
    await other.aadd_messages(conversation())
    assert await other.aget_messages() == sync.messages
    assert leaf_texts(other.memory) == leaf_texts(sync.memory)
    await other.aclear()
    assert await other.aget_messages() == [] and len(other.memory) == 0


class FlakyEmbedder(HashingEmbedder):
    def __init__(self) -> None:
        super().__init__(64)
        self.down = False

    def embed(self, texts: Sequence[str]) -> Matrix:
        if self.down:
            raise ConnectionError("embedding service unavailable")
        return super().embed(texts)


def test_a_failed_insert_loses_nothing_and_is_retried_with_the_next_messages() -> None:
    embedder = FlakyEmbedder()
    history = MemTreeChatMessageHistory(MemTree(embedder=embedder, config=MemTreeConfig(theta0=0.2)), session_id="s")
    embedder.down = True
    with pytest.raises(ConnectionError):
        history.add_messages([HumanMessage("I play the cello."), AIMessage("Wonderful.")])
    assert [m.text for m in history.messages] == ["I play the cello.", "Wonderful."]
    embedder.down = False
    history.add_messages([HumanMessage("And the piano."), AIMessage("Impressive.")])
    assert leaf_texts(history.memory) == [
        "User: I play the cello.\nAssistant: Wonderful.",
        "User: And the piano.\nAssistant: Impressive.",
    ]


def test_timestamps_come_from_the_clock_and_the_tree_serves_a_retriever() -> None:
    history = MemTreeChatMessageHistory(hashing_memory(), session_id="s", clock=lambda: "2024-05-01T10:00:00Z")
    history.add_messages([HumanMessage("My greyhound is called Pepper."), AIMessage("Cute name.")])
    history.add_messages([HumanMessage("I work as a nurse in Oslo."), AIMessage("Busy job!")])
    docs = MemTreeRetriever(memory=history.memory, leaves_only=True).invoke("greyhound called Pepper", k=1)
    assert docs[0].page_content == "User: My greyhound is called Pepper.\nAssistant: Cute name."
    assert docs[0].metadata["timestamp"] == "2024-05-01T10:00:00+00:00"
    assert docs[0].metadata["metadata"]["session_id"] == "s"


def test_bad_arguments_are_refused_clearly() -> None:
    memory = hashing_memory()
    with pytest.raises(ValueError, match="granularity must be 'round' or 'message'"):
        MemTreeChatMessageHistory(memory, session_id="s", granularity="turn")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="session_id must be a non-empty str"):
        MemTreeChatMessageHistory(memory, session_id="")
    with pytest.raises(TypeError, match=r"memory must be a memtree\.MemTree"):
        MemTreeChatMessageHistory("memory", session_id="s")  # type: ignore[arg-type]
    history = MemTreeChatMessageHistory(memory, session_id="s")
    with pytest.raises(TypeError, match="langchain BaseMessage"):
        history.add_messages(["hello"])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="cannot be stored as JSON"):
        history.add_messages([HumanMessage("hi", additional_kwargs={"raw": np.float32(1.0)})])
    assert history.messages == []


def deprecated_since(source: str, anchor: str) -> str:
    """The ``since=`` version langchain-core's source gives right before ``anchor``."""
    before = source[: source.index(anchor)]
    return re.findall(r'since="([^"]+)"', before)[-1]


def test_the_deprecation_note_names_the_installed_langchain_core_versions() -> None:
    import langchain_core.chat_history
    import langchain_core.runnables.history

    base = deprecated_since(inspect.getsource(langchain_core.chat_history), "class BaseChatMessageHistory")
    runnable = deprecated_since(
        inspect.getsource(langchain_core.runnables.history.RunnableWithMessageHistory.__init__),
        "RunnableWithMessageHistory is deprecated",
    )
    assert (base, runnable) == ("1.6.4", "1.3.3")
    page = Path(__file__).resolve().parents[1] / "docs" / "langchain.md"  # the README's LangChain section
    readme = " ".join(page.read_text(encoding="utf-8").split())
    assert f"`RunnableWithMessageHistory`, which langchain-core deprecates since {runnable}" in readme
    assert f"`BaseChatMessageHistory`, the class it builds on, is deprecated since langchain-core {base}" in readme
    doc = " ".join((MemTreeChatMessageHistory.__doc__ or "").split())
    assert f"(deprecated since langchain-core {runnable})" in doc and f"deprecated since langchain-core {base}" in doc


def test_langchains_deprecation_warnings_reach_the_user() -> None:
    """memtree filters no warnings: building a chain on the deprecated runnable warns as
    LangChain means it to, and using the history changes no warning filter."""
    filters = list(warnings.filters)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        chain = RunnableWithMessageHistory(
            scripted("Hello!"), lambda session_id: MemTreeChatMessageHistory(hashing_memory(), session_id=session_id)
        )
        chain.invoke([HumanMessage("Hi")], config={"configurable": {"session_id": "s"}})
    assert any(
        issubclass(w.category, DeprecationWarning) and "RunnableWithMessageHistory is deprecated" in str(w.message)
        for w in caught
    )
    assert warnings.filters == filters


def test_works_with_runnable_with_message_history() -> None:
    memory = hashing_memory()
    prompt = ChatPromptTemplate.from_messages(
        [("system", "You are a friendly assistant."), MessagesPlaceholder("history"), ("human", "{question}")]
    )
    model = scripted("Nice to meet you, Maya!", "Your greyhound is called Pepper.")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # RunnableWithMessageHistory itself is deprecated
        chain = RunnableWithMessageHistory(
            prompt | model,
            lambda session_id: MemTreeChatMessageHistory(memory, session_id=session_id),
            input_messages_key="question",
            history_messages_key="history",
        )
    recorder = PromptRecorder()
    config = {"configurable": {"session_id": "maya"}, "callbacks": [recorder]}
    chain.invoke({"question": "Hi, I'm Maya and my greyhound is Pepper."}, config=config)
    answer = chain.invoke({"question": "What is my dog called?"}, config=config)
    assert answer.content == "Your greyhound is called Pepper."
    assert [m.text for m in recorder.calls[1]] == [
        "You are a friendly assistant.",
        "Hi, I'm Maya and my greyhound is Pepper.",
        "Nice to meet you, Maya!",
        "What is my dog called?",
    ]
    history = MemTreeChatMessageHistory(memory, session_id="maya")
    assert [m.type for m in history.messages] == ["human", "ai", "human", "ai"]
    assert leaf_texts(history.memory) == [
        "User: Hi, I'm Maya and my greyhound is Pepper.\nAssistant: Nice to meet you, Maya!",
        "User: What is my dog called?\nAssistant: Your greyhound is called Pepper.",
    ]


speakers = st.sampled_from(["human", "ai", "ai-tools", "tool", "system", "chat-user", "chat-assistant", "chat-system"])


def build(kinds: list[str]) -> list[BaseMessage]:
    out: list[BaseMessage] = []
    for i, kind in enumerate(kinds):
        text = f"message {i} about topic {i % 3}"
        if kind == "human":
            out.append(HumanMessage(text, id=f"m{i}"))
        elif kind == "ai":
            out.append(AIMessage(text, id=f"m{i}"))
        elif kind == "ai-tools":
            out.append(AIMessage(text, id=f"m{i}", tool_calls=[{"name": "f", "args": {}, "id": f"c{i}"}]))
        elif kind.startswith("chat-"):
            out.append(ChatMessage(text, role=kind.removeprefix("chat-"), id=f"m{i}"))
        elif kind == "tool":
            out.append(ToolMessage(text, tool_call_id=f"c{i}", id=f"m{i}"))
        else:
            out.append(SystemMessage(text, id=f"m{i}"))
    return out


@settings(max_examples=60, deadline=None)
@given(kinds=st.lists(speakers, max_size=14), cuts=st.lists(st.integers(0, 14), max_size=5))
def test_how_messages_are_batched_changes_nothing(kinds: list[str], cuts: list[int]) -> None:
    messages = build(kinds)
    whole = MemTreeChatMessageHistory(hashing_memory(), session_id="s")
    whole.add_messages(messages)
    pieces = MemTreeChatMessageHistory(hashing_memory(), session_id="s")
    bounds = sorted({0, len(messages), *(c for c in cuts if c <= len(messages))})
    for start, end in itertools.pairwise(bounds):
        pieces.add_messages(messages[start:end])
    assert pieces.messages == whole.messages == messages
    assert leaf_texts(pieces.memory) == leaf_texts(whole.memory)
    # every remembered line is a human or AI message's text, each at most once, in order
    lines = [line for text in leaf_texts(whole.memory) for line in text.split("\n")]
    spoken = [f"{speaker(m)}: {m.text}" for m in messages if speaker(m) is not None]
    assert lines == spoken[: len(lines)]


async def test_works_with_runnable_with_message_history_async() -> None:
    memory = hashing_memory()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        chain = RunnableWithMessageHistory(
            scripted("Hello Maya.", "You told me about Pepper."),
            lambda session_id: MemTreeChatMessageHistory(memory, session_id=session_id),
        )
    config = {"configurable": {"session_id": "maya"}}
    await chain.ainvoke([HumanMessage("Hi, my greyhound is Pepper.")], config=config)
    await chain.ainvoke([HumanMessage("What did I tell you?")], config=config)
    history = MemTreeChatMessageHistory(memory, session_id="maya")
    assert [m.text for m in await history.aget_messages()] == [
        "Hi, my greyhound is Pepper.",
        "Hello Maya.",
        "What did I tell you?",
        "You told me about Pepper.",
    ]
    assert len(history.memory) == 2
