"""Aggregators write a summary node's text from what lies below it.

``aggregate(summary, new_texts, count)`` merges raw new texts into an existing summary
of ``count`` earlier entries (the paper's Aggregate step). With ``summary=""`` and
``count=0`` it summarizes ``new_texts`` from scratch, which is how a node is rebuilt
after a deletion. Two implementations:

* :class:`ExtractiveAggregator`, the offline default: picks central, diverse
  sentences of the leaves; no model call, every word traceable to a leaf.
* :class:`LLMAggregator`: asks a chat model to merge the texts; its replies can be
  checked by :mod:`memtree.summary_guard`, with the extractive summary as fallback.
"""

from __future__ import annotations

import asyncio
import math
import threading
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from memtree.embed import Embedder, Matrix, check_embeddings
from memtree.llm import ChatModel, Completion
from memtree.model_usage import report
from memtree.models.resolve import resolve_chat_model
from memtree.node import Vector
from memtree.retry import EmptyReplyError, ModelResponseError
from memtree.summary_guard import (
    GuardedReply,
    GuardVerdict,
    SummaryRejectedError,
    check_summary,
    clean_reply,
    restore_dates,
)
from memtree.text import count_words, fold, split_sentences


class Aggregator(ABC):
    """Interface for writing summary texts.

    ``centroid`` is the mean embedding of every leaf below the node after the change;
    aggregators that select content by centrality use it, others ignore it.
    Implement :meth:`aggregate`; override :meth:`aaggregate` for a native async path.
    An aggregator that cannot produce a summary raises; the engine then keeps the
    node's previous text and marks it stale, never losing the new leaf.
    """

    @abstractmethod
    def aggregate(self, summary: str, new_texts: Sequence[str], count: int, *, centroid: Vector | None = None) -> str:
        """Merge ``new_texts`` into ``summary`` (which covers ``count`` entries)."""

    async def aaggregate(
        self, summary: str, new_texts: Sequence[str], count: int, *, centroid: Vector | None = None
    ) -> str:
        """Async :meth:`aggregate`; by default runs the sync one in a worker thread
        (``asyncio.to_thread`` carries context variables, so usage reports arrive)."""
        return await asyncio.to_thread(lambda: self.aggregate(summary, new_texts, count, centroid=centroid))

    def summarize(self, texts: Sequence[str], vectors: Matrix, leaves: int, *, centroid: Vector | None = None) -> str:
        """Write a new summary of ``texts`` (its children's texts, whose embeddings are
        the rows of ``vectors``) standing for ``leaves`` leaves. Bulk ingestion
        (:mod:`memtree.bulk`) calls it once per summary it builds; an aggregator can
        use the vectors instead of embedding anything. By default:
        ``aggregate("", texts, 0, centroid=centroid)``."""
        return self.aggregate("", texts, 0, centroid=centroid)

    async def asummarize(
        self, texts: Sequence[str], vectors: Matrix, leaves: int, *, centroid: Vector | None = None
    ) -> str:
        """Async :meth:`summarize`; by default the sync one in a worker thread, or
        :meth:`aaggregate` where :meth:`summarize` is not overridden."""
        if type(self).summarize is Aggregator.summarize:
            return await self.aaggregate("", texts, 0, centroid=centroid)
        return await asyncio.to_thread(lambda: self.summarize(texts, vectors, leaves, centroid=centroid))

    def sentences_to_embed(self, text: str) -> list[str]:
        """Texts this aggregator will embed to fold ``text`` into summaries and has
        not embedded yet. The engine embeds them in the same call as the new leaf
        and hands them back through :meth:`learn_vectors`, so an insert makes one
        embedding call instead of two. By default none."""
        return []

    def learn_vectors(self, texts: Sequence[str], vectors: Matrix) -> None:
        """Embeddings the engine made with the memory's embedder (see
        :meth:`sentences_to_embed`; a new leaf's own text among them). By default ignored."""
        return

    def known_vector(self, summary: str) -> Vector | None:
        """A vector for ``summary`` made from vectors this aggregator already holds, so
        the memory need not embed it (``parent_embedding="sentences"``); ``None``
        when it cannot (the default: a model's prose is embedded)."""
        return None

    def missing_sentences(self, summary: str) -> list[str]:
        """The texts :meth:`known_vector` still lacks to give ``summary`` a vector. The
        engine embeds them first, so a summary's vector depends on its text alone,
        not on what this process happened to embed before. By default none."""
        return []

    @property
    def calls_model(self) -> bool:
        """Whether aggregation costs a model call (the engine reports these)."""
        return True

    def bound_to(self, embedder: Embedder) -> Aggregator:
        """This aggregator, ready to use ``embedder`` where it needs one and has none
        (the memory calls it with its own embedder); by default unchanged."""
        return self


