"""Checks on a model-written summary before the tree stores it.

A summary node stands in for everything below it, so a bad one hides facts from
retrieval. Small local models write bad ones often: they drop the date or the name
of the memory they were asked to fold in, copy an earlier summary word for word,
repeat the instructions, or stop mid-sentence at the token cap. Hosted models do it
too, more rarely. :func:`check_summary` catches those replies with cheap, model-free
tests, so :class:`~memtree.aggregate.LLMAggregator` can fall back to the offline
summary (or mark the node stale in strict mode) instead of storing them.

The guards, in the order they are tried (the first that fails names the verdict):

* ``empty``: nothing but whitespace or a bare label such as ``Summary:``;
* ``truncated``: the reply hit the output-token cap (:attr:`Completion.truncated
  <memtree.llm.Completion.truncated>`), or is longer than ``max_words``;
* ``echo``: the reply only repeats the prompt: it is a verbatim piece of it (an
  input copied whole, which loses the others), half its word triples come from
  the instructions, or 90% of them from the prompt (inputs pasted together);
* ``facts``: a name or number of the new texts is missing: capitalized words
  inside a sentence (``Maya``, ``Google``, ``February``; not the first word of a
  speaker's line, ``Maya: Gonna go``) and digits (``22``, ``2024``; not times of
  day); a merge of more than two new texts (a deferred session) must keep half of
  them. Or the reply keeps none of the words the new texts add to the current
  summary (an earlier summary copied, the new memory lost);
* ``invented``: the reply states a name or number (found as ``facts`` finds them)
  that none of its inputs has: a person from the prompt's example, a guessed
  count, a date made up. A summary is read in place of its leaves, so a fact it
  adds is a false memory;
* ``shorter``: the reply has at least as many words as its inputs together (the
  current summary and the new texts): it summarizes nothing.

One failure is mended instead of rejected: a reply that fails ``facts`` only because
it states no date, where the new texts start with one (``23 March, 2023``; small
models summarize the event and drop the date nearly every time on some
conversations), is stored with that date put in front (:func:`restore_dates`), if
the mended reply then passes every guard. The date is copied from the inputs, so
nothing is invented; a reply that gives another date is not mended (it may have
put the new event on the earlier summary's day).

They are heuristics with known misses: a date rewritten (``2024-02-22`` as
``22 February``) fails ``facts`` (a number spelled out, ``twelve`` for ``12``, does
not: :data:`NUMBER_WORDS`); a name that only ever opens a
sentence is neither required nor checked; an event put on another date of the
inputs, or a made-up fact without a new name or number, passes. They keep out the
replies that are surely wrong, not every weak one.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from memtree.retry import ModelResponseError
from memtree.text import count_words, date_of, split_sentences

GUARDS = ("empty", "truncated", "echo", "facts", "invented", "shorter")
"""The guards' names, as counted in ``stats().extra`` (``summary_guard_<name>``)."""

_WORD = re.compile(r"[^\W_]+(?:['’][^\W_]+)*", re.UNICODE)
_NAME = re.compile(r"(?<![\w'’])[A-Z][^\W_]*(?:['’][^\W_]+)*")
_DIGITS = re.compile(r"\d+")
_CLOCK = re.compile(r"\b\d{1,2}:\d{2}(?::\d{2})?(?:\s*[ap]\.?m\b\.?)?", re.IGNORECASE)
_LABEL = re.compile(
    r"^\s*(?:(?:here\s+is|here's)\b[^:\n]{0,60}:"
    r"|[*#_\s]*(?:the\s+)?(?:updated\s+|new\s+|merged\s+|cohesive\s+)?summary(?:\s+is)?[*_\s]*:)\s*",
    re.IGNORECASE,
)

# Capitalized only because they start a sentence (or are the pronoun I): not names.
_FUNCTION_WORDS = """
    a about actually after again all also although always am an and another any anyway are as at back be
    because been before being both but by can could did do does done during each even ever every finally first
    for from good great had has have having he her here hers him his how however i i'd i'll i'm i've if in
    indeed is it it's its just last later let let's like maybe me meanwhile more most much my myself never
    new next nice no not now of off oh ok okay on once one only or other our ours out over please really same
    see she should since so some soon still such sure than thank thanks that that's the their theirs them then
    there there's these they they're this those though through to today together tomorrow too until up us
    very was we we're well were what what's when where which while who whoa why will with without wow yeah
    yes yesterday yet you you're you'd you'll you've your yours we'd we'll we've they'd they'll
    they've he's she's he'd she'd he'll she'll it'll that'll there'll who's
    hey hi hello haha lol omg congrats congratulations awesome cool
    definitely absolutely totally right exactly true sounds love glad sorry dear anything something everything
    nothing anyone someone everyone nobody guess btw take keep make check go look wait
"""
_NOT_NAMES = frozenset(_FUNCTION_WORDS.split())

_SPELLED = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen twenty"
)
NUMBER_WORDS: dict[str, str] = {word: str(value) for value, word in enumerate(_SPELLED.split())}
NUMBER_WORDS.update(
    {"thirty": "30", "forty": "40", "fifty": "50", "sixty": "60", "seventy": "70", "eighty": "80", "ninety": "90"}
)
"""Numbers spelled out, with their digits: a summary may write ``twelve`` as ``12``
(or the reverse) without dropping or inventing a number."""

