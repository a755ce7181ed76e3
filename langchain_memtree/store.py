"""``MemTreeStore``: a LangGraph long-term store whose semantic search is MemTree retrieval.

Each LangGraph namespace (``("memories", "alice")``) is one memtree namespace under
the store's ``prefix`` (``("store", "memories", "alice")``), holding two things:

* the items, exactly as put: JSON records (value, created and updated times),
  which ``get``, filtered listing and ``list_namespaces`` read;
* a memory tree in which every indexed text of an item (the fields named by the
  ``index`` configuration, as in LangGraph) is a leaf whose ``source_id`` is the
  item's key. ``search(query=...)`` retrieves leaves and maps them back to items,
  scoring each item by its best leaf.

The records are the truth and the tree is the index: a put writes the record
first, then adds or removes only the leaves whose text changed.

Operations in a batch run in order. Puts and deletes are serialized within a
process; the store's own locks serialize writers to one tree across processes.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from langgraph.store.base import (
    BaseStore,
    GetOp,
    IndexConfig,
    InvalidNamespaceError,
    Item,
    ListNamespacesOp,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    get_text_at_path,
    tokenize_path,
    validate_op_namespace,
)

from langchain_memtree._calls import Call, Procedure, WriteLock, arun, run
from langchain_memtree._text import storable
from langchain_memtree.filters import check_filter, matches, namespace_matches
from memtree import MemTree
from memtree.config import Aggregation, RetrievalMode
from memtree.store import Namespace, NamespaceKey, namespace_key

logger = logging.getLogger(__name__)

ITEMS = "store_items"
"""Record kind of the items (key: the item's key)."""

_Path = tuple[str, str | list[str]]
_Hit = tuple[float | None, NamespaceKey, str, dict[str, Any]]


class MemTreeStore(BaseStore):
    """A LangGraph ``BaseStore`` on a MemTree: exact items, tree-backed semantic search.

    ``memory`` supplies the embedder, aggregator and engine store (SQLite,
    PostgreSQL or in-memory). ``index`` chooses which fields of a value are
    embedded, as in LangGraph (``{"fields": ["text"]}``; default ``["$"]``, the
    whole value as JSON); the memory's embedder does the embedding, so ``dims``
    and ``embed`` are not taken. ``put(..., index=False)`` stores an item without
    indexing it; ``index=[...]`` names its fields for that put. ``mode``
    (``"collapsed"`` or ``"traversal"``; default: the memory's) is how searches
    walk each tree. A traversal search lists first the items its beam reaches,
    best first, then the other matching items by collapsed score, so ``limit``
    and ``filter`` behave as in collapsed mode. ``aggregation`` is when the
    summaries above an indexed text are written: by the memory's background worker
    (default: a put waits for embeddings only, never for a chat request),
    ``"deferred"`` to ``flush()`` / ``close()`` of the memory, or ``"eager"``
    inside the put (see :class:`memtree.MemTreeConfig`).

    Example::

        store = MemTreeStore(MemTree(), index={"fields": ["text"]})
        store.put(("memories", "alice"), "pet", {"text": "Alice has a cat named Miso."})
        store.search(("memories",), query="What is Alice's cat called?", limit=3)
        agent = create_agent(model, tools, store=store)
    """

    supports_ttl: bool = False

    def __init__(
        self,
        memory: MemTree,
        *,
        index: IndexConfig | None = None,
        prefix: Namespace = ("store",),
        mode: RetrievalMode | None = None,
        aggregation: Aggregation = "background",
    ) -> None:
        if not isinstance(memory, MemTree):
            raise TypeError(f"memory must be a memtree.MemTree, got {type(memory).__name__}")
        self.prefix: NamespaceKey = namespace_key(prefix)
        # Items are indexed independently: equal texts of two items are two leaves
        # (no de-duplication), and search must see every leaf (no sentence dropping).
        config = memory.config.with_options(deduplicate=False, drop_repeated_sentences=False, aggregation=aggregation)
        if mode is not None:
            config.with_options(mode=mode)  # refuses an unknown mode now, not at the first search
        self.memory = memory
        self._memories = memory.with_namespace(self.prefix, config=config)
        self.fields: list[str] = _index_fields(index)
        self._paths = _tokenized(self.fields)
        self.mode = mode
        self._write_lock = WriteLock()

    # -- the LangGraph interface --------------------------------------------------

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """Run operations in order and return their results (``None`` for puts)."""
        return [run(self._op_steps(op)) for op in _checked_ops(ops)]

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        """Async :meth:`batch`: model calls are awaited, store I/O runs in threads."""
        return [await arun(self._op_steps(op)) for op in _checked_ops(ops)]

    def tree(self, namespace: tuple[str, ...]) -> MemTree:
        """The memory tree behind a LangGraph namespace, with the memory's own
        config, for reading: a ``MemTreeRetriever``, ``format_tree()``, ``stats()``.
        Change items through the store, which keeps tree and items in step."""
        return self.memory.sibling(self._key(namespace))

    # -- operations ----------------------------------------------------------------

    def _op_steps(self, op: Op) -> Procedure[Result]:
        if isinstance(op, GetOp):
            return (yield from self._get_steps(op))
        if isinstance(op, SearchOp):
            return (yield from self._search_steps(op))
        if isinstance(op, ListNamespacesOp):
            return (yield from self._list_steps(op))
        yield Call(self._write_lock, "acquire")
        try:
            if op.value is None:
                yield from self._delete_steps(op)
            else:
                yield from self._put_steps(op)
        finally:
            self._write_lock.release()
        return None

    def _get_steps(self, op: GetOp) -> Procedure[Item | None]:
        key = self._key(op.namespace)
        found = yield Call(self._records, "get_records", (key, ITEMS, [op.key]))
        record = found.get(op.key)
        return None if record is None else _item(op.namespace, op.key, record)

    def _put_steps(self, op: PutOp) -> Procedure[None]:
        key = self._key(op.namespace)
        value = _checked_value(op.value)
        memory = yield Call(self._memories, "sibling", (key,))
        old = yield Call(self._records, "get_records", (key, ITEMS, [op.key]))
        now = datetime.now(UTC)
        texts = [] if op.index is False else _texts(value, self._paths if op.index is None else _tokenized(op.index))
        record = {
            "value": value,
            "created_at": old[op.key]["created_at"] if op.key in old else now.isoformat(),
            "updated_at": now.isoformat(),
            "vectors": len(texts),
        }
        yield Call(self._records, "put_records", (key, ITEMS, {op.key: record}))
        yield from _reindex_steps(memory, op.key, texts, now)

    def _delete_steps(self, op: PutOp) -> Procedure[None]:
        key = self._key(op.namespace)
        memory = yield Call(self._memories, "sibling", (key,))
        old = yield Call(self._records, "get_records", (key, ITEMS, [op.key]))
        if op.key in old:
            yield Call(self._records, "put_records", (key, ITEMS, {op.key: None}))
        yield from _reindex_steps(memory, op.key, [], None)
        leaves = yield Call(memory, "__len__")
        if leaves == 0:  # only then can the namespace be empty: check its items
            rest = yield Call(self._records, "get_records", (key, ITEMS))
            if not rest:  # an empty namespace is no namespace (list_namespaces)
                yield Call(memory, "delete_namespace")

    def _search_steps(self, op: SearchOp) -> Procedure[list[SearchItem]]:
        check_filter(op.filter)
        if op.limit < 0 or op.offset < 0:
            raise ValueError(f"limit and offset must be >= 0, got limit={op.limit}, offset={op.offset}")
        wanted = op.offset + op.limit
        if wanted == 0:
            return []
        found = yield Call(self._records, "list_namespaces", (self._key(op.namespace_prefix, allow_empty=True),))
        namespaces = [ns for ns in found if len(ns) > len(self.prefix)]
        hits: list[_Hit] = []
        if op.query:
            hits = yield from self._ranked_steps(op, namespaces, wanted)
        if len(hits) < wanted:  # listing, or items no query can score (nothing indexed)
            hits += yield from self._listed_steps(op, namespaces, wanted - len(hits), unscored_only=bool(op.query))
        return [
            _item(ns[len(self.prefix) :], item_key, record, score=score, result=SearchItem)
            for score, ns, item_key, record in hits[op.offset : wanted]
        ]

    def _ranked_steps(self, op: SearchOp, namespaces: list[NamespaceKey], wanted: int) -> Procedure[list[_Hit]]:
        """Items by their best leaf's score, across namespaces, filtered.

        The filter applies to item values the tree does not hold, so this asks each
        tree for more leaves (4x per round) until enough items pass or every tree
        has given all it has. In traversal mode the beam reaches only a few leaves
        whatever ``k`` is, so the items it reaches come first (best first) and the
        other items follow by their collapsed score: ``limit`` and ``filter`` work
        as in collapsed mode, and the beam decides what leads.
        """
        assert op.query is not None
        vector = yield Call(self._memories, "embed_query", (op.query,))
        memories = []
        for ns in namespaces:
            memories.append((ns, (yield Call(self._memories, "sibling", (ns,)))))
        traversal = (self.mode or self._memories.config.mode) == "traversal"
        options = {"leaves_only": True, "min_score": -1.0, "query_embedding": vector}
        k = wanted * 2 + 8
        while True:
            leaves: list[tuple[int, float, NamespaceKey, str]] = []  # (tier, score, ...): tier 0 leads
            exhausted = True
            for ns, memory in memories:
                if traversal:
                    reached = yield Call(memory, "retrieve", (op.query,), {"k": k, "mode": "traversal", **options})
                    leaves += [(0, hit.score, ns, hit.source_id) for hit in reached if hit.source_id is not None]
                results = yield Call(memory, "retrieve", (op.query,), {"k": k, "mode": "collapsed", **options})
                exhausted = exhausted and len(results) < k
                leaves += [(1, hit.score, ns, hit.source_id) for hit in results if hit.source_id is not None]
            leaves.sort(key=lambda leaf: (leaf[0], -leaf[1]))
            best: dict[tuple[NamespaceKey, str], tuple[int, float]] = {}
            for tier, score, ns, item_key in leaves:
                best.setdefault((ns, item_key), (tier, score))
            hits: list[_Hit] = []
            for ns in namespaces:
                keys = [item_key for (space, item_key) in best if space == ns]
                records = (yield Call(self._records, "get_records", (ns, ITEMS, keys))) if keys else {}
                hits += [
                    (best[(ns, item_key)][1], ns, item_key, record)
                    for item_key, record in records.items()
                    if matches(record["value"], op.filter)
                ]
            # beam-reached first; equal scores stay in namespace, then insertion, order
            hits.sort(key=lambda hit: (best[(hit[1], hit[2])][0], -(hit[0] or 0.0)))
            if len(hits) >= wanted or exhausted:
                return hits
            k *= 4

    def _listed_steps(
        self, op: SearchOp, namespaces: list[NamespaceKey], wanted: int, *, unscored_only: bool
    ) -> Procedure[list[_Hit]]:
        """Items in namespace order, then in the order first put, filtered."""
        hits: list[_Hit] = []
        for ns in namespaces:
            records = yield Call(self._records, "get_records", (ns, ITEMS))
            for item_key, record in records.items():
                if unscored_only and record.get("vectors", 0) > 0:
                    continue
                if matches(record["value"], op.filter):
                    hits.append((None, ns, item_key, record))
                    if len(hits) >= wanted:
                        return hits
        return hits

    def _list_steps(self, op: ListNamespacesOp) -> Procedure[list[tuple[str, ...]]]:
        found = yield Call(self._records, "list_namespaces", (self.prefix,))
        names = [ns[len(self.prefix) :] for ns in found if len(ns) > len(self.prefix)]
        for condition in op.match_conditions or ():
            names = [ns for ns in names if namespace_matches(condition, ns)]
        if op.max_depth is not None:
            names = list({ns[: op.max_depth]: None for ns in names})
        names.sort()
        return names[op.offset : op.offset + op.limit]

    # -- helpers ---------------------------------------------------------------------

    @property
    def _records(self) -> Any:
        return self._memories.store

    def _key(self, namespace: Sequence[str], *, allow_empty: bool = False) -> NamespaceKey:
        if not allow_empty and not namespace:
            raise InvalidNamespaceError("Namespace cannot be empty.")
        return (*self.prefix, *namespace)


def _reindex_steps(memory: MemTree, key: str, texts: list[tuple[str, str]], moment: datetime | None) -> Procedure[None]:
    """Make the item's leaves exactly ``texts``: remove the others, add the missing."""
    leaf_ids = yield Call(memory, "find", kwargs={"source_id": key})
    kept: set[tuple[str, str]] = set()
    for leaf_id in leaf_ids:
        node = yield Call(memory, "get", (leaf_id,))
        pair = (node.metadata.get("path"), node.text)
        if pair in texts and pair not in kept:
            kept.add(pair)
            continue
        with contextlib.suppress(KeyError):  # another writer removed it first
            yield Call(memory, "delete", (leaf_id,))
    for path, text in texts:
        if (path, text) not in kept:
            kept.add((path, text))
            yield Call(memory, "add", (text,), {"metadata": {"path": path}, "timestamp": moment, "source_id": key})


def _texts(value: Mapping[str, Any], paths: list[_Path]) -> list[tuple[str, str]]:
    """(path label, text) for every non-empty text at the paths, as LangGraph names them."""
    out: list[tuple[str, str]] = []
    for path, tokens in paths:
        texts = [storable(text) for text in get_text_at_path(value, tokens)]
        for i, text in enumerate(texts):
            if text:
                out.append((f"{path}.{i}" if len(texts) > 1 else path, text))
    return out


def _tokenized(fields: Sequence[str]) -> list[_Path]:
    if isinstance(fields, str) or not all(isinstance(field, str) and field for field in fields):
        raise TypeError(f"index fields must be a list of JSON paths (str), got {fields!r}")
    return [(field, "$" if field == "$" else tokenize_path(field)) for field in fields]


def _index_fields(index: IndexConfig | None) -> list[str]:
    if index is None:
        return ["$"]
    if not isinstance(index, Mapping):
        raise TypeError(f"index must be a dict like {{'fields': ['text']}}, got {type(index).__name__}")
    extra = sorted(set(index) - {"fields"})
    if extra:
        raise ValueError(
            f"MemTreeStore index takes only 'fields'; drop {extra}: the memory's embedder embeds "
            "(choose it with MemTree(embedder=...))"
        )
    fields = index.get("fields") or ["$"]
    _tokenized(fields)
    return list(fields)


def _checked_ops(ops: Iterable[Op]) -> list[Op]:
    checked = list(ops)
    for op in checked:
        if not isinstance(op, (GetOp, SearchOp, ListNamespacesOp, PutOp)):
            raise TypeError(f"unknown store operation {type(op).__name__}")
        validate_op_namespace(op)
        if isinstance(op, PutOp):
            if op.namespace and op.namespace[0] == "langgraph":
                raise InvalidNamespaceError(f'Root label for namespace cannot be "langgraph". Got: {op.namespace}')
            if op.ttl is not None:
                raise NotImplementedError("MemTreeStore does not expire items; put them with ttl=None")
            if not isinstance(op.key, str):
                raise TypeError(f"item keys must be str, got {type(op.key).__name__}")
    return checked


def _checked_value(value: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise TypeError(f"item values must be dicts, got {type(value).__name__}")
    try:
        text = json.dumps(dict(value), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise TypeError(f"item values must be JSON-serializable: {error}") from None
    if _has_nul(value):
        raise ValueError("item value contains a NUL character (\\x00), which durable stores cannot hold; remove it")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ValueError(f"item value is not valid Unicode ({error.reason}); fix the text before storing") from None
    return json.loads(text)  # type: ignore[no-any-return]


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, Mapping):
        return any(_has_nul(key) or _has_nul(item) for key, item in value.items())
    if isinstance(value, (list, tuple)):
        return any(_has_nul(item) for item in value)
    return False


def _item(
    namespace: tuple[str, ...],
    key: str,
    record: dict[str, Any],
    *,
    score: float | None = None,
    result: type[Item] = Item,
) -> Any:
    times = {
        "created_at": datetime.fromisoformat(record["created_at"]),
        "updated_at": datetime.fromisoformat(record["updated_at"]),
    }
    if result is SearchItem:
        return SearchItem(tuple(namespace), key, record["value"], score=score, **times)
    return Item(value=record["value"], key=key, namespace=tuple(namespace), **times)
