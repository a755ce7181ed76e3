"""Document ingestion: LlamaIndex's ``VectorStoreIndex`` against ``MemTreeIndex``, side by side.

The corpus is built deterministically from files installed on this machine:
the licence texts in ``/usr/share/common-licenses``, the ``copyright`` files in
``/usr/share/doc/*/`` and the ``METADATA`` (package description) files of the
Python packages installed beside memtree. Each file is cut into chunks of 100-200
words (whole paragraphs where they fit, words otherwise); identical files and
identical chunks are kept once; ``--chunks`` of them are drawn with a fixed seed
and kept in their corpus order. Each chunk is one LlamaIndex ``Document``, so
both indexes get the same nodes (``from_documents`` runs the default splitter,
which leaves a chunk this short whole).

Every method embeds with the same model: memtree's bundled all-MiniLM-L6-v2
(``memtree.LocalEmbedder``) wrapped as a LlamaIndex embed model, which counts the
texts it is given. Methods, in one process, one after another:

* ``VectorStoreIndex.from_documents`` (LlamaIndex's defaults);
* ``MemTreeIndex.from_documents`` (memtree's offline defaults: extractive summaries);
* ``MemTreeIndex.from_documents(aggregation="deferred")``.

Methods alternate: with ``--repeats`` above 1 the order flips every round, and the
median build time is reported. Each number in ``--load`` is a condition: that many
spinning processes run meanwhile (benchmarks/busy_load.py; 0 is the machine as it
is, the number of cores a machine with every core busy).

Reported per method: build time, embedded texts per chunk, tree depth, and
exact-phrase hit@5: for ``--queries`` chunks (seeded), a window of ``--phrase-words``
words from the chunk that occurs in no other chunk is the query; a hit when that
chunk's node is among the retriever's top 5 (``similarity_top_k=5``).

Writes ``ingestion_rag.md`` and ``ingestion_rag.json`` to ``--out``.

    python benchmarks/ingestion_rag.py --chunks 2000
    python benchmarks/ingestion_rag.py --chunks 300 --queries 100   # a quick look
    python benchmarks/ingestion_rag.py --chunks 400 --repeats 2 --load 0,2   # quiet and loaded
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import hashlib
import json
import os
import platform
import random
import re
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

os.environ.pop("OPENAI_API_KEY", None)  # the offline defaults, whatever the shell has
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from busy_load import busy_cores, load_average  # noqa: E402
from llama_index.core import Document, Settings, VectorStoreIndex  # noqa: E402
from llama_index.core.embeddings import BaseEmbedding  # noqa: E402
from pydantic import PrivateAttr  # noqa: E402

import llamaindex_memtree  # noqa: E402
from memtree import LocalEmbedder  # noqa: E402
from memtree.version import __version__  # noqa: E402

MIN_WORDS = 100
MAX_WORDS = 200
SEED = 23


# -- the corpus ---------------------------------------------------------------------------


def source_files() -> list[Path]:
    """Licence texts, Debian copyright files and Python package descriptions, sorted."""
    files = sorted(Path("/usr/share/common-licenses").glob("*"))
    files += sorted(Path("/usr/share/doc").glob("*/copyright"))
    files += sorted(Path(sys.prefix).glob("lib/python*/site-packages/*.dist-info/METADATA"))
    return [path for path in files if path.is_file() and not path.is_symlink()]


def chunks_of(text: str) -> Iterator[str]:
    """Chunks of ``MIN_WORDS``-``MAX_WORDS`` words: paragraphs packed whole while they
    fit, a longer one cut by words; a short tail joins the chunk before it."""
    words_so_far: list[str] = []
    for paragraph in re.split(r"\n\s*\n", text):
        words = paragraph.split()
        while words:
            room = MAX_WORDS - len(words_so_far)
            words_so_far.extend(words[:room])
            words = words[room:]
            if len(words_so_far) >= MAX_WORDS or (len(words_so_far) >= MIN_WORDS and not words):
                yield " ".join(words_so_far)
                words_so_far = []
    if len(words_so_far) >= MIN_WORDS // 2:
        yield " ".join(words_so_far)


def corpus(size: int) -> list[str]:
    """``size`` distinct chunks of the installed documentation, drawn with a fixed seed."""
    seen_files: set[str] = set()
    seen_chunks: set[str] = set()
    chunks: list[str] = []
    for path in source_files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        digest = hashlib.sha256(text.encode()).hexdigest()
        if digest in seen_files:
            continue
        seen_files.add(digest)
        for chunk in chunks_of(text):
            key = chunk.lower()
            if MIN_WORDS <= len(chunk.split()) <= MAX_WORDS and key not in seen_chunks:
                seen_chunks.add(key)
                chunks.append(chunk)
    if len(chunks) < size:
        raise SystemExit(f"only {len(chunks)} chunks found on this machine, asked for {size}")
    picked = sorted(random.Random(SEED).sample(range(len(chunks)), size))
    return [chunks[i] for i in picked]


@dataclass(frozen=True)
class Query:
    chunk: int
    phrase: str


def phrase_queries(chunks: list[str], count: int, words: int) -> list[Query]:
    """For ``count`` chunks, a window of ``words`` words found in no other chunk."""
    folded = [" ".join(chunk.lower().split()) for chunk in chunks]
    rng = random.Random(SEED + 1)
    queries: list[Query] = []
    for number in rng.sample(range(len(chunks)), len(chunks)):
        tokens = chunks[number].split()
        starts = list(range(0, len(tokens) - words + 1))
        rng.shuffle(starts)
        for start in starts[:10]:
            phrase = " ".join(tokens[start : start + words])
            key = phrase.lower()
            if sum(key in text for text in folded) == 1:
                queries.append(Query(number, phrase))
                break
        if len(queries) == count:
            break
    return queries


# -- the shared embedder ---------------------------------------------------------------------


class CountingMiniLM(BaseEmbedding):
    """memtree's bundled all-MiniLM-L6-v2 as a LlamaIndex embed model, counting texts."""

    _embedder: LocalEmbedder = PrivateAttr()
    _count: list[int] = PrivateAttr()
    _lock: threading.Lock = PrivateAttr()

    def __init__(self, embedder: LocalEmbedder, **kwargs: Any) -> None:
        super().__init__(model_name="all-MiniLM-L6-v2", **kwargs)
        self._embedder = embedder
        self._count = [0]
        self._lock = threading.Lock()

    @property
    def texts(self) -> int:
        return self._count[0]

    def reset(self) -> None:
        self._count[0] = 0

    def _embed(self, texts: list[str]) -> list[list[float]]:
        with self._lock:
            self._count[0] += len(texts)
        return [list(map(float, row)) for row in self._embedder.embed(texts)]

    def _get_query_embedding(self, query: str) -> list[float]:
        return self._embed([query])[0]

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return self._get_query_embedding(query)

    def _get_text_embedding(self, text: str) -> list[float]:
        return self._embed([text])[0]

    def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return self._embed(texts)


