"""QA accuracy with an LLM reader and an LLM judge (the MemTree paper's protocol).

For each question a *reader* model answers using only the context a memory retrieved
for it, and a *judge* model compares that answer with the gold answer and replies
1 (same meaning) or 0. Accuracy is the mean verdict, overall and per category.
The prompts are ours, versioned as module constants so a report can say which ones
produced its numbers.

Contexts are plain strings: the caller decides how a method's retrieved texts become
one context (the LoCoMo harness cuts them at a word budget), so every method is
judged by the same reader on the same terms.

A judge reply that is not 0 or 1 is asked again once, then counted as 0 and
reported as a judge failure. A model that keeps failing transiently (rate limits,
server errors, timeouts after the model's own retries, unusable replies) fails only
that item, counted as 0 and reported; errors that would fail every item (a wrong key,
a bad request) stop the run.

Example::

    models = qa_models_from_env()
    if models is not None:
        reader, judge = models
        report = QAEvaluator(reader, judge).evaluate(
            [QAItem("Where did Mira ride?", "to the lake", context="2023-05-07 Mira: I rode to the lake", category=4)]
        )
        print(report.accuracy, report.by_category)
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

from memtree import model_usage as usage
from memtree.llm import ChatModel
from memtree.retry import ModelResponseError, transient
from memtree.stats import Counters

logger = logging.getLogger(__name__)

READER_PROMPT_VERSION = "memtree-qa-reader-v1"

NO_ANSWER = "Not answerable from the memory."
"""What the reader is told to reply when the excerpts do not hold the answer."""

READER_PROMPT = (
    """You answer questions about past conversations, using only the memory excerpts below. \
An excerpt may start with the date of the conversation session it comes from.

Memory excerpts:
{context}

Question: {question}

How to answer:
- Use only what the excerpts say; no outside knowledge, no guessing.
- Reply with a short answer of a few words (a name, a date, a short phrase), not a sentence of explanation.
- For dates, work from the session dates in the excerpts: if someone says "yesterday" or "last week" \
in a session dated 9 June 2023, answer with the date or period that means (8 June 2023, the week before \
9 June 2023).
- If the excerpts do not contain the answer, reply exactly: """
    + NO_ANSWER
    + """

Answer:"""
)
"""The reader's prompt (version ``READER_PROMPT_VERSION``); placeholders ``{context}``
and ``{question}``."""

EMPTY_CONTEXT = "(no excerpts were retrieved)"
"""Stands for the context in the reader's prompt when a method retrieved nothing."""

JUDGE_PROMPT_VERSION = "memtree-qa-judge-v1"

JUDGE_PROMPT = """You grade answers to questions about past conversations against a gold answer.

Question: {question}
Gold answer: {gold}
Answer to grade: {answer}

Reply 1 if the answer to grade means the same as the gold answer, and 0 otherwise. Be generous: \
wording, length, extra detail and format do not matter as long as the answer carries the gold answer's \
meaning. The same date or period written another way counts as the same ("7 May 2023", "May 7, 2023" \
and "2023-05-07" are one date). Reply 0 when the answer is wrong, misses the point of the gold answer, \
contradicts it, or says the question cannot be answered.

Reply with the single digit 1 or 0 and nothing else."""
"""The judge's prompt (version ``JUDGE_PROMPT_VERSION``); placeholders ``{question}``,
``{gold}`` and ``{answer}``."""

JUDGE_REMINDER = """

Your previous reply was {reply}, which is neither 1 nor 0. Reply with the single digit 1 or 0 only."""
"""Appended to the judge's prompt when its first reply could not be read as a verdict."""

_VERDICT = re.compile(r"""[\s"'`*(\[]*([01])[\s"'`*)\].!]*""")
"""A verdict: the digit 0 or 1, perhaps quoted, bolded, bracketed or followed by a period."""


class JudgeReplyError(ModelResponseError):
    """The judge answered twice with something that is neither 1 nor 0 (``replies``)."""

    def __init__(self, message: str, replies: tuple[str, ...]) -> None:
        super().__init__(message)
        self.replies = replies


