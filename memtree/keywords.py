"""The keyword options of ``MemTree``'s writing entry points, written once for each
sync/async pair (``add``/``aadd``, ``add_many``/``aadd_many``,
``replace_source``/``areplace_source``, ``set_expiry``/``aset_expiry``) and checked:
an unknown one raises ``TypeError`` naming the ones allowed, as a misspelt keyword
of a plain function would. ``retrieve``'s options are
:class:`memtree.retrieval.RetrieveOptions`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

from memtree.config import Aggregation
from memtree.inputs import Item, TimeLike, TTLLike, expiry_of, make_item
from memtree.store.base import RecordChanges


class AddOptions(TypedDict, total=False):
    """``MemTree.add`` / ``aadd``."""

    metadata: Mapping[str, Any] | None
    """JSON metadata, filtered on by ``retrieve(where=...)``."""
    timestamp: TimeLike | None
    """When the remembered event happened (a datetime, date, POSIX seconds or ISO text)."""
    source_id: str | None
    """Your id for it (a message id, a document id): ``MemTree.find(source_id=...)``."""
    aggregation: Aggregation | None
    """When the summaries above it are written: ``"eager"`` (in the call),
    ``"deferred"`` (at :meth:`~memtree.MemTree.flush`) or ``"background"`` (by a worker
    thread); default ``config.aggregation``, and in a ``deferred()`` block its end."""
    ttl: TTLLike | None
    """Seconds (or a ``timedelta``) it is remembered; neither this nor ``expires_at``:
    ``config.default_ttl`` (``None``: for ever). An expired leaf is never returned."""
    expires_at: TimeLike | None
    """The moment it expires (instead of ``ttl``)."""


class AddManyOptions(TypedDict, total=False):
    """``MemTree.add_many`` / ``aadd_many``: one ``metadata``, ``timestamps`` and
    ``source_ids`` entry per text; the others as in :class:`AddOptions`, for all."""

    metadata: Sequence[Mapping[str, Any] | None] | None
    timestamps: Sequence[TimeLike | None] | None
    source_ids: Sequence[str | None] | None
    aggregation: Aggregation | None
    """``"eager"`` rewrites each item's path as it goes (the paper); ``"deferred"``
    commits every leaf, then rewrites each touched summary once; ``"background"``
    commits the leaves and a worker writes the summaries."""
    bulk: bool
    """Documents, not chat turns: group the batch by clustering instead of routing
    each text (new subtrees under the root, at most 8 children per summary, each
    summary written once, one transaction: :mod:`memtree.bulk`)."""
    ttl: TTLLike | None
    expires_at: TimeLike | None


class ReplaceOptions(TypedDict, total=False):
    """``MemTree.replace_source`` / ``areplace_source``; ``aggregation``, ``ttl`` and
    ``expires_at`` as in :class:`AddOptions` (kept leaves take the expiry too)."""

    metadata: Sequence[Mapping[str, Any] | None] | None
    """One per text."""
    timestamp: TimeLike | None
    records: RecordChanges | None
    """The caller's own records, committed in the same transaction: kind -> key ->
    dict (``None`` deletes it)."""
    aggregation: Aggregation | None
    ttl: TTLLike | None
    expires_at: TimeLike | None


class ExpiryOptions(TypedDict, total=False):
    """``MemTree.set_expiry`` / ``aset_expiry``: a ``ttl`` or an ``expires_at``."""

    ttl: TTLLike | None
    expires_at: TimeLike | None


class UpdateOptions(TypedDict, total=False):
    """``MemTree.update`` / ``aupdate``: the leaf's new ``metadata`` / ``timestamp``
    (left out or ``None``: kept)."""

    metadata: Mapping[str, Any] | None
    timestamp: TimeLike | None


def checked(options: Mapping[str, Any], names: Sequence[str], call: str) -> Mapping[str, Any]:
    """``options`` if each is one of ``names``; else ``TypeError`` naming them."""
    unknown = sorted(set(options) - set(names))
    if unknown:
        raise TypeError(f"{call}() got unknown option(s) {', '.join(unknown)}; it takes: {', '.join(names)}")
    return options


def expiry(options: Mapping[str, Any], default_ttl: TTLLike | None) -> float | None:
    """When what a call stores expires, from its ``ttl`` / ``expires_at`` options,
    else ``default_ttl`` (POSIX seconds; ``None``: never)."""
    return expiry_of(options.get("ttl"), options.get("expires_at"), default_ttl)


def add_item(text: str, options: Mapping[str, Any], default_ttl: TTLLike | None) -> tuple[Item, str | None]:
    """``add``'s text and options as a checked item and its aggregation mode."""
    given = checked(options, tuple(AddOptions.__annotations__), "add")
    expires = expiry(given, default_ttl)
    item = make_item(text, given.get("metadata"), given.get("timestamp"), given.get("source_id"), expires)
    return item, given.get("aggregation")


def many_items(texts: Sequence[str], options: Mapping[str, Any], default_ttl: TTLLike | None) -> tuple[Any, ...]:
    """``add_many``'s texts and options as the writer takes them: the item lists (texts,
    metadata, timestamps, source ids, expiry), the aggregation mode, ``bulk``."""
    given = checked(options, tuple(AddManyOptions.__annotations__), "add_many")
    lists = (texts, given.get("metadata"), given.get("timestamps"), given.get("source_ids"))
    return (*lists, expiry(given, default_ttl)), given.get("aggregation"), bool(given.get("bulk", False))


def source_options(options: Mapping[str, Any], default_ttl: TTLLike | None) -> dict[str, Any]:
    """``replace_source``'s options as :func:`memtree.source_leaves.replace_source` takes them."""
    given = checked(options, tuple(ReplaceOptions.__annotations__), "replace_source")
    kept = {name: given.get(name) for name in ("metadata", "timestamp", "records", "aggregation")}
    return {**kept, "expires_at": expiry(given, default_ttl)}


def new_expiry(options: Mapping[str, Any]) -> float | None:
    """``set_expiry``'s new expiry (neither option: never; the default TTL does not apply)."""
    return expiry(checked(options, tuple(ExpiryOptions.__annotations__), "set_expiry"), None)


def update_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """``update``'s options, checked, as :func:`memtree.update.update` takes them."""
    given = checked(options, tuple(UpdateOptions.__annotations__), "update")
    return {"metadata": given.get("metadata"), "timestamp": given.get("timestamp")}
