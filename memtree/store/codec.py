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
    "expires_at",
)
"""Columns read back for a node, in order (``event_time`` holds ``Node.timestamp``;
``expires_at``, schema version 3, ``Node.expires_at``)."""

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
        node.expires_at,
    )


def decode_rows(rows: Sequence[Sequence[Any]], dimension: int | None) -> tuple[list[Node], list[str]]:
    """Rows of :data:`NODE_COLUMNS` to (live nodes, ids of deleted nodes).

    ``dimension`` is the namespace's; when it is unknown it is taken from the first
    stored vector. A vector of another length raises :class:`CorruptDataError`.
    Reopening 100k nodes runs this on 100k rows, so the work per row is kept to
    building the node: metadata is parsed in one call for all rows, vector lengths
    are checked in one pass.
    """
    deleted = [row[0] for row in rows if row[1]]
    live = [row for row in rows if not row[1]] if deleted else rows
    width = None if dimension is None else dimension * VECTOR_DTYPE.itemsize
    if width is None:
        width = next((len(row[13] or row[14]) for row in live if row[13] or row[14]), None)
    for column, what in ((13, "embedding"), (14, "leaf_sum")):
        if any(blob is not None and len(blob) != width for blob in (row[column] for row in live)):
            bad = next(row for row in live if row[column] is not None and len(row[column]) != width)
            _vector(bad[column], width, bad[0], what)  # raises, naming the node
    metadata = _metadata_objects([(row[0], row[10]) for row in live])
    vector = np.frombuffer
    nodes = [
        Node(
            row[0],
            row[3],
            None if row[13] is None else vector(row[13], VECTOR_DTYPE),
            row[2],
            row[4],
            bool(row[5]),
            row[6],
            row[7],
            row[8],
            row[9],
            values,
            row[11],
            None if row[14] is None else vector(row[14], VECTOR_DTYPE),
            bool(row[12]),
            [],
            row[15],
        )
        for row, values in zip(live, metadata, strict=True)
    ]
    return nodes, deleted


def _metadata_objects(rows: list[tuple[str, str]]) -> list[JSONDict]:
    """The metadata texts of these (node id, text) rows as dicts, in order.

    One ``json.loads`` over all of them joined into a JSON array (C speed, where a call
    per row costs a reopen of 100k nodes a quarter of a second), kept only if it gave
    one object per row, each row looking like one object; anything else (a damaged
    row) is parsed row by row, so the error names the node. Empty metadata (``{}``)
    is not parsed at all.
    """
    present = [text for _, text in rows if text != "{}"]
    parsed: list[Any] = []
    if present and all(text[:1] == "{" and text[-1:] == "}" for text in present):
        try:
            parsed = json.loads("[" + ",".join(present) + "]")
        except (TypeError, ValueError):
            parsed = []
    if len(parsed) != len(present) or not all(type(value) is dict for value in parsed):
        parsed = [json_object(text, f"metadata of node {node_id}") for node_id, text in rows if text != "{}"]
    values = iter(parsed)
    return [{} if text == "{}" else next(values) for _, text in rows]


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
