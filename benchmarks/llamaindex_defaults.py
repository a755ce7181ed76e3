"""``MemTreeIndex`` beside ``VectorStoreIndex`` with each one's defaults.

Both indexes are built from the twelve short articles of ``notebooks/articles``
(some 120 words each), and from memtree's own manual (``docs/*.md`` at commit
``--manual-commit``, long pages), with LlamaIndex's default transformations and the same embedder
(memtree's bundled all-MiniLM-L6-v2, wrapped as a LlamaIndex ``BaseEmbedding``;
the documents' metadata kept out of embeddings and prompts), and queried through ``as_query_engine(llm=...)`` with no
other argument, as a newcomer would. The answering model is a ``MockLLM`` that
counts its calls (it echoes its prompt, so a refine step sees the whole first
prompt as the answer so far).

Measured per index, over the questions below:

* words of context per query: the words of the source nodes the engine handed to
  the LLM (their text, without metadata);
* LLM calls per query (more than one means the context overflowed into refine);
* failures: queries the engine raised on (the old ``Calculated available
  context size -44`` error);
* the similarity cut-off (short articles): for each cut-off, the share of
  questions (on-topic and unrelated) whose kept hits are the same in both
  indexes once each keeps its hits scoring at least the cut-off (LlamaIndex's
  ``SimilarityPostprocessor``), both retrieving the top 2. A hit is named by its
  article (one node per article); a memtree summary is never the same hit. And,
  for the articles both rank in their top 10, how far apart their two scores
  are and how often each cut-off keeps or drops them alike.

Writes ``<name>.md`` and ``<name>.json`` to ``--out`` (``--name``, default
``llamaindex_defaults``). Run it against another checkout of memtree by putting
that checkout first on ``PYTHONPATH``.

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

import llamaindex_memtree
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

MANUAL_QUESTIONS = [
    "How do I save a MemTreeIndex and load it again?",
    "Which LlamaIndex filter operators does memtree support?",
    "How does retrieval mix cosine similarity and BM25?",
    "What does theta0 auto do?",
    "How do I run the LoCoMo benchmark?",
    "How do I keep the memory in PostgreSQL?",
    "What does the LangGraph store do with a filter?",
    "How do I draw the tree as a picture?",
    "Which embedding model is used offline?",
    "How are summaries written when no LLM is configured?",
]
"""Questions memtree's manual answers."""

MANUAL_COMMIT = "9e1b281"
"""The manual indexed: docs/*.md as of this commit (before this benchmark's own pages)."""


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


def text_only(documents: list[Document]) -> list[Document]:
    """The documents with their metadata kept out of embeddings and prompts.

    memtree embeds a node's text alone; LlamaIndex embeds the metadata lines with
    it unless told not to, which would make the two cosines differ by what was
    embedded rather than by how it is scored."""
    for document in documents:
        document.excluded_embed_metadata_keys = list(document.metadata)
        document.excluded_llm_metadata_keys = list(document.metadata)
    return documents


