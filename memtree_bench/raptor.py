"""An offline RAPTOR-style tree: the benchmark's "full access to the conversation" baseline.

RAPTOR (Sarthi et al. 2024, "Recursive Abstractive Processing for Tree-Organized
Retrieval") sees the whole corpus before building anything, which an incremental
memory never does, so it bounds what a tree can gain from hindsight. Per level it
reduces the embeddings' dimension, fits Gaussian mixtures (the number of components
chosen by BIC), assigns each node to every component whose probability exceeds a
threshold (a node may have several parents), clusters globally and then locally
inside each global cluster, reclusters groups too long for the summarizer, writes
one summary per cluster and embeds it; the summaries are the next level's input.
Retrieval is RAPTOR's "collapsed tree": one cosine top-N over every node of every level.

Differences from the reference implementation, and why:

* PCA replaces UMAP (only scikit-learn is available). The local step refits PCA on
  each global cluster's members, so it still looks at within-cluster directions.
* A node whose probabilities all fall under the threshold keeps its most likely
  cluster (the reference would drop it from the level above).
* Reclustering a group that clustering did not divide falls back to a hard split
  into enough mixture components to fit the word limit (the reference can recurse
  forever there).
* Levels stop as in RAPTOR (at most ``reduction_dimension + 1`` nodes left, so the
  top level holds up to that many nodes, not one root), and also when one cluster
  remains, ``max_levels`` is reached, or clustering merged nothing.
* A cluster of one node still becomes a summary node (RAPTOR does), which copies
  its child's text when that text fits the summary; search indexes each distinct
  text once (the lowest-level node holding it), so a copy never spends the budget twice.
* Summaries come from memtree's :class:`~memtree.aggregate.Aggregator` (extractive
  by default), the same writer the memory under test uses.

scikit-learn is optional: ``pip install "memtree-llm[bench]"``.

Example::

    tree = RaptorTree.build(turns, LocalEmbedder(), ExtractiveAggregator())
    hits = tree.search(embedder.embed_query("When did Caroline move?"), 10)
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import faiss
import numpy as np
import numpy.typing as npt

from memtree.aggregate import Aggregator, ExtractiveAggregator
from memtree.embed import Embedder, Matrix, check_embeddings
from memtree.text import count_words, require_text

Groups = list[list[int]]

COVARIANCE_TYPES = ("full", "diag", "spherical", "tied")
"""Covariance models of the Gaussian mixtures (scikit-learn's ``covariance_type``)."""


@dataclass(frozen=True)
class RaptorSettings:
    """How a :class:`RaptorTree` is built; the defaults are RAPTOR's where it has one.

    ``max_levels`` caps the summary levels above the leaves; ``reduction_dimension``
    is the PCA target (RAPTOR's UMAP dimension, 10); ``threshold`` is the soft
    assignment's probability cut (0.1); ``max_clusters`` bounds the BIC search (50);
    ``max_cluster_words`` is the summarizer's input limit above which a cluster is
    clustered again (memtree's ``aggregation_max_words``); ``seed`` fixes the mixtures.
    """

    max_levels: int = 5
    reduction_dimension: int = 10
    threshold: float = 0.1
    max_clusters: int = 50
    max_cluster_words: int = 2000
    covariance: str = "full"
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("max_levels", "reduction_dimension", "max_clusters", "max_cluster_words"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed must be a non-negative int, got {self.seed!r}")
        if self.covariance not in COVARIANCE_TYPES:
            raise ValueError(f"covariance must be one of {', '.join(COVARIANCE_TYPES)}; got {self.covariance!r}")
        if not 0.0 < self.threshold < 1.0:
            raise ValueError(f"threshold must be strictly between 0 and 1, got {self.threshold!r}")


@dataclass(frozen=True)
class RaptorNode:
    """One node: a leaf (level 0, one input text) or the summary of a cluster.

    ``children`` are node ids one level below (empty for a leaf); ``leaves`` are the
    ids of every leaf under the node (the node itself for a leaf). Ids are positions
    in :attr:`RaptorTree.nodes`; leaf ``i`` is input text ``i``.
    """

    text: str
    level: int
    children: tuple[int, ...]
    leaves: tuple[int, ...]

    @property
    def is_leaf(self) -> bool:
        return self.level == 0


@dataclass(frozen=True)
class RaptorHit:
    """One search result: a node's text, its cosine similarity, level and kind."""

    text: str
    score: float
    level: int
    is_leaf: bool


@dataclass(frozen=True)
class RaptorBuildStats:
    """What building cost.

    ``embedding_calls`` are the tree's own embedder calls (one batch for the leaves,
    one per summary level) and ``embedded_texts`` the texts in them;
    ``aggregation_calls`` the summaries written; ``aggregator_embedding_calls`` the
    calls an :class:`~memtree.aggregate.ExtractiveAggregator` made to embed sentences.
    """

    embedding_calls: int
    embedded_texts: int
    aggregation_calls: int
    aggregator_embedding_calls: int
    seconds: float


class RaptorTree:
    """A RAPTOR-style tree built offline, searched collapsed (every node at once).

    Build one with :meth:`build`; the constructor takes already-built parts.
    """

    def __init__(self, nodes: Sequence[RaptorNode], embeddings: Matrix, stats: RaptorBuildStats) -> None:
        if len(nodes) != len(embeddings):
            raise ValueError(f"{len(nodes)} nodes but {len(embeddings)} embeddings")
        self.nodes: tuple[RaptorNode, ...] = tuple(nodes)
        self.embeddings: Matrix = np.ascontiguousarray(embeddings, dtype=np.float32)
        self.embeddings.flags.writeable = False
        self.stats = stats
        self._searchable = _first_of_each_text(self.nodes)
        self._index = faiss.IndexFlatIP(self.embeddings.shape[1])
        self._index.add(self.embeddings[self._searchable])

    @classmethod
    def build(
        cls,
        texts: Sequence[str],
        embedder: Embedder,
        aggregator: Aggregator,
        *,
        max_levels: int = 5,
        seed: int = 0,
        reduction_dimension: int = 10,
        threshold: float = 0.1,
        max_clusters: int = 50,
        max_cluster_words: int = 2000,
        covariance: str = "full",
    ) -> RaptorTree:
        """Embed ``texts`` as leaves and cluster and summarize level after level.

        Deterministic for a given ``seed`` (and deterministic embedder and
        aggregator). An :class:`~memtree.aggregate.ExtractiveAggregator` without an
        embedder is bound to ``embedder``, as :class:`~memtree.MemTree` does.
        Raises ``ValueError`` for an empty list or a blank text, ``TypeError`` for
        a non-str text, ``ImportError`` without scikit-learn.
        """
        settings = RaptorSettings(
            max_levels=max_levels,
            reduction_dimension=reduction_dimension,
            threshold=threshold,
            max_clusters=max_clusters,
            max_cluster_words=max_cluster_words,
            covariance=covariance,
            seed=seed,
        )
        leaves = _check_texts(texts)
        if not isinstance(embedder, Embedder):
            raise TypeError(f"embedder must be a memtree Embedder, got {type(embedder).__name__}")
        if not isinstance(aggregator, Aggregator):
            raise TypeError(f"aggregator must be a memtree Aggregator, got {type(aggregator).__name__}")
        clusterer = _Clusterer(settings)
        if isinstance(aggregator, ExtractiveAggregator):
            aggregator = aggregator.bound_to(embedder)
        return _Builder(embedder, aggregator, clusterer, settings).run(leaves)

    @property
    def embedding_calls(self) -> int:
        """The tree's own embedder calls (see :class:`RaptorBuildStats`)."""
        return self.stats.embedding_calls

    @property
    def aggregation_calls(self) -> int:
        """Summaries written while building."""
        return self.stats.aggregation_calls

    @property
    def levels(self) -> int:
        """Levels including the leaves (1 when nothing was summarized)."""
        return self.nodes[-1].level + 1

    def level(self, level: int) -> list[int]:
        """Ids of the nodes at ``level`` (0 = leaves)."""
        if not 0 <= level < self.levels:
            raise ValueError(f"level must be between 0 and {self.levels - 1}, got {level}")
        return [i for i, node in enumerate(self.nodes) if node.level == level]

    def shape(self) -> dict[str, float]:
        """Nodes, leaves, summaries, levels, depth, mean branching and the number of
        distinct texts search scores (``searchable``), as numbers.

        Depths count as in a memtree (a text-less root above the top level has depth
        0): every leaf lies under the top level, so ``max_depth`` and ``mean_depth``
        both equal ``levels``. ``branching`` is the mean number of children of the
        summaries (0 without summaries); soft assignment lets a child count under
        several parents.
        """
        summaries = [node for node in self.nodes if not node.is_leaf]
        leaves = len(self.nodes) - len(summaries)
        return {
            "nodes": float(len(self.nodes)),
            "leaves": float(leaves),
            "summaries": float(len(summaries)),
            "levels": float(self.levels),
            "max_depth": float(self.levels),
            "mean_depth": float(self.levels),
            "branching": sum(len(n.children) for n in summaries) / len(summaries) if summaries else 0.0,
            "searchable": float(len(self._searchable)),
        }

    def search(self, query_vector: Any, limit: int) -> list[RaptorHit]:
        """The ``limit`` nodes most cosine-similar to ``query_vector``, best first,
        over every level at once (RAPTOR's collapsed tree)."""
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"limit must be a positive int, got {limit!r}")
        query = _check_query(query_vector, self.embeddings.shape[1])
        scores, rows = self._index.search(query, min(limit, len(self._searchable)))
        hits = []
        for score, row in zip(scores[0], rows[0], strict=True):
            node = self.nodes[self._searchable[row]]
            hits.append(RaptorHit(node.text, float(score), node.level, node.is_leaf))
        return hits


class _Builder:
    """One build: embeds, clusters, summarizes and counts the calls."""

    def __init__(self, embedder: Embedder, aggregator: Aggregator, clusterer: _Clusterer, settings: RaptorSettings):
        self.embedder = embedder
        self.aggregator = aggregator
        self.clusterer = clusterer
        self.settings = settings
        self.embedding_calls = 0
        self.embedded_texts = 0
        self.aggregation_calls = 0
        self.dimension: int | None = None

    def run(self, texts: list[str]) -> RaptorTree:
        start = time.perf_counter()
        aggregator_calls_before = getattr(self.aggregator, "embedding_calls", 0)
        nodes = [RaptorNode(text, 0, (), (i,)) for i, text in enumerate(texts)]
        matrices = [self._embed(texts)]
        current = list(range(len(nodes)))
        for level in range(1, self.settings.max_levels + 1):
            if len(current) <= self.settings.reduction_dimension + 1:
                break  # RAPTOR's stop: too few nodes to fit a mixture in the reduced space
            embeddings = np.vstack(matrices)
            groups = self.clusterer.clusters(embeddings[current], [count_words(nodes[i].text) for i in current])
            if len(groups) >= len(current):  # nothing merged: a level of copies adds no abstraction
                break
            summaries = [self._summarize(nodes, embeddings, [current[i] for i in group], level) for group in groups]
            matrices.append(self._embed([summary.text for summary in summaries]))
            current = list(range(len(nodes), len(nodes) + len(summaries)))
            nodes.extend(summaries)
            if len(groups) == 1:
                break
        stats = RaptorBuildStats(
            embedding_calls=self.embedding_calls,
            embedded_texts=self.embedded_texts,
            aggregation_calls=self.aggregation_calls,
            aggregator_embedding_calls=getattr(self.aggregator, "embedding_calls", 0) - aggregator_calls_before,
            seconds=time.perf_counter() - start,
        )
        return RaptorTree(nodes, np.vstack(matrices), stats)

    def _summarize(self, nodes: list[RaptorNode], embeddings: Matrix, children: list[int], level: int) -> RaptorNode:
        leaves = sorted({leaf for child in children for leaf in nodes[child].leaves})
        centroid = embeddings[leaves].mean(axis=0).astype(np.float32)
        self.aggregation_calls += 1
        text = self.aggregator.aggregate("", [nodes[child].text for child in children], 0, centroid=centroid)
        if not isinstance(text, str) or not text.strip():
            raise RuntimeError(
                f"{type(self.aggregator).__name__} returned an empty summary for a cluster of "
                f"{len(children)} nodes at level {level}"
            )
        return RaptorNode(text, level, tuple(children), tuple(leaves))

    def _embed(self, texts: list[str]) -> Matrix:
        self.embedding_calls += 1
        self.embedded_texts += len(texts)
        raw = self.embedder.embed(texts)
        vectors = check_embeddings(raw, len(texts), self.dimension, type(self.embedder).__name__)
        self.dimension = vectors.shape[1]
        return vectors


class _Clusterer:
    """RAPTOR's clustering of one level, on PCA-reduced embeddings with scikit-learn."""

    def __init__(self, settings: RaptorSettings) -> None:
        self.settings = settings
        self._pca, self._mixture = _load_sklearn()

    def clusters(self, vectors: Matrix, words: Sequence[int]) -> Groups:
        """Groups of row indices (overlapping where assignment is soft), each within
        ``max_cluster_words`` unless it is a single row."""
        out: Groups = []
        for group in self._global_then_local(vectors):
            if len(group) == len(vectors) and not self._fits(group, words):
                # Clustering did not divide a group that is too long: split it hard.
                pieces = self._hard_split(vectors[group], sum(words[i] for i in group))
                for piece in pieces:
                    out.extend(self._within_limit(vectors, words, [group[i] for i in piece]))
            else:
                out.extend(self._within_limit(vectors, words, group))
        return _unique(out)

    def _within_limit(self, vectors: Matrix, words: Sequence[int], group: list[int]) -> Groups:
        """``group`` itself if it fits, else its own clusters (it is smaller than the
        input, so the recursion ends)."""
        if self._fits(group, words):
            return [group]
        inner = self.clusters(vectors[group], [words[i] for i in group])
        return [[group[i] for i in part] for part in inner]

    def _fits(self, group: list[int], words: Sequence[int]) -> bool:
        return len(group) == 1 or sum(words[i] for i in group) <= self.settings.max_cluster_words

    def _global_then_local(self, vectors: Matrix) -> Groups:
        n = len(vectors)
        if n <= 2:
            return [list(range(n))]
        dimension = self.settings.reduction_dimension
        groups: Groups = []
        for members in self._mixture_clusters(self._reduce(vectors, min(dimension, n - 2))):
            if len(members) <= dimension + 1:  # too few points to fit a local mixture (RAPTOR's rule)
                groups.append(members)
                continue
            local = self._mixture_clusters(self._reduce(vectors[members], dimension))
            groups.extend([members[i] for i in part] for part in local)
        return groups

    def _reduce(self, vectors: Matrix, dimension: int) -> np.ndarray:
        dimension = max(1, min(dimension, vectors.shape[1], len(vectors) - 1))
        return self._pca(n_components=dimension, svd_solver="full").fit_transform(vectors.astype(np.float64))

    def _mixture_clusters(self, points: np.ndarray) -> Groups:
        """Soft clusters of a Gaussian mixture whose size minimizes BIC."""
        n = len(points)
        best: Any = None
        best_bic = math.inf
        for components in range(1, max(2, min(self.settings.max_clusters, n))):
            model = self._fit(points, components)
            bic = float(model.bic(points))
            if bic < best_bic:
                best, best_bic = model, bic
        probabilities = best.predict_proba(points)
        member = probabilities > self.settings.threshold
        member[np.arange(n), probabilities.argmax(axis=1)] = True
        return [np.flatnonzero(column).tolist() for column in member.T if column.any()]

    def _hard_split(self, vectors: Matrix, words: int) -> Groups:
        """At least two hard clusters, enough to fit the word limit; contiguous
        chunks when the mixture cannot tell the rows apart (identical vectors)."""
        n = len(vectors)
        parts = min(n, max(2, math.ceil(words / self.settings.max_cluster_words)))
        points = self._reduce(vectors, self.settings.reduction_dimension)
        labels = self._fit(points, parts).predict(points)
        groups = [np.flatnonzero(labels == label).tolist() for label in np.unique(labels)]
        if len(groups) > 1:
            return groups
        return [chunk.tolist() for chunk in np.array_split(np.arange(n), parts)]

    def _fit(self, points: np.ndarray, components: int) -> Any:
        from sklearn.exceptions import ConvergenceWarning

        with warnings.catch_warnings():  # near-duplicate points make some fits degenerate; BIC rejects them
            warnings.simplefilter("ignore", ConvergenceWarning)
            return self._mixture(
                n_components=components, covariance_type=self.settings.covariance, random_state=self.settings.seed
            ).fit(points)


def _unique(groups: Groups) -> Groups:
    """Groups sorted by their members, each once (two components may claim the same
    members); the order of mixture components carries no meaning."""
    return [list(key) for key in sorted({tuple(sorted(group)) for group in groups})]


def _first_of_each_text(nodes: Sequence[RaptorNode]) -> npt.NDArray[np.int64]:
    """Ids of the nodes search scores: each distinct text once, at its lowest level."""
    seen: set[str] = set()
    ids = []
    for i, node in enumerate(nodes):  # nodes are stored level by level
        if node.text not in seen:
            seen.add(node.text)
            ids.append(i)
    return np.asarray(ids, dtype=np.int64)


def _check_texts(texts: Sequence[str]) -> list[str]:
    if isinstance(texts, (str, bytes)):
        raise TypeError("texts must be a sequence of str, not a single string; wrap it in a list")
    items = list(texts)
    if not items:
        raise ValueError("texts is empty; a RAPTOR tree needs at least one text")
    return [require_text(text, f"texts[{i}]") for i, text in enumerate(items)]


def _check_query(query_vector: Any, dimension: int) -> Matrix:
    try:
        query = np.asarray(query_vector, dtype=np.float32)
    except (TypeError, ValueError) as error:
        raise ValueError(f"query_vector is not a numeric vector: {error}") from None
    if query.ndim == 2 and query.shape[0] == 1:
        query = query[0]
    if query.shape != (dimension,):
        raise ValueError(f"query_vector has shape {query.shape}; this tree's embeddings have dimension {dimension}")
    if not np.isfinite(query).all():
        raise ValueError("query_vector holds NaN or infinite values")
    norm = float(np.linalg.norm(query))
    if norm == 0.0:
        raise ValueError("query_vector is all zeros, which has no direction")
    return np.ascontiguousarray((query / norm)[None, :], dtype=np.float32)


def _load_sklearn() -> tuple[Any, Any]:
    try:
        from sklearn.decomposition import PCA
        from sklearn.mixture import GaussianMixture
    except ImportError as error:
        raise ImportError('RaptorTree needs scikit-learn: pip install "memtree-llm[bench]"') from error
    return PCA, GaussianMixture
