"""Test doubles for the LangChain adapter tests: the scripted chat model that can be
bound to tools (shipped as ``langchain_memtree.testing``, since LangChain's fakes
cannot), and a callback that records what a chat model was sent. Both are real
LangChain classes, only the answers are canned."""

from __future__ import annotations

from datetime import UTC, date, datetime
from typing import Any

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage

from langchain_memtree.testing import ScriptedChatModel, scripted
from memtree import HashingEmbedder, MemTree, MemTreeConfig

__all__ = ["PromptRecorder", "ScriptedChatModel", "conversation", "hashing_memory", "scripted", "values_json_lacks"]


class PromptRecorder(BaseCallbackHandler):
    """Keeps the messages of every chat model call (``calls[i]`` is call i's prompt)."""

    def __init__(self) -> None:
        self.calls: list[list[BaseMessage]] = []

    def on_chat_model_start(self, serialized: dict[str, Any], messages: list[list[BaseMessage]], **kwargs: Any) -> None:
        self.calls.append(list(messages[0]))


def hashing_memory(**kwargs: Any) -> MemTree:
    """A fast memory (feature hashing, fixed θ0, extractive summaries)."""
    return MemTree(embedder=HashingEmbedder(64), config=MemTreeConfig(theta0=0.2), **kwargs)


def conversation() -> list[BaseMessage]:
    """A chat with a system prompt, a tool loop and an image: what real chats contain."""
    return [
        SystemMessage("You are a helpful assistant.", id="s1"),
        HumanMessage("What's the weather in Oslo?", id="h1", name="Maya"),
        AIMessage(
            content=[{"type": "text", "text": "Let me check."}],
            id="a1",
            tool_calls=[{"name": "weather", "args": {"city": "Oslo"}, "id": "call-1"}],
        ),
        ToolMessage("12°C and rain", tool_call_id="call-1", id="t1"),
        AIMessage("It is 12°C and raining in Oslo.", id="a2"),
        HumanMessage(
            content=[
                {"type": "text", "text": "Here is my greyhound Pepper."},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
            ],
            id="h2",
            name="Maya",
        ),
        AIMessage("Pepper looks lovely!", id="a3"),
    ]


def values_json_lacks() -> list[BaseMessage]:
    """Messages carrying values plain JSON has no type for, as real chats can."""
    when = datetime(2024, 5, 1, 10, 30, tzinfo=UTC)
    return [
        HumanMessage(
            content=[
                {"type": "text", "text": "Listen to Pepper barking."},
                {"type": "audio", "base64": b"RIFF-valid-utf8", "mime_type": "audio/wav"},
                {"type": "image", "base64": b"\x89PNG\r\n\x1a\n\x00\xff\xfe", "mime_type": "image/png"},
            ],
            id="h-bytes",
            additional_kwargs={"sent_at": when, "day": date(2024, 5, 1), "pair": (1, "two"), "$memtree": "mine"},
        ),
        AIMessage("What a loud dog!", id="a-int-keys", additional_kwargs={"ids": {1: "one", 2: "two"}}),
    ]