@dataclass(frozen=True)
class QAItem:
    """One question to answer from one retrieved context.

    ``gold_answer`` may be a number (LoCoMo stores a few answers as integers); it is
    kept as text. ``context`` is what the method under test retrieved, as one string
    (empty when it retrieved nothing). ``category`` groups the accuracy report
    (LoCoMo's 1–4).
    """

    question: str
    gold_answer: str
    context: str
    category: int | str

    def __post_init__(self) -> None:
        if not isinstance(self.question, str) or not self.question.strip():
            raise ValueError(f"QAItem.question must be a non-empty string, got {self.question!r}")
        gold = self.gold_answer
        if isinstance(gold, (int, float)) and not isinstance(gold, bool):
            object.__setattr__(self, "gold_answer", str(gold))
        elif not isinstance(gold, str) or not gold.strip():
            raise ValueError(f"QAItem.gold_answer must be a non-empty string or a number, got {gold!r}")
        if not isinstance(self.context, str):
            raise ValueError(f"QAItem.context must be a string, got {type(self.context).__name__} {self.context!r}")
        if isinstance(self.category, bool) or not isinstance(self.category, (int, str)):
            raise ValueError(f"QAItem.category must be an int or a string, got {self.category!r}")


@dataclass(frozen=True)
class QAResult:
    """What happened to one item: the reader's answer and the judge's verdict.

    ``verdict`` is 1 or 0; a failed item has verdict 0 and says why in
    ``reader_error`` (no answer, so no judging) or ``judge_error``.
    ``judge_replies`` are the judge's raw replies (two when the first was unreadable).
    """

    item: QAItem
    answer: str
    verdict: int
    judge_replies: tuple[str, ...] = ()
    reader_error: str | None = None
    judge_error: str | None = None

    @property
    def correct(self) -> bool:
        return self.verdict == 1


@dataclass(frozen=True)
class CategoryScore:
    """Accuracy of one category: ``correct`` of ``count`` items."""

    count: int
    correct: int

    @property
    def accuracy(self) -> float:
        return self.correct / self.count if self.count else 0.0


@dataclass(frozen=True)
class ModelUsage:
    """What one role's model calls cost in a run, as the model adapters reported it.

    ``requests`` counts HTTP-level attempts (retries included), ``retries`` the
    extra attempts; tokens are what the API said (0 when it did not say).
    """

    requests: int = 0
    retries: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @classmethod
    def from_counters(cls, counters: Counters) -> ModelUsage:
        values = counters.snapshot()
        return cls(
            requests=int(values.get("llm_requests", 0)),
            retries=int(values.get("retries", 0)),
            prompt_tokens=int(values.get("prompt_tokens", 0)),
            completion_tokens=int(values.get("completion_tokens", 0)),
        )


@dataclass(frozen=True)
class QAReport:
    """QA accuracy of one run: overall, per category, failures, costs and every result.

    ``results`` are in the order the items were given. Failed items count as wrong
    (verdict 0) in every accuracy. ``reader`` and ``judge`` name the models, and the
    prompt versions say which prompts produced the numbers.
    """

    results: tuple[QAResult, ...]
    reader_usage: ModelUsage
    judge_usage: ModelUsage
    reader: str
    judge: str
    reader_prompt_version: str = READER_PROMPT_VERSION
    judge_prompt_version: str = JUDGE_PROMPT_VERSION
    by_category: dict[int | str, CategoryScore] = field(init=False)

    def __post_init__(self) -> None:
        tallies: dict[int | str, list[int]] = {}
        for result in self.results:
            tally = tallies.setdefault(result.item.category, [0, 0])
            tally[0] += 1
            tally[1] += result.verdict
        ordered = sorted(tallies, key=lambda category: (isinstance(category, str), category))
        object.__setattr__(self, "by_category", {category: CategoryScore(*tallies[category]) for category in ordered})

    @property
    def count(self) -> int:
        return len(self.results)

    @property
    def correct(self) -> int:
        return sum(result.verdict for result in self.results)

    @property
    def accuracy(self) -> float:
        return self.correct / self.count if self.count else 0.0

    @property
    def judge_failures(self) -> int:
        return sum(result.judge_error is not None for result in self.results)

    @property
    def reader_failures(self) -> int:
        return sum(result.reader_error is not None for result in self.results)

    @property
    def prompt_tokens(self) -> int:
        return self.reader_usage.prompt_tokens + self.judge_usage.prompt_tokens

    @property
    def completion_tokens(self) -> int:
        return self.reader_usage.completion_tokens + self.judge_usage.completion_tokens