class ExtractiveAggregator(Aggregator):
    """Offline summaries made of the leaves' own sentences.

    Candidates are the sentences of the current summary and of the new texts. When
    they exceed the word budget, sentences are chosen by maximal marginal relevance:
    close to the centroid of the node's leaves (central) and unlike those already
    chosen (diverse). The budget shrinks as the node covers more leaves, from
    ``max_words`` for two leaves towards ``min_words``, so shallow nodes stay short
    and abstract while deep ones keep detail. Chosen sentences keep their original
    order, one per line, so a summary splits back into exactly its sentences.

    Sentence embeddings come from ``embedder`` (the memory binds its own when none
    is given) and are cached, so a sentence is embedded once per process.
    """

    def __init__(
        self,
        embedder: Embedder | None = None,
        *,
        max_words: int = 80,
        min_words: int = 24,
        diversity: float = 0.3,
        cache_size: int = 100_000,
    ) -> None:
        if min_words < 1 or max_words < min_words:
            raise ValueError(f"need 1 <= min_words <= max_words, got {min_words} and {max_words}")
        if not 0.0 <= diversity <= 1.0:
            raise ValueError(f"diversity must be between 0 and 1, got {diversity}")
        self.embedder = embedder
        self.max_words = max_words
        self.min_words = min_words
        self.diversity = diversity
        self._cache: OrderedDict[str, Vector] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()
        self.embedding_calls = 0

    @property
    def calls_model(self) -> bool:
        return False

    def bound_to(self, embedder: Embedder) -> ExtractiveAggregator:
        """This aggregator if it has an embedder, else a copy that uses ``embedder``."""
        if self.embedder is not None:
            return self
        return ExtractiveAggregator(
            embedder,
            max_words=self.max_words,
            min_words=self.min_words,
            diversity=self.diversity,
            cache_size=self._cache_size,
        )

    def word_budget(self, leaves: int) -> int:
        """Words a summary of ``leaves`` leaves may use: ``max_words`` at 2, shrinking by log."""
        scaled = self.max_words / math.log2(max(2, leaves))
        return max(self.min_words, round(scaled))

    def aggregate(self, summary: str, new_texts: Sequence[str], count: int, *, centroid: Vector | None = None) -> str:
        candidates = _unique_sentences([summary, *new_texts])
        if not candidates:
            return ""
        budget = self.word_budget(count + max(1, len(new_texts)))
        return self._select(candidates, budget, lambda: self._sentence_vectors(candidates), centroid)

    def summarize(self, texts: Sequence[str], vectors: Matrix, leaves: int, *, centroid: Vector | None = None) -> str:
        """A new summary of ``texts`` with no embedding call: each sentence stands in
        for the selection with its own text's vector (``vectors``' row), so maximal
        marginal relevance picks the most central children first and, since a
        child's other sentences then count as redundant, one sentence from each of
        several children before a second from any. The budget follows ``leaves``."""
        candidates: list[str] = []
        owners: list[int] = []
        seen: set[str] = set()
        for number, text in enumerate(texts):
            for sentence in split_sentences(text):
                key = fold(sentence)
                if key not in seen:
                    seen.add(key)
                    candidates.append(sentence)
                    owners.append(number)
        if not candidates:
            return ""
        budget = self.word_budget(max(2, leaves))
        return self._select(candidates, budget, lambda: np.asarray(vectors, dtype=np.float32)[owners], centroid)

    def _select(
        self, candidates: list[str], budget: int, sentence_vectors: Callable[[], Matrix], centroid: Vector | None
    ) -> str:
        """The summary of ``candidates`` within ``budget`` words: all of them when they
        fit, else the most central and diverse (maximal marginal relevance around
        ``centroid`` or the sentences' mean). ``sentence_vectors`` is only called when
        a choice must be made, so a summary that fits costs no embedding."""
        lengths = [count_words(sentence) for sentence in candidates]
        if sum(lengths) <= budget:
            return "\n".join(candidates)
        vectors = sentence_vectors()
        target = vectors.mean(axis=0) if centroid is None else np.asarray(centroid, dtype=np.float32)
        flat = target.ravel()
        norm = float(np.sqrt(flat.dot(flat)))  # np.linalg.norm's own arithmetic, without its checks
        relevance = vectors @ (target / norm) if norm > 0 else np.zeros(len(candidates), np.float32)
        chosen = _select_mmr(vectors, relevance, lengths, budget, self.diversity)
        if not chosen:  # even the best sentence is longer than the budget: keep its start
            best = int(np.argmax(relevance))
            return " ".join(candidates[best].split()[:budget]) + " …"
        return "\n".join(candidates[i] for i in sorted(chosen))

    def sentences_to_embed(self, text: str) -> list[str]:
        """``text``'s sentences not embedded yet, but for a one-sentence text: the
        leaf's own embedding is that sentence's (see :meth:`learn_vectors`)."""
        sentences = split_sentences(text)
        if sentences == [text]:
            return []
        with self._lock:
            return [sentence for sentence in dict.fromkeys(sentences) if sentence not in self._cache]

    def learn_vectors(self, texts: Sequence[str], vectors: Matrix) -> None:
        """Cache the vectors of texts that are one sentence each (others are not
        candidates, so they would only take room)."""
        with self._lock:
            for text, vector in zip(texts, vectors, strict=True):
                if text not in self._cache and split_sentences(text) == [text]:
                    self._cache[text] = np.asarray(vector, dtype=np.float32)
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)

    def known_vector(self, summary: str) -> Vector | None:
        """The word-weighted mean of the summary's sentence vectors, when every one of
        them is cached (an extractive summary is made of sentences the memory embedded
        when their leaves came in); ``None`` otherwise. A text's own vector is close to
        that mean: the model's vector is a mean over its tokens."""
        sentences = split_sentences(summary)
        with self._lock:
            vectors = [self._cache.get(sentence) for sentence in sentences]
        if not sentences or any(vector is None for vector in vectors):
            return None
        weights = np.array([count_words(sentence) or 1 for sentence in sentences], dtype=np.float32)
        mean = weights @ np.stack(vectors)  # type: ignore[arg-type]
        norm = float(np.linalg.norm(mean))
        return (mean / norm).astype(np.float32) if norm > 0 else None

    def missing_sentences(self, summary: str) -> list[str]:
        """The summary's sentences not cached (a summary written in another process, or
        whose sentences the cache dropped): their vectors make its vector."""
        sentences = split_sentences(summary)
        with self._lock:
            return [sentence for sentence in dict.fromkeys(sentences) if sentence not in self._cache]

    def _sentence_vectors(self, sentences: list[str]) -> Matrix:
        if self.embedder is None:
            raise RuntimeError("ExtractiveAggregator has no embedder; pass one or let MemTree bind its own")
        with self._lock:  # one thread embeds the misses, the others then hit the cache
            missing = [s for s in dict.fromkeys(sentences) if s not in self._cache]
            if missing:
                self.embedding_calls += 1
                report(embedding_calls=1, embedded_texts=len(missing))  # the memory's stats count them
                raw = self.embedder.embed(missing)
                vectors = check_embeddings(raw, len(missing), None, type(self.embedder).__name__)
                for sentence, vector in zip(missing, vectors, strict=True):
                    self._cache[sentence] = vector
            for sentence in sentences:
                self._cache.move_to_end(sentence)
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
            return np.stack([self._cache[s] for s in sentences])


