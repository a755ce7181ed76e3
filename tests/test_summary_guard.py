"""Summary guards: model replies that drop facts, echo the prompt, run long or say nothing
never become a node's text; they fall back to the extractive summary (or go stale in
strict mode) and are counted. Canned replies only: no model needed."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import SimpleNamespace

import pytest

from memtree import (
    AGGREGATE_PROMPT,
    ROOT_ID,
    SMALL_MODEL_PROMPT,
    SMALL_MODEL_RETRY_PROMPT,
    ExtractiveAggregator,
    HashingEmbedder,
    LLMAggregator,
    MemTree,
    MemTreeConfig,
)
from memtree.llm import CallableChatModel, ChatModel, Completion
from memtree.models.openai import _completion
from memtree.retry import RetryPolicy
from memtree.summary_guard import (
    GuardedReply,
    SummaryRejectedError,
    check_summary,
    clean_reply,
    key_facts,
    restore_dates,
)

NEW = "22 February 2024 Maya: I got the job at Google as a designer!"
OLD = "14 January 2024 Maya: I started a pottery class at the community center."
GOOD = "Maya took up pottery and on 22 February 2024 got a design job at Google."
NO_WAIT = RetryPolicy(max_attempts=2, initial_delay=0.0, timeout=None)


def verdict(reply: str, *, summary: str = OLD, new_texts: tuple[str, ...] = (NEW,), **options: object) -> str | None:
    aggregator = LLMAggregator(lambda prompt: "unused")
    prompt = aggregator.build_prompt(summary, list(new_texts), 1)
    instructions = aggregator.build_prompt("", [], 1 + len(new_texts))
    found = check_summary(
        clean_reply(reply),
        summary=summary,
        new_texts=new_texts,
        prompt=prompt,
        instructions=instructions,
        **options,  # type: ignore[arg-type]
    )
    return None if found is None else found.guard


def test_key_facts_are_names_and_numbers_not_sentence_initial_function_words() -> None:
    assert key_facts(NEW) == {"22", "february", "2024", "maya", "google"}
    assert key_facts("Yesterday we met Rosa's brother. The weather in Lisbon was 07 degrees.") == {
        "rosa",
        "lisbon",
        "7",
    }
    assert key_facts("I think so. Thanks! Wow, that's great. Anything new?") == set()
    assert key_facts("1:56 pm on 8 May, 2023 Melanie: Hey Caroline! Anything new?") == {
        "8",
        "may",
        "2023",
        "melanie",
        "caroline",
    }  # the time of day is not a fact a summary must keep; the date is
    # Contractions inside a sentence are not names (a chat turn's first word follows its label).
    assert key_facts("8 May, 2023 Melanie: You'd be great. So we'll see, they've said.") == {
        "8",
        "may",
        "2023",
        "melanie",
    }


def test_a_faithful_shorter_summary_passes_every_guard() -> None:
    assert verdict(GOOD) is None
    assert verdict("Summary: " + GOOD) is None  # the label is cleaned off first
    assert verdict("The new summary is: " + GOOD) is None
    assert clean_reply('Here is the updated summary:\n"' + GOOD + '"') == GOOD


@pytest.mark.parametrize(
    ("reply", "options", "guard"),
    [
        ("   ", {}, "empty"),
        ("**Summary:**", {}, "empty"),
        (GOOD, {"truncated": True}, "truncated"),
        (GOOD, {"max_words": 10}, "truncated"),
        (OLD, {}, "echo"),  # the earlier summary copied word for word: the new memory is lost
        ("Write a single, cohesive summary that keeps the key points of the current summary", {}, "echo"),
        (NEW + " Maya: I started a pottery class at the community center.", {}, "echo"),  # inputs pasted together
        ("Maya got a design job and does pottery.", {}, "facts"),  # no date, no Google
        (OLD + " " + NEW + " She is happy about it.", {}, "shorter"),
        # A person from the prompt's example, a year no input states: false memories.
        ("Maya took up pottery with Ana and on 22 February 2024 got a design job at Google.", {}, "invented"),
        ("Maya took up pottery in 2019 and on 22 February 2024 got a design job at Google.", {}, "invented"),
    ],
)
def test_each_guard_rejects_its_kind_of_bad_reply(reply: str, options: dict[str, object], guard: str) -> None:
    assert verdict(reply, **options) == guard


def test_a_reply_that_keeps_the_old_summary_and_loses_the_new_memory_fails_facts() -> None:
    same_day = "14 January 2024 Maya: The glazing workshop was fun."  # no name or date the summary lacks
    assert verdict("Maya started a pottery class on 14 January 2024.", new_texts=(same_day,)) == "facts"
    assert verdict("On 14 January 2024 Maya started pottery and a glazing workshop.", new_texts=(same_day,)) is None


def test_the_facts_verdict_names_what_was_dropped() -> None:
    aggregator = LLMAggregator(lambda prompt: "unused")
    found = check_summary(
        "Maya got a design job.",
        summary="",
        new_texts=[NEW],
        prompt=aggregator.build_prompt("", [NEW], 0),
        instructions=aggregator.build_prompt("", [], 1),
    )
    assert found is not None and found.reason == "drops '2024', '22', 'february', 'google' of the new texts"


def test_openai_replies_cut_at_the_token_cap_are_marked_truncated() -> None:
    def response(finish: str) -> SimpleNamespace:
        message = SimpleNamespace(content="Maya got", role="assistant")
        return SimpleNamespace(choices=[SimpleNamespace(message=message, finish_reason=finish)], usage=None)

    assert _completion(response("length"), "m").truncated is True
    assert _completion(response("stop"), "m").truncated is False


class LocalLikeModel(ChatModel):
    """A model that asks for guarded summaries, as the llama.cpp one does."""

    guard_summaries = True
    retry = NO_WAIT

    def __init__(self, reply: Callable[[str], str]) -> None:
        self.reply = reply
        self.prompts: list[str] = []

    def _complete(self, prompt: str, timeout: float | None) -> Completion:
        self.prompts.append(prompt)
        return Completion(self.reply(prompt))


def test_guards_default_to_the_models_wish() -> None:
    assert LLMAggregator(lambda prompt: "x").guarded is False  # hosted and custom models: unchanged
    assert LLMAggregator(LocalLikeModel(lambda prompt: "x")).guarded is True
    assert LLMAggregator(lambda prompt: "x", guarded=True).guarded is True
    assert LLMAggregator(LocalLikeModel(lambda prompt: "x"), guarded=False).guarded is False


def test_a_guarded_small_model_gets_the_one_shot_prompt_unless_given_one() -> None:
    assert LLMAggregator(lambda prompt: "x").prompt == AGGREGATE_PROMPT
    assert LLMAggregator(LocalLikeModel(lambda prompt: "x")).prompt == SMALL_MODEL_PROMPT
    assert LLMAggregator(lambda prompt: "x", guarded=True).prompt == SMALL_MODEL_PROMPT
    custom = "Merge {summary} ({count}) with {new_texts}. {guidance}"
    assert LLMAggregator(LocalLikeModel(lambda prompt: "x"), prompt=custom).prompt == custom
    sent = LLMAggregator(LocalLikeModel(lambda prompt: "x")).build_prompt(OLD, [NEW], 1)
    assert "plain third-person prose" in sent and "- " + NEW in sent and OLD in sent


def test_the_one_shot_examples_names_count_as_an_echo_when_copied() -> None:
    """A small model that copies the prompt's example instead of summarizing is caught."""
    aggregator = LLMAggregator(LocalLikeModel(lambda prompt: "x"))
    copied = "On 3 March 2024 Ana adopted a puppy named Biscuit, and Tom said he starts a nursing course in April."
    found = aggregator.check(Completion(copied), OLD, [NEW], 1)[0]
    assert found is not None and found.guard == "echo"


