"""``MemTreeChatMessageHistory``: a chat log that also grows a memory tree.

A chat history promises to give back exactly what was added, in order. The log
is therefore kept as JSON records beside the tree (``message_to_dict`` per
message, in the session's namespace), and the tree only *remembers*: each
completed exchange (a human+AI round by default, or each message) is inserted as
one leaf, so a :class:`~langchain_memtree.MemTreeRetriever` or the agent
middleware can later find it by meaning.

Messages that arrive without their answer wait in a small "pending" record until
the round completes, so ``add_user_message`` followed by ``add_ai_message`` is
remembered as one round, across processes too.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
import uuid
import weakref
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.messages import BaseMessage, message_to_dict, messages_from_dict

from langchain_memtree._calls import Call, Procedure, WriteLock, arun, run
from langchain_memtree._json import UntaggableError, tag, untag
from langchain_memtree.messages import Granularity, check_granularity, exchange_text, split_exchanges
from memtree import MemTree
from memtree.inputs import TimeLike
from memtree.store import Namespace, namespace_key
from memtree.text import unstorable

logger = logging.getLogger(__name__)

MESSAGES = "chat_messages"
"""Record kind of the message log (key: a generated id; value: ``message_to_dict``)."""

PENDING = "chat_pending"
"""Record kind holding the log keys not yet remembered (key ``"keys"``)."""

Clock = Callable[[], TimeLike]


class MemTreeChatMessageHistory(BaseChatMessageHistory):
    """Chat message history backed by a MemTree: an exact log plus a memory tree.

    ``session_id`` selects the namespace ``("chat", session_id)`` of the memory's
    store (pass ``namespace=`` to choose another); the log and the tree of a
    session live there and persist as long as the store does. ``granularity``
    is ``"round"`` (default, as in the paper: each human+AI round is one memory)
    or ``"message"`` (each message is one memory). ``clock`` gives the event time
    stamped on each memory (default: now, UTC).

    This class is for chains built on ``RunnableWithMessageHistory`` (deprecated
    since langchain-core 1.3.3) and similar code; ``BaseChatMessageHistory``, which
    it implements, is deprecated since langchain-core 1.6.4 (removal planned for
    2.0). memtree leaves LangChain's deprecation warnings as LangChain raises them.
    For new agents use :class:`MemTreeMemoryMiddleware` (long-term memory),
    LangGraph's checkpointer (the current thread) and :class:`MemTreeStore`.

    Example::

        history = MemTreeChatMessageHistory(memory, session_id="maya")
        history.add_messages([HumanMessage("I adopted a greyhound."), AIMessage("Lovely!")])
        history.messages  # exactly those two messages
        history.memory.retrieve("What dog does Maya have?")
    """

    def __init__(
        self,
        memory: MemTree,
        session_id: str,
        *,
        granularity: Granularity = "round",
        namespace: Namespace | None = None,
        clock: Clock | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(memory, MemTree):
            raise TypeError(f"memory must be a memtree.MemTree, got {type(memory).__name__}")
        if not isinstance(session_id, str) or not session_id:
            raise ValueError(f"session_id must be a non-empty str, got {session_id!r}")
        self.session_id = session_id
        self.granularity = check_granularity(granularity)
        self.namespace = namespace_key(("chat", session_id) if namespace is None else namespace)
        self.memory: MemTree = memory.sibling(self.namespace)
        """The session's memory tree (retrieve from it, or wrap it in a retriever)."""
        self.clock: Clock = clock or (lambda: datetime.now(UTC))

    # -- reading -------------------------------------------------------------------

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        """Every message added, in order, as given (types, ids, content, tool calls)."""
        return run(self._read_steps())

    async def aget_messages(self) -> list[BaseMessage]:
        """Async :attr:`messages`."""
        return await arun(self._read_steps())

    def _read_steps(self) -> Procedure[list[BaseMessage]]:
        records = yield Call(self.memory.store, "get_records", (self.namespace, MESSAGES))
        return messages_from_dict([_deserialize(record) for record in records.values()])

    # -- writing -------------------------------------------------------------------

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        """Append messages to the log, then remember every exchange they complete."""
        run(self._add_steps(messages))

    async def aadd_messages(self, messages: Sequence[BaseMessage]) -> None:
        """Async :meth:`add_messages` (model calls are awaited, store I/O runs in a thread)."""
        await arun(self._add_steps(messages))

    def clear(self) -> None:
        """Forget the session: its log, its pending messages and its tree."""
        run(self._clear_steps())

    async def aclear(self) -> None:
        """Async :meth:`clear`."""
        await arun(self._clear_steps())

    def _clear_steps(self) -> Procedure[None]:
        yield Call(self.memory, "delete_namespace")

    def _add_steps(self, messages: Sequence[BaseMessage]) -> Procedure[None]:
        entries = {uuid.uuid4().hex: _serialize(message) for message in _checked(messages)}
        if not entries:
            return
        lock = _session_lock(self.memory)
        yield Call(lock, "acquire")
        try:
            yield from self._append_steps(entries)
        finally:
            lock.release()

    def _append_steps(self, entries: dict[str, dict[str, Any]]) -> Procedure[None]:
        store, ns = self.memory.store, self.namespace
        pending = yield Call(store, "get_records", (ns, PENDING, ["keys"]))
        waiting: list[str] = list(pending.get("keys", {}).get("keys", []))
        # Pending keys first: a crash before the log write leaves keys that point
        # at nothing (skipped later), never a logged message nobody will remember.
        yield Call(store, "put_records", (ns, PENDING, {"keys": {"keys": [*waiting, *entries]}}))
        yield Call(store, "put_records", (ns, MESSAGES, entries))
        yield from self._remember_steps([*waiting, *entries], entries)

    def _remember_steps(self, keys: list[str], known: dict[str, dict[str, Any]]) -> Procedure[None]:
        """Insert every complete exchange among ``keys``; keep the rest pending."""
        store, ns = self.memory.store, self.namespace
        missing = [key for key in keys if key not in known]
        found = (yield Call(store, "get_records", (ns, MESSAGES, missing))) if missing else {}
        logged = {**found, **known}
        keys = [key for key in keys if key in logged]
        messages = messages_from_dict([_deserialize(logged[key]) for key in keys])
        exchanges, rest = split_exchanges(messages, self.granularity)
        for exchange in exchanges:
            text = exchange_text([messages[i] for i in exchange])
            last_key = keys[exchange[-1]]
            if not text:
                logger.debug("session %s: exchange ending at %s has no text to remember", self.session_id, last_key)
                continue
            done = yield Call(self.memory, "find", kwargs={"source_id": last_key})
            if done:  # inserted before a crash cut this call short
                continue
            ids = [messages[i].id for i in exchange if messages[i].id]
            yield Call(
                self.memory,
                "add",
                (text,),
                {
                    "metadata": {"session_id": self.session_id, "message_ids": ids},
                    "timestamp": self.clock(),
                    "source_id": last_key,
                },
            )
        yield Call(store, "put_records", (ns, PENDING, {"keys": {"keys": [keys[i] for i in rest]}}))


