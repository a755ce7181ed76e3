"""``MemTreeMemoryMiddleware``: long-term memory for ``create_agent`` agents.

Two hooks, both thin calls into the engine:

* before each model call (``wrap_model_call``) it retrieves the memories most
  relevant to the latest user message and appends them to the system message as
  a section (see :func:`format_memories`), within ``token_budget``;
* after each model turn (``after_model``) that answers the user — an AI message
  calling no tools, or a structured response (``response_format``) — it records
  the exchange (the user's latest message and that answer, as
  ``"User: ...\\nAssistant: ..."``) in the user's memory.

Recording stores the exchange as a leaf, searchable at once, and by default
(``aggregation="background"``) leaves the summaries above it to the memory's
background worker: a turn waits for one embedding, never for a chat request.
``"deferred"`` keeps them for one rewrite at the end of the session
(:meth:`MemTreeMemoryMiddleware.flush`, ``memory.close()`` or interpreter exit);
``"eager"`` writes them inside the turn, as the paper does.

Each user's memories are kept apart by default: the namespace is the template
``("memories", "{user_id}")``, filled per run from the agent's runtime context or
config (:mod:`langchain_memtree.namespaces`), and a run with no ``user_id`` is
refused rather than given a memory shared with everyone. Another template, a
function of the LangGraph runtime, or a fixed namespace (shared by every run, on
purpose) can be chosen instead.
"""

from __future__ import annotations

import json
import logging
import threading
import weakref
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, Literal

from langchain.agents.middleware import AgentMiddleware, AgentState, ModelRequest, ModelResponse
from langchain_core.messages import AIMessage, BaseMessage, SystemMessage, ToolMessage
from langgraph.runtime import Runtime
from pydantic_core import PydanticSerializationError, to_jsonable_python

from langchain_memtree._calls import Call, Procedure, arun, run
from langchain_memtree.messages import closes_round, exchange_text, latest_human_text, role, text_parts
from langchain_memtree.namespaces import NamespaceChoice, namespace_chooser
from memtree import MemTree, RetrievedNode
from memtree.config import AGGREGATION_MODES, Aggregation, RetrievalMode
from memtree.inputs import TimeLike, to_min_score
from memtree.recency import SIBLINGS
from memtree.store import Store
from memtree.store.base import not_a_langgraph_store

logger = logging.getLogger(__name__)

MEMORY_HEADER = "## Relevant memories from earlier conversations"
"""First line of the memory section added to the system message."""


def format_memories(hits: Sequence[RetrievedNode], header: str = MEMORY_HEADER) -> str:
    """The system-message section for retrieved memories: ``header``, then one bullet
    per memory, best first, with its event date when known. A summary's date is the
    latest event below it, so it reads ``(up to 2024-06-02)``: the model should not
    take a summary of months as something said that day. Each bullet holds the
    result's ``context`` (what the token budget was charged on); continuation lines
    are indented so a multi-line exchange stays one bullet."""
    lines = [header]
    for hit in hits:
        body = (hit.context or hit.text).replace("\n", "\n  ")
        lines.append(f"- {_dated(hit)}{body}")
    return "\n".join(lines)


OVERVIEW_HEADER = "## What you remember about this, in time order"
"""First line of the memory section when the user's message asked for an overview
("What do you know about me?", "Recap our last chat"): ``MemTree.overview``'s parts."""


def format_overview(parts: Sequence[RetrievedNode], header: str = OVERVIEW_HEADER) -> str:
    """The system-message section for an overview: ``header``, then one bullet per
    part in time order, each part's ``context`` already dated by the overview."""
    lines = [header]
    for part in parts:
        body = (part.context or part.text).replace("\n", "\n  ")
        lines.append(f"- {body}")
    return "\n".join(lines)


def _dated(hit: RetrievedNode) -> str:
    when = hit.time
    if when is None:
        return ""
    return f"({'' if hit.is_leaf else 'up to '}{when.date().isoformat()}) "


