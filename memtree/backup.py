"""JSONL backups of one namespace: portable, human-readable, restorable without re-embedding.

Format ``memtree-jsonl`` version 1, UTF-8, one JSON object per line:

1. A header::

       {"format": "memtree-jsonl", "version": 1, "namespace": ["users", "alice"],
        "dimension": 384, "embedder": "LocalEmbedder(...)", "settings": {...},
        "vector_encoding": "base64 little-endian float32", "nodes": 57, "records": 3,
        "memtree_version": "0.1.0", "exported_at": "2025-01-31T12:00:00+00:00"}

   ``nodes`` and ``records`` count the lines that follow, so a truncated file is
   noticed. ``settings`` is engine state that must survive (the calibrated θ0).
2. One line per node, root first, every parent before its children::

       {"type": "node", "id": "…", "parent": "root", "text": "…", "depth": 1,
        "is_leaf": true, "leaf_count": 1, "created_at": 1706700000.0,
        "updated_at": 1706700000.0, "timestamp": null, "metadata": {}, "source_id": null,
        "stale": false, "embedding": "<base64>", "leaf_sum": null, "expires_at": null}

   Times are POSIX seconds (UTC). ``expires_at`` is when a leaf expires (``null``:
   never; absent in backups from before expiry existed): a leaf restored after it
   is hidden at once and deleted by the next sweep. ``embedding`` and ``leaf_sum`` (the sum of the
   leaf embeddings below a summary) are base64 of ``dimension`` little-endian
   float32 values; the root has neither. Decode one in Python with
   ``numpy.frombuffer(base64.b64decode(s), "<f4")``.
3. One line per record (adapters' JSON documents beside the tree), in the order
   they were first written::

       {"type": "record", "kind": "messages", "key": "000001", "value": {...}}

4. One line per earlier version of a leaf (what ``MemTree.update`` replaced), each
   leaf's oldest first; the header counts them as ``versions`` (absent: none)::

       {"type": "version", "leaf_id": "…", "text": "…", "metadata": {},
        "timestamp": null, "replaced_at": 1706700000.0}

Importing validates the whole file before writing anything and reports problems
as ``ValueError("line 7: …")``. With ``skip_bad=True`` bad lines are skipped
(with a warning naming them); top-level branches that lost a node are dropped and
their surviving leaves are routed in again with their stored embeddings (same
ids, nothing re-embedded; summaries above them are aggregated anew). A bad header
is fatal even then (a header whose ``dimension`` no embedding in the file has would
make every line "bad"), and a backup from which nothing with a vector survives
records no dimension or embedder for the namespace.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import os
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, datetime
from typing import Any, TextIO

import numpy as np

from memtree.index import VectorIndex
from memtree.inputs import check_seconds, to_metadata
from memtree.integrity import integrity_problems
from memtree.node import ROOT_ID, JSONDict, LeafVersion, Node, Vector
from memtree.output_file import write_output
from memtree.planning import root_node
from memtree.state import TreeState
from memtree.store.base import ChangeBatch, NamespaceInfo, NamespaceKey, Store, check_record_name, namespace_key
from memtree.store.codec import VECTOR_DTYPE, vector_bytes
from memtree.text import require_text
from memtree.version import __version__
from memtree.writer import Writer

_SWEEP_ATTEMPTS = 3
"""Snapshots an export reads at most while leaves keep expiring under it."""

FORMAT = "memtree-jsonl"
VERSION = 1
VECTOR_ENCODING = "base64 little-endian float32"

_NODE_FIELDS = {"type", *(item.name for item in fields(Node) if item.name != "children")}
_OPTIONAL_NODE_FIELDS = {"expires_at"}
"""Node fields a backup may leave out (written by a memtree before they existed)."""
_RECORD_FIELDS = {"type", "kind", "key", "value"}
_MAX_SHOWN = 20


# -- export -------------------------------------------------------------------------------


def export_jsonl(
    store: Store,
    namespace: NamespaceKey,
    target: str | os.PathLike[str] | TextIO,
    *,
    sweep: Callable[[], object] | None = None,
) -> int:
    """Write ``namespace`` of ``store`` to ``target`` (a path or a text stream); return the
    number of nodes written. A regular file is written beside itself and renamed, so an
    interrupted export never leaves half a backup under the name; a pipe or a device is
    written through, a symbolic link followed, a file's mode kept
    (:func:`~memtree.output_file.write_output`).

    Tree and records are read from the store in one snapshot
    (:meth:`~memtree.store.Store.read_snapshot`), so a backup taken while other
    writers work holds the namespace as it was at one moment.

    A backup never holds a memory that expired (nor the summaries' quotes of it, nor
    a record whose ``expires_at`` has passed, such as an expired LangGraph item): if
    the snapshot holds a leaf whose expiry has passed, ``sweep`` (the memory's
    ``sweep_expired``) deletes it and the snapshot is read again; without ``sweep``,
    or where the store cannot be written (read-only), nothing is written and
    ``PermissionError`` says so."""
    for attempt in range(_SWEEP_ATTEMPTS):
        snapshot = store.read_snapshot(namespace)
        tree = TreeState(lexical=False)
        tree.apply(snapshot.changes)
        expired = tree.expired(time.time())
        if not expired:
            break
        if sweep is None or attempt == _SWEEP_ATTEMPTS - 1:
            raise PermissionError(
                f"namespace {namespace!r} holds {len(expired)} expired memories not swept yet, which a backup must "
                "not hold; sweep them first (sweep_expired(), or any memtree command that writes)"
            )
        sweep()
    nodes, info = list(tree.walk()), tree.info
    now = time.time()
    records = [
        (kind, key, value)
        for kind, table in snapshot.records.items()
        for key, value in table.items()
        if not _expired_record(value, now)
    ]
    history = [version for version in snapshot.history if version.leaf_id in tree.nodes]

    header = {
        "format": FORMAT,
        "version": VERSION,
        "namespace": list(namespace),
        "dimension": info.dimension,
        "embedder": info.embedder,
        "settings": info.settings,
        "vector_encoding": VECTOR_ENCODING,
        "nodes": len(nodes),
        "records": len(records),
        "versions": len(history),
        "memtree_version": __version__,
        "exported_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    lines = _lines(header, nodes, records, history)
    if isinstance(target, (str, os.PathLike)):
        write_output(target, lines)
    else:
        for line in lines:
            target.write(line)
        target.flush()
    return len(nodes)


def _expired_record(value: JSONDict, now: float) -> bool:
    """Whether a record says it expired: a numeric ``expires_at`` (POSIX seconds) that
    has passed, as the LangGraph store's items and the sources' manifests carry. A
    backup leaves it out, as it leaves out the expired leaves it describes."""
    expires_at = value.get("expires_at")
    return isinstance(expires_at, (int, float)) and not isinstance(expires_at, bool) and expires_at <= now


def _lines(
    header: JSONDict, nodes: list[Node], records: list[tuple[str, str, JSONDict]], history: list[LeafVersion]
) -> Iterator[str]:
    yield _dump(header)
    for node in nodes:
        yield _dump(
            {
                "type": "node",
                "id": node.id,
                "parent": node.parent,
                "text": node.text,
                "depth": node.depth,
                "is_leaf": node.is_leaf,
                "leaf_count": node.leaf_count,
                "created_at": node.created_at,
                "updated_at": node.updated_at,
                "timestamp": node.timestamp,
                "metadata": node.metadata,
                "source_id": node.source_id,
                "stale": node.stale,
                "embedding": _b64(node.embedding),
                "leaf_sum": _b64(node.leaf_sum),
                "expires_at": node.expires_at,
            }
        )
    for kind, key, value in records:
        yield _dump({"type": "record", "kind": kind, "key": key, "value": value})
    for version in history:
        yield _dump(
            {
                "type": "version",
                "leaf_id": version.leaf_id,
                "text": version.text,
                "metadata": version.metadata,
                "timestamp": version.timestamp,
                "replaced_at": version.replaced_at,
            }
        )


def _dump(value: JSONDict) -> str:
    return json.dumps(value, ensure_ascii=False, allow_nan=False) + "\n"


def _b64(vector: Vector | None) -> str | None:
    data = vector_bytes(vector)
    return None if data is None else base64.b64encode(data).decode("ascii")


# -- import -------------------------------------------------------------------------------


class _BadLine(ValueError):
    pass


@dataclass
class _Parsed:
    """What a backup file holds, each node and record with the line it came from."""

    info: NamespaceInfo
    header: JSONDict
    nodes: dict[str, tuple[int, Node]] = field(default_factory=dict)
    records: dict[tuple[str, str], tuple[int, JSONDict]] = field(default_factory=dict)
    versions: list[tuple[int, LeafVersion]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    last_line: int = 1
    embedding_sizes: Counter[int] = field(default_factory=Counter)
    """How many node lines hold an embedding of each size (float32 values), whatever the header says."""

    def bad(self, line: int, message: str) -> None:
        self.problems.append(f"line {line}: {message}")


def import_jsonl(writer: Writer, source: str | os.PathLike[str] | TextIO, *, skip_bad: bool = False) -> int:
    """Restore a backup through ``writer`` into its memory's namespace, which must be empty; return the
    number of nodes imported. See the module docstring for the format and for
    ``skip_bad``."""
    if isinstance(source, (str, os.PathLike)):
        with open(source, encoding="utf-8", newline="") as stream:
            parsed = _parse(stream)
    else:
        parsed = _parse(source)
    kept, loose = _check_tree(parsed, writer.config.depth_cap)
    info = parsed.info
    if not loose and all(node.embedding is None for node in kept):
        # Nothing with a vector survives: recording the header's dimension and model
        # would bind the namespace to a size no stored node has (every add would fail).
        info = replace(info, dimension=None, embedder=None)
    if parsed.problems and not skip_bad:
        raise ValueError(_summary(parsed.problems, "nothing was imported; fix the file or pass skip_bad=True"))
    if parsed.problems:
        warnings.warn(_summary(parsed.problems, "these lines were skipped"), UserWarning, stacklevel=3)
    embedder = writer.calls.embedder.name
    if parsed.info.embedder is not None and parsed.info.embedder != embedder:
        warnings.warn(
            f"the backup was made with {parsed.info.embedder} but this memory embeds with {embedder}; "
            "new texts and queries will not be comparable with the stored ones",
            UserWarning,
            stacklevel=3,
        )
    leaves = {node.id for node in [*kept, *loose] if node.is_leaf}
    versions = [version for _, version in parsed.versions if version.leaf_id in leaves]
    writer.restore(kept, info, versions)
    by_kind: dict[str, dict[str, JSONDict]] = {}
    for (kind, key), (_, value) in parsed.records.items():  # file order: the order first written
        by_kind.setdefault(kind, {})[key] = value
    for kind, records in by_kind.items():
        writer.replica.store.put_records(writer.replica.namespace, kind, records)
    for leaf in sorted(loose, key=lambda node: (node.created_at, node.id)):
        writer.reinsert_leaf(leaf)
    made_root = 0 if ROOT_ID in parsed.nodes else 1
    return len(kept) - made_root + len(loose)


def _summary(problems: list[str], consequence: str) -> str:
    shown = problems[:_MAX_SHOWN]
    more = f"\n(and {len(problems) - _MAX_SHOWN} more)" if len(problems) > _MAX_SHOWN else ""
    return "\n".join(shown) + more + f"\n{len(problems)} problem(s) in the backup; {consequence}"


def _parse(stream: Iterable[str]) -> _Parsed:
    lines = iter(stream)
    first = next(lines, None)
    if first is None or not first.strip():
        raise ValueError(f"line 1: the file is empty; a {FORMAT} backup starts with its header line")
    header, info = _header(first)
    parsed = _Parsed(info=info, header=header)
    node_lines = record_lines = version_lines = 0
    number = 1
    for number, text in enumerate(lines, start=2):
        if not text.strip():
            continue
        try:
            value = _json_line(text)
            kind = value.get("type")
            if kind == "node":
                node_lines += 1
                size = _embedding_size(value)
                if size is not None:
                    parsed.embedding_sizes[size] += 1
                node = _node(value, parsed.info.dimension)
                if node.id in parsed.nodes:
                    raise _BadLine(f"node id {node.id!r} already appeared on line {parsed.nodes[node.id][0]}")
                parsed.nodes[node.id] = (number, node)
            elif kind == "record":
                record_lines += 1
                record_kind, key, record = _record(value)
                if (record_kind, key) in parsed.records:
                    first_line = parsed.records[(record_kind, key)][0]
                    raise _BadLine(f"record {record_kind!r}/{key!r} already appeared on line {first_line}")
                parsed.records[(record_kind, key)] = (number, record)
            elif kind == "version":
                version_lines += 1
                parsed.versions.append((number, _version(value)))
            else:
                raise _BadLine(f'"type" must be "node", "record" or "version", got {kind!r}')
        except _BadLine as error:
            parsed.bad(number, str(error))
    parsed.last_line = number
    _check_dimension(parsed)
    for line, version in parsed.versions:
        known = parsed.nodes.get(version.leaf_id)
        if known is None or not known[1].is_leaf:
            parsed.bad(line, f"a version of {version.leaf_id!r}, which is not a leaf of this backup")
    for what, found in (("nodes", node_lines), ("records", record_lines), ("versions", version_lines)):
        announced = parsed.header.get(what, 0 if what == "versions" else None)
        if announced != found:
            parsed.bad(
                number + 1,
                f"the header announces {announced} {what} but the file holds {found} (truncated or edited?)",
            )
    return parsed


def _embedding_size(value: JSONDict) -> int | None:
    """The number of float32 values a node line's embedding holds (``None``: none, or unreadable)."""
    item = value.get("embedding")
    if not isinstance(item, str):
        return None
    try:
        data = base64.b64decode(item, validate=True)
    except (binascii.Error, ValueError):
        return None
    return len(data) // VECTOR_DTYPE.itemsize if len(data) % VECTOR_DTYPE.itemsize == 0 else None