def _unique_sentences(texts: Sequence[str]) -> list[str]:
    seen: set[str] = set()
    out: list[str] = []
    for text in texts:
        for sentence in split_sentences(text):
            key = fold(sentence)
            if key not in seen:
                seen.add(key)
                out.append(sentence)
    return out


def _select_mmr(vectors: Matrix, relevance: np.ndarray, lengths: list[int], budget: int, diversity: float) -> list[int]:
    """Greedy maximal marginal relevance under a word budget."""
    chosen: list[int] = []
    remaining = budget
    available = np.ones(len(lengths), dtype=bool)
    redundancy = np.full(len(lengths), -1.0, dtype=np.float32)
    words = np.asarray(lengths)
    central = (1.0 - diversity) * relevance  # the same every round: computed once (every insert runs this per level)
    while True:
        fits = available & (words <= remaining)
        if not fits.any():
            return chosen
        penalty = np.where(redundancy < 0, 0.0, redundancy)
        score = central - diversity * penalty
        score = np.where(fits, score, -np.inf)
        pick = int(score.argmax())
        chosen.append(pick)
        available[pick] = False
        remaining -= lengths[pick]
        redundancy = np.maximum(redundancy, vectors @ vectors[pick])


AGGREGATE_PROMPT_VERSION = "memtree-aggregate-v1"

