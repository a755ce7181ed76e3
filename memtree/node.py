"""The two records a memory hands out: a stored :class:`Node` and a :class:`RetrievedNode`.

A node is either the root (no text, no embedding, never aggregated), a leaf (a text
the caller gave; only ``MemTree.update`` changes it, keeping each earlier version as a
:class:`LeafVersion`), or a summary (an internal node
whose text aggregates the leaves below it). Internal nodes always have two or more
children: a parent left with one child is folded away.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np
import numpy.typing as npt

ROOT_ID = "root"
"""Id of every namespace's root node."""

Vector = npt.NDArray[np.float32]
JSONDict = dict[str, Any]


def to_datetime(timestamp: float | None) -> datetime | None:
    """POSIX seconds to an aware UTC datetime (``None`` stays ``None``).

    Also ``None`` for a number no datetime can hold (outside years 1 to 9999, which
    memtree refuses today but an older version may have stored): reading must not
    fail because of one stored value. :func:`time_text` shows such a number raw.
    """
    if timestamp is None:
        return None
    try:
        return datetime.fromtimestamp(timestamp, tz=UTC)
    except (OverflowError, OSError, ValueError):
        return None


def time_text(timestamp: float | None) -> str | None:
    """POSIX seconds as ISO 8601 UTC text, or the raw number when no date can show it
    (``None`` stays ``None``)."""
    if timestamp is None:
        return None
    moment = to_datetime(timestamp)
    return moment.isoformat() if moment is not None else repr(timestamp)


@dataclass(slots=True)
class Node:
    """One node of a memory tree, as stored.

    ``timestamp`` is when the remembered event happened (POSIX seconds, UTC), if the
    caller said; for a summary it is the latest timestamp among its leaves.
    ``leaf_sum`` is the sum of the leaf embeddings below a summary, kept so that its
    centroid can be updated per insert without reading its subtree.
    ``stale`` marks a summary whose text is missing a change below it, because a model
    call failed or because its aggregation is deferred; ``MemTree.repair()`` (or
    ``flush()`` for deferred ones) brings it up to date.
    ``children`` is not stored: the engine derives it from the children's ``parent``.
    ``expires_at`` (leaves only; POSIX seconds, UTC) is when the leaf stops being
    remembered: from then on no read returns it and a sweep deletes it
    (``MemTree.add(ttl=...)``); ``None``: never.
    """

    id: str
    text: str
    embedding: Vector | None
    parent: str | None
    depth: int
    is_leaf: bool
    leaf_count: int
    created_at: float
    updated_at: float
    timestamp: float | None = None
    metadata: JSONDict = field(default_factory=dict)
    source_id: str | None = None
    leaf_sum: Vector | None = None
    stale: bool = False
    children: list[str] = field(default_factory=list)
    expires_at: float | None = None

    @property
    def is_root(self) -> bool:
        return self.parent is None

    @property
    def time(self) -> datetime | None:
        """``timestamp`` as an aware UTC datetime (``None`` if it has none or no
        datetime can hold it; see :func:`time_text`)."""
        return to_datetime(self.timestamp)

    def copy(self) -> Node:
        """A copy that shares the (read-only) embedding arrays but not the lists."""
        return Node(
            id=self.id,
            text=self.text,
            embedding=self.embedding,
            parent=self.parent,
            depth=self.depth,
            is_leaf=self.is_leaf,
            leaf_count=self.leaf_count,
            created_at=self.created_at,
            updated_at=self.updated_at,
            timestamp=self.timestamp,
            metadata=dict(self.metadata),
            source_id=self.source_id,
            leaf_sum=self.leaf_sum,
            stale=self.stale,
            children=list(self.children),
            expires_at=self.expires_at,
        )


@dataclass(frozen=True, slots=True)
class LeafVersion:
    """An earlier version of a leaf, kept when ``MemTree.update`` replaced it.

    ``text``, ``metadata`` and ``timestamp`` (when the event happened, POSIX seconds)
    are the leaf's as they were; ``replaced_at`` is when the update replaced them
    (POSIX seconds). ``MemTree.history(leaf_id)`` lists them oldest first.
    """

    leaf_id: str
    text: str
    metadata: JSONDict
    timestamp: float | None
    replaced_at: float

    @property
    def time(self) -> datetime | None:
        """``timestamp`` as an aware UTC datetime."""
        return to_datetime(self.timestamp)


@dataclass(frozen=True, slots=True)
class RetrievedNode:
    """One retrieval result.

    ``text`` is the node's full stored text. ``context`` is what this result adds to a
    context built from the results above it: its text without the sentences an
    earlier result already contributed (summaries repeat their leaves' sentences).
    Budgets are charged on ``context``; join the ``context`` fields to build a prompt.

    ``score`` is what the results are ranked by: hybrid by default (cosine and
    BM25 mixed, summaries discounted; see :mod:`memtree.retrieval`), so it is on
    another scale than a vector store's. ``similarity`` is the plain cosine of the
    node's embedding with the query's, what a vector store with the same embedder
    would report for this node; adapters hand it to frameworks whose cut-offs
    (LlamaIndex's ``similarity_cutoff``) are tuned on cosine.

    A leaf that a summary's match brought in (``found_by``) keeps its own score, so
    it can come before results of higher score: the order is the delivery order.
    """

    id: str
    text: str
    score: float
    depth: int
    is_leaf: bool
    timestamp: float | None
    metadata: JSONDict
    leaf_ids: tuple[str, ...]
    source_id: str | None = None
    context: str = ""
    similarity: float | None = None
    found_by: str | None = None
    """The summary whose match brought this leaf in (``summary_hits="leaves"``, the
    default: a summary that ranks delivers its best leaves in its place); ``None``
    when the node ranked by itself."""
    answered_by: str = "retrieve"
    """Which path gave this result: ``"retrieve"`` (ranked against the query) or
    ``"overview"`` (a part of :meth:`MemTree.overview <memtree.tree.MemTree.overview>`,
    which ``retrieve`` answers overview requests with: "what do you know about...",
    "recap...", "what happened in...")."""

    @property
    def time(self) -> datetime | None:
        """``timestamp`` as an aware UTC datetime (``None`` if it has none or no
        datetime can hold it; see :func:`time_text`)."""
        return to_datetime(self.timestamp)
