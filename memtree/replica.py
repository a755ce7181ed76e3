"""``Replica``: this process's copy of one namespace, kept in step with its store.

A replica holds the tree (:class:`~memtree.state.TreeState`) and its vector index,
and changes only by applying change batches: those other writers committed (read
from the store by :meth:`Replica.refresh`) and this process's own commits
(:meth:`Replica.commit` shows each one exactly as another writer's would be seen).
Queries read it under a shared lock; applying a batch takes the lock alone.

Large namespaces start from a segment when the store keeps index files
(:mod:`memtree.checkpoint`): a reopen maps the newest usable segment and applies
only the rows committed after it. Work that grows with the tree never runs on the
write path; a background thread does it, and the replica takes its result at a
moment when nothing is half written:

* a new segment, once enough has changed since the last one: written from a frozen
  copy of what changed, then loaded and caught up beside the live tree, and
  *adopted* (the live tree becomes it) by the next catch-up that finds this
  process's tree equal to the committed one (no batch staged but not committed);
* without index files, the IVF index (:mod:`memtree.ann`): trained on a sample and
  filled from copies of the rows taken a chunk at a time, the rows written
  meanwhile re-filed when it is installed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from memtree.ann import IvfIndex, train_centroids
from memtree.checkpoint import LOCK_FILE, CheckpointPolicy, SegmentFolder, remove_outdated
from memtree.config import MemTreeConfig
from memtree.index import AnnSettings, VectorIndex
from memtree.node import ROOT_ID, LeafVersion, Node
from memtree.redaction import masked_texts, redacted
from memtree.segment import Segment, SegmentError
from memtree.segment_writer import FrozenTree, ivf_lists, write_segment
from memtree.state import TreeState, paused_gc
from memtree.store.base import (
    ChangeBatch,
    CompactionReport,
    NamespaceInfo,
    NamespaceKey,
    RecordChanges,
    Store,
    WriteTransaction,
)

R = TypeVar("R")

logger = logging.getLogger(__name__)

HEAD_ONLY = 1 << 62
"""``read(HEAD_ONLY)`` asks the store for its sequence number and generation and no rows."""

RETRAIN_GROWTH = 2
"""A new segment retrains the IVF's centroids once the tree has this many times the rows they were trained on."""
REBUILD_GROWTH = 4
"""Without index files, the IVF is rebuilt in memory once the tree has this many times the rows it was built on."""
SAMPLE_PER_LIST = 64
"""Rows k-means trains on per IVF list."""
COPY_ROWS = 65_536
"""Rows copied under one hold of the read lock while an IVF is filled beside the tree."""


@dataclass
class _Prepared:
    """A state and index loaded from a new segment (or, the last resort, from the
    rows) and caught up, waiting to be adopted."""

    state: TreeState
    index: VectorIndex | None