# -- the methods ---------------------------------------------------------------------------


@dataclass
class Built:
    name: str
    seconds: float
    embedded_texts: int
    retrieve: Callable[[str], list[str]]
    shape: dict[str, Any]


def build_vector_store(documents: list[Document], embed: CountingMiniLM) -> Built:
    embed.reset()
    started = time.perf_counter()
    index = VectorStoreIndex.from_documents(documents)
    seconds = time.perf_counter() - started
    retriever = index.as_retriever(similarity_top_k=5)
    return Built(
        "VectorStoreIndex.from_documents",
        seconds,
        embed.texts,
        lambda query: [hit.node.ref_doc_id or "" for hit in retriever.retrieve(query)],
        {},
    )


def build_memtree(documents: list[Document], embed: CountingMiniLM, aggregation: str | None) -> Built:
    embed.reset()
    started = time.perf_counter()
    # What a user runs: Settings.embed_model set, the index's own memory and defaults.
    index = llamaindex_memtree.MemTreeIndex.from_documents(documents, aggregation=aggregation)
    seconds = time.perf_counter() - started
    stats = index.memory.stats()
    retriever = index.as_retriever(similarity_top_k=5)

    def retrieve(query: str) -> list[str]:
        return [hit.node.ref_doc_id or "" for hit in retriever.retrieve(query)]

    name = "MemTreeIndex.from_documents" + (f'(aggregation="{aggregation}")' if aggregation else "")
    shape = {
        "nodes": stats.nodes,
        "leaves": stats.leaves,
        "summaries": stats.summaries,
        "max_depth": stats.max_depth,
        "mean_leaf_depth": round(stats.mean_leaf_depth, 2),
        "branching": round(stats.branching, 2),
        "stale": stats.stale,
        "integrity_problems": len(index.memory.check_integrity()),
    }
    return Built(name, seconds, embed.texts, retrieve, shape)


