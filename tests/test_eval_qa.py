"""QA accuracy against the local OpenAI-compatible server: the reader's prompt, the
judge's 1/0 parsing and its one re-ask, the per-category arithmetic, usage counting,
the concurrency bound, retries and failures, and models from the environment."""

from __future__ import annotations

import re

import pytest
from openai_server import FakeOpenAIServer

from memtree.models import OpenAIChatModel
from memtree.retry import RetryPolicy
from memtree_bench.qa import (
    EMPTY_CONTEXT,
    JUDGE_PROMPT,
    JUDGE_REMINDER,
    READER_PROMPT,
    JudgeReplyError,
    QAEvaluator,
    QAItem,
    QAReport,
    parse_verdict,
    qa_models_from_env,
)

FAST = RetryPolicy(max_attempts=3, initial_delay=0.0, timeout=10.0)

GARBLED = "hmm"
"""A reader answer the scripted judge cannot grade: it replies with prose every time."""


def field(prompt: str, label: str) -> str:
    match = re.search(rf"^{label}: (.*)$", prompt, re.M)
    assert match, f"no {label!r} line in the prompt"
    return match.group(1)


class Script:
    """Scripted replies: the reader answers from a table keyed by question; the judge
    replies 1 when the answer equals the gold answer and 0 otherwise, in prose for
    :data:`GARBLED`, and with ``judge_first`` replies (one per call) when given."""

    def __init__(self, answers: dict[str, str], judge_first: list[str] | None = None) -> None:
        self.answers = answers
        self.judge_first = list(judge_first or [])

    def __call__(self, prompt: str) -> str:
        if "Memory excerpts:" in prompt:
            return self.answers[field(prompt, "Question")]
        if self.judge_first:
            return self.judge_first.pop(0)
        answer = field(prompt, "Answer to grade")
        if answer == GARBLED:
            return "The answer seems right to me."
        return "1" if answer == field(prompt, "Gold answer") else "0"


def evaluator(server: FakeOpenAIServer, **options: int) -> QAEvaluator:
    reader = OpenAIChatModel("reader-model", **server.client_options(), retry=FAST)
    judge = OpenAIChatModel("judge-model", **server.client_options(), retry=FAST)
    return QAEvaluator(reader, judge, **options)


def chat_bodies(server: FakeOpenAIServer, model: str) -> list[dict]:
    return [r.body for r in server.requests if r.endpoint == "chat" and r.body["model"] == model and r.status == 200]


def test_the_reader_gets_exactly_the_context_and_the_question() -> None:
    context = "2023-05-07 Mira: I rode to the lake {not a placeholder}\n2023-05-08 Jon: nice!"
    question = "Where did Mira ride?"
    with FakeOpenAIServer(reply=Script({question: "  to the lake \n"})) as server:
        qa = evaluator(server)
        assert qa.answer(question, context) == "to the lake"
        assert qa.answer(question, "  \n") == "to the lake"
        first, empty = chat_bodies(server, "reader-model")
    assert first["messages"] == [{"role": "user", "content": READER_PROMPT.format(context=context, question=question)}]
    assert context in first["messages"][0]["content"]
    assert empty["messages"][0]["content"] == READER_PROMPT.format(context=EMPTY_CONTEXT, question=question)
    assert "Gold" not in first["messages"][0]["content"]  # the reader never sees the gold answer


@pytest.mark.parametrize(
    ("reply", "verdict"),
    [("1", 1), ("0", 0), (" 1\n", 1), ("0.", 0), ("1.", 1), ("**1**", 1), ("'0'", 0), ("(1)", 1), ("`1`!", 1)],
)
def test_verdicts_tolerate_whitespace_and_punctuation(reply: str, verdict: int) -> None:
    assert parse_verdict(reply) == verdict


@pytest.mark.parametrize("reply", ["", "yes", "correct", "1 because it matches", "10", "0 or 1", "-1", "1.0", "2"])
def test_anything_else_is_not_a_verdict(reply: str) -> None:
    assert parse_verdict(reply) is None


def test_the_judge_is_asked_once_more_after_an_unreadable_reply_then_fails_clearly() -> None:
    with FakeOpenAIServer(reply=Script({}, judge_first=["Yes, they match.", "1", "No.", "Still no"])) as server:
        qa = evaluator(server)
        assert qa.judge("When?", "7 May 2023", "May 7, 2023") == 1
        with pytest.raises(JudgeReplyError, match=r"replied 'No\.', then 'Still no'") as failure:
            qa.judge("When?", "7 May 2023", "June")
        prompts = [body["messages"][0]["content"] for body in chat_bodies(server, "judge-model")]
    assert failure.value.replies == ("No.", "Still no")
    first_prompt = JUDGE_PROMPT.format(question="When?", gold="7 May 2023", answer="May 7, 2023")
    assert prompts[:2] == [first_prompt, first_prompt + JUDGE_REMINDER.format(reply="'Yes, they match.'")]
    assert len(prompts) == 4