def two_leaf_memory(aggregator: LLMAggregator) -> MemTree:
    memory = MemTree(embedder=HashingEmbedder(64), aggregator=aggregator, config=MemTreeConfig(theta0=-1.0))
    memory.add(OLD)
    memory.add(NEW)
    return memory


def summaries(memory: MemTree) -> list[str]:
    return [node.text for node in memory.walk() if not node.is_leaf and node.id != ROOT_ID]


def test_a_rejected_reply_falls_back_to_the_extractive_summary_and_is_counted() -> None:
    model = LocalLikeModel(lambda prompt: "Maya got a job.")  # drops the date and Google
    memory = two_leaf_memory(LLMAggregator(model))
    expected = ExtractiveAggregator(HashingEmbedder(64)).aggregate("", [OLD, NEW], 0)
    assert summaries(memory) == [expected]
    stats = memory.stats()
    assert stats.stale == 0 and stats.aggregation_failures == 0
    assert len(model.prompts) == 2 and "Fold the new notes" in model.prompts[1]  # asked once more, then it gave up
    assert stats.extra["summaries_checked"] == 2
    assert stats.extra["summary_guard_facts"] == 2
    assert stats.extra["summary_retries"] == 1
    assert stats.extra["summary_fallbacks"] == 1


def test_a_rejected_reply_is_asked_for_once_more_with_the_retry_prompt() -> None:
    """Most rejected replies of the 1.5B model dropped the new notes or their date; the
    retry prompt puts the new notes first, and its reply is guarded the same way."""
    model = LocalLikeModel(lambda prompt: GOOD if "Fold the new notes" in prompt else "Maya got a job.")
    seen: list[GuardedReply] = []
    memory = two_leaf_memory(LLMAggregator(model, on_reply=seen.append))
    assert summaries(memory) == [GOOD]
    assert [model.prompts[0] == p for p in model.prompts] == [True, False]
    assert (
        model.prompts[1].startswith(SMALL_MODEL_RETRY_PROMPT.split("{new_texts}")[0]) and f"- {NEW}" in model.prompts[1]
    )
    assert [(reply.attempt, reply.verdict.guard if reply.verdict else None) for reply in seen] == [
        (1, "facts"),
        (2, None),
    ]
    extra = memory.stats().extra
    assert extra["summaries_checked"] == 2 and extra["summary_retries"] == 1 and "summary_fallbacks" not in extra


