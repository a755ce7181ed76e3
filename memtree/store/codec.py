"""How nodes become database rows and back (shared by the SQL stores and backups).

Vectors are stored as raw little-endian float32 bytes: exact, compact (4 bytes
per dimension), and read back for a whole namespace with one ``np.frombuffer``
instead of one array per node. Metadata and settings are JSON text. Nothing here
can execute code when loaded (no pickle).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from memtree.embed import Matrix
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


def vectors_from_bytes(blobs: Sequence[bytes], dimension: int, what: str = "embedding") -> Matrix:
    """Stack byte strings of ``dimension`` float32 values into a read-only ``(n, d)`` array.

    One join and one ``frombuffer`` for the whole batch: reopening 100k nodes
    must not build 100k arrays one by one. The rows are views of one buffer.
    """
    width = dimension * VECTOR_DTYPE.itemsize
    for blob in blobs:
        if len(blob) != width:
            raise CorruptDataError(
                f"a stored {what} has {len(blob)} bytes where {dimension} float32 values ({width} bytes) belong"
            )
    if not blobs:
        return np.zeros((0, dimension), dtype=np.float32)
    matrix = np.frombuffer(b"".join(blobs), dtype=VECTOR_DTYPE).reshape(len(blobs), dimension)
    if np.dtype(np.float32) != VECTOR_DTYPE:  # big-endian host: convert once
        matrix = matrix.astype(np.float32)
        matrix.flags.writeable = False
    return matrix


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
    """
    live = [row for row in rows if not row[1]]
    deleted = [row[0] for row in rows if row[1]]
    embedded = [row[13] for row in live if row[13] is not None]
    summed = [row[14] for row in live if row[14] is not None]
    if dimension is None and (embedded or summed):
        first = (embedded or summed)[0]
        dimension = len(first) // VECTOR_DTYPE.itemsize
    embeddings = iter(vectors_from_bytes(embedded, dimension or 1))
    leaf_sums = iter(vectors_from_bytes(summed, dimension or 1, "leaf_sum"))
    nodes = []
    for row in live:
        metadata = row[10]
        nodes.append(
            Node(
                id=row[0],
                text=row[3],
                embedding=None if row[13] is None else next(embeddings),
                parent=row[2],
                depth=row[4],
                is_leaf=bool(row[5]),
                leaf_count=row[6],
                created_at=row[7],
                updated_at=row[8],
                timestamp=row[9],
                metadata={} if metadata == "{}" else json_object(metadata, f"metadata of node {row[0]}"),
                source_id=row[11],
                leaf_sum=None if row[14] is None else next(leaf_sums),
                stale=bool(row[12]),
            )
        )
    return nodes, deleted


def json_object(text: str, what: str) -> JSONDict:
    """Parse stored JSON text that must be an object (``CorruptDataError`` otherwise)."""
    try:
        value = json.loads(text)
    except (TypeError, ValueError) as error:
        raise CorruptDataError(f"{what}: stored JSON is damaged ({error})") from None
    if not isinstance(value, dict):
        raise CorruptDataError(f"{what}: stored JSON is not an object")
    return value
