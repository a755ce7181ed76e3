"""LoCoMo research: can the tree's (extractive) summaries add evidence recall over
flat hybrid retrieval and over hybrid retrieval of the tree's leaves alone?

Building memtree's tree for a conversation costs about a minute; scoring a way of
reading it costs seconds. So each conversation's tree is built once with the
engine (``MemTree.add`` turn by turn, the defaults unless a tree variant says
otherwise), exported with ``MemTree.export_jsonl`` into a cache directory, and every
retrieval/packing variant is then scored over the cached trees, with the metric of
design.md §5 (:mod:`memtree_bench.metrics`). Embeddings of every text (turns,
summaries, sentences, questions) are cached on disk too, so a re-run embeds nothing.

The variants re-implement the engine's ranking in numpy over a whole tree
(``Scene``); ``--check`` verifies that the engine's own ``retrieve`` and this
re-implementation give the same contexts for the default and leaves-only rows.

    python benchmarks/locomo_research.py --data ../shared/data/locomo10.json \\
        --cache /tmp/locomo-cache --conversations 0-2 --out benchmarks/results --name locomo_research_slice

Writes ``<name>.md`` and ``<name>.json``: evidence recall at each budget overall
and per category, and answer recall for categories 1 and 4, per variant.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from memtree.aggregate import ExtractiveAggregator  # noqa: E402
from memtree.config import MemTreeConfig  # noqa: E402
from memtree.digest import DigestAggregator  # noqa: E402
from memtree.embed import Embedder, Matrix  # noqa: E402
from memtree.lexical import lexical_tokens  # noqa: E402
from memtree.retrieval import SUMMARY_WEIGHT  # noqa: E402
from memtree.summary_hits import LEAF_ALLOWANCE, SUMMARY_HIT_WEIGHT  # noqa: E402
from memtree.text import (  # noqa: E402
    count_tokens,
    count_words,
    fold,
    split_sentences,
)
from memtree_bench.locomo import (  # noqa: E402
    CATEGORY_NAMES,
    RETRIEVAL_CATEGORIES,
    Conversation,
    first_sessions,
    load_locomo,
    select_conversations,
)
from memtree_bench.metrics import answer_recall, contexts_at_budgets, evidence_recall  # noqa: E402
from memtree_bench.report import machine_info, machine_lines, markdown_table  # noqa: E402
from memtree_bench.saved_trees import SavedTrees, TreeRecipe  # noqa: E402

BUDGETS: tuple[int, ...] = (250, 500, 1000, 2000)
WEIGHT = MemTreeConfig().lexical_weight
DEFAULT_ROW = f"collapsed, summaries x {SUMMARY_WEIGHT}, a summary delivers its text (the previous default)"
POINTER_ROW = (
    f"summaries x {SUMMARY_HIT_WEIGHT}, a summary hit delivers its best leaves up to {LEAF_ALLOWANCE:g}x "
    "its length (the engine default)"
)


# -- embeddings cached on disk ------------------------------------------------------------


class DiskCachedEmbedder(Embedder):
    """Remembers every vector it computed, keyed by the text's SHA-1, in ``path``
    (``.npz``); a text is embedded once across runs."""

    def __init__(self, inner: Embedder, path: Path) -> None:
        self.inner = inner
        self.path = path
        self._keys: dict[str, int] = {}
        self._rows: list[np.ndarray] = []
        self._dirty = False
        if path.with_suffix(".npz").exists():
            with np.load(path.with_suffix(".npz")) as stored:
                self._keys = {str(key): i for i, key in enumerate(stored["keys"])}
                self._rows = list(stored["vectors"])

    @property
    def name(self) -> str:
        return self.inner.name

    @staticmethod
    def _key(text: str) -> str:
        return hashlib.sha1(text.encode("utf-8")).hexdigest()

    def embed(self, texts: Sequence[str]) -> Matrix:
        keys = [self._key(text) for text in texts]
        missing = list(dict.fromkeys(t for t, k in zip(texts, keys, strict=True) if k not in self._keys))
        if missing:
            vectors = np.asarray(self.inner.embed(missing), dtype=np.float32)
            for text, vector in zip(missing, vectors, strict=True):
                self._keys[self._key(text)] = len(self._rows)
                self._rows.append(vector)
            self._dirty = True
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        return np.stack([self._rows[self._keys[key]] for key in keys])

    @property
    def pools_parts(self) -> bool:  # type: ignore[override]
        return self.inner.pools_parts

    def embed_parts(self, texts: Sequence[str], parts: Sequence[Sequence[str]]) -> tuple[Matrix, list[Matrix]]:
        """The inner model's pooled parts, cached under their text and part (a part's
        vector depends on the text around it), so trees build as the engine's do."""
        if not self.inner.pools_parts:
            return super().embed_parts(texts, parts)
        keys = [
            [self._key(f"{text}\x00part\x00{part}") for part in own] for text, own in zip(texts, parts, strict=True)
        ]
        wanted = [self._key(text) for text in texts] + [key for own in keys for key in own]
        if any(key not in self._keys for key in wanted):
            vectors, part_vectors = self.inner.embed_parts(texts, parts)
            for text, vector, own, rows in zip(texts, vectors, keys, part_vectors, strict=True):
                for key, row in [(self._key(text), vector), *zip(own, rows, strict=True)]:
                    if key not in self._keys:
                        self._keys[key] = len(self._rows)
                        self._rows.append(np.asarray(row, dtype=np.float32))
            self._dirty = True
        text_rows = np.stack([self._rows[self._keys[self._key(text)]] for text in texts])
        return text_rows, [np.stack([self._rows[self._keys[key]] for key in own]) for own in keys]

    def save(self) -> None:
        if not self._dirty:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        keys = sorted(self._keys, key=self._keys.__getitem__)
        # One file, written beside and renamed: a concurrent reader never sees half of it.
        partial = self.path.with_suffix(f".{os.getpid()}.npz")
        np.savez(partial, keys=np.array(keys), vectors=np.stack(self._rows).astype(np.float32))
        partial.replace(self.path.with_suffix(".npz"))
        self._dirty = False


# -- the trees, built once by the engine ----------------------------------------------------


@dataclass(frozen=True)
class TreeKind:
    """How a cached tree is built: the engine's config and the extractive summaries' word budget."""

    name: str
    config: dict[str, Any] = field(default_factory=dict)
    max_words: int = 80
    min_words: int = 24
    aggregator: str = "extractive"  # or "digest" (memtree.digest.DigestAggregator)


TREES: dict[str, TreeKind] = {
    "default": TreeKind("default"),
    "summaries 40 words": TreeKind("summaries 40 words", max_words=40, min_words=12),
    "summaries 160 words": TreeKind("summaries 160 words", max_words=160, min_words=48),
    "digest": TreeKind("digest", max_words=40, min_words=24, aggregator="digest"),
    "paper": TreeKind("paper", config={"theta0": 0.4}),
}


def tree_file(cache: Path, kind: TreeKind, conversation: Conversation) -> Path:
    """Where a tree is cached (``cache`` is per embedder). Delete the cache when the
    engine's insert path changes: a cached tree is whatever the engine built then."""
    slug = kind.name.replace(" ", "-")
    return cache / "trees" / slug / f"{conversation.sample_id}.jsonl"


def build_tree(cache: Path, kind: TreeKind, conversation: Conversation, embedder: DiskCachedEmbedder) -> Path:
    """The engine's tree of this conversation, built turn by turn (as the benchmark
    does) and exported, unless the cache already holds it."""
    from memtree.tree import MemTree

    path = tree_file(cache, kind, conversation)
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    aggregator = (
        DigestAggregator(embedder, max_words=kind.max_words, min_words=kind.min_words)
        if kind.aggregator == "digest"
        else ExtractiveAggregator(embedder, max_words=kind.max_words, min_words=kind.min_words)
    )
    start = time.perf_counter()
    with MemTree(embedder=embedder, aggregator=aggregator, config=MemTreeConfig(**kind.config)) as memory:
        for turn in conversation.turns:
            memory.add(turn.text, timestamp=turn.timestamp, source_id=turn.dia_id)
        partial = path.with_suffix(".partial")
        memory.export_jsonl(partial)
        stats = memory.stats()
        shape = {
            "nodes": stats.nodes,
            "max_depth": stats.max_depth,
            "mean_leaf_depth": stats.mean_leaf_depth,
            "aggregation_calls_per_insert": stats.aggregation_calls_per_insert,
            "theta0": stats.theta0,
        }
        path.with_suffix(".stats.json").write_text(json.dumps(shape), encoding="utf-8")
        partial.replace(path)
    embedder.save()
    print(f"built {kind.name} tree of {conversation.sample_id} in {time.perf_counter() - start:.0f} s", flush=True)
    return path