_SPEAKER_LABEL = re.compile(r"(?<![\w'’])[A-Z][^\W_]*(?:\s+[A-Z][^\W_]*)?:\s*$")
"""``Maya:`` (or ``Maya Lee:``) right before a word: the word opens the speaker's line,
so its capital is the sentence's, not a name's (``Maya: Gonna go``)."""

_REQUIRED_SHARE_OF_MANY = 0.5
"""The share of the new texts' names and numbers a summary must keep when it merges
more than two new texts (deferred aggregation folds a whole session into one call):
a 60-word summary of a dozen chat lines cannot keep every nickname and weekday, and
the leaves below it keep them all. A merge of one or two texts must keep them all:
that is where a model that copies the earlier summary loses the new memory."""


_MIN_COPIED_TRIPLES = 8
"""A reply of at least this many word triples, 90% of them from the prompt, is pasted
pieces of it (shorter replies reuse the inputs' phrasing legitimately)."""


@dataclass(frozen=True)
class GuardVerdict:
    """Why a summary was rejected: the guard's name and a sentence for logs."""

    guard: str
    reason: str


@dataclass(frozen=True)
class GuardedReply:
    """One guarded aggregation as :class:`~memtree.aggregate.LLMAggregator`'s
    ``on_reply`` sees it: the inputs the model was asked to merge, its raw reply, and
    the verdict (``None``: stored). Enough to re-check the reply with other guards
    without calling the model again."""

    summary: str
    new_texts: tuple[str, ...]
    count: int
    reply: str
    truncated: bool
    verdict: GuardVerdict | None
    attempt: int = 1
    """1: the reply to the aggregator's prompt; 2: to its retry prompt, asked because
    the first reply was rejected."""
    restored: str | None = None
    """What was stored instead of a reply rejected only for the new texts' date: the
    reply with that date in front (:func:`restore_dates`); ``None`` otherwise."""


_A_DATE = re.compile(
    r"\b(?:January|February|March|April|May|June|July|August|September|October|November|December|\d{4}-\d{2}-\d{2})\b"
)
"""A month named as a month (capitalized: ``may`` is a verb) or an ISO date."""


def restore_dates(reply: str, new_texts: Sequence[str]) -> str | None:
    """``reply`` with the date (or first and last dates) the new texts start with put
    in front, when it states no date at all; ``None`` when it names a month or an ISO
    date (it dated its events itself, perhaps wrongly: that reply is judged as
    written), or when the texts start with no date. The caller re-checks the result
    with :func:`check_summary`: only the date is restored, a missing name still fails.

    Example::

        restore_dates("Calvin plans a trip to Japan.", ["11:53 am on 23 March, 2023 Calvin: I'm off to Japan!"])
        # '23 March, 2023: Calvin plans a trip to Japan.'
    """
    dates = list(dict.fromkeys(date for date in map(date_of, new_texts) if date))
    if not dates or _A_DATE.search(reply):
        return None
    span = dates[0] if len(dates) == 1 else f"{dates[0]} – {dates[-1]}"
    return f"{span}: {reply}"


class SummaryRejectedError(ModelResponseError):
    """A model's summary failed a guard (strict mode): the engine keeps the node's
    old text and marks it stale, so :meth:`~memtree.MemTree.repair` retries it."""

    def __init__(self, verdict: GuardVerdict) -> None:
        super().__init__(f"the model's summary failed the {verdict.guard!r} guard: {verdict.reason}")
        self.verdict = verdict


def clean_reply(reply: str) -> str:
    """The reply without a leading label (``Summary:``, ``Here is the summary:``) or
    wrapping quotes, which small models add although the prompt asks them not to."""
    text = _LABEL.sub("", reply.strip(), count=1).strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        text = text[1:-1].strip()
    return text


def key_facts(text: str) -> set[str]:
    """The names and numbers of ``text`` that a summary of it must keep, folded.

    Names are capitalized words inside a sentence (a sentence's first word is
    capitalized anyway, so it counts only as a speaker label, ``Maya: ...``), other
    than the pronoun I and the like (``_NOT_NAMES``); a possessive ``'s`` is
    dropped. Numbers are digit runs without leading zeros, so ``07`` and ``7``
    match; times of day (``1:56 pm``) are left out, dates are kept.
    """
    facts: set[str] = set()
    for sentence in split_sentences(text):
        for match in _NAME.finditer(sentence):
            before = sentence[: match.start()]
            initial = not before.strip(" \t\"'“‘(*-") or _SPEAKER_LABEL.search(before) is not None
            if initial and not sentence[match.end() :].startswith(":"):
                continue
            word = _possessive(match.group().lower())
            if word not in _NOT_NAMES:
                facts.add(word)
    facts.update(_number(digits) for digits in _DIGITS.findall(_CLOCK.sub(" ", text)))
    return facts


