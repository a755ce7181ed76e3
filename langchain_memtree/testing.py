"""A scripted chat model that can call tools, for examples and tests that run offline.

LangChain's ``GenericFakeChatModel`` replays canned answers but cannot be bound to
tools, so an agent built on it with tools fails on its first call
(``NotImplementedError`` from ``bind_tools``). :class:`ScriptedChatModel` accepts
the tools and replays its script: an ``AIMessage`` with ``tool_calls`` makes the
agent call those tools, a plain text ends the turn.

Example::

    model = scripted(
        AIMessage("", tool_calls=[{"name": "recall", "args": {"query": "dog"}, "id": "c1"}]),
        "Your greyhound is called Pepper.",
    )
    agent = create_agent(model, tools=[recall], store=store)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langchain_core.runnables import Runnable


class ScriptedChatModel(GenericFakeChatModel):
    """``GenericFakeChatModel`` that accepts ``bind_tools``: the script decides the calls."""

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Runnable[Any, AIMessage]:
        return self


def scripted(*answers: AIMessage | str) -> ScriptedChatModel:
    """A :class:`ScriptedChatModel` that gives ``answers`` in order, one per model call."""
    return ScriptedChatModel(messages=iter(answers))
