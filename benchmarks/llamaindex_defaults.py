"""``MemTreeIndex`` beside ``VectorStoreIndex`` with each one's defaults.

Both indexes are built from the twelve short articles of
``notebooks/articles`` with LlamaIndex's default transformations and the same
embedder (memtree's bundled all-MiniLM-L6-v2, wrapped as a LlamaIndex
``BaseEmbedding``), and queried through ``as_query_engine(llm=...)`` with no
other argument, as a newcomer would. The answering model is a ``MockLLM`` that
counts its calls (it echoes its prompt, so a refine step sees the whole first
prompt as the answer so far).

Measured per index, over the questions below:

* words of context per query: the words of the source nodes the engine handed to
  the LLM (their text, without metadata);
* LLM calls per query (more than one means the context overflowed into refine);
* failures: queries the engine raised on (the old ``Calculated available
  context size -44`` error);
* the similarity cut-off: for each cut-off tuned on the vector index, the share
  of questions (on-topic and unrelated) whose kept hits, by node id, are the
  same in both indexes once each keeps its hits scoring at least the cut-off
  (LlamaIndex's ``SimilarityPostprocessor``), both retrieving the top 2.

Writes ``llamaindex_defaults.md`` and ``llamaindex_defaults.json`` to ``--out``.

    python benchmarks/llamaindex_defaults.py
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

from llama_index.core import Document, Settings, SimpleDirectoryReader, VectorStoreIndex
from llama_index.core.base.llms.types import CompletionResponse
from llama_index.core.bridge.pydantic import PrivateAttr
from llama_index.core.embeddings import BaseEmbedding
from llama_index.core.indices.base import BaseIndex
from llama_index.core.llms import MockLLM
from llama_index.core.postprocessor import SimilarityPostprocessor
from llama_index.core.schema import QueryBundle

from llamaindex_memtree import MemTreeIndex
from memtree import LocalEmbedder

ROOT = Path(__file__).resolve().parents[1]
ARTICLES = ROOT / "notebooks" / "articles"

ON_TOPIC = [
    "How do honey bees stay warm in winter?",
    "When is honey ready to harvest?",
    "What does a beekeeper look for when inspecting a hive?",
    "Why is the soil near volcanoes so fertile?",
    "Why do some volcanoes explode instead of pouring out lava?",
    "How do volcanoes form?",
    "What should I feed my sourdough starter?",
    "How do I get a crisp crust on my bread?",
    "How do I shape a sourdough loaf?",
    "How do I fix a punctured inner tube?",
    "How often should I oil my bike chain?",
    "How do I adjust my bicycle brakes?",
]
"""Questions the articles answer (the notebook's eight and four more)."""

UNRELATED = [
    "What is 17 times 3?",
    "Who wrote Pride and Prejudice?",
    "What is the capital of Australia?",
    "Good morning, how are you today?",
    "Which programming language has a borrow checker?",
    "How many players are on a football team?",
]
"""Questions the articles do not answer: a good cut-off keeps nothing for them."""

CUTOFFS = (0.3, 0.4, 0.5, 0.6)


class MiniLMEmbedding(BaseEmbedding):
    """memtree's bundled all-MiniLM-L6-v2 as a LlamaIndex embed model, so both
    indexes embed alike (normalized vectors: their dot product is the cosine)."""

    _embedder: LocalEmbedder = PrivateAttr(default_factory=LocalEmbedder)

    def _get_text_embedding(self, text: str) -> list[float]:
        return [float(x) for x in self._embedder.embed([text])[0]]

    def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return [[float(x) for x in row] for row in self._embedder.embed(texts)]

    def _get_query_embedding(self, query: str) -> list[float]:
        return self._get_text_embedding(query)

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return self._get_text_embedding(query)


class CountingLLM(MockLLM):
    """A MockLLM that counts its completions."""

    _calls: int = PrivateAttr(default=0)

    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        self._calls += 1
        return super().complete(prompt, formatted=formatted, **kwargs)

    def take_calls(self) -> int:
        calls, self._calls = self._calls, 0
        return calls


def load_documents() -> list[Document]:
    return SimpleDirectoryReader(str(ARTICLES), file_metadata=lambda path: {"article": Path(path).stem}).load_data()


def words(text: str) -> int:
    return len(text.split())


def engine_costs(index: BaseIndex[Any], questions: list[str]) -> dict[str, Any]:
    """Words of context and LLM calls per query of ``index.as_query_engine(llm=...)``."""
    llm = CountingLLM()
    engine = index.as_query_engine(llm=llm)
    context_words: list[int] = []
    calls: list[int] = []
    failures: list[str] = []
    for question in questions:
        try:
            response = engine.query(question)
        except ValueError as error:
            failures.append(f"{question}: {error}")
            llm.take_calls()
            continue
        context_words.append(sum(words(source.node.get_content()) for source in response.source_nodes))
        calls.append(llm.take_calls())
    answered = len(calls)
    return {
        "queries": len(questions),
        "answered": answered,
        "failures": failures,
        "words_per_query": sum(context_words) / answered if answered else None,
        "llm_calls_per_query": sum(calls) / answered if answered else None,
    }


def kept_hits(index: BaseIndex[Any], question: str, cutoff: float) -> list[tuple[str, float]]:
    """The top-2 hits' node ids and scores that ``SimilarityPostprocessor`` keeps."""
    hits = index.as_retriever(similarity_top_k=2).retrieve(question)
    kept = SimilarityPostprocessor(similarity_cutoff=cutoff).postprocess_nodes(hits, QueryBundle(question))
    return [(hit.node.node_id, round(float(hit.score or 0.0), 3)) for hit in kept]


def cutoff_agreement(vector: BaseIndex[Any], tree: BaseIndex[Any]) -> list[dict[str, Any]]:
    rows = []
    for cutoff in CUTOFFS:
        row: dict[str, Any] = {"cutoff": cutoff}
        for name, questions in (("on_topic", ON_TOPIC), ("unrelated", UNRELATED)):
            same = 0
            kept_vector = kept_tree = 0
            for question in questions:
                a = kept_hits(vector, question, cutoff)
                b = kept_hits(tree, question, cutoff)
                same += [node_id for node_id, _ in a] == [node_id for node_id, _ in b]
                kept_vector += len(a)
                kept_tree += len(b)
            row[name] = {
                "questions": len(questions),
                "same_hits": same,
                "hits_kept_vector": kept_vector,
                "hits_kept_memtree": kept_tree,
            }
        rows.append(row)
    return rows


def first_hit_scores(vector: BaseIndex[Any], tree: BaseIndex[Any]) -> list[dict[str, Any]]:
    """Each on-topic question's best hit in both indexes, with its score in each."""
    rows = []
    for question in ON_TOPIC:
        a = vector.as_retriever(similarity_top_k=1).retrieve(question)[0]
        b = tree.as_retriever(similarity_top_k=1).retrieve(question)[0]
        rows.append(
            {
                "question": question,
                "vector": [a.node.node_id, round(float(a.score or 0.0), 3)],
                "memtree": [b.node.node_id, round(float(b.score or 0.0), 3)],
            }
        )
    return rows


def git_commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def render(report: dict[str, Any]) -> str:
    lines = [
        "# MemTreeIndex beside VectorStoreIndex, each with its defaults",
        "",
        "Twelve short articles (`notebooks/articles`), LlamaIndex's default transformations, the same embedder "
        "(memtree's bundled all-MiniLM-L6-v2 as a LlamaIndex embed model) for both; "
        "`index.as_query_engine(llm=MockLLM())` with no other argument. Produced by "
        "`benchmarks/llamaindex_defaults.py`.",
        "",
        f"- Command: `{report['command']}`",
        f"- Machine: {report['machine']} (shared with other jobs while it ran); commit {report['commit']}; "
        f"{report['date']}",
        f"- Questions: {len(ON_TOPIC)} on-topic, {len(UNRELATED)} unrelated",
        "",
        "| index | documents → nodes | words of context per query | LLM calls per query | queries that raised |",
        "|---|---|---|---|---|",
    ]
    for name in ("VectorStoreIndex", "MemTreeIndex"):
        row = report["engines"][name]
        wpq = "–" if row["words_per_query"] is None else f"{row['words_per_query']:.0f}"
        cpq = "–" if row["llm_calls_per_query"] is None else f"{row['llm_calls_per_query']:.2f}"
        lines.append(
            f"| {name} | {report['documents']} → {row['nodes']} | {wpq} | {cpq} | "
            f"{len(row['failures'])} of {row['queries']} |"
        )
    failures = [f for name in report["engines"] for f in report["engines"][name]["failures"]]
    if failures:
        lines += ["", "First error: `" + failures[0] + "`"]
    lines += [
        "",
        "## A similarity cut-off tuned on the vector index",
        "",
        "Both retrieve the top 2, then `SimilarityPostprocessor(similarity_cutoff=c)` keeps the hits scoring "
        "at least `c`. A question counts as *same* when both keep the same node ids in the same order.",
        "",
        "| cut-off | on-topic: same hits | hits kept (vector / memtree) | unrelated: same hits | "
        "hits kept (vector / memtree) |",
        "|---|---|---|---|---|",
    ]
    for row in report["cutoffs"]:
        on, off = row["on_topic"], row["unrelated"]
        lines.append(
            f"| {row['cutoff']} | {on['same_hits']} of {on['questions']} | {on['hits_kept_vector']} / "
            f"{on['hits_kept_memtree']} | {off['same_hits']} of {off['questions']} | {off['hits_kept_vector']} / "
            f"{off['hits_kept_memtree']} |"
        )
    lines += ["", "Best hit of each on-topic question, node and score:", ""]
    lines += ["| question | VectorStoreIndex | MemTreeIndex |", "|---|---|---|"]
    for row in report["first_hits"]:
        same = "same node" if row["vector"][0] == row["memtree"][0] else "other node"
        lines.append(f"| {row['question']} | {row['vector'][1]:.3f} | {row['memtree'][1]:.3f} ({same}) |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    Settings.embed_model = MiniLMEmbedding()
    documents = load_documents()
    vector = VectorStoreIndex.from_documents(documents)
    tree = MemTreeIndex.from_documents(documents)
    questions = ON_TOPIC + UNRELATED
    report: dict[str, Any] = {
        "command": "python benchmarks/llamaindex_defaults.py" + "".join(f" {a}" for a in (argv or sys.argv[1:])),
        "machine": f"{platform.platform()}, Python {platform.python_version()}, {os.cpu_count()} CPUs",
        "commit": git_commit(),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "documents": len(documents),
        "engines": {},
    }
    for name, index in (("VectorStoreIndex", vector), ("MemTreeIndex", tree)):
        report["engines"][name] = {"nodes": len(index.docstore.docs), **engine_costs(index, questions)}
    report["cutoffs"] = cutoff_agreement(vector, tree)
    report["first_hits"] = first_hit_scores(vector, tree)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "llamaindex_defaults.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / "llamaindex_defaults.md").write_text(render(report))
    print(render(report))


if __name__ == "__main__":
    main()