def saved_tree(
    cache: Path, folder: Path, recipe: TreeRecipe, conversation: Conversation, embedder: Embedder
) -> tuple[Path, Conversation]:
    """A tree that ``memtree bench locomo --keep-trees`` built (a model-written one: an
    hour of a local model), exported into the cache for :class:`Scene`; or, while it
    is still being built, its last checkpoint with the conversation cut to the
    sessions the checkpoint holds (and the questions answered in them)."""
    trees = SavedTrees(folder)
    tree = trees.tree_path(conversation.sample_id, recipe)
    target = cache / "saved" / recipe.key / f"{conversation.sample_id}.jsonl"
    target.parent.mkdir(parents=True, exist_ok=True)
    if tree.is_file():
        facts = trees.load_sidecar(conversation.sample_id, recipe, len(conversation.turns))
        # The export is keyed by the tree's sha256, not its age: two folders may hold
        # a tree of one conversation and recipe (built by older and newer code), and
        # switching between them must never read the other folder's export.
        stamp = target.with_suffix(".sha256")
        exported = stamp.read_text().strip() if stamp.is_file() and target.exists() else None
        if exported != facts["tree_sha256"]:
            with trees.open(conversation.sample_id, recipe, embedder) as memory:
                memory.export_jsonl(target)
            stamp.write_text(facts["tree_sha256"] + "\n")
        return target, conversation
    checkpoint = trees.load_checkpoint(conversation.sample_id, recipe, len(conversation.turns))
    if checkpoint is None:
        raise FileNotFoundError(f"no saved tree or checkpoint of {conversation.sample_id} ({recipe.key}) in {folder}")
    backup, progress = checkpoint
    sessions = int(progress["sessions_done"])
    partial = target.with_name(f"{conversation.sample_id}.first-{sessions}-sessions.jsonl")
    partial.write_bytes(backup.read_bytes())
    return partial, first_sessions(conversation, sessions)


def add_saved_recipe_options(parser: argparse.ArgumentParser) -> None:
    """The options that name which saved trees to read (their recipe): the scripts
    that read ``--keep-trees`` folders share them."""
    parser.add_argument(
        "--saved-model", default="llama-cpp:qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", help="their --llm model name"
    )
    parser.add_argument("--saved-aggregator", default="llm", choices=("llm", "extractive"))
    parser.add_argument("--saved-aggregation", default="deferred", choices=("eager", "deferred"))


def saved_recipe(args: argparse.Namespace) -> TreeRecipe:
    """The recipe :func:`add_saved_recipe_options` named (the defaults' tree)."""
    model = args.saved_model if args.saved_aggregator == "llm" else None
    return TreeRecipe.of({}, args.saved_aggregator, model, args.saved_aggregation)


def make_embedder(kind: str, cache: Path) -> DiskCachedEmbedder:
    """``local`` (all-MiniLM-L6-v2, what the reports use) or ``hashing`` (tests)."""
    from memtree.embed import HashingEmbedder, LocalEmbedder

    inner: Embedder = HashingEmbedder(256) if kind == "hashing" else LocalEmbedder()
    return DiskCachedEmbedder(inner, cache / "embeddings")


# -- a cached tree as arrays ------------------------------------------------------------------


class BM25:
    """Okapi BM25 as :class:`memtree.lexical.LexicalIndex` scores it (k1 1.5, b 0.75,
    the same tokens), over a chosen subset of documents, as a vector over all of them.
    ``b`` may differ per document (length normalization of summaries). With
    ``statistics``, only those documents count towards idf and the average length (e.g.
    the leaves alone, so that summaries repeating their words do not lower their idf)."""

    k1 = 1.5

    def __init__(
        self,
        texts: Sequence[str],
        documents: np.ndarray,
        b: np.ndarray | float = 0.75,
        average_of: np.ndarray | None = None,
        statistics: np.ndarray | None = None,
    ) -> None:
        self.size = len(texts)
        tokens = [lexical_tokens(text) if documents[i] else [] for i, text in enumerate(texts)]
        lengths = np.array([len(t) for t in tokens], dtype=np.float64)
        counted = documents if statistics is None else statistics & documents
        self.count = int(counted.sum())
        average = lengths[counted].sum() / max(1, self.count) or 1.0
        if average_of is not None:  # per-document average length (e.g. summaries against summaries)
            average = average_of
        b_values = np.broadcast_to(np.asarray(b, dtype=np.float64), (self.size,))
        self.norm = self.k1 * (1.0 - b_values + b_values * lengths / average)
        postings: dict[str, dict[int, int]] = {}
        for i, words in enumerate(tokens):
            for word in words:
                postings.setdefault(word, {}).setdefault(i, 0)
                postings[word][i] += 1
        self.postings = {
            term: (np.fromiter(docs, dtype=np.int64), np.fromiter(docs.values(), dtype=np.float64))
            for term, docs in postings.items()
        }
        self.df = {term: int(counted[docs].sum()) for term, (docs, _) in self.postings.items()}

    def scores(self, query: str) -> np.ndarray:
        out = np.zeros(self.size, dtype=np.float64)
        for term in dict.fromkeys(lexical_tokens(query)):
            posting = self.postings.get(term)
            if posting is None:
                continue
            docs, tf = posting
            repeats = lexical_tokens(query).count(term)
            df = self.df[term]
            idf = np.log(1.0 + (self.count - df + 0.5) / (df + 0.5)) * repeats
            out[docs] += idf * tf * (self.k1 + 1.0) / (tf + self.norm[docs])
        return out