def test_restore_dates_puts_the_new_texts_date_in_front_only_when_the_reply_lacks_it() -> None:
    assert restore_dates("Maya got a design job at Google.", [NEW]) == (
        "22 February 2024: Maya got a design job at Google."
    )
    assert restore_dates(GOOD, [NEW]) is None  # it states the date already
    # A reply that dates the event itself is judged as written: it may have put it on the wrong day.
    assert restore_dates("Maya got a job in February.", [NEW]) is None
    assert restore_dates("On 14 January Maya got a job.", [NEW]) is None
    assert restore_dates("Maya got a job on 2024-01-14.", [NEW]) is None
    assert restore_dates("Maya may get a job.", [NEW]) == "22 February 2024: Maya may get a job."  # a verb
    assert restore_dates("Maya got a job.", ["Maya: I got the job!"]) is None  # no date to restore
    later = "1:56 pm on 8 May, 2023 Maya: The first day went well."
    assert restore_dates("Maya started a job.", [NEW, later]) == "22 February 2024 – 8 May, 2023: Maya started a job."


def test_a_reply_that_only_drops_the_date_is_stored_with_the_date_restored() -> None:
    """The 1.5B model summarizes the new notes and leaves out their date: on one held-out
    conversation 52 of its 303 replies were rejected for that alone. Putting the date
    back keeps the model's summary without inventing anything, and saves the retry."""
    model = LocalLikeModel(lambda prompt: "Maya took up pottery, then got a design job at Google.")
    seen: list[GuardedReply] = []
    memory = two_leaf_memory(LLMAggregator(model, on_reply=seen.append))
    restored = "22 February 2024: Maya took up pottery, then got a design job at Google."
    assert summaries(memory) == [restored]
    assert len(model.prompts) == 1  # no retry asked for
    assert [(r.verdict.guard if r.verdict else None, r.restored) for r in seen] == [("facts", restored)]
    extra = memory.stats().extra
    assert extra["summaries_checked"] == 1 and extra["summary_guard_facts"] == 1
    assert extra["summary_dates_restored"] == 1
    assert "summary_retries" not in extra and "summary_fallbacks" not in extra


def test_a_restored_reply_must_still_pass_every_guard_and_restoring_can_be_switched_off() -> None:
    # Google is missing too: the date alone does not save it.
    missing_name = LocalLikeModel(lambda prompt: "Maya took up pottery, then got a design job.")
    memory = two_leaf_memory(LLMAggregator(missing_name))
    assert summaries(memory) == [ExtractiveAggregator(HashingEmbedder(64)).aggregate("", [OLD, NEW], 0)]
    assert "summary_dates_restored" not in memory.stats().extra and len(missing_name.prompts) == 2
    # An invented number is not mended either: it fails a later guard.
    invented = LocalLikeModel(lambda prompt: "Maya took up pottery, then got 3 design jobs at Google.")
    assert "summary_dates_restored" not in two_leaf_memory(LLMAggregator(invented)).stats().extra
    off = LLMAggregator(LocalLikeModel(lambda prompt: "Maya took up pottery, then got a design job at Google."))
    off = LLMAggregator(off.model, restore_dates=False)
    assert off.bound_to(HashingEmbedder(8)).restores_dates is False
    memory = two_leaf_memory(off)
    assert memory.stats().extra["summary_fallbacks"] == 1 and "summary_dates_restored" not in memory.stats().extra


