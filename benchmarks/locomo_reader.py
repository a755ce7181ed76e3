"""Answer quality as a reader sees it: a local model reads each method's retrieved
context and answers LoCoMo's questions; its answers are scored with LoCoMo's token F1
and with answer containment (issue 22, item 4).

Evidence recall only says whether the gold turns were delivered; a summary may help a
reader in ways it cannot see, or a reader may miss what was delivered. Here the same
reader (the same model, prompt and settings) answers from the context each row
retrieved at ``--budget`` words, on the trees ``memtree bench locomo --keep-trees``
saved (model-written ones; a build still running is read from its last checkpoint, as
``locomo_llm_retrieval.py`` does). Rows: flat hybrid search over the same turns,
memtree's default (a summary hit delivers its best leaves) and memtree delivering
summary text as it did before. Each row's mean comes with a 95% bootstrap interval,
and each memtree row's paired difference to flat hybrid with its own.

Every reply is kept in ``--replies`` (JSON Lines, keyed by the model and the exact
prompt), so a rerun asks the model nothing it was asked before; the file is derived
from LoCoMo (CC BY-NC 4.0) and stays out of the repository.

    python benchmarks/locomo_reader.py --data ../shared/data/locomo10.json \\
        --saved-trees /work/trees/llm --conversations 8,9 \\
        --llm llama-cpp:/work/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf \\
        --replies /work/trees/llm/reader_replies.jsonl --out benchmarks/results
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import locomo_research as research  # noqa: E402

from memtree.llm import ChatModel, Completion  # noqa: E402
from memtree_bench.answer_f1 import contains, f1  # noqa: E402
from memtree_bench.locomo import CATEGORY_NAMES, Conversation, load_locomo, select_conversations  # noqa: E402
from memtree_bench.metrics import context_at_budget  # noqa: E402
from memtree_bench.qa import EMPTY_CONTEXT, READER_PROMPT, READER_PROMPT_VERSION  # noqa: E402
from memtree_bench.report import machine_info, machine_lines, markdown_table  # noqa: E402
from memtree_bench.saved_trees import SavedTrees, TreeRecipe  # noqa: E402

ROWS = {
    "flat hybrid": "flat hybrid",
    "memtree (default: a summary hit delivers its best leaves)": research.POINTER_ROW,
    "memtree, summaries delivered as text (before)": research.DEFAULT_ROW,
}
"""Report row -> the locomo_research.py variant that retrieves for it."""
BASELINE = "flat hybrid"


class ReplyCache:
    """A model's replies on disk, keyed by the model's name and the exact prompt
    (also used by ``summary_prompt_replay.py``)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.replies: dict[str, Completion] = {}
        if path.is_file():
            for line in path.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    item = json.loads(line)
                    self.replies[item["key"]] = Completion(item["reply"], truncated=item.get("truncated", False))

    @staticmethod
    def key(model: str, prompt: str) -> str:
        return hashlib.sha256(f"{model}\n{prompt}".encode()).hexdigest()

    def complete(self, model: ChatModel, prompt: str, *, ask: bool = True) -> Completion | None:
        """The cached completion, else the model's (``ask=False``: else ``None``)."""
        key = self.key(model.name, prompt)
        if key not in self.replies:
            if not ask:
                return None
            completion = model.complete(prompt)
            completion = Completion(completion.text.strip(), truncated=completion.truncated)
            self.replies[key] = completion
            self.path.parent.mkdir(parents=True, exist_ok=True)
            line = {"key": key, "model": model.name, "reply": completion.text, "truncated": completion.truncated}
            with self.path.open("a", encoding="utf-8") as stream:  # one write per line: shards may share the file
                stream.write(json.dumps(line) + "\n")
        return self.replies[key]

    def answer(self, model: ChatModel, prompt: str, *, ask: bool = True) -> str | None:
        """The cached reply's text, else the model's (``ask=False``: else ``None``)."""
        completion = self.complete(model, prompt, ask=ask)
        return None if completion is None else completion.text


@dataclass
class RowScores:
    """Per question read: its id, category, F1, containment."""

    questions: list[str] = field(default_factory=list)
    categories: list[int] = field(default_factory=list)
    f1: list[float] = field(default_factory=list)
    contained: list[float] = field(default_factory=list)


def bootstrap(values: Sequence[float], resamples: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """The mean and a 95% percentile interval over resampled questions."""
    if not values:
        return float("nan"), float("nan"), float("nan")
    rng = random.Random(seed)
    n = len(values)
    means = sorted(statistics.fmean(values[rng.randrange(n)] for _ in range(n)) for _ in range(resamples))
    return statistics.fmean(values), means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1]