def normalized(scores: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Scores divided by the best among ``mask`` (the engine's BM25 / best BM25), 0 outside."""
    peak = float(scores[mask].max()) if mask.any() else 0.0
    if peak <= 0:
        return np.zeros_like(scores)
    return np.where(mask, scores / peak, 0.0)


@dataclass
class Scene:
    """One conversation's cached tree, with what the variants look up."""

    conversation: Conversation
    ids: list[str]
    texts: list[str]
    is_leaf: np.ndarray
    depth: np.ndarray
    parent: np.ndarray  # -1 under the root
    embeddings: np.ndarray
    children: list[list[int]]
    leaves: list[np.ndarray]
    ancestor: dict[int, np.ndarray]  # depth -> each node's ancestor at that depth (itself if shallower)
    id_rank: np.ndarray
    sentences: list[list[str]]
    words: np.ndarray
    turn_position: np.ndarray  # a leaf's position in the conversation (-1 for summaries)
    bm25_all: BM25
    bm25_leaves: BM25
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path, conversation: Conversation) -> Scene:
        lines = path.read_text(encoding="utf-8").splitlines()
        rows = [json.loads(line) for line in lines[1:]]
        rows = [row for row in rows if row.get("type") == "node" and row["parent"] is not None]
        ids = [row["id"] for row in rows]
        position = {node_id: i for i, node_id in enumerate(ids)}
        texts = [row["text"] for row in rows]
        is_leaf = np.array([row["is_leaf"] for row in rows])
        parent = np.array([position.get(row["parent"], -1) for row in rows])
        embeddings = np.stack([np.frombuffer(base64.b64decode(row["embedding"]), "<f4") for row in rows])
        children: list[list[int]] = [[] for _ in rows]
        for i, p in enumerate(parent):
            if p >= 0:
                children[p].append(i)
        leaves: list[np.ndarray] = [np.zeros(0, dtype=np.int64)] * len(rows)
        for i in reversed(range(len(rows))):  # parents come before children in the file
            if is_leaf[i]:
                leaves[i] = np.array([i])
            else:
                leaves[i] = np.concatenate([leaves[c] for c in children[i]]) if children[i] else np.zeros(0, np.int64)
        depth = np.array([row["depth"] for row in rows])
        ancestor = {}
        for level in (1, 2, 3):
            up = np.arange(len(rows))
            for i in range(len(rows)):
                node = i
                while depth[node] > level:
                    node = parent[node]
                up[i] = node
            ancestor[level] = up
        turn_index = {turn.dia_id: i for i, turn in enumerate(conversation.turns)}
        turn_position = np.array([turn_index.get(row["source_id"], -1) if row["is_leaf"] else -1 for row in rows])
        order = sorted(range(len(ids)), key=ids.__getitem__)
        id_rank = np.empty(len(ids), dtype=np.int64)
        id_rank[order] = np.arange(len(ids))
        everything = np.ones(len(rows), dtype=bool)
        return cls(
            conversation=conversation,
            ids=ids,
            texts=texts,
            is_leaf=is_leaf,
            depth=depth,
            parent=parent,
            embeddings=embeddings,
            children=children,
            leaves=leaves,
            ancestor=ancestor,
            id_rank=id_rank,
            sentences=[split_sentences(text) for text in texts],
            words=np.array([count_words(text) for text in texts]),
            turn_position=turn_position,
            bm25_all=BM25(texts, everything),
            bm25_leaves=BM25(texts, is_leaf),
        )


@dataclass
class Query:
    """One question over one scene, with its scores precomputed."""

    text: str
    vector: np.ndarray
    dense: np.ndarray
    lexical: np.ndarray  # BM25 over every node (the engine's index)
    lexical_turns: np.ndarray  # BM25 with the statistics of the turns alone (flat hybrid)

    def hybrid(
        self, scene: Scene, mask: np.ndarray, weight: float = WEIGHT, lexical: np.ndarray | None = None
    ) -> np.ndarray:
        """The engine's ``(cosine + w * BM25 / best BM25) / (1 + w)``, best taken over ``mask``."""
        lex = normalized(self.lexical if lexical is None else lexical, mask)
        return (self.dense + weight * lex) / (1.0 + weight)

    def flat(self, scene: Scene, weight: float = WEIGHT) -> np.ndarray:
        """Flat hybrid search's scores of the turns: BM25 with the turns' own statistics,
        normalized by the best turn (what every flat-hybrid row and comparison uses)."""
        return self.hybrid(scene, scene.is_leaf, weight, self.lexical_turns)


def order(scene: Scene, scores: np.ndarray, mask: np.ndarray) -> list[int]:
    """Node indices in ``mask`` best first, ties by id (as the engine sorts)."""
    candidates = np.flatnonzero(mask)
    keys = np.lexsort((scene.id_rank[candidates], -scores[candidates]))
    return candidates[keys].tolist()


class Packer:
    """The engine's packing (packing.pack): each text in order, without the sentences
    an earlier one already gave; a text with nothing new is skipped. Stops at ``k``
    results or ``words`` words."""

    def __init__(self, words: int = max(BUDGETS), k: int = max(BUDGETS) // 8, dedup: bool = True) -> None:
        self.limit = words
        self.k = k
        self.dedup = dedup
        self.seen: set[str] = set()
        self.texts: list[str] = []
        self.words = 0

    @property
    def full(self) -> bool:
        return self.words >= self.limit or len(self.texts) >= self.k

    def fresh(self, text: str) -> list[str]:
        return [s for s in split_sentences(text) if fold(s) not in self.seen]

    def add(self, text: str) -> bool:
        if self.full:
            return False
        sentences = split_sentences(text)
        context = text
        if self.dedup:
            fresh = [s for s in sentences if fold(s) not in self.seen]
            if not fresh:
                return False
            if len(fresh) < len(sentences):
                context = ("\n" if "\n" in text else " ").join(fresh)
        self.seen.update(fold(s) for s in sentences)
        self.texts.append(context)
        self.words += count_words(context)
        return True


Variant = Callable[[Scene, Query], list[str]]


def pack_order(scene: Scene, ranking: Sequence[int], dedup: bool = True) -> list[str]:
    packer = Packer(dedup=dedup)
    for i in ranking:
        if packer.full:
            break
        packer.add(scene.texts[i])
    return packer.texts


# -- variants -------------------------------------------------------------------------------


def flat_dense(dedup: bool = False) -> Variant:
    def run(scene: Scene, query: Query) -> list[str]:
        leaves = np.flatnonzero(scene.is_leaf)
        leaves = leaves[np.argsort(scene.turn_position[leaves])]  # conversation order, as the baseline
        ranking = leaves[np.argsort(-query.dense[leaves], kind="stable")]
        if not dedup:
            return [scene.texts[i] for i in ranking]
        return pack_order(scene, ranking.tolist())

    return run


def flat_hybrid(weight: float = WEIGHT) -> Variant:
    def run(scene: Scene, query: Query) -> list[str]:
        scores = query.flat(scene, weight)
        return pack_order(scene, order(scene, scores, scene.is_leaf))

    return run


def leaves_only(weight: float = WEIGHT) -> Variant:
    def run(scene: Scene, query: Query) -> list[str]:
        scores = query.hybrid(scene, scene.is_leaf, weight)
        return pack_order(scene, order(scene, scores, scene.is_leaf))

    return run


def everything(scene: Scene) -> np.ndarray:
    return np.ones(len(scene.ids), dtype=bool)


def summary_factor(scene: Scene, gamma: float, per_level: bool = False) -> np.ndarray:
    """What each node's score is multiplied by: 1 for leaves; ``gamma`` for summaries,
    or with ``per_level`` ``gamma ** log2(leaves under it)`` (broad summaries lower)."""
    if not per_level:
        return np.where(scene.is_leaf, 1.0, gamma)
    counts = np.array([len(leaves) for leaves in scene.leaves], dtype=np.float64)
    return np.where(scene.is_leaf, 1.0, gamma ** np.log2(np.maximum(2.0, counts)))


def collapsed(
    weight: float = WEIGHT,
    gamma: float = 1.0,
    dedup: bool = True,
    per_level: bool = False,
    peak: str = "all",
    deliver: str = "all",
) -> Variant:
    """Every node ranked; summaries' scores multiplied by ``gamma`` (1 is the engine's
    default). Diagnostics: ``peak="leaves"`` normalizes BM25 by the best leaf instead
    of the best node; ``deliver="leaves"`` ranks exactly so but never delivers a summary."""

    def run(scene: Scene, query: Query) -> list[str]:
        mask = everything(scene) if peak == "all" else scene.is_leaf
        lexical = query.lexical if peak == "all" else np.where(scene.is_leaf, query.lexical, 0.0)
        hybrid = query.hybrid(scene, mask, weight, lexical)
        if peak != "all":  # summaries keep their own BM25 on the leaves' scale
            hybrid = np.where(
                scene.is_leaf, hybrid, (query.dense + weight * normalized_by(query.lexical, mask)) / (1 + weight)
            )
        scores = hybrid * summary_factor(scene, gamma, per_level)
        ranking = order(scene, scores, everything(scene) if deliver == "all" else scene.is_leaf)
        return pack_order(scene, ranking, dedup)

    return run


def normalized_by(scores: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Every score divided by the best among ``mask`` (may exceed 1 outside it)."""
    peak = float(scores[mask].max()) if mask.any() else 0.0
    return scores / peak if peak > 0 else np.zeros_like(scores)


def summary_lexical(kind: str, factor: float = 1.0, gamma: float = 1.0) -> Variant:
    """Summaries' BM25 normalized differently: ``b1`` (full length normalization for
    summaries), ``avg`` (summaries against the mean summary length), ``scale`` (the
    summaries' lexical share times ``factor``)."""

    def run(scene: Scene, query: Query) -> list[str]:
        bm25 = scene.extra.get(f"bm25-{kind}")
        if bm25 is None:
            mask = everything(scene)
            if kind == "b1":
                bm25 = BM25(scene.texts, mask, b=np.where(scene.is_leaf, 0.75, 1.0))
            elif kind == "avg":
                lengths = np.array([len(lexical_tokens(t)) for t in scene.texts], dtype=np.float64)
                leaf_avg = lengths[scene.is_leaf].mean()
                summary_avg = lengths[~scene.is_leaf].mean() if (~scene.is_leaf).any() else leaf_avg
                bm25 = BM25(scene.texts, mask, average_of=np.where(scene.is_leaf, leaf_avg, summary_avg))
            else:
                bm25 = scene.bm25_all
            scene.extra[f"bm25-{kind}"] = bm25
        lexical = bm25.scores(query.text)
        if kind == "scale":
            lexical = np.where(scene.is_leaf, lexical, factor * lexical)
        scores = query.hybrid(scene, everything(scene), WEIGHT, lexical) * summary_factor(scene, gamma)
        return pack_order(scene, order(scene, scores, everything(scene)))

    return run


def subtree_diversity(level: int, cap: int | None = None, penalty: float = 0.0) -> Variant:
    """Tree-guided diversity: a result's depth-``level`` subtree may give ``cap``
    results before the others come first (``cap``), or each result already taken from
    a subtree lowers its other members' scores by ``penalty`` (MMR with subtree
    membership as the redundancy)."""

    def run(scene: Scene, query: Query) -> list[str]:
        scores = query.hybrid(scene, everything(scene), WEIGHT)
        ranking = order(scene, scores, everything(scene))
        groups = scene.ancestor[level]
        packer = Packer()
        taken: dict[int, int] = {}
        if cap is not None:
            later = []
            for i in ranking:
                group = int(groups[i])
                if taken.get(group, 0) >= cap:
                    later.append(i)
                    continue
                if packer.add(scene.texts[i]):
                    taken[group] = taken.get(group, 0) + 1
            for i in later:
                packer.add(scene.texts[i])
            return packer.texts
        queues: dict[int, list[int]] = {}
        for i in ranking:
            queues.setdefault(int(groups[i]), []).append(i)
        heads = dict.fromkeys(queues, 0)
        while not packer.full:
            best, best_score = None, -np.inf
            for group, queue in queues.items():
                if heads[group] < len(queue):
                    value = scores[queue[heads[group]]] - penalty * taken.get(group, 0)
                    if value > best_score:
                        best, best_score = group, value
            if best is None:
                break
            i = queues[best][heads[best]]
            heads[best] += 1
            if packer.add(scene.texts[i]):
                taken[best] = taken.get(best, 0) + 1
        return packer.texts

    return run


def sentence_vectors(scene: Scene, embedder: DiskCachedEmbedder) -> None:
    """Every leaf sentence's embedding and its BM25 over the leaves' sentences."""
    if "sentence_of" in scene.extra:
        return
    sentences: list[str] = []
    owner: list[int] = []
    for i in np.flatnonzero(scene.is_leaf):
        for sentence in scene.sentences[i]:
            sentences.append(sentence)
            owner.append(int(i))
    scene.extra["sentence_text"] = sentences
    scene.extra["sentence_owner"] = np.array(owner)
    scene.extra["sentence_vectors"] = embedder.embed(sentences)
    scene.extra["sentence_bm25"] = BM25(sentences, np.ones(len(sentences), dtype=bool))
    by_leaf: dict[int, list[int]] = {}
    for s, leaf in enumerate(owner):
        by_leaf.setdefault(leaf, []).append(s)
    scene.extra["sentence_of"] = by_leaf


def focused(
    embedder: DiskCachedEmbedder, unit: str = "sentence", allowance: str = "summary", gamma: float = 1.0
) -> Variant:
    """Query-focused delivery of summary hits: a summary that ranks delivers, instead of
    its fixed text, the best not-yet-given ``unit``s (sentences or whole leaves) of the
    leaves under it for this query: as many words as its own text has
    (``allowance="summary"``) or one unit (``"one"``)."""

    def run(scene: Scene, query: Query) -> list[str]:
        scores = query.hybrid(scene, everything(scene), WEIGHT)
        ranking = order(scene, np.where(scene.is_leaf, scores, gamma * scores), everything(scene))
        if unit == "sentence":
            sentence_vectors(scene, embedder)
            dense = scene.extra["sentence_vectors"] @ query.vector
            lexical = scene.extra["sentence_bm25"].scores(query.text)
            peak = float(lexical.max())
            unit_score = (dense + WEIGHT * (lexical / peak if peak > 0 else 0.0)) / (1 + WEIGHT)
            unit_text: list[str] = scene.extra["sentence_text"]
        else:
            unit_score, unit_text = scores, scene.texts
        packer = Packer()
        for i in ranking:
            if packer.full:
                break
            if scene.is_leaf[i]:
                packer.add(scene.texts[i])
                continue
            if unit == "sentence":
                units = [s for leaf in scene.leaves[i] for s in scene.extra["sentence_of"].get(int(leaf), [])]
            else:
                units = scene.leaves[i].tolist()
            units.sort(key=lambda u: (-unit_score[u], u))
            limit = int(scene.words[i]) if allowance == "summary" else 1
            given = 0
            for u in units:
                if given >= limit or packer.full:
                    break
                before = packer.words
                if packer.add(unit_text[u]):
                    given += packer.words - before if allowance == "summary" else 1
        return packer.texts

    return run


def siblings(ratio: float, base: str = "collapsed") -> Variant:
    """A leaf hit is followed by its sibling leaves (same parent summary) that score at
    least ``ratio`` times its score, best first."""

    def run(scene: Scene, query: Query) -> list[str]:
        mask = everything(scene) if base == "collapsed" else scene.is_leaf
        scores = query.hybrid(scene, mask, WEIGHT)
        packer = Packer()
        for i in order(scene, scores, mask):
            if packer.full:
                break
            if not packer.add(scene.texts[i]) or not scene.is_leaf[i] or scene.parent[i] < 0:
                continue
            family = [c for c in scene.children[scene.parent[i]] if c != i and scene.is_leaf[c]]
            for sibling in sorted(family, key=lambda c: -scores[c]):
                if scores[sibling] >= ratio * scores[i]:
                    packer.add(scene.texts[sibling])
        return packer.texts

    return run


def pointer(
    gamma: float = SUMMARY_WEIGHT,
    per_hit: int | None = None,
    first: int = 0,
    scale: float = 1.0,
    gist: int = 0,
    leaf_statistics: bool = False,
    flat_leaves: bool = False,
) -> Variant:
    """A summary hit as a pointer: it delivers, in its place, the best not-yet-given
    leaves under it by their own hybrid scores (``per_hit`` of them, or as many words
    as its own text when ``None``), never its own text. Summaries are skipped until
    ``first`` results are packed (expand only after the top leaves). With ``gist``,
    the summary's first ``gist`` words come first, as a one-line heading over its
    leaves (what a reader may use; evidence recall cannot see it). With
    ``leaf_statistics``, BM25's idf and average length come from the leaves alone
    (summaries are scored against them), as flat search over the same turns has them.
    With ``flat_leaves``, leaves score exactly as in flat hybrid search (their BM25 with
    the leaves' statistics, normalized by the best leaf) and summaries as the engine
    scores them."""

    def run(scene: Scene, query: Query) -> list[str]:
        return pointer_delivery(
            scene, query, gamma, per_hit, first, scale, gist, leaf_statistics=leaf_statistics, flat_leaves=flat_leaves
        )[0]

    return run


def pointer_delivery(
    scene: Scene,
    query: Query,
    gamma: float = SUMMARY_HIT_WEIGHT,
    per_hit: int | None = None,
    first: int = 0,
    scale: float = LEAF_ALLOWANCE,
    gist: int = 0,
    *,
    leaf_statistics: bool = False,
    flat_leaves: bool = False,
) -> tuple[list[str], list[int]]:
    """What :func:`pointer` packs, and the node index each packed text came from (a
    leaf's, or a summary's for its gist). The defaults are the engine's: summaries
    x ``SUMMARY_HIT_WEIGHT``, a hit delivering up to ``LEAF_ALLOWANCE`` x its length."""
    lexical = leaf_statistics_bm25(scene).scores(query.text) if leaf_statistics else None
    scores = query.hybrid(scene, everything(scene), WEIGHT, lexical)
    if flat_leaves:
        scores = np.where(scene.is_leaf, query.flat(scene), scores)
    ranking = order(scene, np.where(scene.is_leaf, scores, gamma * scores), everything(scene))
    packer = Packer()
    sources: list[int] = []
    for i in ranking:
        if packer.full:
            break
        if scene.is_leaf[i]:
            if packer.add(scene.texts[i]):
                sources.append(i)
            continue
        if len(packer.texts) < first:
            continue
        units = sorted(scene.leaves[i].tolist(), key=lambda u: (-scores[u], scene.id_rank[u]))
        if gist and packer.add(" ".join(scene.texts[i].split()[:gist])):
            sources.append(i)
        # the engine's allowance: the summary's own cost in its token counter
        limit = scale * count_tokens(scene.texts[i]) if per_hit is None else per_hit
        given = 0
        for u in units:
            if given >= limit or packer.full:
                break
            if packer.add(scene.texts[u]):
                sources.append(u)
                given += count_tokens(packer.texts[-1]) if per_hit is None else 1
    return packer.texts, sources


def fusion(k: float, tree_weight: float = 1.0) -> Variant:
    """Flat hybrid's ranking of the turns and the default's delivered turns, fused by
    reciprocal rank (each list adds ``weight / (k + rank)``; a turn only one list
    gives gets only that list's share). A turn both rank high comes first, and flat
    search's best turns cannot be pushed far down by a summary's leaves."""

    def run(scene: Scene, query: Query) -> list[str]:
        flat = order(scene, query.flat(scene), scene.is_leaf)
        _, tree = pointer_delivery(scene, query)
        return pack_order(scene, reciprocal_rank_fusion([flat, tree], [1.0, tree_weight], k, scene.id_rank))

    return run


def reciprocal_rank_fusion(
    rankings: Sequence[Sequence[int]], weights: Sequence[float], k: float, tie_rank: np.ndarray
) -> list[int]:
    """Items of several rankings by the sum of ``weight / (k + rank)`` over the rankings
    that hold them (ranks from 1), best first; ties by ``tie_rank`` (the engine's id order)."""
    fused: dict[int, float] = {}
    for ranking, weight in zip(rankings, weights, strict=True):
        for rank, item in enumerate(ranking, 1):
            fused[item] = fused.get(item, 0.0) + weight / (k + rank)
    return sorted(fused, key=lambda item: (-fused[item], tie_rank[item]))


def leaf_statistics_bm25(scene: Scene) -> BM25:
    """BM25 over every node with the leaves' statistics (cached on the scene)."""
    bm25 = scene.extra.get("bm25-leaf-statistics")
    if bm25 is None:
        bm25 = BM25(scene.texts, everything(scene), statistics=scene.is_leaf)
        scene.extra["bm25-leaf-statistics"] = bm25
    return bm25


def ancestor_paths(scene: Scene) -> list[np.ndarray]:
    """Each node's ancestors (its parent first, the root's children last; empty under the root)."""
    paths = scene.extra.get("ancestor_paths")
    if paths is None:
        paths = []
        for i in range(len(scene.ids)):
            path = []
            node = int(scene.parent[i])
            while node >= 0:
                path.append(node)
                node = int(scene.parent[node])
            paths.append(np.array(path, dtype=np.int64))
        scene.extra["ancestor_paths"] = paths
    return paths


def ancestors(
    beta: float, over: str = "max", gamma: float = SUMMARY_WEIGHT, deliver: str = "all", weight: float = WEIGHT
) -> Variant:
    """A node ranks by its own hybrid score plus ``beta`` times its ancestors'
    (``over``: ``max`` over the path, ``parent`` only, or ``mean`` over the path),
    divided by ``1 + beta``; a node under the root counts its own score in their place
    (no boost, no penalty). Summaries are then multiplied by ``gamma`` and delivered
    (``deliver="all"``) or never delivered (``"leaves"``). The idea: a leaf in a subtree
    that matches the question as a whole (related turns) is promoted."""

    def run(scene: Scene, query: Query) -> list[str]:
        own = query.hybrid(scene, everything(scene), weight)
        above = own.copy()
        for i, path in enumerate(ancestor_paths(scene)):
            if len(path) == 0:
                continue
            if over == "parent":
                above[i] = own[path[0]]
            elif over == "mean":
                above[i] = float(own[path].mean())
            else:
                above[i] = float(own[path].max())
        scores = (own + beta * above) / (1.0 + beta) * summary_factor(scene, gamma)
        return pack_order(scene, order(scene, scores, everything(scene) if deliver == "all" else scene.is_leaf))

    return run


def speakers_of(scene: Scene) -> np.ndarray:
    """Each leaf's speaker (the benchmark's ``"<date> <speaker>: <text>"``), "" for summaries."""
    found = scene.extra.get("speakers")
    if found is None:
        by_position = {i: turn.speaker for i, turn in enumerate(scene.conversation.turns)}
        found = np.array([by_position.get(int(p), "") for p in scene.turn_position], dtype=object)
        scene.extra["speakers"] = found
    return found


def speaker_boost(delta: float, base: str = "collapsed", gamma: float = SUMMARY_WEIGHT) -> Variant:
    """Diagnostic (not a tree idea): when the question names exactly one of the
    conversation's speakers, that speaker's own turns gain ``delta``. Multi-hop
    questions ask about one person (``What activities does Melanie partake in?``) and
    flat hybrid ranks the other speaker's replies that name them (``Wow, Mel!``) high.
    ``base``: ``collapsed`` (the engine default ranking) or ``flat`` (flat hybrid)."""

    def run(scene: Scene, query: Query) -> list[str]:
        speakers = speakers_of(scene)
        if base == "flat":
            mask = scene.is_leaf
            scores = query.flat(scene)
        else:
            mask = everything(scene)
            scores = query.hybrid(scene, mask, WEIGHT) * summary_factor(scene, gamma)
        words = set(lexical_tokens(query.text))
        named = {name for name in set(speakers) if name and fold(name) in words}
        if len(named) == 1:
            scores = scores + delta * (speakers == next(iter(named)))
        return pack_order(scene, order(scene, scores, mask))

    return run


def rocchio(
    alpha: float,
    top: int,
    feedback: str = "summaries",
    gamma: float = SUMMARY_WEIGHT,
    speaker: float = 0.0,
    deliver: str = "all",
) -> Variant:
    """Pseudo-relevance feedback with the tree's summaries: the question's vector plus
    ``alpha`` times the mean vector of the ``top`` best-ranked summaries (``feedback=
    "leaves"``: of the best leaves, the control without the tree; ``"clusters"``: of
    every leaf under each best leaf's parent), re-normalized; the
    dense part of the default ranking uses it (BM25 is unchanged). A summary stands for
    a cluster of related turns, so it may carry the vocabulary of the evidence the
    question does not name. ``speaker``: the named speaker's turns gain this much in
    both rounds (:func:`speaker_boost`). ``deliver="leaves"``: summaries are never
    ranked nor delivered (the same ranking without the tree)."""

    def run(scene: Scene, query: Query) -> list[str]:
        boost = np.zeros(len(scene.ids))
        if speaker:
            speakers = speakers_of(scene)
            words = set(lexical_tokens(query.text))
            named = {name for name in set(speakers) if name and fold(name) in words}
            if len(named) == 1:
                boost = speaker * (speakers == next(iter(named)))
        first = query.hybrid(scene, everything(scene), WEIGHT) + boost
        pool = ~scene.is_leaf if feedback == "summaries" else scene.is_leaf
        best = order(scene, first, pool)[:top]
        if feedback == "clusters":  # the leaves under each best leaf's parent (its cluster)
            best = sorted(
                {int(u) for i in best for u in (scene.leaves[scene.parent[i]] if scene.parent[i] >= 0 else [i])}
            )
        vector = query.vector + alpha * scene.embeddings[best].mean(axis=0) if best else query.vector
        vector = vector / (np.linalg.norm(vector) or 1.0)
        dense = scene.embeddings @ vector
        lexical = normalized(query.lexical, everything(scene))
        scores = (dense + WEIGHT * lexical) / (1.0 + WEIGHT) * summary_factor(scene, gamma) + boost
        return pack_order(scene, order(scene, scores, everything(scene) if deliver == "all" else scene.is_leaf))

    return run


def subtree_relevance(beta: float, top: int = 3, gamma: float = SUMMARY_WEIGHT) -> Variant:
    """A node ranks by its own hybrid score plus ``beta`` times the mean of the ``top``
    best leaf scores under its parent (how much of its cluster matches the question,
    measured on the turns rather than the summary's text), divided by ``1 + beta``; a
    node under the root counts its own score there."""

    def run(scene: Scene, query: Query) -> list[str]:
        own = query.hybrid(scene, everything(scene), WEIGHT)
        above = own.copy()
        cluster: dict[int, float] = {}
        for i in range(len(scene.ids)):
            p = int(scene.parent[i])
            if p < 0:
                continue
            if p not in cluster:
                values = np.sort(own[scene.leaves[p]])[::-1][:top]
                cluster[p] = float(values.mean()) if len(values) else 0.0
            above[i] = cluster[p]
        scores = (own + beta * above) / (1.0 + beta) * summary_factor(scene, gamma)
        return pack_order(scene, order(scene, scores, everything(scene)))

    return run


# -- the variants on record -------------------------------------------------------------------


def variant_table(embedder: DiskCachedEmbedder) -> dict[str, dict[str, Variant]]:
    """Every variant, by group (``--variants`` takes group or variant names)."""
    return {
        "baselines": {
            "flat dense": flat_dense(),
            "flat dense, de-dup packing": flat_dense(dedup=True),
            "flat hybrid": flat_hybrid(),
            "leaves only (hybrid)": leaves_only(),
            "collapsed, summaries x 1 (the default before x 0.85)": collapsed(),
            DEFAULT_ROW: collapsed(gamma=SUMMARY_WEIGHT),
            POINTER_ROW: pointer(SUMMARY_HIT_WEIGHT, scale=LEAF_ALLOWANCE),
        },
        "gamma": {
            f"summaries x {g}": collapsed(gamma=g)
            for g in (0.98, 0.95, 0.9, 0.85, 0.8, 0.75, 0.7, 0.6, 0.5)
            if g != SUMMARY_WEIGHT
        },
        "gamma per level": {
            f"summaries x {g}^log2(leaves)": collapsed(gamma=g, per_level=True) for g in (0.97, 0.95, 0.9)
        },
        "lexical": {
            "summary BM25 b=1": summary_lexical("b1"),
            "summary BM25 vs mean summary length": summary_lexical("avg"),
            "summary BM25 x 0.5": summary_lexical("scale", 0.5),
        },
        "diversity": {
            "depth-1 subtree cap 2": subtree_diversity(1, cap=2),
            "depth-1 subtree cap 4": subtree_diversity(1, cap=4),
            "depth-2 subtree cap 2": subtree_diversity(2, cap=2),
            "depth-1 subtree MMR 0.02": subtree_diversity(1, penalty=0.02),
            "depth-1 subtree MMR 0.05": subtree_diversity(1, penalty=0.05),
            "depth-2 subtree MMR 0.02": subtree_diversity(2, penalty=0.02),
            "depth-1 subtree cap 1": subtree_diversity(1, cap=1),
            "depth-2 subtree cap 1": subtree_diversity(2, cap=1),
            "depth-3 subtree cap 1": subtree_diversity(3, cap=1),
            "depth-3 subtree cap 2": subtree_diversity(3, cap=2),
        },
        "focused": {
            "summary hit -> best sentences of its leaves": focused(embedder, "sentence"),
            "summary hit -> best sentence of its leaves": focused(embedder, "sentence", "one"),
            "summary hit -> best leaves": focused(embedder, "leaf"),
            "summary hit -> best leaf": focused(embedder, "leaf", "one"),
        },
        "diagnostics": {
            "leaves only, BM25 normalized by the best node": collapsed(deliver="leaves"),
            "summaries x 0.8, BM25 normalized by the best leaf": collapsed(gamma=0.8, peak="leaves"),
            "summaries x 1, BM25 normalized by the best leaf": collapsed(gamma=1.0, peak="leaves"),
            "dense: collapsed": collapsed(weight=0.0),
            "dense: leaves only": leaves_only(0.0),
            "dense: summaries x 0.85": collapsed(weight=0.0, gamma=0.85),
            "dense: summaries x 0.95": collapsed(weight=0.0, gamma=0.95),
        },
        "combinations": {
            "summaries x 0.8, hit -> best leaves": focused(embedder, "leaf", gamma=0.8),
            "summaries x 0.85, hit -> best leaves": focused(embedder, "leaf", gamma=0.85),
            "summaries x 0.9, hit -> best leaves": focused(embedder, "leaf", gamma=0.9),
            "summaries x 0.8, hit -> best sentences": focused(embedder, "sentence", gamma=0.8),
            "summaries x 0.9, summary BM25 x 0.5": summary_lexical("scale", 0.5, gamma=0.9),
            "summaries x 0.8, summary BM25 b=1": summary_lexical("b1", gamma=0.8),
            "summaries x 0.8, lexical 0.5": collapsed(weight=0.5, gamma=0.8),
            "summaries x 0.8, lexical 0.2": collapsed(weight=0.2, gamma=0.8),
            "leaves only, lexical 0.5": leaves_only(0.5),
            "leaves only, lexical 0.2": leaves_only(0.2),
        },
        "pointer": {POINTER_ROW: pointer(SUMMARY_HIT_WEIGHT, scale=LEAF_ALLOWANCE)},
        "fusion": {
            f"default and flat hybrid fused by reciprocal rank, k {k}, default x {w}": fusion(k, w)
            for k in (5, 20, 60)
            for w in (1.0, 1.5)
        },
        "gist": {
            f"pointer x {SUMMARY_HIT_WEIGHT} under a {words}-word gist of the summary": pointer(
                SUMMARY_HIT_WEIGHT, scale=LEAF_ALLOWANCE, gist=words
            )
            for words in (12, 25)
        },
        "leaf statistics": {
            f"pointer x {g}, allowance x {a}, BM25 statistics of the leaves": pointer(g, scale=a, leaf_statistics=True)
            for g in (0.75, 0.8)
            for a in (1.0, 2.0)
        }
        | {
            f"pointer x {g}, allowance x {a}, leaves scored as in flat hybrid": pointer(g, scale=a, flat_leaves=True)
            for g in (0.75, 0.8)
            for a in (1.0, 2.0)
        },
        "pointer tuning": {
            f"pointer x {g}, allowance x {a}": pointer(g, scale=a) for g in (0.75, 0.8, 0.85, 0.9) for a in (1.0, 2.0)
        },
        "earns": {
            "pointer x 1, words": pointer(1.0),
            "pointer x 0.85, 1 leaf": pointer(0.85, 1),
            "pointer x 0.85, 2 leaves": pointer(0.85, 2),
            "pointer x 1, 2 leaves": pointer(1.0, 2),
            "pointer x 0.85, 2 leaves, after 3": pointer(0.85, 2, first=3),
            "pointer x 0.85, words, after 3": pointer(0.85, first=3),
            "pointer x 1.1, 2 leaves": pointer(1.1, 2),
        },
        "ancestors": {
            f"ancestors {over} x {beta}{', leaves only' if deliver == 'leaves' else ''}": ancestors(
                beta, over, deliver=deliver
            )
            for over in ("max", "parent", "mean")
            for beta in (0.1, 0.2, 0.3, 0.5)
            for deliver in ("all", "leaves")
        },
        "speaker": {
            f"{'flat hybrid' if base == 'flat' else 'defaults'} + {delta} for the named speaker's turns": speaker_boost(
                delta, base
            )
            for base in ("collapsed", "flat")
            for delta in (0.02, 0.05, 0.1, 0.2)
        },
        "feedback": {
            f"Rocchio from the top {top} {fb}, alpha {alpha}": rocchio(alpha, top, fb)
            for fb in ("summaries", "leaves")
            for top in (1, 3)
            for alpha in (0.2, 0.5)
        }
        | {
            f"Rocchio from the top {top} leaves, alpha {alpha}, named speaker + {delta}": rocchio(
                alpha, top, "leaves", speaker=delta
            )
            for top in (1, 3)
            for alpha in (0.5, 1.0)
            for delta in (0.05, 0.1)
        }
        | {
            f"Rocchio from the clusters of the top {top} leaves, alpha {alpha}{extra}": rocchio(
                alpha, top, "clusters", speaker=delta
            )
            for top in (1, 3)
            for alpha in (0.5, 1.0)
            for delta, extra in ((0.0, ""), (0.1, ", named speaker + 0.1"))
        }
        | {
            "leaves only: Rocchio from the top 1 leaves, alpha 0.5, named speaker + 0.1": rocchio(
                0.5, 1, "leaves", speaker=0.1, deliver="leaves"
            ),
            "leaves only: Rocchio from the top 3 leaves, alpha 0.5, named speaker + 0.1": rocchio(
                0.5, 3, "leaves", speaker=0.1, deliver="leaves"
            ),
        },
        "subtree relevance": {
            f"+ {beta} x mean of the top {top} leaves under the parent": subtree_relevance(beta, top)
            for top in (1, 3)
            for beta in (0.1, 0.2, 0.3)
        },
        "held out": {  # chosen on conversations 0-4, scored once on 5-9 (issue 15 item 3)
            "ancestors max x 0.2": ancestors(0.2),
            "Rocchio from the top 1 leaves, alpha 0.5, named speaker + 0.1": rocchio(0.5, 1, "leaves", speaker=0.1),
            "Rocchio from the clusters of the top 1 leaves, alpha 0.5, named speaker + 0.1": rocchio(
                0.5, 1, "clusters", speaker=0.1
            ),
            "leaves only: Rocchio from the top 1 leaves, alpha 0.5, named speaker + 0.1": rocchio(
                0.5, 1, "leaves", speaker=0.1, deliver="leaves"
            ),
        },
        "siblings": {
            "leaf hit + siblings >= 0.9 x its score": siblings(0.9),
            "leaf hit + siblings >= 0.8 x its score": siblings(0.8),
            "leaves only + siblings >= 0.9 x score": siblings(0.9, base="leaves"),
        },
    }


def choose(table: dict[str, dict[str, Variant]], spec: str) -> dict[str, Variant]:
    chosen: dict[str, Variant] = {}
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        if part == "all":
            for group in table.values():
                chosen.update(group)
        elif part in table:
            chosen.update(table[part])
        else:
            found = {name: v for group in table.values() for name, v in group.items() if name == part}
            if not found:
                raise SystemExit(f"unknown variant or group {part!r}; groups: {', '.join(table)}")
            chosen.update(found)
    return chosen


# -- scoring ------------------------------------------------------------------------------------


@dataclass
class Scored:
    """Per question: category, recall per budget, answer found per budget (cats 1 and 4)."""

    rows: list[tuple[int, dict[int, float], dict[int, float]]] = field(default_factory=list)

    def recall(self, budget: int, category: int | None = None) -> float:
        values = [r[budget] for c, r, _ in self.rows if category is None or c == category]
        return statistics.fmean(values) if values else float("nan")

    def answers(self, budget: int, category: int) -> float:
        values = [a[budget] for c, _, a in self.rows if c == category]
        return statistics.fmean(values) if values else float("nan")


def queries_of(scene: Scene, embedder: DiskCachedEmbedder) -> list[Query]:
    questions = [q.question for q in scene.conversation.questions]
    vectors = embedder.embed(questions)
    return [
        Query(text, vector, scene.embeddings @ vector, scene.bm25_all.scores(text), scene.bm25_leaves.scores(text))
        for text, vector in zip(questions, vectors, strict=True)
    ]


def score(scene: Scene, queries: list[Query], variant: Variant, into: Scored) -> None:
    conversation = scene.conversation
    for question, query in zip(conversation.questions, queries, strict=True):
        contexts = contexts_at_budgets(variant(scene, query), BUDGETS)
        evidence = [conversation.turn_by_id[i].utterance for i in question.evidence]
        recall = {b: evidence_recall(evidence, contexts[b]) for b in BUDGETS}
        found = {b: answer_recall(question.answer, contexts[b]) for b in BUDGETS} if question.category in (1, 4) else {}
        into.rows.append((question.category, recall, found))


def check_against_engine(scene_path: Path, scene: Scene, queries: list[Query], embedder: DiskCachedEmbedder) -> str:
    """How many questions' contexts differ between the engine's ``retrieve`` and the
    re-implementation (the engine's default, summary-text and leaves-only rows). The
    re-implementation models the ranking, not issue 36's query side (time parsing,
    context feedback, overview routing), so the engine is asked without it."""
    from memtree.tree import MemTree

    with MemTree(embedder=embedder, aggregator=ExtractiveAggregator(embedder)) as memory:
        memory.import_jsonl(scene_path)
        checks: list[tuple[str, Variant, dict[str, Any]]] = [
            ("default (summary hits deliver leaves)", pointer(SUMMARY_HIT_WEIGHT, scale=LEAF_ALLOWANCE), {}),
            ("summary text", collapsed(gamma=SUMMARY_WEIGHT), {"summary_hits": "text"}),
            ("leaves only", leaves_only(), {"leaves_only": True}),
        ]
        differ = {name: 0 for name, _, _ in checks}
        for query in queries:
            for name, variant, options in checks:
                # min_score -1, no floor: the re-implementation applies no score threshold.
                found = memory.retrieve(
                    query.text,
                    k=max(BUDGETS) // 8,
                    min_score=-1.0,
                    min_similarity=None,
                    parse_times=False,
                    context_feedback=0.0,
                    route_overviews=False,
                    **options,
                )
                engine = [r.context for r in found]
                ours = variant(scene, query)
                if contexts_at_budgets(engine, BUDGETS) != contexts_at_budgets(ours, BUDGETS):
                    differ[name] += 1
    return ", ".join(f"{name}: {n}/{len(queries)} questions differ" for name, n in differ.items())


# -- the report -----------------------------------------------------------------------------------


def verdict(name: str, results: dict[str, Scored], against: Sequence[str]) -> dict[str, Any]:
    """``name`` against every row of ``against``: at how many budgets it is above all
    of them overall, and its worst category gap (points, negative = below one of
    them) at 500 words and at any budget."""
    if name in against or not all(a in results for a in against):
        return {}
    ours = results[name]
    wins = sum(all(ours.recall(b) > results[a].recall(b) for a in against) for b in BUDGETS)

    def worst(budgets: Sequence[int]) -> float:
        return min(
            ours.recall(b, c) - results[a].recall(b, c) for a in against for c in RETRIEVAL_CATEGORIES for b in budgets
        )

    losses = [
        f"cat {c} @{b} vs {a} {(ours.recall(b, c) - results[a].recall(b, c)) * 100:+.1f}"
        for a in against
        for c in RETRIEVAL_CATEGORIES
        for b in BUDGETS
        if ours.recall(b, c) < results[a].recall(b, c)
    ]
    return {
        "overall_wins": wins,
        "worst_category_gap_500": worst([500]),
        "worst_category_gap": worst(BUDGETS),
        "category_losses": losses,
        "paired_difference": {a: paired_difference(ours, results[a]) for a in against},
    }


def paired_difference(ours: Scored, base: Scored, resamples: int = 2000) -> dict[str, list[float]]:
    """Per budget: the mean per-question recall difference and its 95% paired
    bootstrap interval (questions resampled with replacement; seed 0)."""
    rng = np.random.default_rng(0)
    picks = rng.integers(0, len(ours.rows), size=(resamples, len(ours.rows)))
    out = {}
    for b in BUDGETS:
        difference = np.array([o[1][b] - t[1][b] for o, t in zip(ours.rows, base.rows, strict=True)])
        means = difference[picks].mean(axis=1)
        out[str(b)] = [float(difference.mean()), float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))]
    return out


def report(
    results: dict[str, Scored],
    conversations: Sequence[Conversation],
    checks: list[str],
    environment: list[str],
    tree: str,
) -> tuple[str, dict[str, Any]]:
    against = ("flat hybrid", "leaves only (hybrid)")
    payload: dict[str, Any] = {"environment": environment, "tree": tree, "checks": checks, "results": {}}
    for name, scored in results.items():
        payload["results"][name] = {
            "recall": {str(b): scored.recall(b) for b in BUDGETS},
            "recall_by_category": {
                str(c): {str(b): scored.recall(b, c) for b in BUDGETS} for c in RETRIEVAL_CATEGORIES
            },
            "answer_recall_by_category": {str(c): {str(b): scored.answers(b, c) for b in BUDGETS} for c in (1, 4)},
            "against flat hybrid and leaves only": verdict(name, results, against),
            "questions": len(scored.rows),
        }
    rows = payload["results"]
    questions = sum(len(c.questions) for c in conversations)
    lines = [
        "# LoCoMo research: retrieval and packing variants over cached trees",
        "",
        *environment,
        "",
        f"Data: {len(conversations)} conversation(s) ({', '.join(c.sample_id for c in conversations)}), "
        f"{questions} questions of categories 1-4. Tree: {tree}.",
        "",
        "Check (engine `retrieve` against this script's re-implementation): " + "; ".join(checks) + ".",
        "",
        "Evidence recall (design.md §5) overall at each budget and per category at 500 words; answer recall "
        "(gold answer string in the context) at 500 words for categories 1 and 4. Against flat hybrid and "
        "leaves only (hybrid): *wins* = budgets at which the variant is above both overall (of 4); *gap* = its "
        "worst category difference to either, in points, at 500 words and at any budget.",
        "",
    ]
    header = [
        "variant",
        *(f"{b}" for b in BUDGETS),
        *(f"cat {c} @500" for c in RETRIEVAL_CATEGORIES),
        "answers cat 1 @500",
        "answers cat 4 @500",
        "wins",
        "gap @500",
        "gap anywhere",
    ]

    def gaps(row: dict[str, Any]) -> list[str]:
        versus = row["against flat hybrid and leaves only"]
        if not versus:
            return ["", "", ""]
        return [
            f"{versus['overall_wins']}/4",
            f"{versus['worst_category_gap_500'] * 100:+.1f}",
            f"{versus['worst_category_gap'] * 100:+.1f}",
        ]

    table = [
        [
            name,
            *(f"{row['recall'][str(b)]:.3f}" for b in BUDGETS),
            *(f"{row['recall_by_category'][str(c)]['500']:.3f}" for c in RETRIEVAL_CATEGORIES),
            f"{row['answer_recall_by_category']['1']['500']:.3f}",
            f"{row['answer_recall_by_category']['4']['500']:.3f}",
            *gaps(row),
        ]
        for name, row in rows.items()
    ]
    lines += [*markdown_table(header, table), ""]
    lines += [
        "## Differences to the baselines, with 95% intervals",
        "",
        "Mean per-question difference in evidence recall (points) against leaves only (hybrid) and against flat "
        "hybrid, with a 95% paired bootstrap interval (2,000 resamples of the questions).",
        "",
    ]

    def interval(value: list[float]) -> str:
        mean, low, high = (100 * v for v in value)
        return f"{mean:+.1f} [{low:+.1f}, {high:+.1f}]"

    interval_rows = []
    for name, row in rows.items():
        versus = row["against flat hybrid and leaves only"]
        if not versus:
            continue
        paired = versus["paired_difference"]
        interval_rows.append([name, *(interval(paired[base][str(b)]) for base in against for b in BUDGETS)])
    lines += markdown_table(
        [
            "variant",
            *(f"vs {'leaves only' if base != 'flat hybrid' else base} @{b}" for base in against for b in BUDGETS),
        ],
        interval_rows,
    )
    lines.append("")
    for c in RETRIEVAL_CATEGORIES:
        lines += [f"## {CATEGORY_NAMES[c]} (category {c}) at every budget", ""]
        lines += markdown_table(
            ["variant", *(f"{b}" for b in BUDGETS)],
            [
                [name, *(f"{row['recall_by_category'][str(c)][str(b)]:.3f}" for b in BUDGETS)]
                for name, row in rows.items()
            ],
        )
        lines.append("")
    return "\n".join(lines), payload


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="locomo10.json")
    parser.add_argument("--cache", type=Path, default=Path("/tmp/locomo-cache"), help="trees and embeddings")
    parser.add_argument("--embedder", default="local", choices=("local", "hashing"), help="hashing: tests only")
    parser.add_argument("--conversations", default="all", help="all, 0-9, 0,3,5 or 2")
    parser.add_argument("--tree", default="default", choices=sorted(TREES), help="which cached tree to read")
    parser.add_argument(
        "--saved-trees",
        type=Path,
        default=None,
        help="read the trees memtree bench locomo --keep-trees saved here (or their last checkpoint) instead",
    )
    add_saved_recipe_options(parser)
    parser.add_argument("--variants", default="all", help="groups or variant names, comma separated")
    parser.add_argument("--check", action="store_true", help="compare with the engine's retrieve first")
    parser.add_argument("--build-only", action="store_true", help="only build the cached trees")
    parser.add_argument("--out", type=Path, default=None, help="directory for <name>.md and <name>.json")
    parser.add_argument("--name", default="locomo_research")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    conversations = select_conversations(load_locomo(args.data), args.conversations)
    cache = args.cache / args.embedder
    embedder = make_embedder(args.embedder, cache)
    kind = TREES[args.tree]
    command = ["python", "benchmarks/locomo_research.py", *(sys.argv[1:] if argv is None else argv)]
    info = machine_info(command, extra_versions=("sentence_transformers", "torch"))
    if args.saved_trees is not None:
        recipe = saved_recipe(args)
        saved = [saved_tree(cache, args.saved_trees, recipe, c, embedder) for c in conversations]
        paths, conversations = [path for path, _ in saved], [c for _, c in saved]
        kind = TreeKind(f"saved {recipe.key} ({args.saved_model}, {args.saved_aggregation})")
    else:
        paths = [build_tree(cache, kind, conversation, embedder) for conversation in conversations]
    if args.build_only:
        return
    variants = choose(variant_table(embedder), args.variants)
    results = {name: Scored() for name in variants}
    checks: list[str] = []
    for path, conversation in zip(paths, conversations, strict=True):
        start = time.perf_counter()
        scene = Scene.load(path, conversation)
        queries = queries_of(scene, embedder)
        if args.check:
            checks.append(f"{conversation.sample_id}: " + check_against_engine(path, scene, queries, embedder))
            print(checks[-1], flush=True)
        for name, variant in variants.items():
            score(scene, queries, variant, results[name])
        embedder.save()
        print(f"{conversation.sample_id}: {len(queries)} questions in {time.perf_counter() - start:.0f} s", flush=True)
    if not checks:
        checks.append("not run (pass --check)")
    for name, scored in results.items():
        print(
            f"{name:50s} "
            + "  ".join(f"{scored.recall(b):.3f}" for b in BUDGETS)
            + "  | cat1@500 "
            + f"{scored.recall(500, 1):.3f}"
        )
    if args.out is not None:
        info["embedder"] = embedder.name
        info["tree"] = kind.name
        markdown, payload = report(results, conversations, checks, machine_lines(info), kind.name)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"{args.name}.md").write_text(markdown + "\n", encoding="utf-8")
        (args.out / f"{args.name}.json").write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {args.out / args.name}.md and .json")


if __name__ == "__main__":
    main()