AGGREGATE_PROMPT = """You keep a long-term memory in which each summary stands for a group of related entries.

Current summary, standing for {count} earlier entries:
{summary}

New entries to fold in:
{new_texts}

Write a single, cohesive summary that keeps the key points of the current summary and of \
the new entries: who, what, when, where, decisions and preferences. {guidance}
Reply with the summary text only: no title, no preamble, no commentary."""
"""The default aggregation prompt (version ``AGGREGATE_PROMPT_VERSION``).

Placeholders: ``{summary}``, ``{count}``, ``{new_texts}`` (a bulleted list) and
``{guidance}`` (how abstract to be, from the number of entries covered).
"""

SMALL_MODEL_PROMPT = """You maintain a memory of a chat. Merge the current summary and the new notes into one \
short summary in plain third-person prose.

Example notes:
- 3 March, 2024 Ana: I finally adopted a puppy named Biscuit!
- 3 March, 2024 Tom: Congrats! I start my nursing course in April.
Example summary: On 3 March 2024 Ana adopted a puppy named Biscuit, and Tom said he starts a nursing course in April.

Current summary ({count} earlier notes):
{summary}

New notes:
{new_texts}

Rules: do not copy the notes or write chat lines; keep every name, number and date of the new notes; \
{guidance} At most 60 words. Reply with the summary only."""
"""The prompt a guarded (small, local) model gets unless another is given.

Small models treat :data:`AGGREGATE_PROMPT`'s inputs as text to continue: on ten
LoCoMo aggregations, Qwen2.5-Coder-1.5B-Instruct (Q4_K_M) pasted the chat lines back
in 8 replies (the echo guard caught them) and passed the guards in 2. This prompt
asks for third-person prose and shows one example; 9 of 10 replies passed on the
same requests. A model that copies the example is caught too: whole, it is an echo;
its names in a real summary ("Ana adopted a puppy") fail the ``invented`` guard
(benchmarks/results/local_model_summaries.md).
"""