Progress = Callable[[QAResult], None]
"""Called once per finished item (in the calling thread), e.g. to advance a progress bar."""


class QAEvaluator:
    """Answers questions from retrieved contexts with ``reader`` and grades them with ``judge``.

    ``judge`` defaults to the reader model. At most ``max_concurrency`` items are in
    progress at once, so at most that many model calls are in flight (each item calls
    the reader, then the judge).

    Example::

        evaluator = QAEvaluator(OpenAIChatModel(temperature=0), max_concurrency=8)
        report = evaluator.evaluate(items)           # or: await evaluator.aevaluate(items)
        report.accuracy, report.by_category[1].accuracy, report.judge_failures
    """

    def __init__(self, reader: ChatModel, judge: ChatModel | None = None, *, max_concurrency: int = 8) -> None:
        for role, model in (("reader", reader), ("judge", judge)):
            if model is not None and not isinstance(model, ChatModel):
                raise TypeError(
                    f"{role} must be a memtree ChatModel, got {type(model).__name__}; "
                    "wrap other models with memtree.models.resolve_chat_model"
                )
        if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int) or max_concurrency < 1:
            raise ValueError(f"max_concurrency must be an integer >= 1, got {max_concurrency!r}")
        self.reader = reader
        self.judge_model = judge if judge is not None else reader
        self.max_concurrency = max_concurrency

    # -- prompts ---------------------------------------------------------------------

    @staticmethod
    def reader_prompt(question: str, context: str) -> str:
        """The exact prompt the reader gets."""
        return READER_PROMPT.format(context=context.strip() or EMPTY_CONTEXT, question=question.strip())

    @staticmethod
    def judge_prompt(question: str, gold: str, answer: str) -> str:
        """The exact prompt the judge gets first."""
        return JUDGE_PROMPT.format(question=question.strip(), gold=gold.strip(), answer=answer.strip())

    # -- one question ------------------------------------------------------------------

    def answer(self, question: str, context: str) -> str:
        """The reader's answer to ``question`` from ``context`` alone."""
        return self.reader.complete(self.reader_prompt(question, context)).text.strip()

    async def aanswer(self, question: str, context: str) -> str:
        """Async :meth:`answer`."""
        return (await self.reader.acomplete(self.reader_prompt(question, context))).text.strip()

    def judge(self, question: str, gold: str, answer: str) -> int:
        """1 if the judge finds ``answer`` means the same as ``gold``, else 0.

        Raises :class:`JudgeReplyError` (a ``ModelResponseError``) when the judge
        replies twice with something other than 1 or 0.
        """
        return self._judge_replies(question, gold, answer)[0]

    async def ajudge(self, question: str, gold: str, answer: str) -> int:
        """Async :meth:`judge`."""
        return (await self._ajudge_replies(question, gold, answer))[0]

    def _judge_replies(self, question: str, gold: str, answer: str) -> tuple[int, tuple[str, ...]]:
        prompt = self.judge_prompt(question, gold, answer)
        first = self.judge_model.complete(prompt).text
        verdict = parse_verdict(first)
        if verdict is not None:
            return verdict, (first,)
        second = self.judge_model.complete(prompt + _reminder(first)).text
        return _final_verdict(self.judge_model.name, first, second), (first, second)

    async def _ajudge_replies(self, question: str, gold: str, answer: str) -> tuple[int, tuple[str, ...]]:
        prompt = self.judge_prompt(question, gold, answer)
        first = (await self.judge_model.acomplete(prompt)).text
        verdict = parse_verdict(first)
        if verdict is not None:
            return verdict, (first,)
        second = (await self.judge_model.acomplete(prompt + _reminder(first))).text
        return _final_verdict(self.judge_model.name, first, second), (first, second)

    # -- a run -------------------------------------------------------------------------

    def evaluate(self, items: Iterable[QAItem], *, progress: Progress | None = None) -> QAReport:
        """Answer and judge every item, ``max_concurrency`` at a time, in worker threads.

        Raises ``ValueError`` for no items. An error that is not a model's transient
        failure (see the module docstring) stops the run and is raised.
        """
        batch = _checked_items(items)
        run = _Run(self)
        results: list[QAResult | None] = [None] * len(batch)
        pool = ThreadPoolExecutor(self.max_concurrency, thread_name_prefix="memtree-qa")
        try:
            futures = {pool.submit(run.item, item): position for position, item in enumerate(batch)}
            pending = set(futures)
            while pending:
                done, pending = wait(pending, return_when=FIRST_EXCEPTION)
                for future in done:
                    result = future.result()  # raises what stopped the run
                    results[futures[future]] = result
                    if progress is not None:
                        progress(result)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)  # after an error: drop the items not started
        return run.report(results)

    async def aevaluate(self, items: Iterable[QAItem], *, progress: Progress | None = None) -> QAReport:
        """Async :meth:`evaluate`: at most ``max_concurrency`` items in flight as tasks."""
        batch = _checked_items(items)
        run = _Run(self)
        gate = asyncio.Semaphore(self.max_concurrency)
        results: list[QAResult | None] = [None] * len(batch)

        async def one(position: int, item: QAItem) -> None:
            async with gate:
                result = await run.aitem(item)
            results[position] = result
            if progress is not None:
                progress(result)

        tasks = [asyncio.ensure_future(one(position, item)) for position, item in enumerate(batch)]
        try:
            await asyncio.gather(*tasks)
        except BaseException:
            for task in tasks:  # raise the error itself (as evaluate does), not a group, after stopping the rest
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        return run.report(results)


