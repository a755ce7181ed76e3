"""``MemTree.replace_source``: the leaves of one source replaced as a whole, in one transaction.

An adapter often keeps a record (a LangGraph item, a document) whose texts are
leaves of the tree under the record's key as ``source_id``. Writing the record and
then changing the leaves one by one leaves them apart if the process dies in
between: the record says one thing, the tree another, and nothing notices.
``replace_source`` instead plans every change of the source's leaves (deletes,
corrections in place, inserts) under the store's writer lock, each on the tree the
previous one left, and commits them with the caller's records in ONE transaction
(:meth:`~memtree.writer.Writer.write_together`).

With them it commits the source's *manifest*: a record of kind :data:`SOURCES`
listing the texts (and metadata, and event time) the source's leaves must hold.
:func:`source_problems` compares manifests with the tree (``check_integrity``,
``memtree check``) and :func:`reconcile` makes the leaves match them again
(``repair``), should they ever differ (leaves changed by hand with ``delete``).

Which leaf a text goes to: a leaf holding the same text and metadata is kept as
it is; a leaf with the same metadata but another text is corrected in place
(``MemTree.update``: same id, the earlier text kept in its history); leaves left
over are deleted; texts left over are inserted.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from memtree.inputs import Item, TimeLike, make_item, to_timestamp
from memtree.integrity import integrity_problems
from memtree.node import JSONDict, Node, Vector
from memtree.redaction import removed_text_problems
from memtree.state import TreeState
from memtree.store.base import RecordChanges
from memtree.update import _Change as Change
from memtree.update import update_steps
from memtree.writer import Staging, Writer

SOURCES = "memtree_sources"
"""Record kind of the manifests (key: the source id)."""


@dataclass
class _Replacement:
    """A checked ``replace_source`` call, ready to embed and commit."""

    source_id: str
    items: list[Item]
    changes: dict[str, Mapping[str, JSONDict | None]]
    mode: str
    expires_at: float | None


def _prepare(
    writer: Writer,
    source_id: str,
    texts: Sequence[str],
    metadata: Sequence[Mapping[str, Any] | None] | None,
    timestamp: TimeLike | None,
    records: RecordChanges | None,
    aggregation: str | None,
    expires_at: float | None,
) -> _Replacement:
    items = _items(source_id, texts, metadata, timestamp, expires_at)
    if records is not None and not isinstance(records, Mapping):
        raise TypeError(f"records must be a dict of kind -> key -> dict (or None), got {type(records).__name__}")
    if records and SOURCES in records:
        raise ValueError(f"record kind {SOURCES!r} is memtree's own (the sources' manifests); use another kind")
    mode = writer.aggregation_mode(aggregation)
    changes: dict[str, Mapping[str, JSONDict | None]] = dict(records or {})
    changes[SOURCES] = {source_id: manifest(items, to_timestamp(timestamp), expires_at)}
    return _Replacement(source_id, items, changes, mode, expires_at)


def _commit(writer: Writer, replacement: _Replacement, vectors: dict[str, Vector]) -> list[str]:
    plan = functools.partial(
        _replace,
        writer,
        source_id=replacement.source_id,
        items=replacement.items,
        vectors=vectors,
        mode=replacement.mode,
        expires_at=replacement.expires_at,
    )
    ids = writer.write_together(plan, replacement.changes)
    if replacement.mode == "background":
        writer.background.notify()
    return ids


def replace_source(
    writer: Writer,
    source_id: str,
    texts: Sequence[str],
    *,
    metadata: Sequence[Mapping[str, Any] | None] | None,
    timestamp: TimeLike | None,
    records: RecordChanges | None,
    aggregation: str | None,
    expires_at: float | None = None,
) -> list[str]:
    """``MemTree.replace_source`` (see there); ``expires_at``: when every leaf of the
    source expires (POSIX seconds, checked; ``None``: never)."""
    replacement = _prepare(writer, source_id, texts, metadata, timestamp, records, aggregation, expires_at)
    fresh = _unheld_texts(writer, source_id, replacement.items)
    vectors = dict(zip(fresh, writer.calls.drive(writer.procedures.embed(fresh)), strict=True)) if fresh else {}
    return _commit(writer, replacement, vectors)


async def areplace_source(
    writer: Writer,
    source_id: str,
    texts: Sequence[str],
    *,
    metadata: Sequence[Mapping[str, Any] | None] | None,
    timestamp: TimeLike | None,
    records: RecordChanges | None,
    aggregation: str | None,
    expires_at: float | None = None,
) -> list[str]:
    """Async :func:`replace_source`: the new texts are embedded on the event loop (an
    async-only embedder serves it); the transaction runs in a worker thread."""
    replacement = _prepare(writer, source_id, texts, metadata, timestamp, records, aggregation, expires_at)
    fresh = await asyncio.to_thread(_unheld_texts, writer, source_id, replacement.items)
    vectors = {}
    if fresh:
        vectors = dict(zip(fresh, await writer.calls.adrive(writer.procedures.embed(fresh)), strict=True))
    return await asyncio.to_thread(_commit, writer, replacement, vectors)


def _items(
    source_id: str,
    texts: Sequence[str],
    metadata: Sequence[Mapping[str, Any] | None] | None,
    timestamp: TimeLike | None,
    expires_at: float | None,
) -> list[Item]:
    if not isinstance(source_id, str) or not source_id:
        raise TypeError(f"source_id must be a non-empty str, got {source_id!r}")
    if isinstance(texts, str) or not isinstance(texts, Sequence):
        raise TypeError("texts must be a list of str (for one text, pass [text])")
    if metadata is not None and len(metadata) != len(texts):
        raise ValueError(f"metadata has {len(metadata)} entries for {len(texts)} texts")
    return [
        make_item(text, metadata[i] if metadata is not None else None, timestamp, source_id, expires_at)
        for i, text in enumerate(texts)
    ]


def manifest(items: Sequence[Item], timestamp: float | None, expires_at: float | None) -> JSONDict | None:
    """The manifest of a source holding ``items`` (``None``: no leaves, no manifest)."""
    if not items:
        return None
    leaves = [{"text": item.text, "metadata": item.metadata} for item in items]
    return {"leaves": leaves, "timestamp": timestamp, "expires_at": expires_at}


def _unheld_texts(writer: Writer, source_id: str, items: list[Item]) -> list[str]:
    """The texts the source's leaves do not hold yet (as this process sees the tree
    now): embedded before the writer lock is taken."""
    replica = writer.replica
    replica.maybe_refresh()
    with replica.lock.read():
        held = {replica.state.nodes[leaf_id].text for leaf_id in replica.state.leaves_by_source.get(source_id, [])}
    return list(dict.fromkeys(item.text for item in items if item.text not in held))


def _replace(
    writer: Writer,
    staging: Staging,
    *,
    source_id: str,
    items: list[Item],
    vectors: dict[str, Vector],
    mode: str,
    expires_at: float | None,
) -> list[str]:
    """Under the lock, caught up: stage the deletes, corrections, inserts and expiries."""
    replica = writer.replica
    now = time.time()
    with replica.lock.read():
        leaves = [replica.state.nodes[leaf_id] for leaf_id in replica.state.leaves_by_source.get(source_id, [])]
        unused = [(leaf.id, leaf.text, dict(leaf.metadata)) for leaf in leaves]
        expired = {leaf.id for leaf in leaves if leaf.expires_at is not None and leaf.expires_at <= now}
    chosen: dict[int, str] = {}
    for i, item in enumerate(items):  # kept as they are (an expired leaf is gone: never kept)
        match = next((e for e in unused if e[1] == item.text and e[2] == item.metadata and e[0] not in expired), None)
        if match is not None:
            chosen[i] = match[0]
            unused.remove(match)
    corrections: dict[int, str] = {}
    for i, item in enumerate(items):  # same place (metadata), new text: corrected in place
        if i in chosen:
            continue
        match = next((entry for entry in unused if entry[2] == item.metadata and entry[0] not in expired), None)
        if match is not None:
            corrections[i] = match[0]
            unused.remove(match)
    defer = mode != "eager"

    def vector(item: Item) -> Vector:
        found = vectors.get(item.text)
        if found is None:  # another writer changed the source meanwhile: embed it now
            found = vectors[item.text] = writer.calls.drive(writer.procedures.embed([item.text]))[0]
        return found

    if unused:
        staging.run(writer.procedures.delete([entry[0] for entry in unused], defer=defer))
    for i, leaf_id in corrections.items():
        item = items[i]
        change = Change(leaf_id, item.text, item.metadata, item.timestamp)
        chosen[i] = staging.run(update_steps(writer, change, vector(item), defer=defer))
    renewed = [chosen[i] for i in chosen]  # kept and corrected leaves take the source's expiry
    for i, item in enumerate(items):
        if i not in chosen:
            chosen[i] = staging.run(writer.procedures.insert(item, vector(item), defer=defer))
    if renewed:
        staging.run(writer.procedures.set_expiry(renewed, expires_at))
    return [chosen[i] for i in range(len(items))]


# -- manifests: the check and the repair ------------------------------------------------


def manifest_items(source_id: str, value: JSONDict) -> list[Item]:
    """The items a stored manifest lists (``ValueError`` for one that is not a manifest)."""
    leaves = value.get("leaves")
    if not isinstance(leaves, list):
        raise ValueError(f"manifest of source {source_id!r} has no list of leaves")
    timestamp, expires_at = value.get("timestamp"), value.get("expires_at")
    return [make_item(entry["text"], entry.get("metadata"), timestamp, source_id, expires_at) for entry in leaves]


def _live(manifests: Mapping[str, JSONDict], now: float) -> dict[str, JSONDict]:
    """The manifests of sources that have not expired (an expired source's leaves go
    with a sweep, on their own schedule: nothing to compare)."""
    return {
        source_id: value
        for source_id, value in manifests.items()
        if not isinstance(value.get("expires_at"), (int, float)) or value["expires_at"] > now
    }


def source_problems(state: TreeState, manifests: Mapping[str, JSONDict]) -> list[str]:
    """Every source whose leaves differ from its manifest, described."""
    problems: list[str] = []
    for source_id, value in _live(manifests, time.time()).items():
        try:
            wanted = _contents(manifest_items(source_id, value))
        except (ValueError, TypeError, KeyError) as error:
            problems.append(f"source {source_id!r}: unreadable manifest ({error})")
            continue
        held = _contents(_leaf_items(state, source_id))
        if wanted != held:
            missing = len([text for text in wanted if text not in held])
            extra = len([text for text in held if text not in wanted])
            problems.append(
                f"source {source_id!r}: its record lists {len(wanted)} leaves, the tree holds {len(held)} "
                f"({missing} missing, {extra} not listed); repair() rewrites them from the record"
            )
    # Leaves of a source without a manifest may be anyone's (messages, documents): not checked.
    return problems


def diverged(state: TreeState, manifests: Mapping[str, JSONDict]) -> list[str]:
    """Ids of the sources whose leaves differ from their (readable) manifests."""
    out = []
    for source_id, value in _live(manifests, time.time()).items():
        try:
            wanted = _contents(manifest_items(source_id, value))
        except (ValueError, TypeError, KeyError):
            continue
        if wanted != _contents(_leaf_items(state, source_id)):
            out.append(source_id)
    return out


def manifests_of(writer: Writer) -> dict[str, Any]:
    """The namespace's manifests: source id -> what :func:`replace_source` last wrote."""
    return writer.replica.store.get_records(writer.replica.namespace, SOURCES)