SMALL_MODEL_RETRY_PROMPT = """You keep a memory of a chat. Fold the new notes into the current summary: one short \
summary in plain third-person prose.

How it is done (made-up people; never write about them):
- 3 March, 2024 Ana: I finally adopted a puppy named Biscuit!
- 3 March, 2024 Tom: Congrats! I start my nursing course in April.
Summary: On 3 March 2024 Ana adopted a puppy named Biscuit, and Tom said he starts a nursing course in April.

New notes:
{new_texts}

Current summary ({count} earlier notes):
{summary}

Rules: start with what the new notes say, with their date; keep every name, number and date of \
the new notes; keep the current summary's main points in fewer words; do not copy chat lines; \
write nothing the notes and the summary do not say. At most 60 words. Reply with the summary only."""
"""What a guarded model is asked once more when the guards reject its reply to
:data:`SMALL_MODEL_PROMPT`, before the extractive summary stands in.

The new notes come first, and the rules ask to begin with them and their date: most
rejected replies dropped the new notes' date or all of the new notes. Asked alone,
this prompt does worse than :data:`SMALL_MODEL_PROMPT` (15 of 40 logged LoCoMo merges
rejected against 10); asked only where that one's reply was rejected, it rescues 3 of
those 10, so 7 of 40 end with the extractive summary, for 1.25 model calls per merge
(``benchmarks/results/summary_prompt_tuning.md``).
"""

_NO_SUMMARY = "(none yet: summarize the new entries on their own)"


def abstraction_guidance(count: int) -> str:
    """How abstract a summary of ``count`` entries should be (the paper's rule)."""
    if count <= 2:
        return "Keep concrete details; the group is still small."
    return (
        f"The group now holds {count} entries, so favour shared themes and patterns over "
        "individual details, and keep the summary shorter than its inputs combined."
    )


