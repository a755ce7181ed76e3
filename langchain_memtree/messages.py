"""What of a chat message is remembered, and how messages group into exchanges.

A memory remembers what was *said*: the text parts of human and AI messages,
labelled with the speaker (``"Maya: ..."``, ``"Assistant: ..."``); a generic
``ChatMessage`` counts as the kind its role names (``"assistant"`` is AI).
Everything else a message can carry — images, audio, tool calls, tool results,
system prompts — is kept in the chat log exactly as given, but not put in the
tree; each skipped part is logged at DEBUG level, never raised, so an unusual
message cannot break a chat.

Exchanges follow the paper: by default one human+AI *round* becomes one memory.
A round starts with the user's message(s) and closes at the AI message that
answers them (one that calls no tools); an AI message that calls tools keeps the
round open, so a tool loop is remembered as the question and its final answer.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Literal

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    FunctionMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)

from langchain_memtree._text import storable

logger = logging.getLogger(__name__)

Granularity = Literal["round", "message"]
GRANULARITIES: tuple[str, ...] = ("round", "message")

Role = Literal["human", "ai", "system", "tool", "other"]

_CHAT_ROLES: dict[str, Role] = {
    "user": "human",
    "human": "human",
    "assistant": "ai",
    "ai": "ai",
    "system": "system",
    "developer": "system",
    "tool": "tool",
    "function": "tool",
}
"""``ChatMessage`` roles as the message classes they stand for (OpenAI's and LangChain's names)."""


def role(message: BaseMessage) -> Role:
    """Who sent the message: a ``ChatMessage`` counts as the class its role names
    (``role="assistant"`` is an AI message), so generic messages group into rounds and
    are remembered exactly like typed ones. Unknown roles are ``"other"``."""
    if isinstance(message, ChatMessage):
        return _CHAT_ROLES.get(message.role.strip().lower(), "other")
    if isinstance(message, HumanMessage):
        return "human"
    if isinstance(message, AIMessage):
        return "ai"
    if isinstance(message, SystemMessage):
        return "system"
    if isinstance(message, (ToolMessage, FunctionMessage)):
        return "tool"
    return "other"


def speaker(message: BaseMessage) -> str | None:
    """The label a remembered message is stored under, or ``None`` if its kind is not
    remembered (system, tool and function messages, whatever their class)."""
    sender = role(message)
    if sender == "human":
        return message.name or "User"
    if sender == "ai":
        return message.name or "Assistant"
    if sender == "other" and isinstance(message, ChatMessage):  # a role we do not know: keep its name
        return message.name or message.role.strip().capitalize()
    return None


def text_parts(message: BaseMessage) -> str:
    """The message's text parts joined by newlines (``""`` if it has none).

    Non-text content blocks and tool calls are skipped with a debug log. Text that
    cannot be stored (NUL characters, lone surrogates) is cleaned, not refused.
    """
    content = message.content
    if isinstance(content, str):
        parts = [content]
    else:
        parts = []
        skipped: list[str] = []
        for block in content:
            if isinstance(block, str):
                parts.append(block)
            elif isinstance(block, dict) and block.get("type") == "text" and isinstance(block.get("text"), str):
                parts.append(block["text"])
            else:
                skipped.append(str(block.get("type", "?")) if isinstance(block, dict) else type(block).__name__)
        if skipped:
            logger.debug("message %s: %d non-text part(s) kept in the log only: %s", message.id, len(skipped), skipped)
    if isinstance(message, AIMessage) and message.tool_calls:
        logger.debug(
            "message %s: tool calls %s kept in the log only",
            message.id,
            [call.get("name") for call in message.tool_calls],
        )
    text = "\n".join(part.strip() for part in parts if part.strip())
    return storable(text)


def exchange_text(messages: Sequence[BaseMessage]) -> str:
    """The text a memory stores for these messages: one ``"Speaker: text"`` line per
    remembered message with text; ``""`` if none has any."""
    lines = []
    for message in messages:
        label = speaker(message)
        if label is None:
            logger.debug("message %s: %s messages are kept in the log only", message.id, message.type)
            continue
        text = text_parts(message)
        if text:
            lines.append(f"{label}: {text}")
    return "\n".join(lines)


def closes_round(message: BaseMessage) -> bool:
    """Whether this message ends a round: an AI message that calls no tools."""
    if role(message) != "ai":
        return False
    if isinstance(message, AIMessage):
        return not message.tool_calls
    return not message.additional_kwargs.get("tool_calls")  # a ChatMessage in OpenAI's format


def split_exchanges(messages: Sequence[BaseMessage], granularity: Granularity) -> tuple[list[list[int]], list[int]]:
    """Group messages (by index) into complete exchanges and a pending remainder.

    ``"message"``: every message is its own exchange. ``"round"``: a round closes at
    an AI message that calls no tools; a human message that arrives after an AI
    message of an unfinished round (a tool loop cut short) closes that round first.
    What is left waits for the message that completes it.
    """
    if granularity == "message":
        return [[i] for i in range(len(messages))], []
    complete: list[list[int]] = []
    current: list[int] = []
    for i, message in enumerate(messages):
        if role(message) == "human" and any(role(messages[j]) == "ai" for j in current):
            complete.append(current)
            current = []
        current.append(i)
        if closes_round(message):
            complete.append(current)
            current = []
    return complete, current


def latest_human_text(messages: Sequence[BaseMessage]) -> str:
    """The text of the most recent human message (``""`` if there is none)."""
    for message in reversed(messages):
        if role(message) == "human":
            return text_parts(message)
    return ""


def check_granularity(granularity: object) -> Granularity:
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity must be 'round' or 'message', got {granularity!r}")
    return granularity  # type: ignore[return-value]
