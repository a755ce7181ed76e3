"""Optimistic writes: call the models outside the store's lock, commit only if still true.

A write (insert, delete, flush, repair, import) is planned against the in-process
tree and its model calls (summaries, their embeddings) are made *before* the
store's writer lock is taken. The lock is then held only to catch up with other
writers and commit. Holding it through model calls would let one slow LLM call
stall every writer of the namespace (and, on SQLite, of the whole file) for as long
as the call and its retries take, until their lock waits time out.

A plan stays valid if nothing it read has changed in the meantime. Each plan names
its *footprint*: the nodes whose content it read (``reads``) and the nodes whose
list of children it relied on (``watched``, e.g. every node routing compared the
children of). At commit time the changes committed since the plan's base sequence
number are checked against it; on a conflict the plan is thrown away and made
again from the newer tree. Writes that touch different subtrees of one namespace
therefore commit without redoing anything.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from memtree.node import LeafVersion, Node
from memtree.state import TreeState
from memtree.store.base import NamespaceInfo

T = TypeVar("T")

OPTIMISTIC_ATTEMPTS = 3
"""Plans made outside the lock before a write plans under it (heavy contention)."""


@dataclass(frozen=True)
class Footprint:
    """What a plan depends on: node contents (``reads``) and children lists (``watched``).

    ``everything`` makes any change since the base a conflict (imports).
    """

    reads: frozenset[str] = frozenset()
    watched: frozenset[str] = frozenset()
    everything: bool = False


@dataclass
class PreparedWrite(Generic[T]):
    """A write with its model calls done, waiting to be committed.

    ``result`` is what the write returns once committed. ``info`` computes the
    namespace info to commit from the info current at commit time (``None``: keep
    it), so concurrent writers' settings are merged, not overwritten. ``recheck``
    may answer the write without committing anything, from the tree as caught up
    under the lock (an identical text stored meanwhile). ``rebase``, called under
    the lock when what the plan depends on did change, may re-apply the plan to the
    tree as caught up (setting ``upserts``) and return ``True`` to commit that
    instead of planning again (a flush rebases on inserts that came in meanwhile).
    ``committed`` and ``abandoned`` are called after a commit, or when the plan is
    thrown away.
    ``versions`` are leaf versions an update replaced, committed to the leaves' history.
    """

    result: T
    base: tuple[int, str | None]
    upserts: list[Node] = field(default_factory=list)
    deletions: list[str] = field(default_factory=list)
    footprint: Footprint = field(default_factory=Footprint)
    info: Callable[[NamespaceInfo], NamespaceInfo] | None = None
    recheck: Callable[[], T | None] | None = None
    rebase: Callable[[], bool] | None = None
    committed: Callable[[], None] | None = None
    abandoned: Callable[[], None] | None = None
    versions: list[LeafVersion] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        """Nothing to write (a duplicate, a flush with nothing pending)."""
        return not self.upserts and not self.deletions and self.info is None and not self.versions

    def abandon(self) -> None:
        if self.abandoned is not None:
            self.abandoned()


def neighbourhood(state: TreeState, node_ids: Iterable[str]) -> set[str]:
    """The nodes and their children: what reading a node's subtree list touches."""
    out: set[str] = set()
    for node_id in node_ids:
        out.add(node_id)
        node = state.nodes.get(node_id)
        if node is not None:
            out.update(node.children)
    return out


def footprint_of(state: TreeState, node_ids: Iterable[str], *, extra_reads: Iterable[str] = ()) -> Footprint:
    """The footprint of a plan that read ``node_ids`` with their children lists."""
    watched = set(node_ids)
    return Footprint(frozenset(neighbourhood(state, watched) | set(extra_reads)), frozenset(watched))


def still_valid(state: TreeState, prepared: PreparedWrite[T]) -> bool:
    """Whether nothing ``prepared`` depends on changed since its base (call under the lock,
    after catching up)."""
    seq, generation = prepared.base
    if generation != state.generation:
        return False
    if seq == state.seq:
        return True
    if prepared.footprint.everything:
        return False
    changes = state.changes_since(seq)
    if changes is None:  # older than what the journal remembers
        return False
    touched, parents = changes
    footprint = prepared.footprint
    return touched.isdisjoint(footprint.reads) and parents.isdisjoint(footprint.watched)
