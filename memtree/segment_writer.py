"""Writing a segment (:mod:`memtree.segment` has the format and the reader): a frozen
copy of a namespace's tree written column by column into a temporary folder, every
file synced, then renamed into place and the folder synced, so a crash at any moment
leaves either no new segment or a complete one.

The previous segment's rows that still hold are copied from its files as stored;
every other node comes from the frozen copies. Only words some live row still uses
are written (a deleted text's words are not carried forward).
"""

from __future__ import annotations

import json
import os
import uuid
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from memtree.ann import assign_lists, train_centroids
from memtree.lexical import _TERM_SHIFT, _TF_MASK, count_terms, stable_order
from memtree.node import ROOT_ID, Node
from memtree.segment import (
    _CHUNK_ROWS,
    FORMAT,
    MANIFEST,
    SEGMENT_PREFIX,
    TEMPORARY_PREFIX,
    VERSION,
    HashedKeys,
    IntArray,
    IvfBase,
    Segment,
    SegmentError,
    _canonical,
    _crc,
    encode_texts,
    gather_texts,
    key_hashes,
    text_key,
)
from memtree.store.base import NamespaceInfo, NamespaceKey


@dataclass
class FrozenTree:
    """What a segment is written from: the previous segment (if any) with the rows of
    it that still hold, and copies of every other node, all as of ``seq``.

    The previous segment's files never change, and the nodes here are copies, so a
    segment is written without any lock while the memory goes on changing."""

    namespace: NamespaceKey
    generation: str
    seq: int
    info: NamespaceInfo
    dimension: int
    root: Node
    changed: list[Node]
    base: Segment | None = None
    base_kept: npt.NDArray[np.bool_] | None = None
    """Per row of ``base``: the node is unchanged since (so it is copied as stored)."""
    ivf_rows: int | None = None
    """Build the IVF index (None: write the segment without one)."""
    retrain: bool = False
    """Train new centroids even when ``base`` has some."""
    identity: str = ""
    """The database the segment comes from (:class:`~memtree.store.base.IndexFolder`)."""
    extra: dict[str, Any] = field(default_factory=dict)


