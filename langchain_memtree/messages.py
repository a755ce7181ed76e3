"""What of a chat message is remembered, and how messages group into exchanges.

A memory remembers what was *said*: the text parts of human and AI messages,
labelled with the speaker (``"Maya: ..."``, ``"Assistant: ..."``). Everything else a
message can carry — images, audio, tool calls, tool results, system prompts — is
kept in the chat log exactly as given, but not put in the tree; each skipped part
is logged at DEBUG level, never raised, so an unusual message cannot break a chat.

Exchanges follow the paper: by default one human+AI *round* becomes one memory.
A round starts with the user's message(s) and closes at the AI message that
answers them (one that calls no tools); an AI message that calls tools keeps the
round open, so a tool loop is remembered as the question and its final answer.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Literal

from langchain_core.messages import AIMessage, BaseMessage, ChatMessage, HumanMessage

from langchain_memtree._text import storable

logger = logging.getLogger(__name__)

Granularity = Literal["round", "message"]
GRANULARITIES: tuple[str, ...] = ("round", "message")


def speaker(message: BaseMessage) -> str | None:
    """The label a remembered message is stored under, or ``None`` if its kind is not
    remembered (system, tool and function messages)."""
    if isinstance(message, HumanMessage):
        return message.name or "User"
    if isinstance(message, AIMessage):
        return message.name or "Assistant"
    if isinstance(message, ChatMessage):
        return message.name or message.role.capitalize()
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
    return isinstance(message, AIMessage) and not message.tool_calls


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
        if isinstance(message, HumanMessage) and any(isinstance(messages[j], AIMessage) for j in current):
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
        if isinstance(message, HumanMessage):
            return text_parts(message)
    return ""


def check_granularity(granularity: object) -> Granularity:
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity must be 'round' or 'message', got {granularity!r}")
    return granularity  # type: ignore[return-value]