class MemTreeMemoryMiddleware(AgentMiddleware):
    """Agent middleware that remembers each exchange and recalls relevant memories.

    ``memory`` is the MemTree (its store keeps the memories); ``namespace`` says
    which namespace of it a run's memories live in:

    * left out: ``("memories", "{user_id}")``, one namespace per user, the
      ``user_id`` taken from the agent's runtime context
      (``agent.invoke(..., context={"user_id": "maya"})`` with a ``context_schema``)
      or ``config={"configurable": {"user_id": ...}}``. A run with no ``user_id``
      raises ``ValueError`` saying how to choose: no user ever sees another's
      memories by default.
    * a template of your own, such as ``("memories", "{org_id}", "{user_id}")``,
      filled the same way;
    * a function of the LangGraph ``Runtime`` returning the namespace;
    * a fixed namespace (no ``{...}`` part), such as ``("shared",)`` or
      ``memory.namespace``: one memory for every run, shared on purpose.

    ``k`` and ``token_budget`` bound what is
    added to the prompt (the budget counts the memories' text, with the memory's
    ``config.token_counter``); ``mode`` and ``min_score`` tune retrieval.

    ``min_similarity`` is the relevance gate: a memory whose cosine similarity to
    the user's message is below it is not added, and when none passes the system
    message gets no memory section ("What is 17 times 3?" recalls nothing). The
    default ``"auto"`` is the memory's policy, the same as ``memory.retrieve``'s:
    its ``config.min_similarity``, by default the floor calibrated for its embedder
    (``memory.relevance_floor``: 0.3 for the offline all-MiniLM-L6-v2, which keeps
    some evidence for 97% of the LoCoMo questions that had some and gives 86% of 105
    unrelated questions no memory, benchmarks/results/relevance_gate.md); for an
    embedder with no calibrated floor it gates nothing. ``None`` turns the gate off
    here, ``MemTreeConfig(min_similarity=None)`` everywhere; a number sets the floor.

    ``newer_first`` (default on) puts a newer memory just above an older sibling in
    the tree (a near-duplicate by construction) that it scores no more than 0.3
    below, so "I moved to Porto" is read before "I live in Lisbon"
    (:func:`memtree.recency.newer_first`; on 34 written knowledge updates the newer
    fact comes first 82% of the time, against 6% with flat hybrid ranking,
    benchmarks/results/knowledge_updates.md).
    ``record=False`` only recalls; ``recall=False`` only records.

    ``route_overviews`` (``None``: the memory's, on by default) answers a message that
    asks for an overview ("What do you know about me?", "Recap our last chat", "What
    did we talk about last week?", relative times counted back from ``clock``) with
    ``MemTree.overview`` within ``token_budget``: the memory's parts about it, in time
    order, each dated, under :data:`OVERVIEW_HEADER`; ``False`` ranks it as any
    message.

    ``load_embedder`` says when the memory's embedding model is loaded, so that the
    agent's first turn does not pay for it: ``"now"`` (default), in the constructor
    (0.25 s for the offline model; a first turn then costs what a later one does,
    benchmarks/results/middleware_first_turn.md), or ``"background"``, on a thread
    started here, for an application that must construct at once: a message that
    arrives before the load ends waits for the rest of it.

    ``aggregation`` says when the summaries above a recorded exchange are written
    (the exchange itself is stored and searchable before the turn ends, whatever
    the choice):

    * ``"background"`` (default): by the memory's worker thread, soon after the
      turn. No chat request is added to a turn; a summary lags by about one model
      call, and the worker's calls still cost tokens.
    * ``"deferred"``: once per summary at the end of the session (:meth:`flush`,
      ``memory.close()`` or interpreter exit), with all the exchanges since: the
      fewest chat requests, but summaries stay stale until then (retrieval still
      finds every exchange).
    * ``"eager"``: inside the turn, before the agent answers: summaries are current
      at once, and each turn waits for the model about once more (the summaries on a
      path are written concurrently).

    Example::

        agent = create_agent(
            model, tools, middleware=[MemTreeMemoryMiddleware(memory=memory)], context_schema=UserContext
        )
        agent.invoke({"messages": [...]}, context=UserContext(user_id="maya"))  # maya's memories only
    """

    def __init__(
        self,
        memory: MemTree,
        *,
        namespace: NamespaceChoice = None,
        k: int = 5,
        token_budget: int | None = 400,
        mode: RetrievalMode | None = None,
        min_score: float | None = None,
        min_similarity: float | Literal["auto"] | None = "auto",
        newer_first: bool = True,
        header: str = MEMORY_HEADER,
        record: bool = True,
        recall: bool = True,
        clock: Callable[[], TimeLike] | None = None,
        aggregation: Aggregation = "background",
        load_embedder: Literal["now", "background"] = "now",
        route_overviews: bool | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(memory, MemTree):
            raise TypeError(f"memory must be a memtree.MemTree, got {type(memory).__name__}")
        if aggregation not in AGGREGATION_MODES:
            raise ValueError(f"aggregation must be one of: {', '.join(AGGREGATION_MODES)}; got {aggregation!r}")
        if load_embedder not in ("now", "background"):
            raise ValueError(f"load_embedder must be 'now' or 'background', got {load_embedder!r}")
        self.choose_namespace = namespace_chooser(namespace)  # a bad namespace fails now, not mid-run
        # refuse bad retrieval options now rather than in the middle of a run
        memory.config.with_options(k=k, token_budget=token_budget, mode=mode or memory.config.mode)
        self.memory = memory
        self.namespace = namespace
        self.k = k
        self.token_budget = token_budget
        self.mode = mode
        self.min_score = min_score
        if min_similarity != "auto" and min_similarity is not None:
            to_min_score(min_similarity, "min_similarity")  # a bad floor fails now, not mid-run
        self.min_similarity = min_similarity
        self.newer_first = newer_first
        self.header = header
        self.record = record
        self.recall = recall
        self.clock: Callable[[], TimeLike] = clock or (lambda: datetime.now(UTC))
        self.aggregation: Aggregation = aggregation
        if route_overviews is not None and not isinstance(route_overviews, bool):
            raise TypeError(f"route_overviews must be True, False or None (the memory's), got {route_overviews!r}")
        self.route_overviews = route_overviews
        self._recorded: weakref.WeakSet[MemTree] = weakref.WeakSet()  # namespaces' handles come and go
        self._recorded_lock = threading.Lock()
        # Load the embedder off the agent's hot path: now, or on a thread that the first
        # retrieval waits for only if it is still running.
        embeds = recall or record
        self.embedder_loading = memory.embedder.preload(background=load_embedder == "background") if embeds else None

    # -- recall: before each model call ---------------------------------------------

    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], ModelResponse[Any]],
    ) -> ModelResponse[Any]:
        return handler(run(self._recall_steps(request)))

    async def awrap_model_call(self, request: ModelRequest[Any], handler: Any) -> ModelResponse[Any]:
        return await handler(await arun(self._recall_steps(request)))  # type: ignore[no-any-return]

    def _recall_steps(self, request: ModelRequest[Any]) -> Procedure[ModelRequest[Any]]:
        query = latest_human_text(request.messages)
        if not self.recall or not query:
            return request
        memory = yield Call(self, "memory_for", (request.runtime,))
        options = {"k": self.k, "token_budget": self.token_budget, "mode": self.mode, "min_score": self.min_score}
        recency = {"same_subject": SIBLINGS} if self.newer_first else {}
        routing = {"route_overviews": self.route_overviews, "now": self.clock()}
        hits = yield Call(
            memory, "retrieve", (query,), {**options, "min_similarity": self.min_similarity, **recency, **routing}
        )
        if not hits:
            return request  # nothing relevant: no memory section at all
        overview = all(hit.answered_by == "overview" for hit in hits)
        section = format_overview(hits) if overview else format_memories(hits, self.header)
        return request.override(system_message=_with_section(request.system_message, section))

    # -- record: after each model turn ----------------------------------------------

    def after_model(self, state: AgentState[Any], runtime: Runtime[Any]) -> dict[str, Any] | None:
        run(self._record_steps(state, runtime))
        return None

    async def aafter_model(self, state: AgentState[Any], runtime: Runtime[Any]) -> dict[str, Any] | None:
        await arun(self._record_steps(state, runtime))
        return None

    def _record_steps(self, state: AgentState[Any], runtime: Runtime[Any]) -> Procedure[None]:
        messages: Sequence[BaseMessage] = state["messages"]
        if not self.record or not messages:
            return
        answer = _answer(messages, state.get("structured_response"))
        if answer is None:
            return  # no answer yet (the model is calling tools)
        question = next((m for m in reversed(messages) if role(m) == "human"), None)
        text = exchange_text([question, answer] if question is not None else [answer])
        if not text:
            logger.debug("exchange ending at %s has no text to remember", answer.id)
            return
        memory = yield Call(self, "memory_for", (runtime,))
        if answer.id is not None and (yield Call(memory, "find", kwargs={"source_id": answer.id})):
            return  # already recorded (a resumed or replayed run)
        ids = [m.id for m in (question, answer) if m is not None and m.id]
        with self._recorded_lock:
            self._recorded.add(memory)
        yield Call(
            memory,
            "add",
            (text,),
            {
                "metadata": {"message_ids": ids},
                "timestamp": self.clock(),
                "source_id": answer.id,
                "aggregation": self.aggregation,
            },
        )

    # -- summaries written outside the turn ------------------------------------------

    def flush(self) -> int:
        """Write now every summary still pending in the memories this middleware
        recorded into (the end of a session with ``aggregation="deferred"``); return
        how many were written. A summary the model cannot write stays stale for
        ``memory.repair()``."""
        return sum(memory.flush() for memory in self._memories())

    async def aflush(self) -> int:
        """Async :meth:`flush`."""
        return sum([await memory.aflush() for memory in self._memories()])

    def wait_for_summaries(self, timeout: float | None = None) -> bool:
        """Block until the background worker has written the summaries of every
        exchange recorded so far (``aggregation="background"``); ``False`` if
        ``timeout`` seconds passed first."""
        return all(memory.wait_for_summaries(timeout) for memory in self._memories())

    def _memories(self) -> list[MemTree]:
        with self._recorded_lock:
            return list(self._recorded)

    # -- namespaces ------------------------------------------------------------------

    def memory_for(self, runtime: Runtime[Any] | None) -> MemTree:
        """The memory of the namespace this run belongs to (``ValueError`` when the
        namespace is a template the run gives no value for)."""
        store = getattr(runtime, "store", None)
        if isinstance(store, Store):  # the agent's store: fail before the model runs, not at a tool call
            raise not_a_langgraph_store(store, "serve as the agent's store")
        return self.memory.sibling(self.choose_namespace(runtime))