def stated_words(text: str) -> set[str]:
    """Every word (folded, possessive dropped) and number ``text`` states; a number
    spelled out (``twelve``) states its digits too."""
    words = {_possessive(word.lower()) for word in _WORD.findall(text)}
    spelled = {NUMBER_WORDS[word] for word in words if word in NUMBER_WORDS}
    return words | spelled | {_number(digits) for digits in _DIGITS.findall(text)}


def content_words(text: str) -> set[str]:
    """Words of four letters or more other than function words: what a text is about."""
    return {word for word in stated_words(text) if len(word) >= 4 and word not in _NOT_NAMES and not word.isdigit()}


def _possessive(word: str) -> str:
    word = word.replace("’", "'")
    return word[:-2] if word.endswith("'s") else word


def _number(digits: str) -> str:
    return digits.lstrip("0") or "0"


def _words(text: str) -> list[str]:
    return [word.lower() for word in _WORD.findall(text)]


def _triples(words: list[str]) -> set[tuple[str, ...]]:
    return {tuple(words[i : i + 3]) for i in range(len(words) - 2)}


def check_summary(
    reply: str,
    *,
    summary: str,
    new_texts: Sequence[str],
    prompt: str,
    instructions: str,
    truncated: bool = False,
    max_words: int | None = None,
) -> GuardVerdict | None:
    """The first guard ``reply`` fails (see the module docstring), or ``None``.

    ``reply`` should already be :func:`clean_reply`-ed. ``summary`` and ``new_texts``
    are the inputs the model was asked to merge, ``prompt`` the exact text sent, and
    ``instructions`` the prompt without its inputs (what a model that echoes copies).

    Example::

        check_summary("Maya got a job.", summary="", new_texts=["Maya got the job at Google on 22 May."],
                      prompt=..., instructions=...)
        # GuardVerdict(guard='facts', reason="drops '22', 'google', 'may' of the new texts")
    """
    words = _words(reply)
    if not words:
        return GuardVerdict("empty", "the reply has no words")
    if truncated:
        return GuardVerdict("truncated", "the reply stopped at the output-token cap")
    if max_words is not None and len(words) > max_words:
        return GuardVerdict("truncated", f"the reply has {len(words)} words, more than the cap of {max_words}")
    flat_reply = " ".join(words)
    if flat_reply in " ".join(_words(prompt)):
        return GuardVerdict("echo", "the reply is a verbatim piece of the prompt")
    triples = _triples(words)
    if triples and len(triples & _triples(_words(instructions))) * 2 >= len(triples):
        return GuardVerdict("echo", "the reply repeats the prompt's instructions")
    if len(triples) >= _MIN_COPIED_TRIPLES and len(triples & _triples(_words(prompt))) >= 0.9 * len(triples):
        return GuardVerdict("echo", "the reply is pieces of the prompt pasted together")
    stated = stated_words(reply)
    required = set().union(*(key_facts(text) for text in new_texts))
    missing = sorted(required - stated)
    allowed = 0 if len(new_texts) <= 2 else int(len(required) * (1 - _REQUIRED_SHARE_OF_MANY))
    if len(missing) > allowed:
        shown = ", ".join(repr(fact) for fact in missing[:5]) + (" …" if len(missing) > 5 else "")
        return GuardVerdict("facts", f"drops {shown} of the new texts")
    novel = content_words(" ".join(new_texts)) - content_words(summary)
    if novel and not novel & stated:
        return GuardVerdict("facts", "keeps none of the words the new texts add to the summary")
    invented = sorted(key_facts(reply) - stated_words("\n".join([summary, *new_texts])))
    if invented:
        shown = ", ".join(repr(fact) for fact in invented[:5]) + (" …" if len(invented) > 5 else "")
        return GuardVerdict("invented", f"states {shown}, which none of its inputs has")
    inputs = count_words(summary) + sum(count_words(text) for text in new_texts)
    if count_words(reply) >= inputs:
        return GuardVerdict("shorter", f"the reply has {count_words(reply)} words, its inputs {inputs}")
    return None


class SummaryTooLongError(ModelResponseError):
    """A summary longer than ``MemTreeConfig.summary_max_chars`` with no sentence end
    within the cap to cut it at: stored as is, one runaway reply would crowd every
    answer that retrieves it. The node stays stale (``repair()`` tries again)."""


_CUT_POINT = re.compile(r"[.!?…][\"')\]]*(?=\s)|\n")


def cap_summary(text: str, max_chars: int) -> str | None:
    """``text`` if it has at most ``max_chars`` characters; else cut after the last
    sentence end (``.``, ``!``, ``?``, ``…`` then a space, or a line break) that
    keeps it within ``max_chars``; ``None`` when there is no such sentence end
    (the caller rejects the reply). Applied to every aggregator's summary, model or
    not, so a 100 KB reply never reaches the store.

    Example::

        cap_summary("One. Two three. Four five six.", 20)  # 'One. Two three.'
    """
    if len(text) <= max_chars:
        return text
    head = text[: max_chars + 1]  # a sentence end right at the cap still counts
    ends = [match.end() for match in _CUT_POINT.finditer(head) if match.end() <= max_chars]
    if not ends:
        return None
    cut = text[: ends[-1]].rstrip()
    return cut or None