def manual_documents(commit: str) -> list[Document]:
    """memtree's own manual (``docs/*.md``) as it was at ``commit`` (so the corpus
    stays put while the manual changes): long pages, cut by the default splitter
    into nodes of up to 1,024 tokens, ten of which overflow a 3,900-token window."""
    listing = subprocess.run(
        ["git", "ls-tree", "--name-only", commit, "docs/"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    pages = sorted(name for name in listing if name.endswith(".md"))
    return text_only(
        [
            Document(
                text=subprocess.run(
                    ["git", "show", f"{commit}:{name}"], cwd=ROOT, capture_output=True, text=True, check=True
                ).stdout,
                metadata={"article": Path(name).stem},
            )
            for name in pages
        ]
    )


def words(text: str) -> int:
    return len(text.split())


def engine_costs(index: BaseIndex[Any], questions: list[str], **options: Any) -> dict[str, Any]:
    """Words of context and LLM calls per query of ``index.as_query_engine(llm=..., **options)``."""
    llm = CountingLLM()
    engine = index.as_query_engine(llm=llm, **options)
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


def hit_name(hit: Any) -> str:
    """The article of a hit (one node per article), or ``summary <id>``."""
    if hit.node.metadata.get("is_leaf", True):
        return str(hit.node.metadata["article"])
    return f"summary {hit.node.metadata['memtree_id']}"


def kept_hits(index: BaseIndex[Any], question: str, cutoff: float) -> list[str]:
    """The top-2 hits that ``SimilarityPostprocessor`` keeps, by article."""
    options = {"min_similarity": None} if isinstance(index, MemTreeIndex) else {}  # the cutoff under test decides
    hits = index.as_retriever(similarity_top_k=2, **options).retrieve(question)
    kept = SimilarityPostprocessor(similarity_cutoff=cutoff).postprocess_nodes(hits, QueryBundle(question))
    return [hit_name(hit) for hit in kept]


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
                same += a == b
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


def shared_hit_agreement(vector: BaseIndex[Any], tree: BaseIndex[Any]) -> dict[str, Any]:
    """For the articles both indexes rank in their top 10 (leaves), the gap between
    their two scores and how often each cut-off decides alike on them."""
    gaps: list[float] = []
    alike = dict.fromkeys(CUTOFFS, 0)
    for question in ON_TOPIC + UNRELATED:
        a = {
            hit_name(hit): float(hit.score or 0.0)
            for hit in vector.as_retriever(similarity_top_k=10).retrieve(question)
        }
        b = {
            hit_name(hit): float(hit.score or 0.0)
            for hit in tree.as_retriever(similarity_top_k=10, min_similarity=None).retrieve(question)
        }
        for article in a.keys() & b.keys():
            gaps.append(abs(a[article] - b[article]))
            for cutoff in CUTOFFS:
                alike[cutoff] += (a[article] >= cutoff) == (b[article] >= cutoff)
    return {
        "shared_hits": len(gaps),
        "mean_gap": sum(gaps) / len(gaps) if gaps else None,
        "max_gap": max(gaps, default=None),
        "decisions_alike": {str(cutoff): count for cutoff, count in alike.items()},
    }


def first_hit_scores(vector: BaseIndex[Any], tree: BaseIndex[Any]) -> list[dict[str, Any]]:
    """Each on-topic question's best hit in both indexes, with its score in each."""
    rows = []
    for question in ON_TOPIC:
        a = vector.as_retriever(similarity_top_k=1).retrieve(question)[0]
        b = tree.as_retriever(similarity_top_k=1, min_similarity=None).retrieve(question)[0]
        rows.append(
            {
                "question": question,
                "vector": [hit_name(a), round(float(a.score or 0.0), 3)],
                "memtree": [hit_name(b), round(float(b.score or 0.0), 3)],
            }
        )
    return rows


def git_commit(folder: Path) -> str:
    """The commit of the checkout holding ``folder`` (the memtree code measured)."""
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=folder, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def render(report: dict[str, Any]) -> str:
    lines = [
        "# MemTreeIndex beside VectorStoreIndex, each with its defaults",
        "",
        "The same embedder (memtree's bundled all-MiniLM-L6-v2 as a LlamaIndex embed model) for both, "
        "LlamaIndex's default transformations, and `index.as_query_engine(llm=MockLLM())` with no other "
        "argument (MockLLM: a 3,900-token window; it echoes its prompt). Corpora: the twelve short articles "
        f"of `notebooks/articles` and memtree's manual, `docs/*.md` at commit {report['manual_commit']}. "
        "Produced by "
        "`benchmarks/llamaindex_defaults.py`.",
        "",
        f"- Command: `{report['command']}`",
        f"- memtree code measured: `{report['code']}` at commit {report['commit']}",
        f"- Machine: {report['machine']} (shared with other jobs while it ran); {report['date']}",
        f"- Questions: {len(ON_TOPIC)} on the articles, {len(MANUAL_QUESTIONS)} on the manual, "
        f"{len(UNRELATED)} unrelated ones asked of both",
        "",
        "| corpus | index | documents → nodes | words of context per query | LLM calls per query | "
        "queries that raised |",
        "|---|---|---|---|---|---|",
    ]
    for corpus, engines in report["corpora"].items():
        for name, row in engines.items():
            wpq = "–" if row["words_per_query"] is None else f"{row['words_per_query']:.0f}"
            cpq = "–" if row["llm_calls_per_query"] is None else f"{row['llm_calls_per_query']:.2f}"
            lines.append(
                f"| {corpus} | {name} | {row['documents']} → {row['nodes']} | {wpq} | {cpq} | "
                f"{len(row['failures'])} of {row['queries']} |"
            )
    failures = [f for engines in report["corpora"].values() for row in engines.values() for f in row["failures"]]
    if failures:
        lines += ["", "First error: `" + failures[0] + "`"]
    lines += [
        "",
        "## A similarity cut-off tuned on the vector index (short articles)",
        "",
        "Both retrieve the top 2, then `SimilarityPostprocessor(similarity_cutoff=c)` keeps the hits scoring "
        "at least `c`. A question counts as *same* when both keep the same articles in the same order "
        "(a memtree summary never counts as the same hit).",
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
    shared = report["shared"]
    lines += [
        "",
        f"On the {shared['shared_hits']} (question, article) pairs both indexes rank in their top 10, the two "
        f"scores differ by {shared['mean_gap']:.4f} on average ({shared['max_gap']:.4f} at most), and each cut-off "
        "keeps or drops them alike: "
        + ", ".join(f"{count} of {shared['shared_hits']} at {c}" for c, count in shared["decisions_alike"].items())
        + ".",
    ]
    lines += ["", "Best hit of each on-topic question (short articles), article and score:", ""]
    lines += ["| question | VectorStoreIndex | MemTreeIndex |", "|---|---|---|"]
    for row in report["first_hits"]:
        lines.append(
            f"| {row['question']} | {row['vector'][0]} {row['vector'][1]:.3f} | "
            f"{row['memtree'][0]} {row['memtree'][1]:.3f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--name", default="llamaindex_defaults", help="stem of the files written")
    parser.add_argument("--manual-commit", default=MANUAL_COMMIT, help="the commit whose docs/*.md to index")
    args = parser.parse_args(argv)
    Settings.embed_model = MiniLMEmbedding()
    articles = text_only(load_documents())
    code = Path(llamaindex_memtree.__file__).resolve().parents[1]
    report: dict[str, Any] = {
        "command": "python benchmarks/llamaindex_defaults.py" + "".join(f" {a}" for a in (argv or sys.argv[1:])),
        "code": str(code),
        "commit": git_commit(code),
        "machine": f"{platform.platform()}, Python {platform.python_version()}, {os.cpu_count()} CPUs",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "manual_commit": args.manual_commit,
        "corpora": {},
    }
    short: tuple[BaseIndex[Any], BaseIndex[Any]] | None = None
    corpora = (
        ("short articles", articles, ON_TOPIC + UNRELATED),
        ("memtree's manual", manual_documents(args.manual_commit), MANUAL_QUESTIONS + UNRELATED),
    )
    for corpus, documents, questions in corpora:
        vector = VectorStoreIndex.from_documents(documents)
        tree = MemTreeIndex.from_documents(documents)
        short = short or (vector, tree)
        engines = (
            ("VectorStoreIndex", vector, {}),
            ("MemTreeIndex", tree, {}),
            ("MemTreeIndex, similarity_top_k=10", tree, {"similarity_top_k": 10}),
        )
        report["corpora"][corpus] = {
            name: {
                "documents": len(documents),
                "nodes": len(index.docstore.docs),
                **engine_costs(index, questions, **options),
            }
            for name, index, options in engines
        }
    assert short is not None
    report["cutoffs"] = cutoff_agreement(*short)
    report["first_hits"] = first_hit_scores(*short)
    report["shared"] = shared_hit_agreement(*short)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / f"{args.name}.md").write_text(render(report))
    print(render(report))


if __name__ == "__main__":
    main()