def _answer(messages: Sequence[BaseMessage], structured: Any) -> BaseMessage | None:
    """The message that answers the user in this model turn, or ``None`` if the turn
    only calls tools.

    Usually the last message: an AI message calling no tools. With structured output
    through a tool (``response_format=ToolStrategy(...)``) the answer is instead a
    call to the schema's tool, which the model step itself answers with a
    ``ToolMessage`` and a fresh ``structured_response`` (cleared on turns without
    one); that answer is remembered as the AI message's own text, if any, followed
    by the structured response as JSON, under the AI message's id.
    """
    if closes_round(messages[-1]):
        return messages[-1]
    if structured is None:
        return None
    end = len(messages)
    while end > 0 and isinstance(messages[end - 1], ToolMessage):  # the model step's replies to the call
        end -= 1
    call = messages[end - 1] if end > 0 else None
    if end == len(messages) or not isinstance(call, AIMessage) or not call.tool_calls:
        return None
    text = "\n".join(part for part in (text_parts(call), _rendered(structured)) if part)
    return AIMessage(content=text, id=call.id, name=call.name)


def _rendered(value: Any) -> str:
    """A structured response (pydantic model, dataclass, dict...) as compact JSON text."""
    try:
        return json.dumps(to_jsonable_python(value), ensure_ascii=False)
    except (PydanticSerializationError, TypeError, ValueError):
        return str(value)


def _with_section(system: SystemMessage | None, section: str) -> SystemMessage:
    """The system message with ``section`` appended (a new text block for block content)."""
    if system is None:
        return SystemMessage(content=section)
    if isinstance(system.content, str):
        content: Any = f"{system.content}\n\n{section}" if system.content else section
    else:
        content = [*system.content, {"type": "text", "text": section}]
    return SystemMessage(content=content, id=system.id, name=system.name, additional_kwargs=system.additional_kwargs)