def problems(writer: Writer, depth_cap: int) -> list[str]:
    """``MemTree.check_integrity``: every broken invariant of the tree and its index,
    every summary that still quotes a removed text (:mod:`memtree.redaction`), then
    every source whose leaves differ from its manifest, described."""
    manifests = manifests_of(writer)
    versions = writer.replica.store.read_history(writer.replica.namespace)

    def found(state: TreeState) -> list[str]:
        broken = integrity_problems(state, writer.replica.index, depth_cap)
        broken += removed_text_problems(state, versions, time.time())
        return broken + source_problems(state, manifests)

    return writer.replica.read(found)


def reconcile(writer: Writer) -> int:
    """Make every diverged source's leaves match its manifest; return how many were."""
    manifests = manifests_of(writer)
    replica = writer.replica
    replica.maybe_refresh()
    with replica.lock.read():
        sources = diverged(replica.state, manifests)
    for source_id in sources:
        items = manifest_items(source_id, manifests[source_id])
        replace_source(
            writer,
            source_id,
            [item.text for item in items],
            metadata=[item.metadata for item in items],
            timestamp=manifests[source_id].get("timestamp"),
            records=None,
            aggregation=None,
            expires_at=items[0].expires_at if items else None,
        )
    return len(sources)


def _leaf_items(state: TreeState, source_id: str) -> list[Item]:
    """The source's leaves that have not expired."""
    now = time.time()
    nodes: list[Node] = [
        node
        for node in (state.nodes[leaf_id] for leaf_id in state.leaves_by_source.get(source_id, []))
        if node.expires_at is None or node.expires_at > now
    ]
    return [Item(node.text, dict(node.metadata), node.timestamp, source_id) for node in nodes]


def _contents(items: Sequence[Item]) -> list[tuple[str, str]]:
    """Texts with their metadata, as a sorted list (a multiset) to compare."""
    return sorted((item.text, json.dumps(item.metadata, sort_keys=True)) for item in items)