def test_the_retry_is_switched_by_retry_and_off_for_a_prompt_of_your_own() -> None:
    custom = "Merge {summary} ({count}) with {new_texts}. {guidance}"
    assert LLMAggregator(LocalLikeModel(lambda prompt: "x")).retry_prompt == SMALL_MODEL_RETRY_PROMPT
    assert LLMAggregator(LocalLikeModel(lambda prompt: "x"), retry=False).retry_prompt is None
    assert LLMAggregator(LocalLikeModel(lambda prompt: "x"), prompt=custom).retry_prompt is None
    mine = LLMAggregator(LocalLikeModel(lambda prompt: "x"), prompt=custom, retry_prompt=custom + " Again.")
    assert (
        mine.retry_prompt == custom + " Again." and mine.bound_to(HashingEmbedder(8)).retry_prompt == mine.retry_prompt
    )
    assert LLMAggregator(lambda prompt: "x").retry_prompt is None  # unguarded: nothing is rejected
    with pytest.raises(ValueError, match="retry_prompt uses an unknown placeholder 'name'"):
        LLMAggregator(LocalLikeModel(lambda prompt: "x"), retry_prompt="Hi {name}")
    model = LocalLikeModel(lambda prompt: "Maya got a job.")
    two_leaf_memory(LLMAggregator(model, retry=False))
    assert len(model.prompts) == 1


def test_a_reply_that_passes_is_stored_cleaned() -> None:
    memory = two_leaf_memory(LLMAggregator(LocalLikeModel(lambda prompt: "Summary: " + GOOD)))
    assert summaries(memory) == [GOOD]
    extra = memory.stats().extra
    assert extra["summaries_checked"] == 1 and "summary_fallbacks" not in extra


def test_an_empty_reply_is_retried_then_falls_back_as_the_empty_guard() -> None:
    model = LocalLikeModel(lambda prompt: "  ")
    memory = two_leaf_memory(LLMAggregator(model))
    assert len(model.prompts) == 4  # the retry policy's two attempts, for each of the two prompts
    assert summaries(memory) == [ExtractiveAggregator(HashingEmbedder(64)).aggregate("", [OLD, NEW], 0)]
    assert memory.stats().extra["summary_guard_empty"] == 2


def test_strict_mode_marks_the_summary_stale_and_repair_rewrites_it() -> None:
    both = "Maya started pottery on 14 January 2024 and on 22 February 2024 got a design job at Google."
    replies = iter([OLD, both])  # first an echo of a leaf, then a good summary of both (repair rebuilds)
    aggregator = LLMAggregator(LocalLikeModel(lambda prompt: next(replies)), strict=True, retry=False)
    memory = two_leaf_memory(aggregator)
    stats = memory.stats()
    assert stats.stale == 1 and stats.aggregation_failures == 1
    assert stats.extra["summary_guard_echo"] == 1 and "summary_fallbacks" not in stats.extra
    assert len(memory.leaves()) == 2  # the new memory is kept
    assert memory.repair() == 1
    assert summaries(memory) == [both] and memory.stats().stale == 0


def test_strict_mode_raises_the_verdict_once_the_retry_failed_too() -> None:
    model = LocalLikeModel(lambda prompt: "Maya got a job.")
    aggregator = LLMAggregator(model, strict=True)
    with pytest.raises(SummaryRejectedError, match="failed the 'facts' guard: drops '2024', '22'"):
        aggregator.aggregate("", [NEW], 0)
    assert len(model.prompts) == 2