def _check_dimension(parsed: _Parsed) -> None:
    """Refuse a header whose dimension no embedding in the file has.

    Every node line would then be "bad", and skipping them all would import nothing
    while reporting success, so this is an error of the header, which ``skip_bad``
    cannot skip.
    """
    sizes = parsed.embedding_sizes
    dimension = parsed.info.dimension
    if not sizes or dimension in sizes:
        return
    found = " or ".join(str(size) for size, _ in sizes.most_common())
    likely = sizes.most_common(1)[0][0]
    raise ValueError(
        f"line 1: the header says dimension {json.dumps(dimension)} but every embedding in the file holds {found} "
        f"values; the header is wrong (edited, or from another backup), and skip_bad cannot skip the header: set its "
        f'"dimension" to {likely} and import again'
    )


def _json_line(text: str) -> JSONDict:
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except (ValueError, _BadLine) as error:
        raise _BadLine(f"not valid JSON ({error})") from None
    if not isinstance(value, dict):
        raise _BadLine(f"expected a JSON object, got {type(value).__name__}")
    return value


def _no_constant(name: str) -> Any:
    raise _BadLine(f"{name} is not allowed")


def _header(text: str) -> tuple[JSONDict, NamespaceInfo]:
    try:
        header = _json_line(text)
    except _BadLine as error:
        raise ValueError(f"line 1: the header is {error}") from None
    if header.get("format") != FORMAT:
        raise ValueError(f"line 1: not a {FORMAT} backup (format is {header.get('format')!r})")
    version = header.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ValueError(f"line 1: version must be a positive integer, got {version!r}")
    if version > VERSION:
        raise ValueError(
            f"line 1: this backup has format version {version}, newer than this memtree reads ({VERSION}); "
            "upgrade memtree (pip install -U memtree-llm)"
        )
    if header.get("vector_encoding", VECTOR_ENCODING) != VECTOR_ENCODING:
        raise ValueError(
            f"line 1: unknown vector_encoding {header.get('vector_encoding')!r}; expected {VECTOR_ENCODING!r}"
        )
    dimension = header.get("dimension")
    if dimension is not None and (not isinstance(dimension, int) or isinstance(dimension, bool) or dimension <= 0):
        raise ValueError(f"line 1: dimension must be a positive integer or null, got {dimension!r}")
    embedder = header.get("embedder")
    if embedder is not None and not isinstance(embedder, str):
        raise ValueError(f"line 1: embedder must be a string or null, got {embedder!r}")
    settings = header.get("settings", {})
    if not isinstance(settings, dict):
        raise ValueError(f"line 1: settings must be an object, got {type(settings).__name__}")
    namespace = header.get("namespace")
    try:
        namespace_key(tuple(namespace) if isinstance(namespace, list) else namespace)  # type: ignore[arg-type]
    except (TypeError, ValueError) as error:
        raise ValueError(f"line 1: namespace is not valid ({error})") from None
    for what in ("nodes", "records"):
        count = header.get(what)
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise ValueError(f"line 1: {what} must be the number of {what} in the file, got {count!r}")
    return header, NamespaceInfo(dimension=dimension, embedder=embedder, settings=settings)


