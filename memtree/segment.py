"""Segments: one namespace's tree frozen into files that a reopen maps instead of rebuilding.

A segment is a folder of NumPy ``.npy`` arrays and a ``manifest.json``, written for one
namespace at one sequence number of one generation (the store's stamps). Everything a
reopen would otherwise rebuild from rows is there, column by column, one row per node
(the root apart, in the manifest):

* node fields as arrays (parent row, depth, leaf flag, leaf count, times, staleness) and
  texts, metadata JSON, ids and source ids as UTF-8 blobs with offsets;
* the embeddings as one ``(rows, d)`` float32 matrix, the summaries' leaf sums as
  another; children as offsets into one array of rows;
* lookups as sorted 64-bit hashes with their rows: node id, a leaf's text and source
  id (the duplicate guard), a leaf's source id; leaves that expire, sorted by expiry;
* the BM25 index (:mod:`memtree.lexical`): per term a run of ``(row, tf, 0)`` triples
  and per row a run of ``term << 32 | tf``, the vocabulary with its hashes, and the
  per-term bounds MaxScore prunes with;
* the IVF index (:mod:`memtree.ann`): its centroids, with the rows sorted by list, so
  each list is a contiguous range of the embedding matrix.

Opening one maps every array (``np.load(mmap_mode=...)``): nothing is read until used,
nodes are built when first asked for (:mod:`memtree.node_table`), and the operating
system shares the pages between the processes that open the same segment.

Safety. Nothing here runs code when loaded (``allow_pickle=False``, JSON). A segment
is written into a temporary folder, every file synced, then renamed into place and
the folder synced (:mod:`memtree.segment_writer`): a crash at any moment leaves
either no new segment or a complete one, and a temporary folder that the next writer removes. The
manifest holds every file's size and CRC-32; :meth:`Segment.open` checks the sizes,
the array shapes and the checksums of the small files (the large ones, embeddings,
texts and postings, by :meth:`Segment.verify`, which ``check_integrity`` and the next
segment writer run). A segment whose generation is not the store's, or whose
sequence number is ahead of it, is never used. The rows in the store stay the truth:
when no usable segment exists, a reopen reads them all.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from memtree.lexical import LexicalBase
from memtree.node import ROOT_ID, Node
from memtree.store.base import NamespaceInfo, NamespaceKey

FORMAT = "memtree-segment"
VERSION = 1
MANIFEST = "manifest.json"
SEGMENT_PREFIX = "seg-"
TEMPORARY_PREFIX = "tmp-"

CHECKED_AT_OPEN = 1 << 20
"""Files up to this size have their CRC-32 checked when a segment is opened (the
manifest's companions: centroids, list offsets, the root's children); the others, by
:meth:`Segment.verify`, which ``check_integrity`` and every segment writer (before
copying from it) run. Checking them all at each open would read the whole segment
(2.3 GB at a million nodes): the open would cost what it saves."""

_CHUNK_ROWS = 65_536
"""Rows copied at a time when the embedding matrix is written."""

IntArray = npt.NDArray[np.int64]


class SegmentError(ValueError):
    """A segment folder that cannot be used (damaged, incomplete, or of another format)."""


def key_hash(text: str) -> int:
    """A stable 64-bit hash of a text (the same in every process and version)."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little")


def key_hashes(texts: Iterable[str]) -> npt.NDArray[np.uint64]:
    """:func:`key_hash` of each text."""
    return np.fromiter((key_hash(text) for text in texts), dtype=np.uint64)


def text_key(text: str, source_id: str | None) -> str:
    """What the duplicate guard looks a leaf up by (its text and source id), as one text."""
    return f"{text}\x00{'' if source_id is None else source_id}\x00{int(source_id is not None)}"


def encode_texts(texts: Sequence[str]) -> tuple[npt.NDArray[np.uint8], IntArray]:
    """Texts as one UTF-8 blob and ``len + 1`` offsets."""
    encoded = [text.encode("utf-8", "surrogatepass") for text in texts]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    if encoded:
        np.cumsum(np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded)), out=offsets[1:])
    return np.frombuffer(b"".join(encoded), dtype=np.uint8), offsets


def gather_texts(blob: np.ndarray, offsets: np.ndarray, rows: IntArray) -> tuple[npt.NDArray[np.uint8], IntArray]:
    """The blob and offsets of the texts at ``rows`` of another blob, in that order,
    copied by one vectorized gather."""
    starts = offsets[rows]
    lengths = offsets[rows + 1] - starts
    out_offsets = np.zeros(rows.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=out_offsets[1:])
    total = int(out_offsets[-1])
    if not total:
        return np.zeros(0, dtype=np.uint8), out_offsets
    within = np.arange(total, dtype=np.int64) - np.repeat(out_offsets[:-1], lengths)
    return np.asarray(blob[np.repeat(starts, lengths) + within], dtype=np.uint8), out_offsets