class Replica:
    """The tree and index of ``namespace`` in ``store``, as this process knows them.

    ``refresh_interval`` is how many seconds a read may skip asking the store
    whether another writer committed (0: ask every time). ``ann`` says from what size
    searches are approximate; ``checkpoints`` when segments are written (``None``:
    never, even where the store keeps files).
    """

    @classmethod
    def configured(
        cls, store: Store, namespace: NamespaceKey, config: MemTreeConfig, refresh_interval: float
    ) -> Replica:
        """The replica a memory with ``config`` reads through: BM25 kept when words
        count in ranking, approximate search and segments as the config sets them."""
        return cls(
            store,
            namespace,
            lexical=config.lexical_weight > 0,
            refresh_interval=refresh_interval,
            ann=ann_settings(config),
            checkpoints=checkpoint_policy(config),
        )

    def __init__(
        self,
        store: Store,
        namespace: NamespaceKey,
        *,
        lexical: bool,
        refresh_interval: float,
        ann: AnnSettings | None = None,
        checkpoints: CheckpointPolicy | None = None,
    ) -> None:
        if refresh_interval < 0:
            raise ValueError(f"refresh_interval must be >= 0 seconds, got {refresh_interval}")
        self.store = store
        self.namespace = namespace
        self.refresh_interval = refresh_interval
        self.ann = ann or AnnSettings(min_rows=None)
        self.checkpoints = checkpoints
        self.state = TreeState(lexical=lexical)
        self.index: VectorIndex | None = None
        self.lock = ReadWriteLock()
        self._sync_lock = threading.Lock()
        self._last_refresh = 0.0
        located = store.index_folder(namespace) if checkpoints is not None else None
        self.segments = (
            SegmentFolder(located.path, located.writable, namespace, located.identity) if located is not None else None
        )
        self._worker: threading.Thread | None = None
        self._prepared: _Prepared | None = None
        self._closed = False
        self._behind = False
        """The segment this process mapped was far behind the rows: write a newer one."""
        self.wrote = False
        """Whether this process committed to the namespace (a reason to write a segment at close)."""
        self.events: dict[str, float] = {}
        """Counts and seconds of the background work (segments written, adopted; IVF builds)."""

    # -- reading ------------------------------------------------------------------------

    def read(self, view: Callable[..., R], *args: Any, **kwargs: Any) -> R:
        """``view(state, *args, **kwargs)`` on the caught-up tree, under the read lock."""
        self.maybe_refresh()
        with self.lock.read():
            return view(self.state, *args, **kwargs)

    def get(self, node_id: str) -> Node:
        """A copy of a node (``KeyError`` naming the id if there is none, or it expired)."""
        self.maybe_refresh()
        with self.lock.read():
            node = self.state.nodes.get(node_id)
            hidden = self.hidden()
            if node is None or node_id in hidden:
                gone = "" if node is None else " (it expired)"
                raise KeyError(f"no node with id {node_id!r} in namespace {self.namespace!r}{gone}")
            return self._copy_out(node, hidden, self.masked(hidden))

    def get_many(self, node_ids: Iterable[str]) -> dict[str, Node]:
        """Copies of those of ``node_ids`` that exist (and have not expired), read
        from one snapshot."""
        self.maybe_refresh()
        with self.lock.read():
            nodes, hidden = self.state.nodes, self.hidden()
            masked = self.masked(hidden)
            found = {node_id: nodes.get(node_id) for node_id in node_ids}
            return {
                node_id: self._copy_out(node, hidden, masked)
                for node_id, node in found.items()
                if node is not None and node_id not in hidden
            }

    def snapshot(self) -> list[Node]:
        """Copies of every node but the expired ones, root first, in depth-first pre-order."""
        self.maybe_refresh()
        with self.lock.read():
            hidden = self.hidden()
            masked = self.masked(hidden)
            return [self._copy_out(node, hidden, masked) for node in self.state.walk() if node.id not in hidden]

    def show(self, view: Callable[..., R], *args: Any, **kwargs: Any) -> R:
        """``view`` (a picture) of the caught-up tree as a reader may see it: with
        leaves expired since the last sweep left out and the summaries above them in
        stand-in text (:func:`~memtree.redaction.redacted`)."""
        self.maybe_refresh()
        with self.lock.read():
            return view(redacted(self.state, time.time()), *args, **kwargs)

    def leaf_ids_under(self, node_id: str) -> tuple[str, ...]:
        """Ids of the leaves below a node that have not expired (as this replica
        knows it: no catch-up)."""
        with self.lock.read():
            hidden = self.hidden()
            if node_id not in self.state.nodes or node_id in hidden:
                raise KeyError(f"no node with id {node_id!r} in namespace {self.namespace!r}")
            leaves = self.state.leaf_ids_under(node_id)
            return tuple(leaf for leaf in leaves if leaf not in hidden) if hidden else leaves

    def hidden(self) -> frozenset[str]:
        """What reads must not return now: expired leaves and the summaries of
        nothing else (:meth:`TreeState.hidden`); call under the read lock."""
        return self.state.hidden(time.time())

    def masked(self, hidden: frozenset[str]) -> dict[str, str]:
        """Summaries that still hold the text of a leaf expired since the last sweep,
        with the stand-in text a reader gets instead (:mod:`memtree.redaction`); call
        under the read lock with :meth:`hidden`'s answer (empty: nothing expired)."""
        return masked_texts(self.state, time.time()) if hidden else {}

    def live_leaf_total(self) -> int:
        """Leaves not expired (call under the read lock)."""
        return self.state.leaf_total - len(self.state.expired(time.time()))

    def sweep_due(self) -> bool:
        """Whether a leaf this replica knows of has expired and waits for a sweep."""
        next_expiry = self.state.next_expiry
        return next_expiry is not None and next_expiry <= time.time()

    def _copy_out(self, node: Node, hidden: frozenset[str] = frozenset(), masked: dict[str, str] | None = None) -> Node:
        out = node.copy()
        if node.id == ROOT_ID:  # the stored root does not count; the state does
            out.leaf_count = self.live_leaf_total()
        if hidden:
            out.children = [child for child in out.children if child not in hidden]
        if masked and node.id in masked:
            out.text, out.stale = masked[node.id], True
        return out

    # -- catching up -----------------------------------------------------------------------

    def refresh(self, *, force: bool = False) -> None:
        """Apply what other writers committed since this replica last looked."""
        if not force and self.state.generation is not None and self._prepared is None:
            seq, generation = self.store.head(self.namespace)
            if seq == self.state.seq and generation == self.state.generation:
                self._last_refresh = time.monotonic()
                return
        self.catch_up(lambda since: self.store.read_changes(self.namespace, since))

    def maybe_refresh(self) -> None:
        """:meth:`refresh` unless one ran less than ``refresh_interval`` ago."""
        if time.monotonic() - self._last_refresh >= self.refresh_interval:
            self.refresh()

    def catch_up(self, read: Callable[[int], ChangeBatch]) -> None:
        """Apply the changes ``read(since)`` returns (from the store, or from a write
        transaction under the store's lock)."""
        with self._sync_lock, paused_gc():
            if self._prepared is not None and self._adopt(read):
                self._last_refresh = time.monotonic()
                return
            loaded = self.state.generation is None and self.segments is not None and self._load_segment(read(HEAD_ONLY))
            batch = read(self.state.seq)
            if loaded and self.checkpoints is not None:
                segment = self.state.nodes.segment
                behind = len(batch.nodes) + len(batch.deleted)
                self._behind = segment is not None and behind > self.checkpoints.reopen_share * segment.count
            if batch.generation != self.state.generation and self.state.seq > 0:
                # the namespace was deleted, or compacted: start over (from a segment if one fits)
                if not (self.segments is not None and self._load_segment(batch)):
                    self.state.__init__(lexical=self.state.lexical is not None)  # type: ignore[misc]
                    self.index = None
                batch = read(self.state.seq)
            self._apply(batch)
            self._last_refresh = time.monotonic()
        self._maybe_start_background()

    def _load_segment(self, head: ChangeBatch) -> bool:
        """Start from the newest segment for the store's ``head`` (generation and
        sequence number), if one is usable; ``False`` leaves the state as it was."""
        assert self.segments is not None
        if not head.generation:
            return False
        segment = self.segments.newest(head.generation, head.seq)
        if segment is None:
            return False
        state, index = self._from_segment(segment)
        with self.lock.write():
            self.state.__dict__.update(state.__dict__)  # a fresh start: nothing of the old state holds
            self.index = index
        return True

    def _from_segment(self, segment: Segment) -> tuple[TreeState, VectorIndex]:
        state = TreeState(lexical=self.state.lexical is not None)
        state.load_segment(segment)
        base = segment.ivf_base()
        ivf = (
            IvfIndex(base.centroids, base.trained_rows, offsets=np.asarray(base.offsets), rows=segment.count)
            if base is not None
            else None
        )
        arrays = segment.arrays
        # Copy-on-write: rows this process overwrites become its own pages, the file stays
        # as written. A plain view of the map (indexing a memmap object costs microseconds).
        vectors = np.asarray(np.load(segment.path / "vectors.npy", mmap_mode="c", allow_pickle=False))
        index = VectorIndex.mapped(
            segment.dimension,
            vectors,
            np.asarray(arrays["is_leaf"]),
            np.asarray(arrays["timestamp"]),
            segment.id_at,
            segment.row_of,
            ivf,
            ann=self.ann,
        )
        return state, index

    def commit(
        self,
        transaction: WriteTransaction,
        upserts: list[Node],
        deletions: list[str],
        info: NamespaceInfo | None = None,
        versions: Sequence[LeafVersion] = (),
    ) -> None:
        """Commit atomically, then show the same change to this process's tree."""
        seq = transaction.commit(upserts, deletions, info, versions)
        self.wrote = True
        self._show(seq, upserts, deletions, info)
        self._maybe_start_background()

    def stage(
        self,
        transaction: WriteTransaction,
        upserts: list[Node],
        deletions: list[str],
        info: NamespaceInfo | None = None,
        versions: Sequence[LeafVersion] = (),
        records: RecordChanges | None = None,
    ) -> None:
        """Stage one batch of a transaction that holds several and show it to this
        process's tree at once, so the next batch is planned on top of it. If the
        transaction then fails, :meth:`reload` forgets what was shown."""
        seq = transaction.stage(upserts, deletions, info, versions, records)
        self.wrote = True
        self._show(seq, upserts, deletions, info)

    def reload(self) -> None:
        """Forget this process's tree and read it again from the store (after a
        transaction whose staged batches were shown here failed to commit)."""
        with self._sync_lock, self.lock.write():
            self.state.__init__(lexical=self.state.lexical is not None)  # type: ignore[misc]
            self.index = None
            self._prepared = None
        self.refresh(force=True)

    def _show(self, seq: int, upserts: list[Node], deletions: list[str], info: NamespaceInfo | None) -> None:
        batch = ChangeBatch(
            nodes=[node.copy() for node in upserts],
            deleted=list(deletions),
            seq=seq,
            generation=self.state.generation or "",
            info=info if info is not None else self.state.info,
        )
        with self._sync_lock:
            self._apply(batch)

    def _apply(self, batch: ChangeBatch) -> None:
        with self.lock.write():
            self.index = self._apply_to(self.state, self.index, batch)

    def _apply_to(self, state: TreeState, index: VectorIndex | None, batch: ChangeBatch) -> VectorIndex | None:
        """Apply a batch to ``state`` and its ``index``; return the index (a new one
        when the batch reset the tree or brought its first dimension)."""
        written, removed, reset = state.apply(batch)
        if reset:
            index = None
        dimension = state.info.dimension
        if index is None and dimension is not None:
            index = VectorIndex(dimension, ann=self.ann)
            written = [node for node in state.nodes.values() if not node.is_root]
            removed = []
        if index is None:
            return None
        index.remove(removed)
        embedded = [node for node in written if node.embedding is not None]
        if embedded:
            index.upsert(
                [node.id for node in embedded],
                [node.embedding for node in embedded],  # type: ignore[misc]
                [node.is_leaf for node in embedded],
                [node.timestamp for node in embedded],
            )
        return index

    # -- adopting a new segment ---------------------------------------------------------------

    def _adopt(self, read: Callable[[int], ChangeBatch]) -> bool:
        """Become the prepared state if this process's tree is the committed one (no
        batch staged and not yet committed); ``False`` if not now (or not at all)."""
        prepared = self._prepared
        assert prepared is not None
        head = read(HEAD_ONLY)
        if head.generation != prepared.state.generation:
            self._prepared = None  # a generation it was not made for: useless
            return False
        if self.state.seq > head.seq:  # a transaction staged batches here: later
            return False
        batch = read(prepared.state.seq)
        if batch.generation != prepared.state.generation:
            self._prepared = None
            return False
        prepared.index = self._apply_to(prepared.state, prepared.index, batch)
        with self.lock.write():
            self.state.take_over(prepared.state)
            self.index = prepared.index
        self._prepared = None
        self.events["segments_adopted"] = self.events.get("segments_adopted", 0) + 1
        return True

    # -- background work -------------------------------------------------------------------------

    def _maybe_start_background(self) -> None:
        """Start a segment write or an IVF build if one is due and none is running."""
        if self._closed or (self._worker is not None and self._worker.is_alive()) or self._prepared is not None:
            return
        job = self._due_job()
        if job is None:
            return
        worker = threading.Thread(target=self._run, args=(job,), name="memtree-index", daemon=True)
        self._worker = worker
        worker.start()

    def _due_job(self, *, closing: bool = False) -> str | None:
        """``"segment"``, ``"ivf"`` or ``None``: the background work due now."""
        state, index = self.state, self.index
        if index is None or state.generation is None:
            return None
        rows = len(index)
        table = state.nodes
        segment = table.segment
        if self.segments is not None and self.segments.writable and self.checkpoints is not None:
            changed = max(table.dirty_rows, table.materialized - 1)
            due = self.checkpoints.due(rows, changed, segment.count if segment is not None else None, closing=closing)
            if due or (self._behind and not closing):
                return "segment"  # a segment comes with its IVF (trained afresh when the tree has grown)
        if closing or self.ann.min_rows is None or rows < self.ann.min_rows:
            return None
        ivf = index.ivf
        if ivf is None or (self.segments is None and rows >= REBUILD_GROWTH * ivf.trained_rows):
            return "ivf"  # no segment brings one: built in memory
        return None

    def _run(self, job: str) -> None:
        try:
            if job == "segment":
                self._write_segment()
            else:
                self._build_ivf()
        except Exception:
            logger.exception("memtree: background index work for namespace %r failed", self.namespace)

    def _write_segment(self) -> None:
        """Write a segment from a frozen copy of the tree (or take a newer one another
        process wrote), then load and catch it up beside the live tree for :meth:`_adopt`."""
        folder = self.segments
        assert folder is not None
        started = time.perf_counter()
        with folder.writing() as held:
            if not held:
                return
            self._behind = False
            current = self.state.nodes.segment
            newest = folder.candidates()
            newer = newest and newest[0][0] > (current.seq if current is not None else 0)
            if newer and newest[0][0] >= self.state.seq:  # it holds all this process knows
                try:
                    self._prepare(newest[0][1])  # another process wrote one since: take it
                    return
                except SegmentError:
                    pass  # damaged: write one from this tree instead
            if self.store.head(self.namespace)[1] != self.state.generation:
                return  # compacted or deleted since this tree was read: a segment of it would never be used
            frozen = self._freeze(folder)
            path = self._written(folder, frozen) if frozen is not None else None
            if path is None:
                return
        self._prepare(path)
        self.events["segments_written"] = self.events.get("segments_written", 0) + 1
        self.events["segment_seconds"] = self.events.get("segment_seconds", 0.0) + time.perf_counter() - started

    def _written(self, folder: SegmentFolder, frozen: FrozenTree) -> Path | None:
        """Write ``frozen`` as the folder's one segment (under its lock); ``None`` when the
        segment it builds on fails its checksums: then the folder is emptied and the tree
        is read from the rows instead."""
        base = frozen.base
        if base is not None and base.verify():
            logger.warning("memtree: segment %s fails its checksums; reading the tree from the rows", base.path)
            folder.clean(keep=folder.path / LOCK_FILE)
            self._prepare_from_rows()
            return None
        path = write_segment(folder.path, frozen)
        folder.clean(keep=path)
        return path

    def _freeze(self, folder: SegmentFolder) -> FrozenTree | None:
        """What a new segment is written from: a frozen copy of the tree, taken under
        the read lock (``None``: no tree to write yet)."""
        with self.lock.read():
            state, index = self.state, self.index
            if index is None or state.info.dimension is None or state.generation is None:
                return None
            root, changed, clean = state.freeze()
            rows = len(index)
            trained = index.ivf.trained_rows if index.ivf is not None else 0
            return FrozenTree(
                namespace=self.namespace,
                identity=folder.identity,
                generation=state.generation,
                seq=state.seq,
                info=state.info,
                dimension=state.info.dimension,
                root=root,
                changed=changed,
                base=state.nodes.segment,
                base_kept=clean,
                ivf_rows=rows if self.ann.min_rows is not None and rows >= self.ann.min_rows else None,
                retrain=not trained or rows >= RETRAIN_GROWTH * trained,
            )

    # -- compaction --------------------------------------------------------------------------------

    def compact(self) -> CompactionReport:
        """Drop the store's dead rows (:meth:`Store.compact`), catch up, then leave no
        index file of this namespace holding a text its rows no longer hold
        (:meth:`purge_segments`), and remove the other namespaces' segments that the
        compaction made useless (:func:`~memtree.checkpoint.remove_outdated`)."""
        report = self.store.compact()
        self.refresh(force=True)
        self.purge_segments()
        located = self.store.index_folder(self.namespace)
        if located is not None and located.writable:  # other namespaces: what compaction made useless
            remove_outdated(located.path.parent, self.store.head, located.identity, skip=located.path)
        return report

    def purge_segments(self) -> None:
        """Replace this namespace's segments by one written now from the current tree
        (or, below the size segments are written from, remove them), unless the folder
        already holds just one that is the current tree with no word of a removed text.

        A segment holds the texts, metadata and words of the tree it was frozen from,
        deleted or replaced ones included until a newer segment replaces it: a delete
        made for privacy is only gone from disk once this has run. It waits for the
        folder's writer lock (a segment another process is writing is replaced after
        it); a process still mapping a removed segment keeps reading it (on Linux the
        kernel frees the pages with the last map) and moves to the new one at its next
        refresh."""
        located = self.store.index_folder(self.namespace)
        if located is None or not located.writable or not located.path.is_dir():
            return
        folder = self.segments or SegmentFolder(located.path, True, self.namespace, located.identity)
        self.wait()  # this process's background writer first: it holds the lock while it writes
        if self._prepared is not None:
            self.refresh(force=True)  # take the segment it wrote: if it is the current tree, it stays
        with folder.writing(wait=True) as held:
            if not held:
                return
            entries = folder.entries()
            if not entries:
                return
            current = self.state.nodes.segment
            if current is not None and entries == [current.path] and self._is_current_tree(current):
                return
            policy, index = self.checkpoints, self.index
            due = self.segments is not None and policy is not None and len(index or ()) >= policy.min_rows
            frozen = self._freeze(folder) if due else None
            if frozen is None:
                folder.clean(keep=folder.path / LOCK_FILE)  # no segment is due at this size: a reopen reads the rows
                return
            path = self._written(folder, frozen)
            if path is not None:
                self._prepare(path)
        self.refresh(force=True)  # adopt it now: this process no longer maps the old segment

    def _is_current_tree(self, segment: Segment) -> bool:
        """Whether ``segment`` is exactly this process's tree (nothing committed or
        changed since it was written) and its vocabulary has no word without a posting
        (segments written before words were dropped with their texts kept them)."""
        state = self.state
        if segment.seq != state.seq or segment.generation != state.generation or state.nodes.dirty_rows:
            return False
        return bool(np.all(np.diff(np.asarray(segment.arrays["lex_posting_offsets"])) > 0))

    def _prepare(self, path: Path) -> None:
        """Load a segment and catch it up from the store, ready for :meth:`_adopt`."""
        segment = Segment.open(path, namespace=self.namespace)
        assert self.segments is not None
        if segment.identity != self.segments.identity:
            return
        state, mapped = self._from_segment(segment)
        batch = self.store.read_changes(self.namespace, segment.seq)
        if batch.generation != segment.generation:
            return
        with paused_gc():
            index = self._apply_to(state, mapped, batch)
        self._prepared = _Prepared(state, index)

    def _prepare_from_rows(self) -> None:
        """Read the whole tree from the rows (the last resort), ready for :meth:`_adopt`."""
        state = TreeState(lexical=self.state.lexical is not None)
        with paused_gc():
            index = self._apply_to(state, None, self.store.read_changes(self.namespace, 0))
        self._prepared = _Prepared(state, index)

    def _build_ivf(self) -> None:
        """Train and fill an IVF index beside the live one (no index files)."""
        started = time.perf_counter()
        with self.lock.read():
            index = self.index
            if index is None:
                return
            rows = len(index)
            lists = ivf_lists(rows)
            sample = index.sample(SAMPLE_PER_LIST * lists)
            index.watch()
        centroids = train_centroids(sample, lists)
        ivf = IvfIndex(centroids, rows)
        assignment = np.empty(rows, dtype=np.int64)
        filled = 0
        while filled < rows:
            with self.lock.read():
                if self.index is not index:
                    return
                block = index.rows_copy(filled, min(rows, filled + COPY_ROWS))
            if not len(block):
                break
            assignment[filled : filled + len(block)] = ivf.assign(block)
            filled += len(block)
        with self.lock.write():
            if self.index is index:
                index.install_ivf(ivf, assignment[:filled])
        self.events["ivf_builds"] = self.events.get("ivf_builds", 0) + 1
        self.events["ivf_seconds"] = self.events.get("ivf_seconds", 0.0) + time.perf_counter() - started

    def close(self, timeout: float | None = None) -> None:
        """Wait for background work; a process that wrote leaves a segment behind when
        enough changed since the last one (so the next reopen reads few rows)."""
        if self._closed:
            return
        worker = self._worker
        if worker is not None:
            worker.join(timeout)
        self._closed = True
        if worker is not None and worker.is_alive():
            return
        if self.wrote and self._prepared is not None:
            try:  # take the segment written last, so the one written now builds on it
                self.refresh(force=True)
            except Exception:
                logger.exception("memtree: adopting the last segment at close failed")
        if self.wrote and self._due_job(closing=True) == "segment":
            self._run("segment")

    def wait(self, timeout: float | None = None) -> None:
        """Wait for the background work running now (tests and benchmarks)."""
        worker = self._worker
        if worker is not None:
            worker.join(timeout)

    def index_facts(self) -> dict[str, Any]:
        """What the index and segments hold (for stats and benchmarks)."""
        facts: dict[str, Any] = dict(self.events)
        if self.index is not None:
            facts.update(self.index.footprint())
        segment = self.state.nodes.segment
        facts["segment_rows"] = segment.count if segment is not None else 0
        facts["materialized_nodes"] = self.state.nodes.materialized
        return facts


def ann_settings(config: MemTreeConfig) -> AnnSettings:
    """The vector index's approximate-search settings from a memory's config."""
    return AnnSettings(config.ann_min_nodes, config.ann_probe_share, config.ann_min_probes)


def checkpoint_policy(config: MemTreeConfig) -> CheckpointPolicy | None:
    """When segments are written, from a memory's config (``None``: never)."""
    if config.segment_min_nodes is None:
        return None
    return CheckpointPolicy(min_rows=config.segment_min_nodes, share=config.segment_share)


class ReadWriteLock:
    """Many readers or one writer. Writers wait for readers to leave and block new
    readers while waiting, so a steady stream of queries cannot starve an insert."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._readers = 0
        self._writer = False
        self._writers_waiting = 0

    @contextmanager
    def read(self) -> Iterator[None]:
        with self._cond:
            while self._writer or self._writers_waiting:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                if self._readers == 0:
                    self._cond.notify_all()

    @contextmanager
    def write(self) -> Iterator[None]:
        with self._cond:
            self._writers_waiting += 1
            while self._writer or self._readers:
                self._cond.wait()
            self._writers_waiting -= 1
            self._writer = True
        try:
            yield
        finally:
            with self._cond:
                self._writer = False
                self._cond.notify_all()