def _node(value: JSONDict, dimension: int | None) -> Node:
    unknown = set(value) - _NODE_FIELDS
    if unknown:
        raise _BadLine(f"unknown node field(s) {', '.join(sorted(unknown))}")
    missing = _NODE_FIELDS - _OPTIONAL_NODE_FIELDS - set(value)
    if missing:
        raise _BadLine(f"node is missing {', '.join(sorted(missing))}")
    node_id = _string(value, "id")
    parent = value["parent"]
    is_root = node_id == ROOT_ID
    if is_root != (parent is None):
        raise _BadLine(
            "only the root (id 'root') has a null parent" if parent is None else "the root must have parent null"
        )
    if parent is not None:
        _string(value, "parent")
    text = value["text"]
    if is_root:
        if text != "":
            raise _BadLine("the root holds no text")
    else:
        try:
            require_text(text)
        except (TypeError, ValueError) as error:
            raise _BadLine(f"node {node_id}: {error}") from None
    try:
        metadata = to_metadata(value["metadata"])
    except (TypeError, ValueError) as error:
        raise _BadLine(f"node {node_id}: {error}") from None
    source_id = value["source_id"]
    if source_id is not None:
        _string(value, "source_id")
    embedding = _vector(value, "embedding", dimension, unit=True)
    if is_root != (embedding is None):
        raise _BadLine("the root has no embedding" if is_root else f"node {node_id} has no embedding")
    return Node(
        id=node_id,
        text=text,
        embedding=embedding,
        parent=parent,
        depth=_integer(value, "depth"),
        is_leaf=_boolean(value, "is_leaf"),
        leaf_count=_integer(value, "leaf_count"),
        created_at=_moment(value, "created_at", node_id),
        updated_at=_moment(value, "updated_at", node_id),
        timestamp=None if value["timestamp"] is None else _moment(value, "timestamp", node_id),
        metadata=metadata,
        source_id=source_id,
        leaf_sum=_vector(value, "leaf_sum", dimension, unit=False),
        stale=_boolean(value, "stale"),
        expires_at=None if value.get("expires_at") is None else _moment(value, "expires_at", node_id),
    )