def hit_rate(built: Built, queries: list[Query], doc_ids: list[str]) -> float:
    hits = sum(doc_ids[query.chunk] in built.retrieve(query.phrase) for query in queries)
    return hits / len(queries)


# -- the report ---------------------------------------------------------------------------


def machine() -> dict[str, str]:
    def run(*command: str) -> str:
        try:
            return subprocess.run(command, capture_output=True, text=True, check=False).stdout.strip()
        except OSError:
            return ""

    import llama_index.core

    cpu = next((line.split(":", 1)[1].strip() for line in _lines("/proc/cpuinfo") if line.startswith("model name")), "")
    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "os": platform.platform(),
        "python": platform.python_version(),
        "llama-index-core": llama_index.core.__version__,
        "memtree": __version__,
        "memtree commit": run("git", "-C", str(ROOT), "rev-parse", "--short", "HEAD")
        + ("-dirty" if run("git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no") else ""),
        "load before": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }


def _lines(path: str) -> list[str]:
    try:
        return Path(path).read_text().splitlines()
    except OSError:
        return []


def write_report(out: Path, conditions: list[dict[str, Any]], info: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "ingestion_rag.json").write_text(json.dumps({"machine": info, "conditions": conditions}, indent=2) + "\n")
    lines = [
        "# Document ingestion: VectorStoreIndex against MemTreeIndex",
        "",
        f"{info['chunks']:,} chunks of {MIN_WORDS}-{MAX_WORDS} words (mean {info['mean_words']:.0f}) from the "
        "documentation installed on the machine (licence texts in `/usr/share/common-licenses`, "
        "`/usr/share/doc/*/copyright`, the `METADATA` files of the installed Python packages), each one "
        "LlamaIndex `Document`; every method embeds with memtree's bundled all-MiniLM-L6-v2 "
        "(`LocalEmbedder`) wrapped as a LlamaIndex embed model (`Settings.embed_model`, LlamaIndex's default "
        "`embed_batch_size` of 10), which counts the texts it embeds. Both indexes are built as a user builds "
        "them: `from_documents(documents)`, defaults otherwise (MemTreeIndex: offline extractive summaries, "
        "`MemTreeConfig(deduplicate=False)`, no timeout lifted). Methods run in one process, the order "
        f"flipping every round ({info['repeats']} rounds, median build time), on a machine shared with other "
        'jobs; "spinning processes" are busy loops the benchmark adds (benchmarks/busy_load.py). '
        f"Exact-phrase hit@5: {info['queries']} chunks, a {info['phrase_words']}-word window of each that "
        "occurs in no other chunk as the query; a hit when the chunk is among the top 5 retrieved.",
        "",
    ]
    for condition in conditions:
        rows = condition["rows"]
        base = rows[0]["build_s"]
        spinners = condition["spinning_processes"]
        title = f"{spinners} spinning processes" if spinners else "No added load"
        lines += [
            f"## {title} (load {condition['load_before']} → {condition['load_after']})",
            "",
            "| method | build time (s) | each round (s) | ÷ VectorStoreIndex | embedded texts | per chunk "
            "| max depth | summaries | hit@5 |",
            "|---|---:|---|---:|---:|---:|---:|---:|---:|",
        ]
        for row in rows:
            shape = row["shape"]
            rounds = ", ".join(f"{value:.1f}" for value in row["rounds_s"])
            lines.append(
                f"| `{row['method']}` | {row['build_s']:.1f} | {rounds} | {row['build_s'] / base:.2f}× | "
                f"{row['embedded_texts']:,} | {row['embedded_per_chunk']:.2f} | {shape.get('max_depth', '—')} | "
                f"{shape.get('summaries', '—')} | {row['hit_at_5']:.3f} |"
            )
        lines.append("")
    lines += ["## Machine and command", "", "| | |", "|---|---|"]
    lines += [f"| {key} | {value} |" for key, value in info.items()]
    (out / "ingestion_rag.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", type=int, default=2000)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--phrase-words", type=int, default=8)
    parser.add_argument("--methods", default="vector,memtree,memtree-deferred")
    parser.add_argument("--repeats", type=int, default=1, help="rounds of every method, the order flipping")
    parser.add_argument("--load", default="0", help="spinning processes per condition, comma-separated")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()

    chunks = corpus(args.chunks)
    queries = phrase_queries(chunks, args.queries, args.phrase_words)
    doc_ids = [f"chunk-{number:05d}" for number in range(len(chunks))]
    documents = [Document(text=text, doc_id=doc_id) for text, doc_id in zip(chunks, doc_ids, strict=True)]
    info: dict[str, Any] = machine()
    info.update(
        chunks=len(chunks),
        mean_words=sum(len(chunk.split()) for chunk in chunks) / len(chunks),
        queries=len(queries),
        phrase_words=args.phrase_words,
        repeats=args.repeats,
        command="python benchmarks/ingestion_rag.py " + " ".join(sys.argv[1:]),
    )

    embedder = LocalEmbedder()
    embedder.embed(["warm up the model before any method is timed"])
    embed = CountingMiniLM(embedder)
    Settings.embed_model = embed
    builders: dict[str, Callable[[], Built]] = {
        "vector": lambda: build_vector_store(documents, embed),
        "memtree": lambda: build_memtree(documents, embed, None),
        "memtree-deferred": lambda: build_memtree(documents, embed, "deferred"),
    }
    methods = args.methods.split(",")
    conditions = []
    for spinners in (int(value) for value in args.load.split(",")):
        with busy_cores(spinners):
            time.sleep(2.0 if spinners else 0.0)  # let the spinners reach the run queue
            load_before = load_average()
            rounds: dict[str, list[Built]] = {key: [] for key in methods}
            for number in range(args.repeats):
                for key in methods if number % 2 == 0 else list(reversed(methods)):
                    gc.collect()
                    rounds[key].append(builders[key]())
                    print(spinners, key, f"{rounds[key][-1].seconds:.1f} s", flush=True)
            load_after = load_average()
        rows = []
        for key in methods:
            built = rounds[key][-1]
            times = [one.seconds for one in rounds[key]]
            row = {
                "method": built.name,
                "build_s": statistics.median(times),
                "rounds_s": times,
                "embedded_texts": built.embedded_texts,
                "embedded_per_chunk": built.embedded_texts / len(chunks),
                "hit_at_5": hit_rate(built, queries, doc_ids),
                "shape": built.shape,
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
        conditions.append(
            {"spinning_processes": spinners, "load_before": load_before, "load_after": load_after, "rows": rows}
        )
    info["load after"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    write_report(args.out, conditions, info)


if __name__ == "__main__":
    main()
