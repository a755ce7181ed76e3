"""The write procedures: insert, flush, delete, repair and restore, as sans-IO steps.

Each procedure reads the replica under its shared lock, plans the change
(:mod:`memtree.routing`, :mod:`memtree.planning`), asks for the model calls it
needs (:mod:`memtree.summaries`) and returns a :class:`~memtree.optimistic.PreparedWrite`:
the nodes to commit, what the plan depends on, and what to do once committed.
None of them touches the store; :class:`~memtree.writer.Writer` commits.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from memtree import bulk, calibration
from memtree.config import MemTreeConfig
from memtree.deferral import PendingSummaries, flush_base, rebase_flush
from memtree.embed import Matrix, check_embeddings
from memtree.inputs import Item
from memtree.model_calls import ModelCalls, Steps, embed_steps, embed_with_parts
from memtree.node import ROOT_ID, LeafVersion, Node, Vector
from memtree.optimistic import Footprint, PreparedWrite, footprint_of
from memtree.planning import InsertPlan, plan_delete_many, plan_insert, rebuild_job, root_node
from memtree.replica import Replica
from memtree.routing import route
from memtree.state import TreeState
from memtree.store.base import NamespaceInfo
from memtree.summaries import SummaryWriter

logger = logging.getLogger(__name__)


class Procedures:
    """The write procedures of one memory: its replica, models, config and the
    summaries its deferred inserts left to flush."""

    def __init__(self, replica: Replica, calls: ModelCalls, config: MemTreeConfig, pending: PendingSummaries) -> None:
        self.replica = replica
        self.calls = calls
        self.config = config
        self.pending = pending
        self.summaries = SummaryWriter(config, calls, self.embed)

    @property
    def state(self) -> TreeState:
        return self.replica.state

    def embed(self, texts: list[str], *, query: bool = False) -> Steps[Matrix]:
        """Embed texts in chunks, counting calls and checking every vector."""
        return embed_steps(texts, self.check_vectors, self.state.info.dimension, query=query)

    def embed_new_text(self, text: str) -> Steps[Vector]:
        """The vector of a text about to be inserted, in one embedding call with the
        sentences the aggregator will need to fold it into summaries
        (``Aggregator.sentences_to_embed``), which it is then given."""
        aggregator = self.calls.aggregator
        sentences = aggregator.sentences_to_embed(text)
        if not sentences:
            vectors = yield from self.embed([text])
            aggregator.learn_vectors([text], vectors)
            return vectors[0]
        vector, sentence_vectors = yield from embed_with_parts(text, sentences, self.check_vectors)
        aggregator.learn_vectors([text, *sentences], np.concatenate([vector, sentence_vectors]))
        return vector[0]

    def check_vectors(self, vectors: Any, count: int) -> Matrix:
        return check_embeddings(vectors, count, self.state.info.dimension, type(self.calls.embedder).__name__)

    def theta0(self) -> float:
        return calibration.effective_theta0(self.config, self.state.info.settings)

    def insert(
        self, item: Item, embedding: Vector, restore: Node | None = None, *, defer: bool = False
    ) -> Steps[PreparedWrite[str]]:
        """Route and plan one leaf and write the summaries on its path (or, with
        ``defer``, mark them stale for a flush). A ``restore`` leaf (from a backup)
        keeps its id and times."""
        state = self.state
        dimension = int(embedding.shape[0])
        check_dimension(dimension, state.info.dimension)
        deduplicate = self.config.deduplicate and restore is None
        with self.replica.lock.read():
            base = (state.seq, state.generation)
            existing = state.duplicate_of(item.text, item.metadata, item.source_id) if deduplicate else None
        if existing is not None:
            return PreparedWrite(existing, base)
        now = time.time()
        sample = self._calibration_sample(embedding)
        with self.replica.lock.read():
            base = (state.seq, state.generation)
            path = route(state, self.scorer(embedding), self.theta0(), self.config)
            plan = plan_insert(
                state,
                path,
                text=item.text,
                embedding=embedding,
                metadata=item.metadata,
                timestamp=item.timestamp,
                source_id=item.source_id,
                now=now,
                expires_at=item.expires_at,
            )
            upserts = [] if state.root is not None else [root_node(now)]
            if restore is not None:  # a leaf coming back from a backup keeps who it is
                plan.leaf.id, plan.leaf.created_at, plan.leaf.updated_at = (
                    restore.id,
                    restore.created_at,
                    restore.updated_at,
                )
            footprint = insert_footprint(state, plan)
            pending = self.pending.describe_insert(plan, state) if defer else []
            children = {node_id: state.children_of(node_id) for node_id in path.path}
        if defer:
            self.summaries.defer(plan.summaries.values(), plan.fallback_texts())
        else:
            yield from self.summaries.write_path(plan, children)

        def committed() -> None:
            self.pending.record(pending)
            self.calls.counters.add("inserts")

        return PreparedWrite(
            plan.leaf.id,
            base,
            [*upserts, *plan.nodes()],
            [],
            footprint,
            info=lambda current: self._info_after_insert(current, dimension, sample),
            recheck=(lambda: state.duplicate_of(item.text, item.metadata, item.source_id)) if deduplicate else None,
            committed=committed,
        )

    def insert_bulk(self, items: list[Item], vectors: Matrix) -> Steps[PreparedWrite[list[str]]]:
        """Store a batch as new subtrees under the root, grouped by clustering
        (:mod:`memtree.bulk`), each summary written once from its children, deepest
        level first, and embedded once. All of it commits in one transaction."""
        state = self.state
        for vector in vectors:
            check_dimension(int(vector.shape[0]), state.info.dimension)
        with self.replica.lock.read():
            base = (state.seq, state.generation)
            has_root = state.nodes.get(ROOT_ID) is not None
        now = time.time()
        grouping = bulk.group(vectors, max_levels=self.config.depth_cap - 1)
        plan = bulk.plan_bulk(items, vectors, grouping, now=now, depth_cap=self.config.depth_cap)
        yield from self.summaries.write_bulk(plan)
        samples = _batch_samples(vectors, self.config, state.info.settings)
        dimension = int(vectors.shape[1])

        def info(current: NamespaceInfo) -> NamespaceInfo:
            for sample in samples:
                current = self._info_after_insert(current, dimension, sample)
            return current if samples else self._info_after_insert(current, dimension, None)

        def committed() -> None:
            self.calls.counters.add("inserts", len(items))
            self.calls.counters.add("bulk_builds")

        return PreparedWrite(
            [leaf.id for leaf in plan.leaves],
            base,
            [*([] if has_root else [root_node(now)]), *plan.nodes()],
            [],
            Footprint(everything=True),
            info=info,
            committed=committed,
        )

    def scorer(self, embedding: Vector) -> Callable[[str, Sequence[str]], Any]:
        """Routing's scores of a node's children against ``embedding``."""
        index = self.replica.index
        if index is None:
            return lambda parent, ids: np.zeros(len(ids), dtype=np.float32)
        return lambda parent, ids: index.score_children(embedding, parent, ids)

    def _calibration_sample(self, embedding: Vector) -> float | None:
        """How similar a new text is to its nearest stored leaf, while θ0 is calibrating."""
        if not calibration.needs_sample(self.config, self.state.info.settings):
            return None
        with self.replica.lock.read():
            index = self.replica.index
            if index is None:
                return None
            nearest = index.search(embedding, 1, index.mask(leaves_only=True))
        return nearest[0][1] if nearest else None

    def _info_after_insert(self, info: NamespaceInfo, dimension: int, sample: float | None) -> NamespaceInfo:
        """Namespace info after an insert (from the info current at commit): dimension,
        model name, calibration."""
        check_dimension(dimension, info.dimension)
        settings = dict(info.settings)
        if sample is not None and calibration.needs_sample(self.config, settings):
            settings = calibration.with_sample(self.config, settings, sample)
        name = self.calls.embedder.name
        if info.embedder is not None and info.embedder != name:
            logger.warning(
                "namespace %r was built with %s but this memory uses %s", self.replica.namespace, info.embedder, name
            )
        return NamespaceInfo(dimension=dimension, embedder=info.embedder or name, settings=settings)

    def flush(self) -> Steps[PreparedWrite[int]]:
        """Rewrite the deferred summaries: merges all at once, then rebuilds deepest first."""
        state = self.state
        with self.replica.lock.read():
            base = (state.seq, state.generation)
            plan = self.pending.take(state)
            nodes = {node_id: state.nodes[node_id].copy() for node_id in [*plan.merges, *plan.rebuilds]}
            footprint = footprint_of(state, nodes)
            children = {node_id: state.children_of(node_id) for node_id in plan.rebuilds}
            written_from = flush_base(state, nodes, (kid for kids in children.values() for kid in kids))
        if not nodes:
            return PreparedWrite(0, base)
        try:
            written = yield from self.summaries.merge_then_rebuild(plan, nodes, children)
            yield from self.summaries.embed_summaries(written, nodes.values())
        except BaseException:
            self.pending.restore(plan)  # nothing was written: the next flush tries them all again
            raise

        grown_bases: dict[str, tuple[str, int]] = {}

        def committed() -> None:
            with self.replica.lock.read():
                self.pending.put_back((node_id for node_id, node in nodes.items() if node.stale), state)
            self.pending.rebase(grown_bases)
            self.calls.counters.add("flushes")

        prepared = PreparedWrite(
            sum(1 for node in nodes.values() if not node.stale),
            base,
            list(nodes.values()),
            [],
            footprint,
            committed=committed,
            abandoned=lambda: self.pending.restore(plan),
        )

        def rebase() -> bool:  # under the lock, caught up: inserts came in while the models ran
            if state.generation != base[1]:
                return False
            rebased = rebase_flush(state, nodes.values(), written_from, self.pending.arrivals())
            if rebased is None:
                return False
            prepared.upserts, bases = rebased
            grown_bases.update(bases)
            self.calls.counters.add("flush_rebases")
            return True

        prepared.rebase = rebase
        return prepared

    def delete(self, node_ids: list[str], *, defer: bool = False) -> Steps[PreparedWrite[None]]:
        """Remove leaves; every ancestor is rebuilt from what remains (with ``defer``,
        marked stale with its children's texts and left in the ledger for a flush)."""
        state = self.state
        with self.replica.lock.read():
            for node_id in node_ids:
                node = state.nodes.get(node_id)
                if node is None:
                    raise KeyError(f"no node with id {node_id!r} in namespace {self.replica.namespace!r}")
                if not node.is_leaf:
                    raise ValueError(f"node {node_id!r} is a summary, not a leaf; delete the leaves below it instead")
            base = (state.seq, state.generation)
            plan = plan_delete_many(state, node_ids, time.time())
            above = {ancestor.id for node_id in node_ids for ancestor in state.path_to_root(node_id)}
            parents = {state.nodes[node_id].parent or ROOT_ID for node_id in node_ids}
            footprint = footprint_of(state, above | parents, extra_reads=plan.moved)
        if defer:
            self.summaries.defer_ancestors(plan)
        else:
            yield from self.summaries.rewrite_ancestors(plan)

        def committed() -> None:
            self.pending.mark_rebuild(node.id for node in plan.ancestors)
            if defer:
                with self.replica.lock.read():
                    self.pending.put_back((node.id for node in plan.ancestors), self.replica.state)
            self.calls.counters.add("deletes", len(node_ids))

        return PreparedWrite(None, base, plan.nodes(), plan.deleted, footprint, committed=committed)

    def sweep(self, *, defer: bool = False) -> Steps[PreparedWrite[int]]:
        """Delete the leaves whose expiry has passed, as :meth:`delete` would (every
        ancestor rebuilt from what remains, or with ``defer`` given a stand-in for the
        background worker); counted as ``expired`` in ``stats()``."""
        with self.replica.lock.read():
            base = (self.state.seq, self.state.generation)
            expired = self.state.expired(time.time())
        if not expired:
            return PreparedWrite(0, base)
        prepared = yield from self.delete(expired, defer=defer)
        deleted = prepared.committed

        def committed() -> None:
            if deleted is not None:
                deleted()
            self.calls.counters.add("expired", len(expired))

        return PreparedWrite(
            len(expired), prepared.base, prepared.upserts, prepared.deletions, prepared.footprint, committed=committed
        )

    def set_expiry(self, leaf_ids: list[str], expires_at: float | None) -> Steps[PreparedWrite[int]]:
        """Give leaves a new expiry (``None``: never); nothing else about them changes,
        no summary is rewritten. An unknown or already expired leaf raises ``KeyError``."""
        state = self.state
        now = time.time()
        with self.replica.lock.read():
            base = (state.seq, state.generation)
            changed = []
            for leaf_id in leaf_ids:
                node = state.nodes.get(leaf_id)
                if node is None or not node.is_leaf or (node.expires_at is not None and node.expires_at <= now):
                    raise KeyError(f"no leaf with id {leaf_id!r} in namespace {self.replica.namespace!r}")
                if node.expires_at != expires_at:
                    copy = node.copy()
                    copy.expires_at = expires_at
                    changed.append(copy)
            footprint = footprint_of(state, {node.id: node for node in changed})
        yield from ()
        return PreparedWrite(len(leaf_ids), base, changed, [], footprint)

    def repair(self, also: Iterable[str] = ()) -> Steps[PreparedWrite[int]]:
        """Rebuild every stale summary, and the summaries ``also`` names (ones that
        still quote a removed text), from its children, deepest first; one whose
        child could not be rebuilt waits for the next repair."""
        state = self.state
        extra = set(also)
        with self.replica.lock.read():
            base = (state.seq, state.generation)
            stale = [node.copy() for node in state.nodes.values() if node.stale or node.id in extra]
            children = {node.id: state.children_of(node.id) for node in stale}
            footprint = footprint_of(state, children)
        if not stale:
            return PreparedWrite(0, base)
        fixed: dict[str, Node] = {}
        for depth in sorted({node.depth for node in stale}, reverse=True):
            level = {node.id: node for node in stale if node.depth == depth}
            jobs = []
            for node in level.values():
                kids = [fixed.get(child.id, child) for child in children[node.id]]
                if not any(kid.stale for kid in kids):
                    jobs.append(rebuild_job(node, [kid.text for kid in kids]))
            yield from self.summaries.write(jobs, {job.node_id: level[job.node_id] for job in jobs})
            fixed.update(level)
        changed = [node for node in fixed.values() if not node.stale]
        return PreparedWrite(len(changed), base, changed, [], footprint)

    def restore(
        self, nodes: list[Node], info: NamespaceInfo, versions: Sequence[LeafVersion] = ()
    ) -> Steps[PreparedWrite[None]]:
        """Write a whole checked tree (a backup) into this namespace, which must be empty."""
        leaves = self.state.leaf_total
        namespace = self.replica.namespace
        kinds = self.replica.store.record_kinds(namespace)
        if leaves or kinds:
            held = f"{leaves} leaves" + (f" and records ({', '.join(kinds)})" if kinds else "")
            raise ValueError(
                f"namespace {namespace!r} is not empty ({held}); import into a new namespace "
                "or delete this one first (delete_namespace())"
            )
        base = (self.state.seq, self.state.generation)
        yield from ()
        return PreparedWrite(
            None, base, nodes, [], Footprint(everything=True), info=lambda _current: info, versions=list(versions)
        )


def insert_footprint(state: TreeState, plan: InsertPlan) -> Footprint:
    """What an insert's plan depends on: the summaries it rewrites (their texts,
    counts and places), the leaf it splits, the children a stale summary is rebuilt
    from, and the root if it creates it. Siblings it only compared on the way down
    are not included: had one changed meanwhile, the text would still land in a
    sound place, and every concurrent insert rewrites the top of its own path, so
    counting those would make every pair of inserts conflict."""
    reads = set(plan.route.path)
    reads.update(node_id for node_id in (plan.route.parent, plan.route.split) if node_id is not None)
    for node_id in plan.route.path:
        if state.nodes[node_id].stale:
            reads.update(state.nodes[node_id].children)
    return Footprint(frozenset(reads))  # the parent may be the root: only its creation writes it


def _batch_samples(vectors: Matrix, config: MemTreeConfig, settings: dict[str, Any]) -> list[float]:
    """While θ0 calibrates: how similar each of a batch's first texts is to its
    nearest earlier one in the batch (as one-by-one inserts would have measured)."""
    if not calibration.needs_sample(config, settings):
        return []
    wanted = config.calibration_samples - len(settings.get(calibration.SAMPLES_KEY, []))
    head = vectors[: wanted + 1]
    similarities = head @ head.T
    return [float(similarities[number, :number].max()) for number in range(1, len(head))]


def check_dimension(dimension: int, stored: int | None) -> None:
    if stored is not None and dimension != stored:
        raise ValueError(
            f"embedding dimension {dimension} does not match this memory's {stored}; "
            "use the embedder this memory was built with"
        )