def _record(value: JSONDict) -> tuple[str, str, JSONDict]:
    unknown = set(value) - _RECORD_FIELDS
    if unknown:
        raise _BadLine(f"unknown record field(s) {', '.join(sorted(unknown))}")
    try:
        kind = check_record_name(value.get("kind"), "record kind")
        key = check_record_name(value.get("key"), "record key")
    except (TypeError, ValueError) as error:
        raise _BadLine(str(error)) from None
    record = value.get("value")
    if not isinstance(record, dict):
        raise _BadLine(f"record {kind!r}/{key!r}: value must be an object, got {type(record).__name__}")
    return kind, key, record


def _version(value: JSONDict) -> LeafVersion:
    unknown = set(value) - {"type", "leaf_id", "text", "metadata", "timestamp", "replaced_at"}
    if unknown:
        raise _BadLine(f"unknown version fields: {', '.join(sorted(unknown))}")
    missing = {"leaf_id", "text", "replaced_at"} - set(value)
    if missing:
        raise _BadLine(f"a version needs {', '.join(sorted(missing))}")
    leaf_id = _string(value, "leaf_id")
    try:
        text = require_text(value.get("text"), "text")
        metadata = to_metadata(value.get("metadata"))
    except (TypeError, ValueError) as error:
        raise _BadLine(f"version of {leaf_id!r}: {error}") from None
    timestamp = None if value.get("timestamp") is None else _number(value, "timestamp")
    return LeafVersion(leaf_id, text, metadata, timestamp, _number(value, "replaced_at"))