def ivf_lists(rows: int) -> int:
    """How many IVF lists a segment of ``rows`` embeddings gets (about the square
    root, so a list and the centroid scan cost alike)."""
    return max(1, min(rows // 16, round(rows**0.5)))


def write_segment(folder: Path, frozen: FrozenTree) -> Path:
    """Write ``frozen`` as a new segment in ``folder``; return its path.

    The files go to a temporary folder, each synced, which is then renamed to
    ``seg-<seq>-<random>`` and the parent folder synced: readers see the whole
    segment or none of it."""
    folder.mkdir(parents=True, exist_ok=True)
    temporary = folder / f"{TEMPORARY_PREFIX}{uuid.uuid4().hex}"
    temporary.mkdir()
    try:
        manifest = _write_files(temporary, frozen)
        manifest["manifest_crc32"] = zlib.crc32(_canonical(manifest))
        with open(temporary / MANIFEST, "w", encoding="utf-8") as handle:
            json.dump(manifest, handle, sort_keys=True)
            handle.flush()
            os.fsync(handle.fileno())
        _sync_folder(temporary)
        final = folder / f"{SEGMENT_PREFIX}{frozen.seq:012d}-{uuid.uuid4().hex[:8]}"
        os.rename(temporary, final)
        _sync_folder(folder)
        return final
    except BaseException:
        _remove_tree(temporary)
        raise


def _sync_folder(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _remove_tree(path: Path) -> None:
    if not path.exists():
        return
    for child in path.iterdir():
        child.unlink(missing_ok=True)
    path.rmdir()


class _Writer:
    """Saves arrays into the temporary folder, syncing each, and lists them for the manifest."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.files: dict[str, dict[str, Any]] = {}

    def save(self, name: str, array: np.ndarray) -> None:
        array = np.ascontiguousarray(array)
        path = self.folder / f"{name}.npy"
        with open(path, "wb") as handle:
            np.save(handle, array, allow_pickle=False)
            handle.flush()
            os.fsync(handle.fileno())
        self._record(name, path, array)

    def save_rows(self, name: str, shape: tuple[int, int], parts: Iterable[tuple[int, np.ndarray]]) -> None:
        """A large float32 matrix written chunk by chunk (``parts``: first row, rows)."""
        path = self.folder / f"{name}.npy"
        out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=shape)
        for start, rows in parts:
            out[start : start + len(rows)] = rows
        out.flush()
        del out
        with open(path, "rb+") as handle:
            os.fsync(handle.fileno())
        self._record(name, path, np.load(path, mmap_mode="r", allow_pickle=False))

    def _record(self, name: str, path: Path, array: np.ndarray) -> None:
        self.files[name] = {
            "bytes": path.stat().st_size,
            "crc32": _crc(array),
            "dtype": str(array.dtype),
            "shape": list(array.shape),
        }


class _Rows:
    """Where each row of the new segment comes from: a clean row of the base segment
    (``base_row >= 0``) or a changed node (``changed >= 0``), in the new order."""

    def __init__(self, base: Segment | None, kept: IntArray, changed: list[Node], order: IntArray) -> None:
        self.base = base
        self.kept = kept
        self.changed = changed
        self.count = int(order.size)
        from_base = order < kept.size
        self.base_row = np.where(from_base, kept[np.minimum(order, max(kept.size - 1, 0))] if kept.size else -1, -1)
        self.changed_index = np.where(from_base, -1, order - kept.size)
        self.from_base = from_base

    def merge_runs(
        self,
        base_values: np.ndarray | None,
        base_offsets: np.ndarray | None,
        changed_values: np.ndarray,
        changed_offsets: IntArray,
        dtype: Any,
    ) -> tuple[np.ndarray, IntArray]:
        """Variable-length runs (bytes of a text, children of a node) in the new order:
        a base row's run from ``base_values`` (delimited by ``base_offsets``), a changed
        node's from ``changed_values``; returns the values and their offsets."""
        lengths = np.zeros(self.count, dtype=np.int64)
        starts = np.zeros(self.count, dtype=np.int64)
        if base_offsets is not None and self.from_base.any():
            rows = self.base_row[self.from_base]
            lengths[self.from_base] = base_offsets[rows + 1] - base_offsets[rows]
            starts[self.from_base] = base_offsets[rows]
        picked = ~self.from_base
        if picked.any():
            index = self.changed_index[picked]
            lengths[picked] = changed_offsets[index + 1] - changed_offsets[index]
            starts[picked] = changed_offsets[index]
        offsets = np.zeros(self.count + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        out = np.empty(int(offsets[-1]), dtype=dtype)
        for first in range(0, self.count, _CHUNK_ROWS):
            last = min(self.count, first + _CHUNK_ROWS)
            for source, mask in ((base_values, self.from_base[first:last]), (changed_values, picked[first:last])):
                if source is None or not mask.any():
                    continue
                run = lengths[first:last][mask]
                total = int(run.sum())
                if not total:
                    continue
                within = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(run) - run, run)
                out[np.repeat(offsets[first:last][mask], run) + within] = np.asarray(
                    source[np.repeat(starts[first:last][mask], run) + within]
                )
        return out, offsets

    def blob(self, name: str, texts: list[str]) -> tuple[np.ndarray, IntArray]:
        """A text column (``name``: id, text, meta, source) in the new order."""
        changed_blob, changed_offsets = encode_texts(texts)
        base = self.base.arrays if self.base is not None else None
        return self.merge_runs(
            base[f"{name}_blob"] if base is not None else None,
            np.asarray(base[f"{name}_offsets"]) if base is not None else None,
            changed_blob,
            changed_offsets,
            np.uint8,
        )

    def matrix(
        self, base_rows: np.ndarray | None, changed: Sequence[np.ndarray], dimension: int, rows: IntArray | None = None
    ) -> Iterator[tuple[int, np.ndarray]]:
        """Rows of a matrix in the new order, a chunk at a time: a base row's from
        ``base_rows``, a changed node's from ``changed`` (``rows``: only these new rows)."""
        wanted = np.arange(self.count) if rows is None else rows
        for first in range(0, wanted.size, _CHUNK_ROWS):
            chunk = wanted[first : first + _CHUNK_ROWS]
            out = np.empty((chunk.size, dimension), dtype=np.float32)
            from_base = self.from_base[chunk]
            if from_base.any():
                assert base_rows is not None
                source = self.base_source(chunk[from_base])
                ordering = np.argsort(source, kind="stable")  # read the map in file order
                gathered = np.empty((source.size, dimension), dtype=np.float32)
                gathered[ordering] = base_rows[source[ordering]]
                out[from_base] = gathered
            if (~from_base).any():
                out[~from_base] = np.stack([changed[i] for i in self.changed_index[chunk[~from_base]].tolist()])
            yield first, out

    def base_source(self, rows: IntArray) -> IntArray:
        return self.base_row[rows]


def _write_files(folder: Path, frozen: FrozenTree) -> dict[str, Any]:
    """Merge the clean rows of the base with the changed nodes and write every array.

    Only the changed nodes are encoded, hashed and tokenized; the clean rows' texts,
    hashes, term lists and vectors are copied from the base with vectorized gathers."""
    base = frozen.base
    a = base.arrays if base is not None else {}
    d = frozen.dimension
    kept = (
        np.flatnonzero(frozen.base_kept).astype(np.int64)
        if base is not None and frozen.base_kept is not None
        else np.zeros(0, np.int64)
    )
    changed = frozen.changed
    rows = kept.size + len(changed)
    changed_vectors = [np.asarray(node.embedding, dtype=np.float32) for node in changed]

    # -- the IVF lists decide the order of the rows ---------------------------------------------
    ivf: IvfBase | None = None
    base_ivf = base.ivf_base() if base is not None else None
    if frozen.ivf_rows is not None and rows:
        identity = _Rows(base, kept, changed, np.arange(rows, dtype=np.int64))
        lists = np.zeros(rows, dtype=np.int64)
        if base_ivf is not None and not frozen.retrain:
            centroids = np.asarray(base_ivf.centroids)
            base_lists = np.repeat(np.arange(base_ivf.offsets.size - 1), np.diff(base_ivf.offsets))
            lists[: kept.size] = base_lists[kept]
            if changed:
                lists[kept.size :] = assign_lists(centroids, np.stack(changed_vectors))
            trained = base_ivf.trained_rows
        else:
            count = ivf_lists(rows)
            rng = np.random.default_rng(rows)
            sample_rows = np.sort(rng.choice(rows, size=min(rows, 64 * count), replace=False))
            sample = np.concatenate(
                [part for _, part in identity.matrix(a.get("vectors"), changed_vectors, d, sample_rows)]
            )
            centroids = train_centroids(sample, count)
            for first, part in identity.matrix(a.get("vectors"), changed_vectors, d):
                lists[first : first + len(part)] = assign_lists(centroids, part)
            trained = rows
        order = np.argsort(lists, kind="stable")
        counts = np.bincount(lists, minlength=centroids.shape[0])
        ivf = IvfBase(centroids.astype(np.float32), np.concatenate(([0], np.cumsum(counts))).astype(np.int64), trained)
    else:
        order = np.arange(rows, dtype=np.int64)
    position = np.empty(rows, dtype=np.int64)
    position[order] = np.arange(rows, dtype=np.int64)
    merged = _Rows(base, kept, changed, order)

    # -- where every node lands ---------------------------------------------------------------------
    changed_position = {node.id: int(position[kept.size + i]) for i, node in enumerate(changed)}
    base_position = np.full(base.count if base is not None else 0, -1, dtype=np.int64)
    if base is not None:
        base_position[kept] = position[: kept.size]
        changed_rows = base.rows_of_ids([node.id for node in changed])
        present = changed_rows >= 0
        base_position[changed_rows[present]] = position[kept.size :][present]

    referred = [
        node_id
        for node in (*changed, frozen.root)
        for node_id in (node.parent, *node.children)
        if node_id is not None and node_id != ROOT_ID and node_id not in changed_position
    ]
    referred = list(dict.fromkeys(referred))
    referred_rows = base.rows_of_ids(referred) if base is not None else np.full(len(referred), -1, np.int64)
    base_at = dict(zip(referred, referred_rows.tolist(), strict=True))

    def place(node_id: str) -> int:
        at = changed_position.get(node_id)
        if at is not None:
            return at
        if node_id == ROOT_ID:
            return -1
        row = base_at.get(node_id, -1)
        if row < 0 or base_position[row] < 0:
            raise SegmentError(f"node {node_id!r} is referred to but not in the tree being written")
        return int(base_position[row])

    out = _Writer(folder)

    def column(name: str, values: list[Any], dtype: Any) -> np.ndarray:
        merged_values = np.empty(rows, dtype=dtype)
        if kept.size:
            merged_values[: kept.size] = np.asarray(a[name])[kept]
        merged_values[kept.size :] = np.asarray(values, dtype=dtype) if values else np.zeros(0, dtype=dtype)
        return merged_values[order]

    for name, texts in (
        ("id", [node.id for node in changed]),
        ("text", [node.text for node in changed]),
        ("meta", [_metadata_text(node) for node in changed]),
        ("source", [node.source_id or "" for node in changed]),
    ):
        values, offsets = merged.blob(name, texts)
        out.save(f"{name}_blob", values)
        out.save(f"{name}_offsets", offsets)
    out.save("has_source", column("has_source", [node.source_id is not None for node in changed], np.bool_))
    parents = np.empty(rows, dtype=np.int64)
    if kept.size:
        base_parent = np.asarray(a["parent"])[kept]
        parents[: kept.size] = np.where(base_parent < 0, -1, base_position[np.maximum(base_parent, 0)])
    parents[kept.size :] = [place(node.parent or ROOT_ID) for node in changed]
    out.save("parent", parents[order].astype(np.int32))
    out.save("depth", column("depth", [node.depth for node in changed], np.int32))
    out.save("is_leaf", is_leaf := column("is_leaf", [node.is_leaf for node in changed], np.bool_))
    out.save("leaf_count", column("leaf_count", [node.leaf_count for node in changed], np.int64))
    out.save("created_at", column("created_at", [node.created_at for node in changed], np.float64))
    out.save("updated_at", column("updated_at", [node.updated_at for node in changed], np.float64))
    out.save("timestamp", column("timestamp", [_nan(node.timestamp) for node in changed], np.float64))
    out.save("expires_at", expires := column("expires_at", [_nan(node.expires_at) for node in changed], np.float64))
    out.save("stale", column("stale", [node.stale for node in changed], np.bool_))

    # children: a clean row's as stored (mapped to the new rows), a changed node's as it lists them
    changed_children = [np.asarray([place(child) for child in node.children], dtype=np.int64) for node in changed]
    children, child_offsets = merged.merge_runs(
        base_position[np.asarray(a["children"], dtype=np.int64)] if base is not None else None,
        np.asarray(a["child_offsets"]) if base is not None else None,
        np.concatenate([*changed_children, np.zeros(0, np.int64)]),
        np.concatenate(([0], np.cumsum([len(kids) for kids in changed_children], dtype=np.int64))).astype(np.int64),
        np.int64,
    )
    if children.size and children.min() < 0:
        raise SegmentError("a clean row lists a child that is not in the tree being written")
    out.save("child_offsets", child_offsets)
    out.save("children", children.astype(np.int32))
    out.save("root_children", np.asarray([place(child) for child in frozen.root.children], dtype=np.int32))

    # embeddings and leaf sums
    out.save_rows("vectors", (rows, d), merged.matrix(a.get("vectors"), changed_vectors, d))
    has_sum = np.zeros(rows, dtype=bool)
    if kept.size:
        has_sum[merged.from_base] = np.asarray(a["leaf_sum_row"])[merged.base_row[merged.from_base]] >= 0
    changed_sums = [
        np.asarray(node.leaf_sum, dtype=np.float32) if node.leaf_sum is not None else None for node in changed
    ]
    for final in np.flatnonzero(~merged.from_base).tolist():
        has_sum[final] = changed_sums[int(merged.changed_index[final])] is not None
    with_sum = np.flatnonzero(has_sum)
    leaf_sum_row = np.full(rows, -1, dtype=np.int32)
    leaf_sum_row[with_sum] = np.arange(with_sum.size, dtype=np.int32)
    out.save("leaf_sum_row", leaf_sum_row)
    base_sums = np.asarray(a["leaf_sum_row"]) if base is not None else None
    stored_sums = a.get("leaf_sums")
    summed = _Rows(base, kept, changed, order)
    summed.base_row = np.where(
        merged.from_base & has_sum, base_sums[np.maximum(merged.base_row, 0)] if base_sums is not None else -1, -1
    )
    out.save_rows(
        "leaf_sums",
        (with_sum.size, d),
        (
            (first, part)
            for first, part in summed.matrix(
                stored_sums, [s if s is not None else np.zeros(d, np.float32) for s in changed_sums], d, with_sum
            )
        ),
    )

    # lookups: the clean rows' hashes are reused, the changed nodes' computed
    def hashed(name: str, fresh: list[tuple[int, str]]) -> None:
        parts_hash = [key_hashes(key for _, key in fresh)]
        parts_row = [np.asarray([at for at, _ in fresh], dtype=np.int64)]
        if base is not None:
            stored_rows = np.asarray(a[f"{name}_hash_row"], dtype=np.int64)
            usable = (
                np.asarray(frozen.base_kept, dtype=bool)[stored_rows]
                if frozen.base_kept is not None
                else np.zeros(stored_rows.size, bool)
            )
            parts_hash.append(np.asarray(a[f"{name}_hash"])[usable])
            parts_row.append(base_position[stored_rows[usable]])
        keys = HashedKeys.build(np.concatenate(parts_hash).astype(np.uint64), np.concatenate(parts_row))
        out.save(f"{name}_hash", keys.hashes)
        out.save(f"{name}_hash_row", keys.rows)

    hashed("id", [(changed_position[node.id], node.id) for node in changed])
    leaves = [node for node in changed if node.is_leaf]
    hashed("text", [(changed_position[node.id], text_key(node.text, node.source_id)) for node in leaves])
    hashed("source", [(changed_position[node.id], node.source_id) for node in leaves if node.source_id is not None])
    leaf_rows = np.flatnonzero(is_leaf)
    expiring = leaf_rows[~np.isnan(expires[leaf_rows])]
    by_expiry = np.lexsort((expiring, expires[expiring]))
    out.save("expiry", expires[expiring][by_expiry])
    out.save("expiry_row", expiring[by_expiry].astype(np.int32))

    lexical = _write_lexical(out, merged, base, [node.text for node in changed])
    if ivf is not None:
        out.save("ann_centroids", ivf.centroids)
        out.save("ann_offsets", ivf.offsets)
    root = frozen.root
    return {
        "format": FORMAT,
        "version": VERSION,
        "namespace": list(frozen.namespace),
        "generation": frozen.generation,
        "identity": frozen.identity,
        "seq": frozen.seq,
        "rows": rows,
        "dimension": d,
        "info": {
            "dimension": frozen.info.dimension,
            "embedder": frozen.info.embedder,
            "settings": frozen.info.settings,
        },
        "root": {
            "leaf_count": root.leaf_count,
            "created_at": root.created_at,
            "updated_at": root.updated_at,
            "metadata": root.metadata,
            "stale": root.stale,
        },
        "lexical": lexical,
        "ann": {"lists": int(ivf.centroids.shape[0]), "trained_rows": ivf.trained_rows} if ivf is not None else None,
        "files": out.files,
        **frozen.extra,
    }


def _write_lexical(out: _Writer, merged: _Rows, base: Segment | None, texts: list[str]) -> dict[str, int]:
    """The BM25 arrays: the clean rows' term lists copied, the changed texts counted
    and their words numbered after the base's vocabulary; postings regrouped by term."""
    counted = count_terms(texts)
    base_words = base.lexical_base() if base is not None else None
    known = base_words.terms if base_words is not None else 0
    texts = [word if isinstance(word, str) else word.decode("ascii") for word in counted.words]
    numbering = base_words.terms_of(texts) if base_words is not None else np.full(len(texts), -1, dtype=np.int64)
    unknown = np.flatnonzero(numbering < 0)
    numbering[unknown] = known + np.arange(unknown.size)
    new_words = [texts[i] for i in unknown.tolist()]
    changed_forward = counted.forward
    if changed_forward.size:
        changed_forward = (numbering[changed_forward >> _TERM_SHIFT] << _TERM_SHIFT) | (changed_forward & _TF_MASK)
    a = base.arrays if base is not None else None
    forward, forward_offsets = merged.merge_runs(
        a["lex_forward"] if a is not None else None,
        np.asarray(a["lex_forward_offsets"]) if a is not None else None,
        changed_forward,
        counted.forward_offsets,
        np.int64,
    )
    lengths = np.zeros(merged.count, dtype=np.float64)
    if a is not None and merged.from_base.any():
        lengths[merged.from_base] = np.asarray(a["lex_lengths"])[merged.base_row[merged.from_base]]
    lengths[~merged.from_base] = counted.lengths[merged.changed_index[~merged.from_base]]
    numbered = known + len(new_words)
    entry_terms = forward >> _TERM_SHIFT
    # Only words some row still holds are kept, renumbered in order: a word that only
    # deleted or replaced texts had leaves the vocabulary with them (nothing of a removed
    # text is carried into the next segment).
    live = np.bincount(entry_terms, minlength=numbered) > 0
    renumber = np.cumsum(live, dtype=np.int64) - 1
    kept_terms = np.flatnonzero(live)
    terms_total = int(kept_terms.size)
    if terms_total < numbered:
        entry_terms = renumber[entry_terms]
        forward = (entry_terms << _TERM_SHIFT) | (forward & _TF_MASK)
    entry_rows = np.repeat(np.arange(merged.count, dtype=np.int64), np.diff(forward_offsets))
    grouped = stable_order(entry_terms)
    sizes = np.bincount(entry_terms, minlength=terms_total).astype(np.int64)
    posting_offsets = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
    postings = np.zeros((forward.size, 3), dtype=np.int32)
    postings[:, 0] = entry_rows[grouped]
    postings[:, 1] = (forward & _TF_MASK)[grouped]
    present = np.flatnonzero(sizes)
    tf_max = np.zeros(terms_total, dtype=np.int64)
    length_min = np.zeros(terms_total, dtype=np.float64)
    if present.size:
        tf_max[present] = np.maximum.reduceat(postings[:, 1], posting_offsets[present])
        length_min[present] = np.minimum.reduceat(lengths[postings[:, 0]], posting_offsets[present])
    if a is not None:
        term_blob, term_offsets = _append_texts(a["lex_term_blob"], np.asarray(a["lex_term_offsets"]), new_words)
        hashes = np.concatenate((np.asarray(a["lex_term_hash"]), key_hashes(new_words)))
        term_rows = np.concatenate((np.asarray(a["lex_term_hash_row"], dtype=np.int64), np.arange(known, numbered)))
    else:
        term_blob, term_offsets = encode_texts(new_words)
        hashes, term_rows = key_hashes(new_words), np.arange(numbered)
    if terms_total < numbered:
        term_blob, term_offsets = gather_texts(np.asarray(term_blob), np.asarray(term_offsets), kept_terms)
        held = live[term_rows]
        hashes, term_rows = hashes[held], renumber[term_rows[held]]
    keys = HashedKeys.build(hashes.astype(np.uint64), term_rows)
    out.save("lex_term_blob", term_blob)
    out.save("lex_term_offsets", term_offsets)
    out.save("lex_term_hash", keys.hashes)
    out.save("lex_term_hash_row", keys.rows)
    out.save("lex_postings", postings)
    out.save("lex_posting_offsets", posting_offsets)
    out.save("lex_forward", forward)
    out.save("lex_forward_offsets", forward_offsets)
    out.save("lex_lengths", lengths)
    out.save("lex_tf_max", tf_max)
    out.save("lex_length_min", length_min)
    return {"total_length": int(lengths.sum()), "documents": merged.count, "words": terms_total}


def _append_texts(blob: np.ndarray, offsets: IntArray, texts: list[str]) -> tuple[np.ndarray, IntArray]:
    more, more_offsets = encode_texts(texts)
    return np.concatenate((np.asarray(blob), more)), np.concatenate((offsets, offsets[-1] + more_offsets[1:]))


def _metadata_text(node: Node) -> str:
    if not node.metadata:
        return ""
    return json.dumps(node.metadata, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def _nan(value: float | None) -> float:
    return float("nan") if value is None else value
