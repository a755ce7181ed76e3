"""``MemTreeMemoryBlock``: long-term memory for ``llama_index.core.memory.Memory``.

``Memory`` keeps recent messages in a short-term FIFO queue; when the queue passes
its token limit the oldest messages are flushed to every memory block. This block
remembers each flushed message as a leaf of a memtree tree and, when the memory
is read, returns the leaves and summaries most relevant to the current input,
within the block's own token limit.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from llama_index.core.base.llms.types import ChatMessage, TextBlock
from llama_index.core.bridge.pydantic import Field, field_validator
from llama_index.core.constants import DEFAULT_SIMILARITY_TOP_K
from llama_index.core.memory.memory import BaseMemoryBlock

from llamaindex_memtree.settings import memory_from_settings, open_memory
from memtree import MemTree
from memtree.inputs import make_item
from memtree.text import preview, storable_text, unstorable

logger = logging.getLogger(__name__)


class MemTreeMemoryBlock(BaseMemoryBlock[str]):
    """A memory block backed by a :class:`~memtree.MemTree`.

    Each message flushed from short-term memory becomes one leaf,
    ``"<role>: <text>"``, with metadata ``role`` and ``session_id``. Reading the
    block retrieves, for the text of the last ``retrieval_context_window``
    messages (the current input last), up to ``similarity_top_k`` memories (2 by
    default, as for LlamaIndex's ``VectorMemoryBlock``) scoring
    at least ``min_score`` whose joined text fits ``token_limit`` tokens (counted by
    the memory's ``config.token_counter``), one per line.

    ``memory`` defaults to an in-memory tree with ``Settings``' models when set,
    else the offline defaults. To keep it across runs pass a SQLite path or a
    PostgreSQL DSN (``memory="chat.db"``), opened with ``Settings``' models too (see
    :func:`~llamaindex_memtree.open_memory`), or a memory you opened yourself,
    ``MemTree.open(path, embedder=..., llm=...)``.

    ``Memory`` reads the block for its ``session_id``. As with LlamaIndex's
    ``VectorMemoryBlock``, a block shared by several sessions then returns only the
    reading session's memories: its leaves (summaries mix sessions, so they are
    left out). To remember across sessions (a new ``Memory`` per run over the same
    durable tree), reuse the ``session_id`` or set ``session_scoped=False``.

    Example::

        block = MemTreeMemoryBlock(memory="chat.db", token_limit=400)
        chat_memory = Memory.from_defaults(token_limit=4000, memory_blocks=[block])
    """

    name: str = Field(default="MemTreeMemory", description="The name of the memory block.")
    memory: MemTree = Field(default_factory=memory_from_settings, description="The tree that holds the memories.")
    token_limit: int = Field(default=500, gt=0, description="Most tokens this block returns.")
    similarity_top_k: int = Field(
        default=DEFAULT_SIMILARITY_TOP_K, gt=0, description="Most memories this block returns (as VectorMemoryBlock)."
    )
    mode: str | None = Field(default=None, description="'collapsed' or 'traversal'; None: the memory's default.")
    retrieval_context_window: int = Field(default=1, gt=0, description="Latest messages the query is made of.")
    min_score: float | None = Field(default=None, description="Least similarity a memory needs; None: the memory's.")
    session_scoped: bool = Field(
        default=True, description="Read only the memories of the session reading (its session_id); False: all."
    )

    @field_validator("memory", mode="before")
    @classmethod
    def _check_memory(cls, value: Any) -> MemTree:
        if isinstance(value, (str, os.PathLike)):  # a SQLite path or a PostgreSQL DSN
            return open_memory(value)
        if not isinstance(value, MemTree):
            raise TypeError(
                f"memory must be a memtree.MemTree, or a SQLite path or PostgreSQL DSN to open, "
                f"got {type(value).__name__}"
            )
        return value

    async def _aget(
        self, messages: list[ChatMessage] | None = None, session_id: str | None = None, **block_kwargs: Any
    ) -> str:
        """The memories most relevant to the latest messages, one per line (only
        ``session_id``'s when given and the block is ``session_scoped``)."""
        recent = (messages or [])[-self.retrieval_context_window :]
        query = " ".join(text for text in map(_text_of, recent) if text)
        if not query.strip():
            return ""
        where = {"session_id": session_id} if session_id is not None and self.session_scoped else None
        hits = await self.memory.aretrieve(
            query,
            k=self.similarity_top_k,
            token_budget=self.token_limit,
            mode=self.mode,
            min_score=self.min_score,
            where=where,
        )
        return "\n".join(hit.context for hit in hits)

    async def _aput(self, messages: list[ChatMessage]) -> None:
        """Remember each message that has text, in order, as one leaf.

        A message the engine would refuse (a NUL character, a lone surrogate) is
        cleaned, with a warning naming it, and one it still refuses is skipped with a
        warning: ``Memory`` flushes many messages at once, and one bad message must
        not lose the others or make ``Memory.put()`` raise.
        """
        texts: list[str] = []
        metadata: list[dict[str, Any]] = []
        for position, message in enumerate(messages, start=1):
            text = _text_of(message)
            if not text.strip():
                continue
            role = message.role.value
            session = message.additional_kwargs.get("session_id")
            where = f"message {position} of {len(messages)}"
            problem = unstorable(text)
            if problem:
                text = storable_text(text)
                logger.warning(
                    "%s (%s: %r): its text %s, which memtree cannot store; remembered without it "
                    "(NUL characters removed, invalid characters replaced by '?')",
                    where,
                    role,
                    preview(text, 60),
                    problem,
                )
            if isinstance(session, str) and unstorable(session):
                session = storable_text(session)
                logger.warning("%s: its session_id could not be stored as it is; stored as %r", where, session)
            try:
                item = make_item(f"{role}: {text}", {"role": role, "session_id": session})
            except (TypeError, ValueError) as error:
                logger.warning("%s (%s: %r) was not remembered: %s", where, role, preview(text, 60), error)
                continue
            texts.append(item.text)
            metadata.append(item.metadata)
        if texts:
            await self.memory.aadd_many(texts, metadata=metadata)

    async def atruncate(self, content: str, tokens_to_truncate: int) -> str | None:
        """Drop memories from the end (the least relevant) until ``tokens_to_truncate``
        tokens are gone; ``None`` when nothing is left."""
        lines = content.split("\n")
        count = self.memory.config.token_counter
        removed = 0
        while lines and removed < tokens_to_truncate:
            removed += count(lines.pop())
        return "\n".join(lines) or None


def _text_of(message: ChatMessage) -> str:
    """The text blocks of a message, joined (images, audio and tool calls carry none)."""
    return "".join(block.text for block in message.blocks if isinstance(block, TextBlock))