def _string(value: JSONDict, name: str) -> str:
    item = value[name]
    if not isinstance(item, str) or not item or "\x00" in item:
        raise _BadLine(f"{name} must be non-empty text without NUL, got {item!r}")
    return item


def _integer(value: JSONDict, name: str) -> int:
    item = value[name]
    if not isinstance(item, int) or isinstance(item, bool) or item < 0:
        raise _BadLine(f"{name} must be a non-negative integer, got {item!r}")
    return item


def _number(value: JSONDict, name: str) -> float:
    item = value[name]
    if not isinstance(item, (int, float)) or isinstance(item, bool) or not math.isfinite(item):
        raise _BadLine(f"{name} must be a finite number, got {item!r}")
    return float(item)


def _moment(value: JSONDict, name: str, node_id: str) -> float:
    """A time in POSIX seconds that a date can show (see :func:`check_seconds`)."""
    try:
        return check_seconds(_number(value, name), f"node {node_id}: {name}")
    except ValueError as error:
        raise _BadLine(str(error)) from None


def _boolean(value: JSONDict, name: str) -> bool:
    item = value[name]
    if not isinstance(item, bool):
        raise _BadLine(f"{name} must be true or false, got {item!r}")
    return item


def _vector(value: JSONDict, name: str, dimension: int | None, *, unit: bool) -> Vector | None:
    item = value[name]
    if item is None:
        return None
    if not isinstance(item, str):
        raise _BadLine(f"{name} must be base64 text or null, got {type(item).__name__}")
    try:
        data = base64.b64decode(item, validate=True)
    except (binascii.Error, ValueError):
        raise _BadLine(f"{name} is not valid base64") from None
    if dimension is None:
        raise _BadLine(f"{name} given but the header's dimension is null")
    if len(data) != dimension * VECTOR_DTYPE.itemsize:
        raise _BadLine(
            f"{name} holds {len(data) // VECTOR_DTYPE.itemsize} float32 values (or a partial one); "
            f"the header says dimension {dimension}"
        )
    vector = np.frombuffer(data, dtype=VECTOR_DTYPE).astype(np.float32)
    if not np.all(np.isfinite(vector)):
        raise _BadLine(f"{name} contains NaN or infinite values")
    if unit and abs(float(np.linalg.norm(vector)) - 1.0) > 1e-3:
        raise _BadLine(f"{name} is not unit length (norm {float(np.linalg.norm(vector)):.4f})")
    vector.flags.writeable = False
    return vector


