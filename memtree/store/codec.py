"""How nodes become database rows and back (shared by the SQL stores and backups).

Vectors are stored as raw little-endian float32 bytes: exact, compact (4 bytes
per dimension), and read back without a copy (``np.frombuffer`` over the bytes
the driver returned). Metadata and settings are JSON text. Nothing here can
execute code when loaded (no pickle).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from memtree.node import JSONDict, Node, Vector

VECTOR_DTYPE = np.dtype("<f4")
"""Stored vector format: little-endian float32."""

NODE_COLUMNS = (
    "id",
    "deleted",
    "parent",
    "text",
    "depth",
    "is_leaf",
    "leaf_count",
    "created_at",
    "updated_at",
    "event_time",
    "metadata",
    "source_id",
    "stale",
    "embedding",
    "leaf_sum",
)
"""Columns read back for a node, in order (``event_time`` holds ``Node.timestamp``)."""

WRITTEN_COLUMNS = NODE_COLUMNS[2:]
"""Columns written for a live node, after ``ns``, ``id``, ``seq`` and ``deleted``."""


class CorruptDataError(ValueError):
    """Stored data cannot be read back as a node (a damaged or hand-edited store)."""


def vector_bytes(vector: Vector | None) -> bytes | None:
    """A vector as little-endian float32 bytes (``None`` stays ``None``)."""
    if vector is None:
        return None
    return np.ascontiguousarray(vector, dtype=VECTOR_DTYPE).tobytes()


def json_text(value: Any) -> str:
    """Compact JSON text that keeps unicode readable."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def node_values(node: Node) -> tuple[Any, ...]:
    """Values of :data:`WRITTEN_COLUMNS` for a node."""
    return (
        node.parent,
        node.text,
        node.depth,
        node.is_leaf,
        node.leaf_count,
        node.created_at,
        node.updated_at,
        node.timestamp,
        json_text(node.metadata),
        node.source_id,
        node.stale,
        vector_bytes(node.embedding),
        vector_bytes(node.leaf_sum),
    )


def decode_rows(rows: Sequence[Sequence[Any]], dimension: int | None) -> tuple[list[Node], list[str]]:
    """Rows of :data:`NODE_COLUMNS` to (live nodes, ids of deleted nodes).

    ``dimension`` is the namespace's; when it is unknown it is taken from the first
    stored vector. A vector of another length raises :class:`CorruptDataError`.
    One pass with positional construction: reopening 100k nodes runs this 100k times.
    """
    nodes: list[Node] = []
    deleted: list[str] = []
    width = None if dimension is None else dimension * VECTOR_DTYPE.itemsize
    for row in rows:
        node_id, dead, parent, text, depth, is_leaf, leaf_count, created, updated, moment, metadata, source, stale = (
            row[:13]
        )
        if dead:
            deleted.append(node_id)
            continue
        if width is None and (row[13] or row[14]):
            width = len(row[13] or row[14])
        embedding = None if row[13] is None else _vector(row[13], width, node_id, "embedding")
        leaf_sum = None if row[14] is None else _vector(row[14], width, node_id, "leaf_sum")
        nodes.append(
            Node(
                node_id,
                text,
                embedding,
                parent,
                depth,
                bool(is_leaf),
                leaf_count,
                created,
                updated,
                moment,
                {} if metadata == "{}" else json_object(metadata, f"metadata of node {node_id}"),
                source,
                leaf_sum,
                bool(stale),
            )
        )
    return nodes, deleted


def _vector(blob: bytes, width: int | None, node_id: str, what: str) -> Vector:
    """A stored vector as a read-only array over the driver's bytes (no copy)."""
    if len(blob) != width:
        values = (width or 0) // VECTOR_DTYPE.itemsize
        raise CorruptDataError(
            f"node {node_id}: a stored {what} has {len(blob)} bytes where {values} float32 values "
            f"({width} bytes) belong"
        )
    return np.frombuffer(blob, VECTOR_DTYPE)


def json_object(text: str, what: str) -> JSONDict:
    """Parse stored JSON text that must be an object (``CorruptDataError`` otherwise)."""
    try:
        value = json.loads(text)
    except (TypeError, ValueError) as error:
        raise CorruptDataError(f"{what}: stored JSON is damaged ({error})") from None
    if not isinstance(value, dict):
        raise CorruptDataError(f"{what}: stored JSON is not an object")
    return value
