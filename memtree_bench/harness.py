"""Run retrieval methods over LoCoMo conversations and score them (design.md §5).

Methods run side by side on the same conversations, questions and embedder; each
question's ranked texts are cut at every budget and scored for evidence recall
(categories 1–4) and answer recall (categories 1 and 4, each and pooled).
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from memtree_bench.locomo import Conversation
from memtree_bench.methods import IngestCost, Method
from memtree_bench.metrics import answer_recall, contexts_at_budgets, evidence_recall

ANSWER_RECALL_CATEGORIES: tuple[int, ...] = (1, 4)


@dataclass
class QuestionScore:
    conversation: str
    category: int
    question: str
    answer: str
    recall: dict[int, float]
    answer_found: dict[int, float]
    contexts: dict[int, str] = field(repr=False, default_factory=dict)


@dataclass
class MethodResult:
    """Everything measured for one method over the run."""

    name: str
    scores: list[QuestionScore] = field(default_factory=list)
    costs: list[IngestCost] = field(default_factory=list)
    query_seconds: list[float] = field(default_factory=list)
    variant: bool = False

    def recall(self, budget: int, category: int | None = None) -> float:
        values = [s.recall[budget] for s in self.scores if category is None or s.category == category]
        return statistics.fmean(values) if values else float("nan")

    def answer_recall(self, budget: int, categories: Sequence[int] = ANSWER_RECALL_CATEGORIES) -> float:
        values = [s.answer_found[budget] for s in self.scores if s.category in categories]
        return statistics.fmean(values) if values else float("nan")

    @property
    def inserts(self) -> int:
        return sum(len(cost.insert_seconds) for cost in self.costs)

    def per_insert(self, what: str) -> float:
        return sum(getattr(cost, what) for cost in self.costs) / max(1, self.inserts)

    def shape(self, key: str) -> float:
        return statistics.fmean(cost.shape[key] for cost in self.costs) if self.costs else float("nan")

    def quality(self) -> dict[str, float]:
        """The mean of each summary-quality number over the conversations (empty for
        methods without summaries)."""
        measured = [cost.quality for cost in self.costs if cost.quality]
        if not measured:
            return {}
        return {key: statistics.fmean(q[key] for q in measured) for key in measured[0]}

    def insert_mean(self) -> float:
        seconds = [s for cost in self.costs for s in cost.insert_seconds]
        return statistics.fmean(seconds) if seconds else float("nan")

    def insert_cpu_mean(self) -> float:
        """Process CPU seconds per insert over every conversation (NaN where a saved tree has none)."""
        cpu = [cost.insert_cpu_seconds for cost in self.costs]
        if not cpu or any(value is None for value in cpu):
            return float("nan")
        return sum(value for value in cpu if value is not None) / max(1, self.inserts)

    def insert_latency(self, quantile: float) -> float:
        return _quantile([s for cost in self.costs for s in cost.insert_seconds], quantile)

    def query_latency(self, quantile: float) -> float:
        return _quantile(self.query_seconds, quantile)


def _quantile(values: list[float], quantile: float) -> float:
    return float(np.percentile(values, quantile * 100)) if values else float("nan")


ProgressFactory = Callable[[int, str], Callable[[int], None]]


def run_locomo(
    conversations: Sequence[Conversation],
    method_factories: Sequence[Callable[[], Method]],
    budgets: Sequence[int],
    *,
    keep_contexts: int | None = None,
    progress: ProgressFactory | None = None,
) -> list[MethodResult]:
    """Every method over every conversation. ``keep_contexts`` keeps the context
    text of each question at that budget (for a QA pass)."""
    if not budgets or any(b <= 0 for b in budgets):
        raise ValueError(f"budgets must be positive word counts, got {list(budgets)}")
    largest = max(budgets)
    results: dict[int, MethodResult] = {}
    total = sum(len(c.turns) + len(c.questions) for c in conversations) * len(method_factories)
    advance = progress(total, "LoCoMo") if progress else (lambda _n: None)
    for conversation in conversations:
        for position, factory in enumerate(method_factories):
            method = factory()
            result = results.setdefault(position, MethodResult(method.name, variant=method.variant))
            try:
                cpu_started = time.process_time()
                cost = method.ingest(conversation.turns, conversation.sample_id)
                if cost.insert_cpu_seconds is None:  # rows sharing one tree keep its builder's
                    cost.insert_cpu_seconds = time.process_time() - cpu_started
                result.costs.append(cost)
                advance(len(conversation.turns))
                for question in conversation.questions:
                    start = time.perf_counter()
                    texts = method.ranked_texts(question.question, largest)
                    result.query_seconds.append(time.perf_counter() - start)
                    contexts = contexts_at_budgets(texts, budgets)
                    evidence = [conversation.turn_by_id[i].utterance for i in question.evidence]
                    found = (
                        {b: answer_recall(question.answer, contexts[b]) for b in budgets}
                        if question.category in ANSWER_RECALL_CATEGORIES
                        else {}
                    )
                    result.scores.append(
                        QuestionScore(
                            conversation.sample_id,
                            question.category,
                            question.question,
                            question.answer,
                            {b: evidence_recall(evidence, contexts[b]) for b in budgets},
                            found,
                            {keep_contexts: contexts[keep_contexts]} if keep_contexts in contexts else {},
                        )
                    )
                    advance(1)
            finally:
                method.close()
    return [results[i] for i in sorted(results)]


def summary_rows(results: Sequence[MethodResult], budgets: Sequence[int]) -> dict[str, dict[int, float]]:
    """Overall recall per method per budget (a quick look; the report has the rest)."""
    grouped: dict[str, dict[int, float]] = defaultdict(dict)
    for result in results:
        for budget in budgets:
            grouped[result.name][budget] = result.recall(budget)
    return dict(grouped)