def read_all(
    scenes: Sequence[tuple[research.Scene, list[research.Query]]],
    model: ChatModel,
    cache: ReplyCache,
    budget: int,
    embedder: research.DiskCachedEmbedder,
    max_questions: int | None = None,
    shard: tuple[int, int] = (0, 1),
    ask: bool = True,
) -> dict[str, RowScores]:
    """Every row's context for every question, read by ``model``, scored.

    Rows are read one after another (all of flat hybrid's questions first), so a run
    stopped early has whole rows. ``shard=(k, n)`` reads only every n-th question
    from the k-th on: n processes share one reply cache to fill it n times faster on
    n cores. ``ask=False`` scores only the replies already cached; a row then leaves
    out the questions it has no reply for (its differences pair the questions both
    rows have)."""
    variants = research.variant_table(embedder)
    chosen = {row: next(group[name] for group in variants.values() if name in group) for row, name in ROWS.items()}
    scores = {row: RowScores() for row in ROWS}
    for row, variant in chosen.items():
        for scene, queries in scenes:
            pairs = list(enumerate(zip(scene.conversation.questions, queries, strict=True)))[:max_questions]
            for number, (question, query) in pairs[shard[0] :: shard[1]]:
                context = context_at_budget(variant(scene, query), budget) or EMPTY_CONTEXT
                prompt = READER_PROMPT.format(context=context, question=question.question)
                reply = cache.answer(model, prompt, ask=ask)
                if reply is None:
                    continue
                scores[row].questions.append(f"{scene.conversation.sample_id}#{number}")
                scores[row].categories.append(question.category)
                scores[row].f1.append(f1(reply, question.answer, question.category))
                scores[row].contained.append(contains(reply, question.answer))
    return scores


def paired(got: RowScores, base: RowScores, values: str) -> list[float]:
    """``got``'s values minus ``base``'s, over the questions both read."""
    theirs = dict(zip(base.questions, getattr(base, values), strict=True))
    return [
        value - theirs[question]
        for question, value in zip(got.questions, getattr(got, values), strict=True)
        if question in theirs
    ]


def summarize(scores: dict[str, RowScores]) -> dict[str, Any]:
    base = scores[BASELINE]
    out: dict[str, Any] = {}
    for row, got in scores.items():
        entry: dict[str, Any] = {
            "questions": len(got.f1),
            "f1": bootstrap(got.f1),
            "containment": bootstrap(got.contained),
            "f1_by_category": {
                str(c): statistics.fmean(v for v, k in zip(got.f1, got.categories, strict=True) if k == c)
                for c in sorted(set(got.categories))
            },
        }
        if row != BASELINE:
            entry["paired_questions"] = len(paired(got, base, "f1"))
            entry["f1_minus_flat_hybrid"] = bootstrap(paired(got, base, "f1"))
            entry["containment_minus_flat_hybrid"] = bootstrap(paired(got, base, "contained"))
        out[row] = entry
    return out


def render(summary: dict[str, Any], facts: dict[str, Any], environment: list[str]) -> str:
    def interval(triple: Sequence[float], scale: float = 1.0, signed: bool = False) -> str:
        mean, low, high = (value * scale for value in triple)
        sign = "+" if signed else ""
        return f"{mean:{sign}.3f} [{low:{sign}.3f}, {high:{sign}.3f}]"

    categories = sorted({c for row in summary.values() for c in row["f1_by_category"]})
    lines = [
        "# LoCoMo answers as a reader gives them: token F1 and containment",
        "",
        *environment,
        "",
        f"Reader: {facts['model']}, prompt {READER_PROMPT_VERSION} (memtree_bench/qa.py), context cut at "
        f"{facts['budget']} words. Trees: {facts['trees']}. Conversations: {facts['conversations']}. "
        "F1 is LoCoMo's token F1 (memtree_bench/answer_f1.py); containment: the gold answer appears whole "
        "in the reply. Brackets: 95% bootstrap intervals over questions (paired for the differences).",
        "",
        *markdown_table(
            [
                "row",
                "questions",
                "paired with flat hybrid",
                "F1",
                "containment",
                "F1 minus flat hybrid",
                "containment minus flat hybrid",
                *(f"F1 {CATEGORY_NAMES.get(int(c), c)}" for c in categories),
            ],
            [
                [
                    row,
                    str(s["questions"]),
                    str(s.get("paired_questions", "")),
                    interval(s["f1"]),
                    interval(s["containment"]),
                    interval(s["f1_minus_flat_hybrid"], signed=True) if "f1_minus_flat_hybrid" in s else "",
                    interval(s["containment_minus_flat_hybrid"], signed=True)
                    if "containment_minus_flat_hybrid" in s
                    else "",
                    *(f"{s['f1_by_category'].get(c, float('nan')):.3f}" for c in categories),
                ]
                for row, s in summary.items()
            ],
        ),
        "",
    ]
    return "\n".join(lines)