class LLMAggregator(Aggregator):
    """The paper's aggregation: a chat model merges new texts into a summary.

    ``llm`` is a memtree :class:`~memtree.llm.ChatModel` or anything
    ``MemTree(llm=...)`` accepts (a LangChain or LlamaIndex model, a callable
    ``prompt -> text``, sync or async); it is wrapped once, so retries, timeouts and
    token usage work the same for every kind. ``prompt`` may replace the default,
    :data:`AGGREGATE_PROMPT` (or :data:`SMALL_MODEL_PROMPT` for a guarded model);
    it must use the same placeholders.

    ``guarded`` checks every reply with :func:`~memtree.summary_guard.check_summary`
    (empty, truncated, an echo of the prompt, a dropped name or number, a name or
    number no input has, not shorter than its inputs). ``None``, the default, follows the model's
    :attr:`~memtree.llm.ChatModel.guard_summaries`: on for the local llama.cpp model,
    off for hosted ones, whose summaries at higher levels are asked to favour themes
    over details. A rejected reply is replaced by ``fallback``'s summary (the offline
    :class:`ExtractiveAggregator` unless given), or with ``strict=True`` raised as
    :class:`~memtree.summary_guard.SummaryRejectedError`, so the engine keeps the
    node's old text and marks it stale for :meth:`~memtree.MemTree.repair`. Either
    way the memory's ``stats().extra`` counts it: ``summaries_checked``,
    ``summary_guard_<guard>`` per failed guard, ``summary_fallbacks``.
    Before falling back, a guarded model is asked once more with ``retry_prompt``
    (:data:`SMALL_MODEL_RETRY_PROMPT` unless given; counted as ``summary_retries``),
    and that reply is guarded the same way. ``retry`` (default: on for a guarded
    model, unless a ``prompt`` of your own is given without a ``retry_prompt``)
    switches it. So the share of merges left to the fallback is
    ``summary_fallbacks / (summaries_checked - summary_retries)``.
    A reply that states no date and fails only for leaving out the date the new
    texts start with is stored with that date put in front instead of rejected
    (counted as ``summary_dates_restored``; ``restore_dates=False`` rejects it).
    ``max_words`` caps a guarded reply's length in words. ``on_reply``, if given, is
    called with a :class:`~memtree.summary_guard.GuardedReply` for every guarded
    reply, kept or rejected: what was asked, what came back and the verdict, so a
    caller can audit which guard rejects which replies. Unguarded, an empty reply
    is retried by the model and then raised (the node goes stale, nothing empty is
    stored).

    Example::

        LLMAggregator(lambda prompt: my_client.complete(prompt))
        LLMAggregator("llama-cpp:/models/qwen2.5-1.5b-instruct-q4_k_m.gguf", strict=True)
    """

    def __init__(
        self,
        llm: Any,
        *,
        prompt: str | None = None,
        guarded: bool | None = None,
        strict: bool = False,
        fallback: Aggregator | None = None,
        max_words: int | None = 200,
        on_reply: Callable[[GuardedReply], None] | None = None,
        retry_prompt: str | None = None,
        retry: bool | None = None,
        restore_dates: bool = True,
    ) -> None:
        self.model: ChatModel = resolve_chat_model(llm)
        self.guarded = self.model.guard_summaries if guarded is None else guarded
        if retry is None:  # on for a guarded model with the default prompt (or a retry prompt given)
            retry = self.guarded and (prompt is None or retry_prompt is not None)
        if prompt is None:
            prompt = SMALL_MODEL_PROMPT if self.guarded else AGGREGATE_PROMPT
        _check_placeholders(prompt, "prompt")
        self.retry_prompt: str | None = None
        if retry and self.guarded:
            self.retry_prompt = retry_prompt if retry_prompt is not None else SMALL_MODEL_RETRY_PROMPT
            _check_placeholders(self.retry_prompt, "retry_prompt")
        if max_words is not None and max_words < 1:
            raise ValueError(f"max_words must be a positive number of words or None, got {max_words}")
        self.prompt = prompt
        self.strict = strict
        self.fallback: Aggregator = fallback if fallback is not None else ExtractiveAggregator()
        self.max_words = max_words
        self.on_reply = on_reply
        self.restores_dates = restore_dates

    def bound_to(self, embedder: Embedder) -> LLMAggregator:
        """This aggregator with its fallback bound to ``embedder`` (the extractive
        fallback embeds sentences with the memory's own model)."""
        bound = self.fallback.bound_to(embedder)
        if bound is self.fallback:
            return self
        copy = LLMAggregator(
            self.model,
            prompt=self.prompt,
            guarded=self.guarded,
            strict=self.strict,
            fallback=bound,
            max_words=self.max_words,
            on_reply=self.on_reply,
            retry_prompt=self.retry_prompt,
            retry=self.retry_prompt is not None,
            restore_dates=self.restores_dates,
        )
        return copy

    def build_prompt(self, summary: str, new_texts: Sequence[str], count: int, template: str | None = None) -> str:
        """The exact prompt sent for one aggregation (with ``template``: that prompt's,
        e.g. :attr:`retry_prompt`)."""
        total = count + len(new_texts)
        return (template or self.prompt).format(
            summary=summary.strip() or _NO_SUMMARY,
            count=count,
            new_texts="\n".join(f"- {text.strip()}" for text in new_texts),
            guidance=abstraction_guidance(total),
        )

    def aggregate(self, summary: str, new_texts: Sequence[str], count: int, *, centroid: Vector | None = None) -> str:
        if not self.guarded:
            return _require_summary(self.model.complete(self.build_prompt(summary, new_texts, count)).text)
        for attempt, template in enumerate(self._templates(), 1):
            try:
                completion = self.model.complete(self.build_prompt(summary, new_texts, count, template))
            except EmptyReplyError:
                completion = Completion("")
            kept = self._settle(completion, summary, new_texts, count, attempt)
            if kept is not None:
                return kept
        return self.fallback.aggregate(summary, new_texts, count, centroid=centroid)

    async def aaggregate(
        self, summary: str, new_texts: Sequence[str], count: int, *, centroid: Vector | None = None
    ) -> str:
        if not self.guarded:
            return _require_summary((await self.model.acomplete(self.build_prompt(summary, new_texts, count))).text)
        for attempt, template in enumerate(self._templates(), 1):
            try:
                completion = await self.model.acomplete(self.build_prompt(summary, new_texts, count, template))
            except EmptyReplyError:
                completion = Completion("")
            kept = self._settle(completion, summary, new_texts, count, attempt)
            if kept is not None:
                return kept
        return await self.fallback.aaggregate(summary, new_texts, count, centroid=centroid)

    def _templates(self) -> tuple[str, ...]:
        """The prompts a guarded merge tries in turn: its own, then the retry prompt."""
        return (self.prompt,) if self.retry_prompt is None else (self.prompt, self.retry_prompt)

    def _settle(
        self, completion: Completion, summary: str, new_texts: Sequence[str], count: int, attempt: int
    ) -> str | None:
        """The text to store if the reply to prompt number ``attempt`` passes the
        guards (or only lacks the new texts' date); else ``None``, with the rejection
        counted (or raised, in strict mode, when no prompt is left to try)."""
        templates = self._templates()
        verdict, kept = self.check(
            completion, summary, new_texts, count, template=templates[attempt - 1], attempt=attempt
        )
        if kept is None and verdict is not None:
            self._reject(verdict, last=attempt == len(templates))
        return kept

    def check(
        self,
        completion: Completion,
        summary: str,
        new_texts: Sequence[str],
        count: int,
        *,
        template: str | None = None,
        attempt: int = 1,
    ) -> tuple[GuardVerdict | None, str | None]:
        """(the guard the model's reply to this aggregation, asked with ``template``
        (:attr:`prompt` if ``None``), fails or ``None``; the text to store or ``None``),
        whether or not ``guarded``.

        The text is the cleaned reply when it passes; when it states no date and
        fails ``facts`` only for the date the new texts start with, it is the reply
        with that date in front (:func:`~memtree.summary_guard.restore_dates`,
        unless ``restore_dates=False``), which passes every guard. Counted as
        ``summaries_checked``, a failed guard as ``summary_guard_<guard>`` (a restored
        reply too) and a restored one as ``summary_dates_restored``."""
        report(summaries_checked=1)
        reply = clean_reply(completion.text)
        context = self.guard_context(summary, new_texts, count, template)

        def judged(text: str, truncated: bool = False) -> GuardVerdict | None:
            return check_summary(
                text,
                summary=summary,
                new_texts=new_texts,
                prompt=context["prompt"],
                instructions=context["instructions"],
                truncated=truncated,
                max_words=self.max_words,
            )

        verdict = judged(reply, completion.truncated)
        kept = reply if verdict is None else None
        if verdict is not None:
            report(**{"summary_guard_" + verdict.guard: 1})
        if verdict is not None and verdict.guard == "facts" and self.restores_dates:
            mended = restore_dates(reply, new_texts)
            if mended is not None and judged(mended) is None:
                kept = mended
                report(summary_dates_restored=1)
        if self.on_reply is not None:
            restored = kept if verdict is not None else None
            reply_seen = GuardedReply(
                summary, tuple(new_texts), count, completion.text, completion.truncated, verdict, attempt, restored
            )
            self.on_reply(reply_seen)
        return verdict, kept

    def guard_context(
        self, summary: str, new_texts: Sequence[str], count: int, template: str | None = None
    ) -> dict[str, str]:
        """What the echo guard compares a reply with: the exact ``prompt`` sent, and the
        ``instructions`` (the prompt without its inputs)."""
        return {
            "prompt": self.build_prompt(summary, new_texts, count, template),
            "instructions": self.build_prompt("", [], count + len(new_texts), template).replace(_NO_SUMMARY, ""),
        }

    def _reject(self, verdict: GuardVerdict, *, last: bool) -> None:
        """Unless it was the ``last`` prompt to try, count the retry; else raise in
        strict mode, or count the fallback (:meth:`check` counted the failed guard)."""
        if not last:
            report(summary_retries=1)
        elif self.strict:
            raise SummaryRejectedError(verdict)
        else:
            report(summary_fallbacks=1)


def _check_placeholders(prompt: str, name: str) -> None:
    try:
        prompt.format(summary="", count=0, new_texts="", guidance="")
    except (KeyError, IndexError) as error:
        raise ValueError(
            f"{name} uses an unknown placeholder {error}; allowed: {{summary}}, {{count}}, {{new_texts}}, {{guidance}}"
        ) from None


def _require_summary(reply: str) -> str:
    text = reply.strip()
    if not text:
        raise ModelResponseError("the aggregation model returned an empty summary")
    return text