_SESSION_LOCKS: weakref.WeakKeyDictionary[MemTree, WriteLock] = weakref.WeakKeyDictionary()
_SESSION_LOCKS_GUARD = threading.Lock()


def _session_lock(memory: MemTree) -> WriteLock:
    """One lock per session handle (``MemTree.sibling`` shares handles), so adds to a
    session in this process take turns and the pending record is never lost."""
    with _SESSION_LOCKS_GUARD:
        lock = _SESSION_LOCKS.get(memory)
        if lock is None:
            lock = _SESSION_LOCKS[memory] = WriteLock()
        return lock


def _checked(messages: Sequence[BaseMessage]) -> list[BaseMessage]:
    if isinstance(messages, BaseMessage) or not isinstance(messages, Sequence):
        raise TypeError("add_messages takes a list of messages (for one message use add_message)")
    for message in messages:
        if not isinstance(message, BaseMessage):
            raise TypeError(f"messages must be langchain BaseMessage objects, got {type(message).__name__}")
    return list(messages)


def _serialize(message: BaseMessage) -> dict[str, Any]:
    """The log record of a message: ``message_to_dict``, stored as it is when it is
    plain JSON. Values JSON has no type for (bytes in an image block, a datetime in
    ``additional_kwargs``...) are tagged (see :mod:`langchain_memtree._json`) and the
    record wrapped as ``{"tagged_json": ...}``; text no durable store can hold (NUL
    characters, lone surrogates) makes it escaped JSON in base64. Either way the
    message comes back exactly as given."""
    try:
        data, tagged = tag(message_to_dict(message))
    except UntaggableError as error:
        raise TypeError(
            f"message {message.id or message.type!r} holds a {error} that cannot be stored as JSON; "
            "convert it (e.g. to str or a list) before adding it"
        ) from None
    record = {_TAGGED: data} if tagged else data
    if unstorable(record):
        return {_ENCODED: base64.b64encode(json.dumps(record).encode("ascii")).decode("ascii")}
    return record  # type: ignore[no-any-return]


def _deserialize(record: dict[str, Any]) -> dict[str, Any]:
    if _ENCODED in record:
        record = json.loads(base64.b64decode(record[_ENCODED]))
    if _TAGGED in record:
        return untag(record[_TAGGED])  # type: ignore[no-any-return]
    return record


_ENCODED = "escaped_json_base64"
_TAGGED = "tagged_json"