class _Run:
    """One evaluation: counts each role's usage and turns model failures into results."""

    def __init__(self, evaluator: QAEvaluator) -> None:
        self.evaluator = evaluator
        self.reader_usage = Counters()
        self.judge_usage = Counters()

    def item(self, item: QAItem) -> QAResult:
        try:
            with usage.recording(self.reader_usage):
                answer = self.evaluator.answer(item.question, item.context)
        except Exception as error:  # noqa: BLE001 - _model_failure re-raises all but model failures
            return _failed_reading(item, error)
        try:
            with usage.recording(self.judge_usage):
                verdict, replies = self.evaluator._judge_replies(item.question, item.gold_answer, answer)
        except Exception as error:  # noqa: BLE001 - as above
            return _failed_judging(item, answer, error)
        return QAResult(item, answer, verdict, replies)

    async def aitem(self, item: QAItem) -> QAResult:
        try:
            with usage.recording(self.reader_usage):
                answer = await self.evaluator.aanswer(item.question, item.context)
        except Exception as error:  # noqa: BLE001 - _model_failure re-raises all but model failures
            return _failed_reading(item, error)
        try:
            with usage.recording(self.judge_usage):
                verdict, replies = await self.evaluator._ajudge_replies(item.question, item.gold_answer, answer)
        except Exception as error:  # noqa: BLE001 - as above
            return _failed_judging(item, answer, error)
        return QAResult(item, answer, verdict, replies)

    def report(self, results: Sequence[QAResult | None]) -> QAReport:
        finished = tuple(result for result in results if result is not None)
        assert len(finished) == len(results), "every item has a result once the run is over"
        return QAReport(
            results=finished,
            reader_usage=ModelUsage.from_counters(self.reader_usage),
            judge_usage=ModelUsage.from_counters(self.judge_usage),
            reader=self.evaluator.reader.name,
            judge=self.evaluator.judge_model.name,
        )


