"""``TreeState``: the in-process picture of one namespace's tree.

It is built and kept current only by applying :class:`~memtree.store.ChangeBatch`
es, whether they come from this process's own commits or from other writers, so
there is exactly one way the picture changes. Besides the nodes it keeps the lookups
the engine needs per insert or query without scanning the tree: leaves by exact
content (duplicate guard: text, metadata and source id), leaves by source id (adapters), leaves by metadata value
(``where`` filters), a depth histogram (the tree's depth for the threshold), the
leaves that expire in order of expiry (what reads hide, what a sweep deletes) and,
unless switched off, a BM25 index of every node's text for hybrid retrieval.
:func:`paused_gc` keeps the garbage collector out of loading a whole tree.

A state loaded from a segment (:meth:`TreeState.load_segment`) builds none of this
up front: nodes come from the segment's rows when read (:mod:`memtree.node_table`),
the lookups answer from its sorted hashes and arrays for the rows still clean and
from small dicts for the nodes changed since, and the BM25 index reads its stored
posting lists in place.
"""

from __future__ import annotations

import bisect
import gc
import json
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from operator import attrgetter
from typing import Any, Protocol

import numpy as np

from memtree.lexical import LexicalIndex
from memtree.node import ROOT_ID, Node
from memtree.node_table import NodeTable
from memtree.segment import Segment
from memtree.store.base import ChangeBatch, NamespaceInfo
from memtree.where import MetadataIndex, Selection, Where, metadata_key

__all__ = ["JOURNAL_LENGTH", "TreeState", "metadata_key"]

JOURNAL_LENGTH = 4096
"""Change batches remembered for :meth:`TreeState.changes_since` (optimistic writes)."""


ContentKey = tuple[str, str, str | None]
"""What makes two leaves duplicates: text, canonical metadata JSON, source id."""


def content_key(text: str, metadata: Mapping[str, Any], source_id: str | None) -> ContentKey:
    """The duplicate guard's key: the same text with other metadata (another tenant,
    another session) or another source id is another memory, not a duplicate."""
    canonical = json.dumps(metadata, sort_keys=True, ensure_ascii=False, separators=(",", ":")) if metadata else ""
    return (text, canonical, source_id)


TextKey = tuple[str, str | None]
"""A leaf's text and source id: what the duplicate guard looks up first."""


def _text_of(node: Node) -> TextKey:
    return (node.text, node.source_id)


class LeafLookup:
    """Leaf ids by a key (oldest first): for a segment's clean rows through ``stored``
    (rows holding the key), for the nodes changed since in a dict."""

    def __init__(
        self, stored: Any = None, table: NodeTable | None = None, key_of_row: Callable[[int], Any] | None = None
    ) -> None:
        self.changed: dict[Any, list[str]] = {}
        self._stored = stored
        self._table = table
        self._key_of_row = key_of_row

    def items(self) -> list[tuple[Any, list[str]]]:
        """Every key with its ids (reads every clean leaf row of a segment: for checks)."""
        if self._stored is None or self._table is None or self._table.segment is None:
            return [(key, list(ids)) for key, ids in self.changed.items()]
        segment = self._table.segment
        assert self._key_of_row is not None
        grouped: dict[Any, list[str]] = {}
        leaves = np.flatnonzero(self._table.clean_rows & np.asarray(segment.arrays["is_leaf"]))
        for row in leaves.tolist():
            key = self._key_of_row(row)
            if key is not None:
                grouped.setdefault(key, []).append(segment.id_at(row))
        for key, ids in self.changed.items():
            grouped.setdefault(key, []).extend(ids)
        return list(grouped.items())

    def get(self, key: Any, default: Any = None) -> list[str] | Any:
        """The ids under ``key`` (``default`` when there are none)."""
        ids = self.changed.get(key)
        if self._stored is not None:
            table = self._table
            assert table is not None and table.segment is not None
            clean = table.clean_rows
            stored = [table.segment.id_at(row) for row in self._stored(key) if clean[row]]
            if stored:
                ids = stored + (ids or [])
        return ids if ids else default

    def add(self, key: Any, node_id: str) -> None:
        self.changed.setdefault(key, []).append(node_id)

    def discard(self, key: Any, node_id: str) -> None:
        ids = self.changed.get(key)
        if ids is None:
            return
        if node_id in ids:
            ids.remove(node_id)
        if not ids:
            del self.changed[key]


