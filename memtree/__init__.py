"""memtree: long-term memory for LLM applications as a dynamic tree (MemTree).

The public entry point is :class:`MemTree`; the README has a tour, docs/ the rest.
The modules, top (what users call) to bottom (what everything uses); an import only
ever points down this list (tests/test_module_graph.py checks it, and that there are
no circles):

Entry points
  cli, commands/   the ``memtree`` command, one module per sub-command (bench: finds memtree_bench)
  demo             the offline demo conversation, its tree and what it retrieves for three questions
  tree             MemTree: the public API, a facade delegating each operation in one step
  keywords         the keyword options of the facade's writing calls, written once per sync/async pair
  siblings         handles a memory keeps open to other namespaces of its store (sibling()), LRU, closed when evicted
  backup           JSONL export and import of one namespace (no pickle, no re-embedding)
  source_leaves    replace_source: a source's leaves and the caller's records in one transaction; manifests
  update           MemTree.update: correct a leaf in place (same id), the versions it replaced kept
Writing
  writer           where a text enters once and leaves committed: entry points, optimistic commit loop
  procedures       insert, flush, delete, repair, restore as sans-IO steps returning a PreparedWrite
  summaries        aggregation and embedding rounds the procedures share; failures mark nodes stale
  model_calls      the steps' model requests and their sync (threads) and async (event loop) drivers
  background       aggregation="background": the worker thread that writes pending summaries
  optimistic       footprints: is a plan made outside the store's lock still valid at commit?
  deferral         which summaries wait for a deferred rewrite, and with which texts
  bulk             add_many(bulk=True): a batch grouped by clustering, each summary written once
  planning         what an insert or delete changes in the tree, before any model is called
  routing          where a new text goes: depth-adaptive threshold, descent from the root
  calibration      theta0="auto": the routing threshold learnt from the embedder's scale
Reading
  overview         MemTree.overview: a person, topic or time span covered breadth first, dated
  retrieval        a query checked, ranked (collapsed or traversal, hybrid) and packed to a budget
  intent           what a query asks for: an overview (about whom or what, when) or a lookup
  time_expressions "in May 2023", "last week": a query's time expressions as a time range (dateparser)
  recency          same_subject: a newer memory about the same subject put above an older one
  packing          a ranking made into results under k, the token budget and sentence de-duplication
  summary_hits     what a summary that ranks delivers: its best leaves (default) or its own text
  feedback         context feedback: the best first match's tree context moves the query
  replica          this process's tree and index of one namespace, caught up from the store
  checkpoint       which segment a reopen maps, when a new one is written, the folder's lock
  integrity        every invariant of a tree and its index, checked
  stats            TreeStats and the cost counters
  viz/             pictures of the tree, functions of a memory: outline, Mermaid, DOT (PNG/SVG), HTML page
  redaction        stand-ins for summaries above a removed text; what readers see before a sweep; the check
  state            TreeState: the in-process tree and its lookups, changed only by change batches
  node_table       nodes by id: those changed in this process as objects, the rest built from a segment when read
  segment_writer   a frozen tree written as a new segment (synced, renamed into place)
  segment          a namespace's tree frozen in memory-mapped files: the format, opened and read
  where            the metadata filter of retrieve (Mongo-style operators), parsed and matched
  index            the incremental vector index: exact search, or the IVF from a size on
  ann              the IVF: k-means lists of row numbers of the vector index's matrix
  lexical          the incremental BM25 index beside it, for hybrid scores
  spare_core       runs the BM25 search on a spare core while the caller scans vectors
Models
  model_choice     which embedder and summary writer a memory uses (the stored one, else offline; never the env)
  digest           digest summaries: an offline summary that says who, when and what (the demo's), read as a phrase
  aggregate        Aggregator: LLM summaries (the paper's prompt) and offline extractive ones
  models/          OpenAI, LangChain, LlamaIndex and llama.cpp adapters; the resolver of what callers pass
  embed            Embedder: local (bundled MiniLM on numpy, else sentence-transformers), hashing (tests); checks
  local_models     where a local: model comes from: bundled, a folder, the HF cache, or the hub if reachable
  minilm           the bundled all-MiniLM-L6-v2 on numpy (tokenizers + safetensors): no torch, a batch per core
  llm              ChatModel: what memtree asks of a language model; plain callables
  summary_guard    checks on a model-written summary before the tree stores it
  retry            backoff with jitter, Retry-After, per-call timeouts; batches split when they time out
  model_usage      usage reports: adapters say what a call cost, the calling memory counts it
Storage
  store/           the Store boundary: in memory, SQLite (sqlite_inspect checks a file first), PostgreSQL
Foundations
  config           MemTreeConfig: every tuning knob in one validated object
  inputs           checks and conversions of what callers pass (metadata, times)
  node             Node and RetrievedNode, the records a memory hands out
  text             sentences, words, token counts, text checks
  output_file      writing a file the user named as shell redirection would, without its risks
  version          the package version, also written into backups
  deprecation      old public names kept working with a DeprecationWarning
"""