def parse_verdict(reply: str) -> int | None:
    """1 or 0 from a judge's reply ("1", " 0.", "**1**", "'0'"), or ``None`` for anything else."""
    match = _VERDICT.fullmatch(reply)
    return int(match.group(1)) if match else None


def _reminder(reply: str) -> str:
    shown = " ".join(reply.split())
    shown = shown if len(shown) <= 200 else shown[:199] + "…"
    return JUDGE_REMINDER.format(reply=repr(shown))


def _final_verdict(name: str, first: str, second: str) -> int:
    verdict = parse_verdict(second)
    if verdict is None:
        raise JudgeReplyError(
            f"{name} did not judge with 1 or 0: it replied {first!r}, then {second!r}", (first, second)
        )
    return verdict


def _model_failure(error: Exception) -> str:
    """The failure's description if it is one a run survives (see the module docstring); else re-raise."""
    if not transient(error)[0]:
        raise error
    return f"{type(error).__name__}: {error}"


def _failed_reading(item: QAItem, error: Exception) -> QAResult:
    message = _model_failure(error)
    logger.warning("QA reader failed on %r: %s", item.question, message)
    return QAResult(item, "", 0, reader_error=message)


def _failed_judging(item: QAItem, answer: str, error: Exception) -> QAResult:
    message = _model_failure(error)
    logger.warning("QA judge failed on %r: %s", item.question, message)
    replies = error.replies if isinstance(error, JudgeReplyError) else ()
    return QAResult(item, answer, 0, replies, judge_error=message)


def _checked_items(items: Iterable[QAItem]) -> list[QAItem]:
    if isinstance(items, (str, bytes, QAItem)):
        raise ValueError(f"items must be an iterable of QAItem, got {type(items).__name__}")
    batch = list(items)
    if not batch:
        raise ValueError("QA evaluation needs at least one QAItem; got an empty list of items")
    for position, item in enumerate(batch):
        if not isinstance(item, QAItem):
            raise ValueError(f"items[{position}] is {type(item).__name__} {item!r}, expected a QAItem")
    return batch


def qa_models_from_env(
    model: str | None = None, *, temperature: float | None = 0.0
) -> tuple[ChatModel, ChatModel] | None:
    """A reader and a judge on OpenAI (or an OpenAI-compatible server), or ``None``.

    Models are configured when ``OPENAI_API_KEY`` or ``OPENAI_BASE_URL`` is set: a
    local server (vLLM, Ollama) often needs no key, so a base URL alone is enough and
    a placeholder key is sent. ``model`` defaults to memtree's default chat model
    (``gpt-4o-mini``, the paper's). ``temperature`` 0 keeps verdicts repeatable;
    pass ``None`` for models that reject the parameter. Returns ``None`` (logged)
    when no endpoint is configured or the ``openai`` package is missing.
    """
    base_url = os.environ.get("OPENAI_BASE_URL") or None
    api_key = os.environ.get("OPENAI_API_KEY") or None
    if base_url is None and api_key is None:
        logger.info("QA evaluation needs a model: set OPENAI_API_KEY or OPENAI_BASE_URL")
        return None
    from memtree.models.openai import DEFAULT_CHAT_MODEL, OpenAIChatModel

    try:
        import openai  # noqa: F401
    except ImportError:
        logger.info("QA evaluation needs the openai package: pip install 'memtree-llm[openai]'")
        return None
    options = {"base_url": base_url, "api_key": api_key or "no-key-needed", "temperature": temperature}
    name = model or DEFAULT_CHAT_MODEL
    return OpenAIChatModel(name, **options), OpenAIChatModel(name, **options)  # type: ignore[arg-type]