def test_a_model_that_raises_is_not_a_guard_failure_the_summary_goes_stale() -> None:
    def broken(prompt: str) -> str:
        raise PermissionError("bad key")

    memory = two_leaf_memory(LLMAggregator(CallableChatModel(broken, retry=NO_WAIT), guarded=True))
    stats = memory.stats()
    assert stats.stale == 1 and stats.aggregation_failures == 1
    assert "summaries_checked" not in stats.extra and "summary_fallbacks" not in stats.extra
    assert len(memory.leaves()) == 2


def test_async_inserts_are_guarded_too() -> None:
    async def model(prompt: str) -> str:
        return "Maya got a job."

    async def run() -> MemTree:
        memory = MemTree(
            embedder=HashingEmbedder(64),
            aggregator=LLMAggregator(model, guarded=True),
            config=MemTreeConfig(theta0=-1.0),
        )
        await memory.aadd(OLD)
        await memory.aadd(NEW)
        return memory

    memory = asyncio.run(run())
    assert summaries(memory) == [ExtractiveAggregator(HashingEmbedder(64)).aggregate("", [OLD, NEW], 0)]
    assert memory.stats().extra["summary_fallbacks"] == 1


def test_the_first_word_of_a_speakers_line_is_no_name() -> None:
    # Chat turns carry "<date> <speaker>: " before the speaker's first word, whose capital
    # is the sentence's: the guard must not demand "Gonna" or "Yep" of a summary.
    line = "1:56 pm on 8 May, 2023 Caroline: Gonna continue my edu. Yep, see you on Friday with Mel."
    assert key_facts(line) == {"8", "may", "2023", "caroline", "friday", "mel"}
    assert key_facts("Maya: Finding freedom at last, said Tom.") == {"maya", "tom"}


@pytest.mark.parametrize(
    ("new_text", "reply"),
    [
        ("Maya: I have twelve cats now.", "Maya now has 12 cats."),  # digits for a spelled-out number
        ("Maya: I have 12 cats now.", "Maya now has twelve cats."),  # and the reverse
    ],
)
def test_a_number_written_the_other_way_is_neither_dropped_nor_invented(new_text: str, reply: str) -> None:
    assert verdict(reply, summary="", new_texts=(new_text,)) is None
    assert verdict(reply.replace("12", "13").replace("twelve", "thirteen"), summary="", new_texts=(new_text,)) in (
        "facts",
        "invented",
    )


SESSION = (
    "8 May, 2023 Caroline: I went to the LGBTQ support group in Boston yesterday.",
    "8 May, 2023 Melanie: Wow Caroline, that sounds powerful!",
    "8 May, 2023 Caroline: I want to study counseling at Harvard, Mel.",
    "8 May, 2023 Melanie: I'm off swimming with the kids on Friday.",
)


def test_a_merge_of_many_texts_must_keep_half_their_names_and_numbers_not_all() -> None:
    # Names and numbers of the session: 8, may, 2023, caroline, melanie, lgbtq, boston, harvard, mel, friday.
    kept_six = "On 8 May 2023 Caroline told Melanie about a support group and her plans to study counseling."
    assert verdict(kept_six, summary="", new_texts=SESSION) is None
    kept_four = "On 8 May Caroline talked about a support group and counseling."
    assert verdict(kept_four, summary="", new_texts=SESSION) == "facts"
    # One or two new texts still must keep every name and number.
    assert verdict(kept_six, summary="", new_texts=SESSION[:2]) == "facts"
    # And nothing invented gets through however many texts are merged.
    assert verdict(kept_six + " They met Ana there.", summary="", new_texts=SESSION) == "invented"


def test_on_reply_sees_every_guarded_reply_kept_or_rejected() -> None:
    faithful = "Maya took up pottery and got a design job at Google on 22 February 2024."
    replies = iter(["Maya got a job.", faithful])
    seen: list[GuardedReply] = []
    aggregator = LLMAggregator(lambda prompt: next(replies), guarded=True, on_reply=seen.append, retry=False)
    bound = aggregator.bound_to(HashingEmbedder(32))
    assert bound is not aggregator and bound.on_reply is aggregator.on_reply  # a memory's copy reports too
    assert bound.aggregate(OLD, [NEW], 1) != "Maya got a job."  # rejected: the extractive summary stands in
    assert bound.aggregate(OLD, [NEW], 1) == faithful
    first, second = seen
    assert first.verdict is not None and first.verdict.guard == "facts" and first.reply == "Maya got a job."
    assert first.new_texts == (NEW,) and first.summary == OLD and first.count == 1
    assert second.verdict is None and second.reply == faithful