ITEMS = [
    QAItem("Q1 Where did Mira ride?", "the lake", "ctx one", 1),
    QAItem("Q2 Who sold the bike?", "Mira", "ctx two", 1),
    QAItem("Q3 When?", "7 May 2023", "ctx three", 2),
    QAItem("Q4 What colour?", "red", "", 4),
    QAItem("Q5 Which pet?", "a cat", "ctx five", 4),
    QAItem("Q6 How many?", 2, "ctx six", 4),
    QAItem("Q7 Which city?", "Oslo", "ctx seven", "adversarial"),
]
ANSWERS = {
    "Q1 Where did Mira ride?": "the lake",  # right
    "Q2 Who sold the bike?": "Jon",  # wrong
    "Q3 When?": "7 May 2023",  # right
    "Q4 What colour?": "red",  # right
    "Q5 Which pet?": GARBLED,  # the judge cannot grade it: a judge failure
    "Q6 How many?": "2",  # right (the gold answer was the number 2)
    "Q7 Which city?": "Bergen",  # wrong
}


def check_scripted_report(report: QAReport, server: FakeOpenAIServer) -> None:
    assert [result.item for result in report.results] == ITEMS  # in the order given
    assert [result.verdict for result in report.results] == [1, 0, 1, 1, 0, 1, 0]
    assert [result.answer for result in report.results] == list(ANSWERS.values())
    assert (report.count, report.correct, report.accuracy) == (7, 4, 4 / 7)
    assert list(report.by_category) == [1, 2, 4, "adversarial"]
    assert {category: (s.count, s.correct) for category, s in report.by_category.items()} == {
        1: (2, 1),
        2: (1, 1),
        4: (3, 2),
        "adversarial": (1, 0),
    }
    assert [s.accuracy for s in report.by_category.values()] == [0.5, 1.0, 2 / 3, 0.0]
    assert (report.judge_failures, report.reader_failures) == (1, 0)
    failed = report.results[4]
    assert failed.judge_replies == ("The answer seems right to me.",) * 2
    assert failed.judge_error is not None and "did not judge with 1 or 0" in failed.judge_error
    assert report.results[0].judge_replies == ("1",)
    assert (report.reader, report.judge) == ("OpenAIChatModel(reader-model)", "OpenAIChatModel(judge-model)")

    # Tokens are what the server reported: words of each prompt and reply.
    reader_bodies, judge_bodies = chat_bodies(server, "reader-model"), chat_bodies(server, "judge-model")
    reader_prompt_words = sum(len(body["messages"][0]["content"].split()) for body in reader_bodies)
    judge_prompt_words = sum(len(body["messages"][0]["content"].split()) for body in judge_bodies)
    assert (report.reader_usage.requests, report.judge_usage.requests) == (7, 8)  # one judge re-ask
    assert report.reader_usage.prompt_tokens == reader_prompt_words
    assert report.reader_usage.completion_tokens == sum(len(answer.split()) for answer in ANSWERS.values())
    assert report.judge_usage.prompt_tokens == judge_prompt_words
    assert report.judge_usage.completion_tokens == 6 + 2 * len(failed.judge_replies[0].split())
    assert report.prompt_tokens == reader_prompt_words + judge_prompt_words
    assert report.completion_tokens == report.reader_usage.completion_tokens + report.judge_usage.completion_tokens


def test_accuracy_per_category_counts_failures_as_wrong() -> None:
    seen: list[str] = []
    with FakeOpenAIServer(reply=Script(ANSWERS)) as server:
        report = evaluator(server, max_concurrency=3).evaluate(ITEMS, progress=lambda r: seen.append(r.item.question))
        check_scripted_report(report, server)
    assert sorted(seen) == sorted(ANSWERS)


async def test_the_async_run_reports_the_same() -> None:
    with FakeOpenAIServer(reply=Script(ANSWERS)) as server:
        report = await evaluator(server, max_concurrency=3).aevaluate(ITEMS)
        check_scripted_report(report, server)


def concurrency_items(count: int) -> tuple[list[QAItem], dict[str, str]]:
    items = [QAItem(f"question {i}", f"answer {i}", f"context {i}", 1) for i in range(count)]
    return items, {item.question: item.gold_answer for item in items}