from typing import TYPE_CHECKING, Any

from memtree.version import __version__

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time __getattr__ imports on first use
    from memtree.aggregate import (
        AGGREGATE_PROMPT,
        AGGREGATE_PROMPT_VERSION,
        SMALL_MODEL_PROMPT,
        SMALL_MODEL_RETRY_PROMPT,
        Aggregator,
        ExtractiveAggregator,
        LLMAggregator,
    )
    from memtree.config import MemTreeConfig
    from memtree.digest import DigestAggregator
    from memtree.embed import Embedder, HashingEmbedder, LocalEmbedder
    from memtree.llm import CallableChatModel, ChatModel, Completion
    from memtree.model_choice import EmbedderMismatchError
    from memtree.node import ROOT_ID, LeafVersion, Node, RetrievedNode
    from memtree.retry import ModelResponseError, RetryPolicy
    from memtree.stats import TreeStats
    from memtree.store import (
        IncompatibleStoreError,
        MemoryBackend,
        NamespaceInfo,
        PostgresBackend,
        SQLiteBackend,
        Store,
    )
    from memtree.tree import MemTree

_HOMES = {
    "memtree.aggregate": (
        "AGGREGATE_PROMPT",
        "AGGREGATE_PROMPT_VERSION",
        "SMALL_MODEL_PROMPT",
        "SMALL_MODEL_RETRY_PROMPT",
        "Aggregator",
        "ExtractiveAggregator",
        "LLMAggregator",
    ),
    "memtree.config": ("MemTreeConfig",),
    "memtree.digest": ("DigestAggregator",),
    "memtree.embed": ("Embedder", "HashingEmbedder", "LocalEmbedder"),
    "memtree.llm": ("CallableChatModel", "ChatModel", "Completion"),
    "memtree.model_choice": ("EmbedderMismatchError",),
    "memtree.node": ("ROOT_ID", "LeafVersion", "Node", "RetrievedNode"),
    "memtree.retry": ("ModelResponseError", "RetryPolicy"),
    "memtree.stats": ("TreeStats",),
    "memtree.store": (
        "IncompatibleStoreError",
        "MemoryBackend",
        "NamespaceInfo",
        "PostgresBackend",
        "SQLiteBackend",
        "Store",
    ),
    "memtree.tree": ("MemTree",),
}
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}
"""Public name -> the module that defines it. ``import memtree`` loads none of them
(numpy, FAISS and the engine cost about half a second); the first use of a name
imports its module, once, and binds the name here."""


def __getattr__(name: str) -> Any:
    module = _HOME_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'memtree' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOME_OF})


__all__ = [
    "AGGREGATE_PROMPT",
    "AGGREGATE_PROMPT_VERSION",
    "ROOT_ID",
    "SMALL_MODEL_PROMPT",
    "SMALL_MODEL_RETRY_PROMPT",
    "Aggregator",
    "CallableChatModel",
    "ChatModel",
    "Completion",
    "DigestAggregator",
    "Embedder",
    "EmbedderMismatchError",
    "ExtractiveAggregator",
    "HashingEmbedder",
    "IncompatibleStoreError",
    "LLMAggregator",
    "LeafVersion",
    "LocalEmbedder",
    "MemTree",
    "MemTreeConfig",
    "MemoryBackend",
    "ModelResponseError",
    "NamespaceInfo",
    "Node",
    "PostgresBackend",
    "RetrievedNode",
    "RetryPolicy",
    "SQLiteBackend",
    "Store",
    "TreeStats",
    "__version__",
]