@dataclass
class HashedKeys:
    """Rows by a key's :func:`key_hash`: hashes sorted, rows beside them (a hash may
    repeat, and two keys may share one: callers compare the keys themselves)."""

    hashes: npt.NDArray[np.uint64]
    rows: npt.NDArray[np.int32]

    def rows_of(self, text: str) -> npt.NDArray[np.int32]:
        """Rows filed under ``text``'s hash, in row order."""
        wanted = np.uint64(key_hash(text))
        start = int(self.hashes.searchsorted(wanted, side="left"))
        end = start
        while end < self.hashes.size and self.hashes[end] == wanted:
            end += 1
        return self.rows[start:end]

    @staticmethod
    def build(hashes: npt.NDArray[np.uint64], rows: np.ndarray) -> HashedKeys:
        order = np.lexsort((rows, hashes))
        return HashedKeys(hashes[order], np.asarray(rows, dtype=np.int32)[order])


@dataclass
class IvfBase:
    """The IVF index as a segment holds it: centroids, and each list's range of rows
    (rows are sorted by list)."""

    centroids: npt.NDArray[np.float32]
    offsets: IntArray
    trained_rows: int
    """How many rows the centroids were trained for (a retrain follows growth)."""


class Segment:
    """An opened segment: memory-mapped arrays and what the manifest says."""

    def __init__(self, path: Path, manifest: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        self.path = path
        self.manifest = manifest
        self.arrays = arrays
        self.count: int = int(manifest["rows"])
        self.seq: int = int(manifest["seq"])
        self.generation: str = str(manifest["generation"])
        self.identity: str = str(manifest.get("identity", ""))
        self.dimension: int = int(manifest["dimension"])
        info = manifest["info"]
        self.info = NamespaceInfo(info.get("dimension"), info.get("embedder"), dict(info.get("settings") or {}))
        self._id_keys = HashedKeys(arrays["id_hash"], arrays["id_hash_row"])
        self._id_cache: dict[int, str] = {}
        self._row_cache: dict[str, int] = {}
        self.ids_ascii = bool(manifest.get("ids_ascii", False))
        self.vectors: np.ndarray = arrays["vectors"]
        """Read-only map of the embedding matrix (nodes built from it share its pages)."""

    # -- opening ---------------------------------------------------------------------------

    @staticmethod
    def open(path: Path, *, namespace: NamespaceKey | None = None) -> Segment:
        """Map the segment in ``path``; :class:`SegmentError` if it is not complete and sound."""
        try:
            text = (path / MANIFEST).read_text(encoding="utf-8")
            manifest = json.loads(text)
        except (OSError, ValueError) as error:
            raise SegmentError(f"{path}: no readable manifest ({error})") from None
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            raise SegmentError(f"{path}: not a memtree segment")
        if manifest.get("version") != VERSION:
            raise SegmentError(
                f"{path}: segment format version {manifest.get('version')}, this memtree reads {VERSION}"
            )
        body = {key: value for key, value in manifest.items() if key != "manifest_crc32"}
        if zlib.crc32(_canonical(body)) != manifest.get("manifest_crc32"):
            raise SegmentError(f"{path}: the manifest's checksum does not match")
        if namespace is not None and tuple(manifest.get("namespace", ())) != namespace:
            raise SegmentError(f"{path}: a segment of namespace {manifest.get('namespace')!r}, not {namespace!r}")
        arrays: dict[str, np.ndarray] = {}
        for name, entry in manifest["files"].items():
            file = path / f"{name}.npy"
            try:
                size = file.stat().st_size
            except OSError as error:
                raise SegmentError(f"{path}: {name}.npy is missing ({error})") from None
            if size != entry["bytes"]:
                raise SegmentError(f"{path}: {name}.npy has {size} bytes, the manifest says {entry['bytes']}")
            try:
                array = np.load(file, mmap_mode="r", allow_pickle=False) if size else np.zeros(0)
            except (OSError, ValueError) as error:
                raise SegmentError(f"{path}: {name}.npy cannot be read ({error})") from None
            if list(array.shape) != entry["shape"] or str(array.dtype) != entry["dtype"]:
                raise SegmentError(f"{path}: {name}.npy is {array.dtype}{array.shape}, the manifest says otherwise")
            if size <= CHECKED_AT_OPEN and _crc(array) != entry["crc32"]:
                raise SegmentError(f"{path}: {name}.npy fails its checksum")
            arrays[name] = np.asarray(array)  # a plain view of the map: slicing a memmap costs microseconds
        segment = Segment(path, manifest, arrays)
        segment._check_shapes()
        return segment

    def _check_shapes(self) -> None:
        rows, d = self.count, self.dimension
        for name in ("parent", "depth", "is_leaf", "leaf_count", "created_at", "updated_at", "timestamp"):
            if self.arrays[name].shape != (rows,):
                raise SegmentError(f"{self.path}: column {name} does not have {rows} rows")
        if self.vectors.shape != (rows, d):
            raise SegmentError(f"{self.path}: the embedding matrix is not {rows} x {d}")

    def verify(self) -> list[str]:
        """Problems found by checking every file's CRC-32. Reads the whole segment, with
        file reads rather than through the maps, so the pages read do not stay in this
        process's resident set."""
        problems = []
        for name, entry in self.manifest["files"].items():
            if _file_crc(self.path / f"{name}.npy", self.arrays[name]) != entry["crc32"]:
                problems.append(f"segment {self.path.name}: {name}.npy fails its checksum")
        return problems

    # -- reading rows --------------------------------------------------------------------------

    def id_at(self, row: int) -> str:
        """The node id stored at ``row``."""
        cached = self._id_cache.get(row)
        if cached is None:
            cached = _text_at(self.arrays["id_blob"], self.arrays["id_offsets"], row)
            if len(self._id_cache) < 1 << 16:
                self._id_cache[row] = cached
        return cached

    def ids_at(self, rows: Iterable[int]) -> list[str]:
        return [self.id_at(row) for row in rows]

    def row_of(self, node_id: str) -> int:
        """The row holding ``node_id``, or -1 (remembered: a segment never changes)."""
        row = self._row_cache.get(node_id)
        if row is None:
            row = next((found for found in self._id_keys.rows_of(node_id).tolist() if self.id_at(found) == node_id), -1)
            self._row_cache[node_id] = row
        return row

    def rows_of_ids(self, node_ids: Sequence[str]) -> IntArray:
        """:meth:`row_of` of many ids at once (-1 where absent)."""
        hashes = key_hashes(node_ids)
        stored = self.arrays["id_hash"]
        low = np.searchsorted(stored, hashes, side="left")
        high = np.searchsorted(stored, hashes, side="right")
        rows = np.full(len(node_ids), -1, dtype=np.int64)
        for i, (start, end) in enumerate(zip(low.tolist(), high.tolist(), strict=True)):
            for row in self.arrays["id_hash_row"][start:end].tolist():
                if self.id_at(row) == node_ids[i]:
                    rows[i] = row
                    break
        return rows

    def rows_with_text(self, text: str, source_id: str | None) -> list[int]:
        """Rows of the leaves holding exactly ``text`` under ``source_id``, in row order."""
        keys = HashedKeys(self.arrays["text_hash"], self.arrays["text_hash_row"])
        return [
            row
            for row in keys.rows_of(text_key(text, source_id)).tolist()
            if self.text_at(row) == text and self.source_at(row) == source_id
        ]

    def rows_with_source(self, source_id: str) -> list[int]:
        """Rows of the leaves stored under ``source_id``, in row order."""
        keys = HashedKeys(self.arrays["source_hash"], self.arrays["source_hash_row"])
        return [row for row in keys.rows_of(source_id).tolist() if self.source_at(row) == source_id]

    def source_at(self, row: int) -> str | None:
        a = self.arrays
        return _text_at(a["source_blob"], a["source_offsets"], row) if a["has_source"][row] else None

    def text_at(self, row: int) -> str:
        return _text_at(self.arrays["text_blob"], self.arrays["text_offsets"], row)

    def children_rows(self, row: int) -> np.ndarray:
        """Rows of the children of ``row`` (-1: the root), in order."""
        offsets = self.arrays["child_offsets"]
        if row < 0:
            return np.asarray(self.arrays["root_children"])
        return np.asarray(self.arrays["children"][offsets[row] : offsets[row + 1]])

    def node(self, row: int) -> Node:
        """The node stored at ``row``, built now (its embedding views the mapped matrix)."""
        a = self.arrays
        parent = int(a["parent"][row])
        metadata_text = _text_at(a["meta_blob"], a["meta_offsets"], row)
        leaf_sum_row = int(a["leaf_sum_row"][row])
        source = self.source_at(row)
        return Node(
            id=self.id_at(row),
            text=self.text_at(row),
            embedding=self.vectors[row],
            parent=ROOT_ID if parent < 0 else self.id_at(parent),
            depth=int(a["depth"][row]),
            is_leaf=bool(a["is_leaf"][row]),
            leaf_count=int(a["leaf_count"][row]),
            created_at=float(a["created_at"][row]),
            updated_at=float(a["updated_at"][row]),
            timestamp=_optional(a["timestamp"][row]),
            metadata=json.loads(metadata_text) if metadata_text else {},
            source_id=source,
            leaf_sum=None if leaf_sum_row < 0 else a["leaf_sums"][leaf_sum_row],
            stale=bool(a["stale"][row]),
            children=self.ids_at(self.children_rows(row).tolist()),
            expires_at=_optional(a["expires_at"][row]),
        )

    def root(self) -> Node:
        """The root as stored (its children are the rows of ``root_children``)."""
        fields = self.manifest["root"]
        return Node(
            id=ROOT_ID,
            text="",
            embedding=None,
            parent=None,
            depth=0,
            is_leaf=False,
            leaf_count=int(fields["leaf_count"]),
            created_at=float(fields["created_at"]),
            updated_at=float(fields["updated_at"]),
            metadata=dict(fields.get("metadata") or {}),
            stale=bool(fields.get("stale", False)),
            children=self.ids_at(self.children_rows(-1).tolist()),
        )

    def metadata_of(self, rows: np.ndarray) -> list[dict[str, Any]]:
        """The metadata of these rows, parsed in one call."""
        a = self.arrays
        texts = [_text_at(a["meta_blob"], a["meta_offsets"], int(row)) for row in rows.tolist()]
        present = [text for text in texts if text]
        parsed = iter(json.loads("[" + ",".join(present) + "]") if present else [])
        return [next(parsed) if text else {} for text in texts]

    # -- what the indexes load -----------------------------------------------------------------

    def lexical_base(self) -> LexicalBase:
        a = self.arrays
        words = self.manifest["lexical"]
        blob, offsets = a["lex_term_blob"], a["lex_term_offsets"]
        keys = HashedKeys(a["lex_term_hash"], a["lex_term_hash_row"])

        def terms_of(words: Sequence[str]) -> IntArray:
            found = np.full(len(words), -1, dtype=np.int64)
            if not words or not keys.hashes.size:
                return found
            hashes = key_hashes(words)
            first = np.searchsorted(keys.hashes, hashes)
            for i in np.flatnonzero(first < keys.hashes.size).tolist():
                at = int(first[i])
                while at < keys.hashes.size and keys.hashes[at] == hashes[i]:  # a shared hash: compare the words
                    term = int(keys.rows[at])
                    if _text_at(blob, offsets, term) == words[i]:
                        found[i] = term
                        break
                    at += 1
            return found

        return LexicalBase(
            terms=int(words["words"]),
            terms_of=terms_of,
            postings=a["lex_postings"],
            posting_offsets=a["lex_posting_offsets"],
            forward=a["lex_forward"],
            forward_offsets=a["lex_forward_offsets"],
            lengths=a["lex_lengths"],
            tf_max=a["lex_tf_max"],
            length_min=a["lex_length_min"],
            total_length=int(words["total_length"]),
            documents=int(words["documents"]),
            row_of=self.row_of,
            id_at=self.id_at,
        )

    def ivf_base(self) -> IvfBase | None:
        ann = self.manifest.get("ann")
        if not ann:
            return None
        return IvfBase(self.arrays["ann_centroids"], self.arrays["ann_offsets"], int(ann["trained_rows"]))


def _text_at(blob: np.ndarray, offsets: np.ndarray, row: int) -> str:
    start, end = int(offsets[row]), int(offsets[row + 1])
    return bytes(blob[start:end]).decode("utf-8", "surrogatepass")


def _optional(value: float) -> float | None:
    number = float(value)
    return None if number != number else number


def _crc(array: np.ndarray) -> int:
    if not array.size:
        return 0
    flat = array.reshape(-1)
    crc = 0
    step = max(1, (64 << 20) // max(1, array.itemsize))
    for start in range(0, flat.size, step):
        crc = zlib.crc32(np.ascontiguousarray(flat[start : start + step]).view(np.uint8).data, crc)
    return crc


def _file_crc(path: Path, array: np.ndarray) -> int:
    """:func:`_crc` of a saved array, from its file (the data after the ``.npy`` header)."""
    if not array.size:
        return 0
    size = array.size * array.itemsize
    crc = 0
    try:
        with open(path, "rb") as handle:
            handle.seek(path.stat().st_size - size)
            while chunk := handle.read(16 << 20):
                crc = zlib.crc32(chunk, crc)
    except FileNotFoundError:  # removed since (a newer segment replaced it): the map still holds it
        return _crc(array)
    return crc


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, ensure_ascii=True, separators=(",", ":")).encode("ascii")