def _check_tree(parsed: _Parsed, depth_cap: int) -> tuple[list[Node], list[Node]]:
    """Split the parsed nodes into a sound tree to restore as stored and leaves to route in again.

    A top-level branch (a child of the root and everything below it) is kept only if
    every node of it survived parsing and it passes the tree invariants; every
    problem found is added to ``parsed.problems`` with the line it concerns.
    """
    nodes = parsed.nodes
    children: dict[str, list[str]] = {}
    for node_id, (line, node) in nodes.items():
        if node.parent is None:
            continue
        parent = nodes.get(node.parent)
        if parent is None:
            parsed.bad(line, f"node {node_id}: its parent {node.parent} is not in the file")
        elif parent[1].is_leaf:
            parsed.bad(line, f"node {node_id}: its parent {node.parent} is a leaf")
        elif node.depth != parent[1].depth + 1:
            parsed.bad(line, f"node {node_id}: depth {node.depth} but its parent has depth {parent[1].depth}")
        else:
            children.setdefault(node.parent, []).append(node_id)
    root = nodes[ROOT_ID][1] if ROOT_ID in nodes else None
    if root is None and nodes:
        parsed.bad(parsed.last_line + 1, "the file has no root node (id 'root')")
    branches = {child: _subtree(child, children) for child in children.get(ROOT_ID, [])}
    line_of = {node_id: line for node_id, (line, _) in nodes.items()}
    damaged = _damaged_branches(parsed, root, branches, depth_cap, line_of)
    kept_ids = {node_id for top, members in branches.items() if top not in damaged for node_id in members}
    base = root or root_node(min((n.created_at for _, n in nodes.values()), default=0.0))
    kept = [base, *(nodes[node_id][1] for node_id in _in_file_order(kept_ids, line_of))]
    loose = [node for node_id, (_, node) in nodes.items() if node.is_leaf and node_id not in kept_ids]
    return kept, loose