def test_sync_runs_overlap_up_to_the_bound_and_no_further() -> None:
    """The gate proves the bound is reached; the server's in-flight maximum that it is
    never passed (each reply takes a moment, so calls of an unbounded run would pile up;
    nothing here depends on how long anything takes)."""
    items, answers = concurrency_items(9)
    with FakeOpenAIServer(reply=Script(answers), chat_delay=0.02) as server:
        server.gate(3)  # the first three calls are answered only once all three are in flight
        report = evaluator(server, max_concurrency=3).evaluate(items)
        assert server.max_in_flight == 3
        assert server.count("chat", status=500) == 0
    assert report.accuracy == 1.0


async def test_async_runs_overlap_up_to_the_bound_and_no_further() -> None:
    items, answers = concurrency_items(9)
    with FakeOpenAIServer(reply=Script(answers), chat_delay=0.02) as server:
        server.gate(4)
        report = await evaluator(server, max_concurrency=4).aevaluate(items)
        assert server.max_in_flight == 4
        assert server.count("chat", status=500) == 0
    assert report.accuracy == 1.0


def test_a_rate_limited_call_is_retried_and_counted() -> None:
    items, answers = concurrency_items(1)
    with FakeOpenAIServer(reply=Script(answers)) as server:
        server.fail_next("429", endpoint="chat", retry_after=0)
        report = evaluator(server).evaluate(items)
        assert server.count("chat", status=429) == 1
        assert server.count("chat", status=200) == 2
    assert report.accuracy == 1.0
    assert (report.reader_usage.requests, report.reader_usage.retries) == (2, 1)
    assert (report.judge_usage.requests, report.judge_usage.retries) == (1, 0)


def test_a_model_that_keeps_failing_fails_only_its_item() -> None:
    items, answers = concurrency_items(2)
    with FakeOpenAIServer(reply=Script(answers)) as server:
        server.fail_next("503", times=3, endpoint="chat")  # every attempt of the first reader call
        report = evaluator(server, max_concurrency=1).evaluate(items)
    first, second = report.results
    assert (first.answer, first.verdict, first.judge_replies) == ("", 0, ())
    assert first.reader_error is not None and first.reader_error.startswith("InternalServerError:")
    assert (second.verdict, second.reader_error, second.judge_error) == (1, None, None)
    assert (report.reader_failures, report.judge_failures, report.accuracy) == (1, 0, 0.5)


def test_an_error_that_would_fail_every_item_stops_the_run() -> None:
    items, answers = concurrency_items(3)
    with FakeOpenAIServer(reply=Script(answers)) as server:
        server.fail_next("401", endpoint="chat")
        with pytest.raises(Exception, match="injected 401") as failure:
            evaluator(server, max_concurrency=1).evaluate(items)
    assert type(failure.value).__name__ == "AuthenticationError"


def test_bad_input_is_refused_with_the_bad_value(openai_server: FakeOpenAIServer) -> None:
    qa = evaluator(openai_server)
    with pytest.raises(ValueError, match="at least one QAItem"):
        qa.evaluate([])
    with pytest.raises(ValueError, match=r"items\[1\] is tuple \('q', 'a'\), expected a QAItem"):
        qa.evaluate([ITEMS[0], ("q", "a")])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="max_concurrency must be an integer >= 1, got 0"):
        QAEvaluator(qa.reader, max_concurrency=0)
    with pytest.raises(TypeError, match="reader must be a memtree ChatModel, got function"):
        QAEvaluator(lambda prompt: "1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="question must be a non-empty string, got ' '"):
        QAItem(" ", "a", "c", 1)
    with pytest.raises(ValueError, match="gold_answer must be a non-empty string or a number, got None"):
        QAItem("q", None, "c", 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="context must be a string, got list"):
        QAItem("q", "a", ["c"], 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"category must be an int or a string, got 1\.5"):
        QAItem("q", "a", "c", 1.5)  # type: ignore[arg-type]
    assert QAItem("q", 2022, "c", 2).gold_answer == "2022"
    assert openai_server.count() == 0
    assert QAEvaluator(qa.reader).judge_model is qa.reader  # the reader judges when no judge is given


def test_models_come_from_the_environment_when_an_endpoint_is_set(
    openai_server: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    assert qa_models_from_env() is None

    monkeypatch.setenv("OPENAI_BASE_URL", openai_server.url)  # a local server: no key needed
    models = qa_models_from_env("local-model")
    assert models is not None
    reader, judge = models
    assert reader is not judge
    assert reader.complete("hello there").text == "Reply: hello there"
    assert openai_server.requests[-1].headers["authorization"] == "Bearer no-key-needed"
    assert openai_server.requests[-1].body["model"] == "local-model"
    assert openai_server.requests[-1].body["temperature"] == 0.0

    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    reader, judge = qa_models_from_env() or (None, None)
    assert judge is not None and judge.complete("hi").text == "Reply: hi"
    assert openai_server.requests[-1].headers["authorization"] == "Bearer sk-from-env"
    assert openai_server.requests[-1].body["model"] == "gpt-4o-mini"
