"""``NodeTable``: a tree's nodes by id, built from a segment when first read.

Without a segment it is a plain dict of :class:`~memtree.node.Node`. Loaded from a
segment (:mod:`memtree.segment`), it starts holding no node at all: reading a node
builds it from the segment's arrays (tens of microseconds), so a reopen costs what
the first queries read, not the size of the tree. Nodes this process changes live in
the table as objects (*materialized*), and their rows in the segment are marked
*dirty*: a row is used only while it is clean.

The rule that keeps the two in step: every change to a node, including a change of
its children list, first materializes it (:meth:`NodeTable.materialize`), so a clean
row is exactly the node as the segment stored it, children included.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import numpy as np
import numpy.typing as npt

from memtree.node import ROOT_ID, Node
from memtree.segment import Segment

_BUILT_CACHE = 4096
"""Nodes built from clean rows kept for the next reads (routing reads the same top nodes)."""


class NodeTable(Mapping[str, Node]):
    """Nodes by id: materialized ones in a dict, the rest built from a segment's clean rows."""

    def __init__(self, segment: Segment | None = None) -> None:
        self._live: dict[str, Node] = {}
        self.segment = segment
        self._dirty: npt.NDArray[np.bool_] = np.zeros(segment.count if segment is not None else 0, dtype=bool)
        self._clean = segment.count if segment is not None else 0
        self._built: dict[str, Node] = {}
        if segment is not None:
            self._live[ROOT_ID] = segment.root()

    # -- the mapping -----------------------------------------------------------------------------

    def __getitem__(self, node_id: str) -> Node:
        node = self._live.get(node_id)
        if node is not None:
            return node
        node = self._from_segment(node_id)
        if node is None:
            raise KeyError(node_id)
        return node

    def get(self, node_id: str, default: Node | None = None) -> Node | None:  # type: ignore[override]
        node = self._live.get(node_id)
        if node is not None:
            return node
        node = self._from_segment(node_id)
        return default if node is None else node

    def text_of(self, node_id: str) -> str:
        """A node's text without building the node (a query reads the texts of dozens of
        ranked nodes; building each from its row costs ten times the text alone)."""
        node = self._live.get(node_id) or self._built.get(node_id)
        if node is not None:
            return node.text
        row = self._clean_row(node_id)
        if row < 0:
            raise KeyError(node_id)
        assert self.segment is not None
        return self.segment.text_at(row)

    def __contains__(self, node_id: object) -> bool:
        if node_id in self._live:
            return True
        return isinstance(node_id, str) and self._clean_row(node_id) >= 0

    def __len__(self) -> int:
        return len(self._live) + self._clean

    def __iter__(self) -> Iterator[str]:
        yield from list(self._live)
        segment = self.segment
        if segment is not None:
            for row in np.flatnonzero(~self._dirty).tolist():
                yield segment.id_at(row)

    def values(self) -> Iterator[Node]:  # type: ignore[override]
        """Every node (those of clean rows built as they are reached)."""
        yield from list(self._live.values())
        segment = self.segment
        if segment is not None:
            for row in np.flatnonzero(~self._dirty).tolist():
                yield self._build(row)

    def items(self) -> Iterator[tuple[str, Node]]:  # type: ignore[override]
        for node in self.values():
            yield node.id, node

    # -- segment rows ------------------------------------------------------------------------------

    @property
    def clean_rows(self) -> npt.NDArray[np.bool_]:
        """Per segment row: still as stored (not changed, not deleted)."""
        return ~self._dirty

    @property
    def dirty_rows(self) -> int:
        """Segment rows out of use (their nodes changed or deleted since)."""
        return int(self._dirty.size) - self._clean

    @property
    def materialized(self) -> int:
        """Nodes held as objects (every node, without a segment)."""
        return len(self._live)

    def _clean_row(self, node_id: str) -> int:
        segment = self.segment
        if segment is None:
            return -1
        row = segment.row_of(node_id)
        return row if row >= 0 and not self._dirty[row] else -1

    def _from_segment(self, node_id: str) -> Node | None:
        node = self._built.get(node_id)
        if node is not None:
            return node
        row = self._clean_row(node_id)
        return None if row < 0 else self._build(row)

    def _build(self, row: int) -> Node:
        assert self.segment is not None
        node = self.segment.node(row)
        if len(self._built) >= _BUILT_CACHE:
            self._built.clear()
        self._built[node.id] = node
        return node

    def _mark_dirty(self, node_id: str) -> Node | None:
        """Take ``node_id``'s clean row out of use; return the node it held."""
        row = self._clean_row(node_id)
        if row < 0:
            return None
        node = self._built.pop(node_id, None) or self._build(row)
        self._built.pop(node_id, None)
        self._dirty[row] = True
        self._clean -= 1
        return node

    # -- changing ----------------------------------------------------------------------------------

    def materialize(self, node_id: str) -> Node | None:
        """The node as an object this table owns (built from its row, which goes dirty),
        ready to be changed in place; ``None`` if there is no such node."""
        node = self._live.get(node_id)
        if node is not None:
            return node
        node = self._mark_dirty(node_id)
        if node is not None:
            self._live[node_id] = node
        return node

    def __setitem__(self, node_id: str, node: Node) -> None:
        if node_id not in self._live:
            self._mark_dirty(node_id)
        self._live[node_id] = node

    def pop(self, node_id: str, default: Node | None = None) -> Node | None:
        node = self._live.pop(node_id, None)
        if node is not None:
            return node
        node = self._mark_dirty(node_id)
        return default if node is None else node

    def replace_all(self, nodes: dict[str, Node]) -> None:
        """Hold exactly ``nodes`` (a tree loaded from rows, without a segment)."""
        self._live = nodes
        self.segment = None
        self._dirty = np.zeros(0, dtype=bool)
        self._clean = 0
        self._built = {}

    def live_nodes(self) -> list[Node]:
        """The materialized nodes themselves (read them under the lock)."""
        return list(self._live.values())

    def changed_nodes(self) -> list[Node]:
        """Copies of the materialized nodes (what a new segment writes beside the clean rows)."""
        return [node.copy() for node in self._live.values()]