class TreeView(Protocol):
    """What routing and planning read of a tree: nodes by id (each with its children
    list) and the tree's depth. A :class:`TreeState` is one; ``MemTree.update``
    routes through a view of the tree as it would be without the leaf it moves."""

    @property
    def nodes(self) -> Mapping[str, Node]: ...

    @property
    def depth(self) -> int: ...


class TreeState:
    """Nodes by id with children lists, plus the lookups above."""

    def __init__(self, *, lexical: bool = True) -> None:
        self.lexical: LexicalIndex | None = LexicalIndex() if lexical else None
        self.nodes = NodeTable()
        self.seq = 0
        self.generation: str | None = None
        self.info = NamespaceInfo()
        self.leaves_by_text = LeafLookup()
        """Leaf ids by text and source id, oldest first; metadata is compared only
        among these (rarely more than one), so a reopen need not serialize every
        leaf's metadata to index it."""
        self.leaves_by_source = LeafLookup()
        self._by_metadata: MetadataIndex | None = None
        """Leaf ids by metadata key and value; made by the first ``where`` filter, then
        kept current (a reopen need not index metadata nobody filters on)."""
        self._depths: Counter[int] = Counter()
        self._expiry: list[tuple[float, str]] = []
        """(expires_at, leaf id) of every leaf that expires, sorted: the expired ones
        are a prefix, found by bisection whatever the tree's size (with a segment:
        those changed since; the segment's own are sorted arrays)."""
        self._stored_expiry_start = 0
        """Entries of the segment's expiry arrays before this one are all dirty."""
        self.leaf_total = 0
        self._journal: deque[tuple[int, frozenset[str], frozenset[str]]] = deque(maxlen=JOURNAL_LENGTH)
        self._journal_floor = 0

    # -- applying changes ---------------------------------------------------------

    def apply(self, batch: ChangeBatch) -> tuple[list[Node], list[str], bool]:
        """Apply a batch; return (nodes written, ids removed, whether it reset the tree).

        A batch from another incarnation of the namespace (it was deleted and made
        again), or a complete one (the store's log no longer reaches back to this
        state), resets the state first. Batches not newer than the state are ignored.
        """
        reset = batch.generation != self.generation or (batch.complete and bool(self.nodes))
        if reset:
            self.__init__(lexical=self.lexical is not None)  # type: ignore[misc]
            self.generation = batch.generation
            self._journal_floor = batch.seq
        elif batch.seq <= self.seq:
            return [], [], False
        else:
            self._remember(batch)
        removed: list[str] = []
        for node_id in batch.deleted:
            node = self.nodes.pop(node_id, None)
            if node is None:
                continue
            self._unindex(node)
            parent = self.nodes.materialize(node.parent) if node.parent else None
            if parent is not None and node_id in parent.children:
                parent.children.remove(node_id)
            removed.append(node_id)
        if self.lexical is not None and removed:
            self.lexical.remove_many(removed)
        moved: list[tuple[Node, str | None]] = []
        loaded = {node.id: node for node in batch.nodes} if not self.nodes else {}
        written = [node for node in batch.nodes if not node.is_root]
        if loaded and len(loaded) == len(batch.nodes):  # the first batch (a reopen): all new
            self.nodes.replace_all(loaded)
            self._index_all(batch.nodes)
            moved = [(node, None) for node in batch.nodes]
        else:
            for node in batch.nodes:
                old = self.nodes.get(node.id)
                if old is not None:
                    node.children = old.children
                    self._unindex(old)
                self.nodes[node.id] = node
                self._index(node)
                if old is None or old.parent != node.parent:
                    moved.append((node, old.parent if old is not None else None))
        if self.lexical is not None and written:
            # One call for the whole batch: a reopen indexes every text in bulk.
            self.lexical.upsert_many([node.id for node in written], [node.text for node in written])
        self._place(moved)
        self.seq = batch.seq
        self.info = batch.info
        return written, removed, reset

    def _place(self, moved: list[tuple[Node, str | None]]) -> None:
        """Move nodes into their (new) parents' children lists.

        Children stay in creation order (ties by id), however the batches arrived: a
        reopened or imported tree lists them exactly as before. A parent whose list
        was empty (every parent, on a reopen) gets its children appended in one
        pass over the nodes sorted once; others take them one by one.
        """
        arrivals: dict[str, list[str]] = {}
        for node, old_parent in moved:
            previous = self.nodes.materialize(old_parent) if old_parent else None
            if previous is not None and node.id in previous.children:
                previous.children.remove(node.id)
            if node.parent is not None:
                arrivals.setdefault(node.parent, []).append(node.id)
        if len(moved) > 1:
            ordered = sorted((node for node, _ in moved), key=attrgetter("created_at", "id"))
            arrivals = {parent: [] for parent in arrivals}
            for node in ordered:
                if node.parent is not None:
                    arrivals[node.parent].append(node.id)
        for parent_id, children in arrivals.items():
            parent = self.nodes.materialize(parent_id)
            if parent is None:
                continue
            if not parent.children:
                parent.children.extend(children)
                continue
            present = set(parent.children)
            for child in children:
                if child not in present:
                    bisect.insort(parent.children, child, key=self._creation_key)

    def _remember(self, batch: ChangeBatch) -> None:
        """Journal which nodes a batch touched and which parents gained children."""
        if len(self._journal) == self._journal.maxlen:
            self._journal_floor = self._journal[0][0]
        touched = frozenset([*(node.id for node in batch.nodes), *batch.deleted])
        parents = frozenset(node.parent for node in batch.nodes if node.parent is not None)
        self._journal.append((batch.seq, touched, parents))

    def changes_since(self, seq: int) -> tuple[set[str], set[str]] | None:
        """Ids of the nodes written or deleted after ``seq``, and the parents of the
        nodes written; ``None`` if the journal does not reach back that far."""
        if seq < self._journal_floor:
            return None
        touched: set[str] = set()
        parents: set[str] = set()
        for entry_seq, ids, entry_parents in reversed(self._journal):
            if entry_seq <= seq:
                break
            touched.update(ids)
            parents.update(entry_parents)
        return touched, parents

    def _creation_key(self, node_id: str) -> tuple[float, str]:
        node = self.nodes.get(node_id)
        return (node.created_at if node is not None else float("inf"), node_id)

    def _index(self, node: Node) -> None:
        if node.is_root:
            return
        self._depths[node.depth] += 1
        if not node.is_leaf:
            return
        self.leaf_total += 1
        if node.expires_at is not None:
            bisect.insort(self._expiry, (node.expires_at, node.id))
        self.leaves_by_text.add(_text_of(node), node.id)
        if node.source_id is not None:
            self.leaves_by_source.add(node.source_id, node.id)
        if self._by_metadata is not None:
            self._by_metadata.add(node.id, node.metadata)

    def _index_all(self, nodes: list[Node]) -> None:
        """:meth:`_index` for every node of a batch loaded into an empty state, with
        the per-node work cut to what each lookup needs (a reopen runs this on every
        node of the tree)."""
        members = [node for node in nodes if not node.is_root]
        self._depths.update(node.depth for node in members)
        leaves = [node for node in members if node.is_leaf]
        self.leaf_total += len(leaves)
        self._expiry = sorted((node.expires_at, node.id) for node in leaves if node.expires_at is not None)
        by_text = self.leaves_by_text.changed
        for node in leaves:
            key = (node.text, node.source_id)
            same = by_text.get(key)
            if same is None:
                by_text[key] = [node.id]
            else:
                same.append(node.id)
        by_source = self.leaves_by_source.changed
        for node in leaves:
            if node.source_id is not None:
                by_source.setdefault(node.source_id, []).append(node.id)
        if self._by_metadata is not None:
            for node in leaves:
                self._by_metadata.add(node.id, node.metadata)

    def _unindex(self, node: Node) -> None:
        if node.is_root:
            return
        self._depths[node.depth] -= 1
        if self._depths[node.depth] <= 0:
            del self._depths[node.depth]
        if not node.is_leaf:
            return
        self.leaf_total -= 1
        if node.expires_at is not None:
            position = bisect.bisect_left(self._expiry, (node.expires_at, node.id))
            if position < len(self._expiry) and self._expiry[position] == (node.expires_at, node.id):
                del self._expiry[position]
        self.leaves_by_text.discard(_text_of(node), node.id)
        if node.source_id is not None:
            self.leaves_by_source.discard(node.source_id, node.id)
        if self._by_metadata is not None:
            self._by_metadata.remove(node.id, node.metadata)

    # -- a segment ---------------------------------------------------------------------

    def load_segment(self, segment: Segment) -> None:
        """Start over from ``segment`` (nothing is built until read; see the module docstring)."""
        self.__init__(lexical=self.lexical is not None)  # type: ignore[misc]
        self.nodes = NodeTable(segment)
        self.seq = segment.seq
        self.generation = segment.generation
        self.info = segment.info
        self._journal_floor = segment.seq
        if self.lexical is not None:
            self.lexical = LexicalIndex.mapped(segment.lexical_base())
        self.leaves_by_text = LeafLookup(
            lambda key: segment.rows_with_text(*key),
            self.nodes,
            lambda row: (segment.text_at(row), segment.source_at(row)),
        )
        self.leaves_by_source = LeafLookup(segment.rows_with_source, self.nodes, segment.source_at)
        depths = np.bincount(np.asarray(segment.arrays["depth"]))
        self._depths = Counter({depth: int(count) for depth, count in enumerate(depths.tolist()) if count})
        self.leaf_total = int(np.count_nonzero(segment.arrays["is_leaf"]))

    def freeze(self) -> tuple[Node, list[Node], np.ndarray | None]:
        """What a new segment is written from (under the read lock): a copy of the
        root, copies of the nodes changed since this state's segment, and which of
        its rows are still clean (``None`` without a segment: every node changed)."""
        root = self.nodes.get(ROOT_ID)
        assert root is not None
        changed = [node for node in self.nodes.changed_nodes() if node.id != ROOT_ID]
        clean = self.nodes.clean_rows.copy() if self.nodes.segment is not None else None
        return root.copy(), changed, clean

    def take_over(self, other: TreeState) -> None:
        """Become ``other`` (a state loaded from a newer segment and caught up to at
        least this one's sequence number), keeping this state's journal of changes,
        so plans made before still find out what changed since."""
        journal, floor, last = self._journal, self._journal_floor, self.seq
        for entry in other._journal:
            if entry[0] > last:
                if len(journal) == journal.maxlen:
                    floor = journal[0][0]
                journal.append(entry)
        self.__dict__.update(other.__dict__)
        self._journal, self._journal_floor = journal, floor

    def shape(self) -> tuple[int, int, int, int, int]:
        """(leaves, summaries, stale summaries, sum of leaf depths, sum of summaries'
        children): what ``stats()`` reports of the tree's shape. A segment's clean rows
        are counted from its columns, not built into nodes."""
        leaves = summaries = stale = depth_total = child_total = 0
        table = self.nodes
        nodes = table.live_nodes() if table.segment is not None else table.values()
        for node in nodes:
            if node.id == ROOT_ID:
                continue
            if node.is_leaf:
                leaves += 1
                depth_total += node.depth
            else:
                summaries += 1
                child_total += len(node.children)
                stale += int(node.stale)
        segment = table.segment
        if segment is not None:
            clean = table.clean_rows
            a = segment.arrays
            is_leaf = np.asarray(a["is_leaf"]) & clean
            is_summary = ~np.asarray(a["is_leaf"]) & clean
            leaves += int(np.count_nonzero(is_leaf))
            summaries += int(np.count_nonzero(is_summary))
            stale += int(np.count_nonzero(np.asarray(a["stale"]) & is_summary))
            depth_total += int(np.asarray(a["depth"], dtype=np.int64)[is_leaf].sum())
            child_total += int(np.diff(np.asarray(a["child_offsets"]))[is_summary].sum())
        return leaves, summaries, stale, depth_total, child_total

    def _materialized_leaves(self) -> Iterator[Node]:
        table = self.nodes
        if table.segment is None:
            yield from (node for node in table.values() if node.is_leaf and not node.is_root)
            return
        yield from (node for node in table.live_nodes() if node.is_leaf and not node.is_root)

    # -- reading ---------------------------------------------------------------------

    @property
    def root(self) -> Node | None:
        return self.nodes.get(ROOT_ID)

    @property
    def depth(self) -> int:
        """The depth of the deepest node (0 for an empty tree)."""
        return max(self._depths) if self._depths else 0

    def depth_histogram(self) -> dict[int, int]:
        return dict(sorted(self._depths.items()))

    def leaves_matching(self, where: Where) -> Selection:
        """The leaves whose metadata pass ``where`` (see :mod:`memtree.where`)."""
        by_metadata = self._by_metadata
        if by_metadata is None:  # the first filter: index every leaf's metadata now
            by_metadata = MetadataIndex()
            for node in self._materialized_leaves():
                by_metadata.add(node.id, node.metadata)
            segment = self.nodes.segment
            if segment is not None:  # the clean rows' metadata, parsed in one call per chunk
                rows = np.flatnonzero(self.nodes.clean_rows & np.asarray(segment.arrays["is_leaf"]))
                for start in range(0, rows.size, 65_536):
                    chunk = rows[start : start + 65_536]
                    for row, metadata in zip(chunk.tolist(), segment.metadata_of(chunk), strict=True):
                        by_metadata.add(segment.id_at(row), metadata)
            self._by_metadata = by_metadata  # one assignment: concurrent readers see all or nothing
        return by_metadata.select(where)

    def duplicate_of(self, text: str, metadata: Mapping[str, Any], source_id: str | None) -> str | None:
        """The id of the oldest leaf holding the same text, metadata and source id, if
        any (an expired one is no longer remembered, so it is none)."""
        same = self.leaves_by_text.get((text, source_id))
        if not same:
            return None
        wanted = content_key(text, metadata, source_id)
        now = time.time()
        for leaf_id in same:
            node = self.nodes[leaf_id]
            if content_key(node.text, node.metadata, node.source_id) != wanted:
                continue
            if node.expires_at is None or node.expires_at > now:
                return leaf_id
        return None

    # -- expiry ----------------------------------------------------------------------

    @property
    def next_expiry(self) -> float | None:
        """When the next leaf expires (POSIX seconds; ``None``: no leaf expires)."""
        soonest = self._expiry[0][0] if self._expiry else None
        stored = self._stored_expiry()
        if stored is not None:
            times, rows = stored
            clean = self.nodes.clean_rows
            start = self._stored_expiry_start
            while start < rows.size and not clean[rows[start]]:
                start += 1
            self._stored_expiry_start = start
            if start < rows.size and (soonest is None or float(times[start]) < soonest):
                soonest = float(times[start])
        return soonest

    def expired(self, now: float) -> list[str]:
        """Ids of the leaves whose expiry is ``now`` or earlier, soonest first."""
        end = bisect.bisect_right(self._expiry, now, key=lambda entry: entry[0])
        changed = self._expiry[:end]
        stored = self._stored_expiry()
        if stored is None:
            return [leaf_id for _, leaf_id in changed]
        times, rows = stored
        last = int(np.searchsorted(times, now, side="right"))
        if last <= self._stored_expiry_start:
            return [leaf_id for _, leaf_id in changed]
        segment = self.nodes.segment
        assert segment is not None
        clean = self.nodes.clean_rows
        picked = np.arange(self._stored_expiry_start, last)
        picked = picked[clean[rows[picked]]]
        merged = [*changed, *((float(times[i]), segment.id_at(int(rows[i]))) for i in picked.tolist())]
        merged.sort()
        return [leaf_id for _, leaf_id in merged]

    def _stored_expiry(self) -> tuple[np.ndarray, np.ndarray] | None:
        segment = self.nodes.segment
        if segment is None or not segment.arrays["expiry"].size:
            return None
        return segment.arrays["expiry"], segment.arrays["expiry_row"]

    def hidden(self, now: float) -> frozenset[str]:
        """What no read may return at ``now``: the expired leaves and the summaries
        every leaf of which has expired (they summarize nothing still remembered)."""
        expired = self.expired(now)
        if not expired:
            return frozenset()
        gone: Counter[str] = Counter()
        for leaf_id in expired:
            gone.update(node.id for node in self.path_to_root(leaf_id))
        return frozenset(expired).union(
            node_id for node_id, count in gone.items() if count >= self.nodes[node_id].leaf_count
        )

    def children_of(self, node_id: str) -> list[Node]:
        """The node's children (the node objects as they are now, in order)."""
        return [self.nodes[child] for child in self.nodes[node_id].children]

    def leaf_ids_under(self, node_id: str) -> tuple[str, ...]:
        """Ids of the leaves below a node (the node itself if it is a leaf), in tree order."""
        out: list[str] = []
        stack = [node_id]
        while stack:
            node = self.nodes[stack.pop()]
            if node.is_leaf:
                out.append(node.id)
            else:
                stack.extend(reversed(node.children))
        return tuple(out)

    def walk(self, start: str = ROOT_ID) -> Iterator[Node]:
        """Nodes in depth-first pre-order from ``start``."""
        if start not in self.nodes:
            return
        stack = [start]
        while stack:
            node = self.nodes[stack.pop()]
            yield node
            stack.extend(reversed(node.children))

    def path_to_root(self, node_id: str) -> list[Node]:
        """The node's ancestors below the root, deepest first."""
        out: list[Node] = []
        node = self.nodes[node_id]
        while node.parent is not None and node.parent != ROOT_ID:
            node = self.nodes[node.parent]
            out.append(node)
        return out


@contextmanager
def paused_gc() -> Iterator[None]:
    """Run the block with the cyclic collector off (and back on after, if it was on).

    Reopening 100k nodes allocates a few hundred thousand objects; the collector
    would run hundreds of times meanwhile, each pass scanning every object made so
    far, although none of them is garbage. Reference counting still frees memory.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
