"""Translation between LlamaIndex nodes and memtree leaves and retrieval results.

A LlamaIndex node becomes a leaf: its text (without metadata), its metadata, its
node id as the leaf's ``source_id`` and, optionally, an event time read from one
metadata key. A retrieval result becomes a ``NodeWithScore``: a leaf comes back as
its original node from the docstore (relationships intact), a summary as a new
``TextNode`` whose ``CHILD`` relationships name the nodes it summarizes. Both carry
the tree's view of them in their metadata, hidden from the LLM and the embedder.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from llama_index.core.schema import (
    BaseNode,
    Document,
    MetadataMode,
    NodeRelationship,
    NodeWithScore,
    RelatedNodeInfo,
    TextNode,
)
from llama_index.core.storage.docstore.types import BaseDocumentStore

from memtree import Node, RetrievedNode
from memtree.inputs import Item, make_item
from memtree.node import time_text

logger = logging.getLogger(__name__)

RESULT_METADATA_KEYS: tuple[str, ...] = (
    "memtree_id",
    "depth",
    "is_leaf",
    "timestamp",
    "leaf_ids",
    "memtree_score",
    "found_by",
    "answered_by",
)
"""Metadata keys every retrieved node carries (they replace same-named keys of the
node's own metadata in the returned copy; the stored node is untouched)."""


def node_text(node: BaseNode) -> str:
    """The text a node contributes as a leaf: its content without metadata."""
    return node.get_content(metadata_mode=MetadataMode.NONE)


def without_empty_documents(documents: Sequence[Document]) -> list[Document]:
    """The documents that have text; each one skipped is named in a warning.
    Anything but a LlamaIndex ``Document`` raises ``TypeError`` naming its position."""
    kept = []
    for position, document in enumerate(documents):
        if not isinstance(document, Document):
            raise TypeError(
                f"documents must be llama_index Document objects, got {type(document).__name__} at position "
                f"{position}; wrap texts as llama_index.core.Document(text=...), or pass nodes to MemTreeIndex(nodes)"
            )
        if (document.text or "").strip():
            kept.append(document)
        else:
            logger.warning("skipping document %r: its text is empty", document.doc_id)
    return kept


def without_empty_nodes(nodes: Sequence[BaseNode]) -> list[BaseNode]:
    """The nodes that have text; each one skipped is named in a warning.
    Anything but a LlamaIndex node raises ``TypeError`` naming its position."""
    kept = []
    for position, node in enumerate(nodes):
        if not isinstance(node, BaseNode):
            raise TypeError(
                f"nodes must be llama_index nodes (BaseNode, such as TextNode), got {type(node).__name__} at "
                f"position {position}; wrap texts as llama_index.core.schema.TextNode(text=...)"
            )
        if node_text(node).strip():
            kept.append(node)
        else:
            logger.warning("skipping node %r: its text is empty", node.node_id)
    return kept


def leaf_item(node: BaseNode, timestamp_key: str | None) -> Item:
    """The leaf a node becomes, checked: its text, metadata, event time (read from
    ``timestamp_key``) and its node id as ``source_id``. Bad input raises the
    engine's ``TypeError`` / ``ValueError`` prefixed with the node id."""
    timestamp = node.metadata.get(timestamp_key) if timestamp_key is not None else None
    try:
        return make_item(node_text(node), node.metadata, timestamp, node.node_id)
    except (TypeError, ValueError) as error:
        raise type(error)(f"node {node.node_id!r}: {error}") from None


def holds(leaf: Node, item: Item) -> bool:
    """Whether a stored leaf already holds exactly what ``item`` would store."""
    return (leaf.text, leaf.metadata, leaf.timestamp) == (item.text, item.metadata, item.timestamp)


def result_metadata(hit: RetrievedNode) -> dict[str, Any]:
    """The tree's view of a result: its memtree id, depth, kind, event time (ISO 8601,
    ``None``, or the raw number when no date can show it), the memtree ids of the
    leaves below it and the engine's ranking score (hybrid, see :func:`result_score`)."""
    return {
        "memtree_id": hit.id,
        "depth": hit.depth,
        "is_leaf": hit.is_leaf,
        "timestamp": time_text(hit.timestamp),
        "leaf_ids": list(hit.leaf_ids),
        "memtree_score": hit.score,
        "found_by": hit.found_by,
        "answered_by": hit.answered_by,
    }


def result_score(hit: RetrievedNode) -> float:
    """The score LlamaIndex sees: the cosine of the node with the query.

    The engine ranks by a hybrid score (cosine and BM25 mixed, summaries
    discounted) on another scale; LlamaIndex's ``SimilarityPostprocessor`` and
    every ``similarity_cutoff`` tuned on a ``VectorStoreIndex`` compare cosines, so
    the cosine is what keeps their meaning here. The order stays the engine's:
    scores need not decrease down the list (the hybrid score is in the node's
    ``memtree_score`` metadata).
    """
    return hit.similarity if hit.similarity is not None else hit.score


def to_node_with_score(
    hit: RetrievedNode,
    docstore: BaseDocumentStore | None,
    source_ids: Mapping[str, str | None],
) -> NodeWithScore:
    """One result as LlamaIndex sees it; its text is the result's ``context`` (what it
    adds to the results above it, cut to the token budget).

    ``source_ids`` maps leaf ids to their LlamaIndex node ids (leaves missing from it
    were deleted meanwhile and are left out of a summary's relationships).
    """
    extra = result_metadata(hit)
    node: BaseNode | None = None
    if hit.is_leaf and hit.source_id is not None and docstore is not None:
        stored = docstore.get_node(hit.source_id, raise_error=False)
        if stored is not None:
            node = stored.model_copy(deep=True)
            if isinstance(node, TextNode):
                node.text = hit.context
    if node is None:
        node = TextNode(id_=hit.source_id or hit.id, text=hit.context, metadata=dict(hit.metadata))
        if not hit.is_leaf:
            sources = [source_ids.get(leaf_id) for leaf_id in hit.leaf_ids]
            node.relationships[NodeRelationship.CHILD] = [
                RelatedNodeInfo(node_id=source) for source in sources if source is not None
            ]
    node.metadata.update(extra)
    for excluded in (node.excluded_llm_metadata_keys, node.excluded_embed_metadata_keys):
        excluded.extend(key for key in RESULT_METADATA_KEYS if key not in excluded)
    return NodeWithScore(node=node, score=result_score(hit))