def tree_origin(folder: Path, recipe: TreeRecipe, conversation: Conversation) -> str:
    """Which code built the tree a reader read, from its sidecar: its summary code
    decides what the summary rows deliver, so a report names it."""
    trees = SavedTrees(folder)
    sidecar = trees.sidecar_path(trees.tree_path(conversation.sample_id, recipe))
    if not sidecar.is_file():
        return "tree still being built: its last checkpoint"
    data = json.loads(sidecar.read_text(encoding="utf-8"))
    return f"tree built by {data.get('memtree_commit') or 'an unknown commit'}, sha256 {data['tree_sha256'][:16]}"


def make_reader(spec: str) -> ChatModel:
    """``llama-cpp:PATH`` (answers are short: 48 tokens at most) or what MemTree(llm=) takes."""
    if spec.startswith("llama-cpp:"):
        from memtree.models.llamacpp import LlamaCppChatModel

        return LlamaCppChatModel(spec.partition(":")[2], max_tokens=48)
    from memtree.models.resolve import resolve_chat_model

    return resolve_chat_model(spec)


def parse_shard(parser: argparse.ArgumentParser, spec: str | None) -> tuple[int, int]:
    """``"K/N"`` -> ``(K, N)`` with 0 <= K < N; no shard -> ``(0, 1)``."""
    if spec is None:
        return 0, 1
    part, _, total = spec.partition("/")
    if not (part.isdigit() and total.isdigit() and int(part) < int(total)):
        parser.error(f"--shard must be K/N with 0 <= K < N, got {spec!r}")
    return int(part), int(total)


def main(argv: Sequence[str] | None = None, model: ChatModel | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="locomo10.json")
    parser.add_argument("--saved-trees", type=Path, required=True, help="--keep-trees folder")
    research.add_saved_recipe_options(parser)
    parser.add_argument("--conversations", default="8,9", help="held-out conversations")
    parser.add_argument("--llm", default=None, help="the reader: llama-cpp:PATH or openai[:MODEL]")
    parser.add_argument("--replies", type=Path, required=True, help="JSON Lines cache of the reader's replies")
    parser.add_argument("--budget", type=int, default=500, help="context words")
    parser.add_argument("--max-questions", type=int, default=None, help="per conversation (smoke runs)")
    parser.add_argument("--cache", type=Path, default=Path("/tmp/locomo-cache"), help="embeddings")
    parser.add_argument("--embedder", default="local", choices=("local", "hashing"), help="hashing: tests only")
    parser.add_argument(
        "--shard", default=None, help="K/N: fill the reply cache with every N-th question from the K-th, no report"
    )
    parser.add_argument(
        "--cached-only", action="store_true", help="score only the replies in --replies; ask the model nothing"
    )
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--name", default="locomo_reader")
    args = parser.parse_args(argv)
    shard = parse_shard(parser, args.shard)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if model is None:
        if not args.llm:
            parser.error("--llm is required: the reader model (llama-cpp:PATH or openai[:MODEL])")
        model = make_reader(args.llm)
    cache_dir = args.cache / args.embedder
    embedder = research.make_embedder(args.embedder, cache_dir)
    recipe = research.saved_recipe(args)
    conversations: list[Conversation] = select_conversations(load_locomo(args.data), args.conversations)
    scenes = []
    for conversation in conversations:
        path, cut = research.saved_tree(cache_dir, args.saved_trees, recipe, conversation, embedder)
        scene = research.Scene.load(path, cut)
        scenes.append((scene, research.queries_of(scene, embedder)))
    embedder.save()
    cache = ReplyCache(args.replies)
    scores = read_all(scenes, model, cache, args.budget, embedder, args.max_questions, shard, not args.cached_only)
    if args.shard is not None:
        print(f"shard {args.shard}: {len(scores[BASELINE].f1)} questions read into {args.replies}")
        return
    summary = summarize(scores)
    facts = {
        "model": model.name,
        "budget": args.budget,
        "trees": f"recipe {recipe.key} ({json.dumps(recipe.describe())})",
        "conversations": ", ".join(
            f"{scene.conversation.sample_id} ({len(scene.conversation.turns)} turns; "
            f"{tree_origin(args.saved_trees, recipe, scene.conversation)})"
            for scene, _ in scenes
        ),
    }
    command = ["python", "benchmarks/locomo_reader.py", *(sys.argv[1:] if argv is None else argv)]
    environment = machine_lines(machine_info(command))
    markdown = render(summary, facts, environment)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.md").write_text(markdown + "\n", encoding="utf-8")
    (args.out / f"{args.name}.json").write_text(
        json.dumps({"environment": environment, "facts": facts, "rows": summary}, indent=1) + "\n", encoding="utf-8"
    )
    print(markdown)


if __name__ == "__main__":
    main()
