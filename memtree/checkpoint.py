"""Where a namespace's segments live, which one a reopen maps, and when a new one is due.

A store that keeps files (SQLite: a folder beside the database file; PostgreSQL: the
``index_dir`` it was given) has one folder per namespace (:meth:`Store.index_folder
<memtree.store.base.Store.index_folder>`). In it:

* ``seg-<seq>-<random>/``: complete segments (:mod:`memtree.segment`);
* ``tmp-<random>/``: a segment being written, or left by a writer that died;
* ``lock``: held (``flock``, released by the kernel when its process dies) by the
  one process writing a segment, so two processes never write at once and the
  holder may delete what no other writer is using.

Rules (docs/storage-and-failure-semantics.md):

* a reopen maps the newest segment whose generation is the store's and whose
  sequence number is not ahead of it, then reads only the rows committed after it;
  any other segment, or one that fails its checks, is ignored (the rows are read
  instead, the last resort);
* a process writes a new segment in the background once the nodes changed since
  its segment pass ``share`` of it (or, without one, once the tree reaches
  ``min_rows``), and adopts it when it is safe (:mod:`memtree.replica`);
* the writer removes older segments and temporary folders once the new one is in
  place. A process that still maps a removed segment keeps reading it (the kernel
  keeps the files until the last map goes) and moves to the newer one on its next
  adoption;
* ``compact()`` leaves no segment holding a deleted text: it writes one of the
  current tree at once and removes the rest (:meth:`Replica.purge_segments
  <memtree.replica.Replica.purge_segments>`), waiting for the lock, and removes
  other namespaces' segments of an older generation (:func:`remove_outdated`); a
  background writer whose tree is of a generation the store no longer has writes
  nothing.
"""

from __future__ import annotations

import fcntl
import logging
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from memtree.segment import SEGMENT_PREFIX, TEMPORARY_PREFIX, Segment, SegmentError
from memtree.store.base import NamespaceKey

logger = logging.getLogger(__name__)

LOCK_FILE = "lock"


@dataclass(frozen=True)
class CheckpointPolicy:
    """When a new segment is written: from ``min_rows`` nodes, whenever the rows
    changed since the last one pass ``share`` of it."""

    min_rows: int = 20_000
    share: float = 0.1
    close_share: float = 0.01
    """At ``close()``, a process that wrote writes a segment if this share changed
    (so the next reopen reads few rows)."""
    reopen_share: float = 0.002
    """A reopen that had to read more than this share of the segment's rows from the
    store writes a new segment in the background (so the next one reads fewer)."""

    def due(self, rows: int, changed: int, segment_rows: int | None, *, closing: bool = False) -> bool:
        if rows < self.min_rows:
            return False
        if segment_rows is None:
            return True
        return changed > (self.close_share if closing else self.share) * max(segment_rows, 1)


class SegmentFolder:
    """One namespace's folder of segments."""

    def __init__(self, path: Path, writable: bool, namespace: NamespaceKey, identity: str = "") -> None:
        self.path = path
        self.writable = writable
        self.namespace = namespace
        self.identity = identity

    def candidates(self) -> list[tuple[int, Path]]:
        """(seq, folder) of the complete segments, newest first."""
        try:
            entries = list(self.path.iterdir())
        except OSError:
            return []
        found = []
        for entry in entries:
            name = entry.name
            if not name.startswith(SEGMENT_PREFIX):
                continue
            try:
                seq = int(name[len(SEGMENT_PREFIX) :].split("-", 1)[0])
            except ValueError:
                continue
            found.append((seq, entry))
        found.sort(key=lambda pair: (pair[0], pair[1].name), reverse=True)
        return found

    def newest(self, generation: str, head_seq: int) -> Segment | None:
        """The newest usable segment for the store's ``generation`` at ``head_seq``."""
        for seq, path in self.candidates():
            if seq > head_seq:
                continue
            try:
                segment = Segment.open(path, namespace=self.namespace)
            except SegmentError as error:
                logger.warning("ignoring segment %s: %s", path, error)
                continue
            except OSError:  # removed while being opened: try the next
                continue
            if segment.generation == generation and segment.seq <= head_seq and segment.identity == self.identity:
                return segment
        return None

    def newer_than(self, seq: int) -> bool:
        """Whether a segment newer than ``seq`` has appeared (cheap: one listing)."""
        candidates = self.candidates()
        return bool(candidates) and candidates[0][0] > seq

    def entries(self) -> list[Path]:
        """The segments and temporary folders in the folder (what :meth:`clean` removes)."""
        try:
            return sorted(
                entry
                for entry in self.path.iterdir()
                if entry.is_dir() and entry.name.startswith((SEGMENT_PREFIX, TEMPORARY_PREFIX))
            )
        except OSError:
            return []

    @contextmanager
    def writing(self, *, wait: bool = False) -> Iterator[bool]:
        """Hold the folder's writer lock if no other process does (``wait``: once the
        one that does lets go): yields whether it is held (a process that does not get
        it writes nothing)."""
        if not self.writable:
            yield False
            return
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            handle = open(self.path / LOCK_FILE, "a+b")  # noqa: SIM115 - held for the block
        except OSError:
            yield False
            return
        try:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                yield False
                return
            yield True
        finally:
            handle.close()

    def clean(self, keep: Path) -> None:
        """Remove every segment but ``keep`` and every temporary folder (call holding
        :meth:`writing`: no other writer is mid-write then)."""
        for entry in list(self.path.iterdir()):
            if entry == keep or not entry.is_dir():
                continue
            if entry.name.startswith((SEGMENT_PREFIX, TEMPORARY_PREFIX)):
                shutil.rmtree(entry, ignore_errors=True)


def segment_bytes(path: Path) -> int:
    """Bytes a segment folder holds on disk."""
    return sum(entry.stat().st_size for entry in path.iterdir()) if path.exists() else 0


def remove_outdated(root: Path, head: Callable[[NamespaceKey], tuple[int, str]], identity: str, skip: Path) -> None:
    """In every namespace's folder under ``root`` but ``skip``, remove the segments no
    reopen can use any more: of a generation that is not their namespace's now (it was
    compacted, so they may hold deleted texts, or deleted), of another database, or
    that cannot be opened; and temporary folders. Each folder under its writer lock
    (waiting for a writer there to finish). A segment of the current generation stays:
    it is replaced by the next one a process of that namespace writes."""
    try:
        folders = [entry for entry in root.iterdir() if entry.is_dir() and entry != skip]
    except OSError:
        return
    for path in folders:
        with SegmentFolder(path, True, ()).writing(wait=True) as held:
            if not held:
                continue
            for entry in SegmentFolder(path, True, ()).entries():
                if entry.name.startswith(SEGMENT_PREFIX):
                    try:
                        segment = Segment.open(entry)
                        fits = segment.identity == identity and head(tuple(segment.manifest["namespace"]))[1] == (
                            segment.generation
                        )
                    except (SegmentError, OSError, KeyError, TypeError):
                        fits = False
                    if fits:
                        continue
                shutil.rmtree(entry, ignore_errors=True)