def _subtree(top: str, children: dict[str, list[str]]) -> list[str]:
    out, stack = [], [top]
    while stack:
        node_id = stack.pop()
        out.append(node_id)
        stack.extend(children.get(node_id, []))
    return out


def _damaged_branches(
    parsed: _Parsed,
    root: Node | None,
    branches: dict[str, list[str]],
    depth_cap: int,
    line_of: dict[str, int],
) -> set[str]:
    """Top-level branches that break an invariant (checked all at once, like a reopened tree)."""
    if root is None or not branches:
        return set(branches)
    top_of = {node_id: top for top, members in branches.items() for node_id in members}
    members = [parsed.nodes[node_id][1] for node_id in _in_file_order(set(top_of), line_of)]
    state = TreeState(lexical=False)
    state.apply(ChangeBatch([root.copy(), *(node.copy() for node in members)], [], 1, "import", parsed.info))
    dimension = parsed.info.dimension
    index = VectorIndex(dimension) if dimension else None
    if index is not None and members:
        index.upsert(
            [node.id for node in members],
            np.stack([node.embedding for node in members]),  # type: ignore[misc]
            [node.is_leaf for node in members],
            [node.timestamp for node in members],
        )
    cap = max(depth_cap, state.depth)
    damaged: set[str] = set()
    for problem in integrity_problems(state, index, cap):
        node_id, _, what = problem.partition(": ")
        if node_id in top_of:
            parsed.bad(line_of[node_id], f"node {node_id}: {what}")
            damaged.add(top_of[node_id])
        elif node_id != ROOT_ID:
            parsed.bad(line_of.get(ROOT_ID, 2), problem)
    return damaged


def _in_file_order(ids: set[str], line_of: dict[str, int]) -> list[str]:
    return sorted(ids, key=line_of.__getitem__)
