"""Text helpers shared by the engine: input checks, sentences, token counts."""

from __future__ import annotations

import re
import unicodedata

_SENTENCE_END = re.compile(r"(?<=[.!?…])[\"')\]]*\s+|\n+")
_TOKEN = re.compile(r"\w+|[^\w\s]", re.UNICODE)
_SPACE = re.compile(r"\s+")
_DATE = re.compile(r"\b(\d{1,2} [A-Z][a-z]+,? \d{4}|[A-Z][a-z]+ \d{1,2},? \d{4}|\d{4}-\d{2}-\d{2})\b")


def require_text(text: object, what: str = "text") -> str:
    """Return ``text`` if it can be stored, else raise a clear error.

    Raises ``TypeError`` for a non-``str`` and ``ValueError`` for empty or
    whitespace-only text, a NUL character (PostgreSQL cannot store it) or text that
    is not valid Unicode (lone surrogates cannot be written as UTF-8).
    """
    if not isinstance(text, str):
        raise TypeError(f"{what} must be a str, got {type(text).__name__}")
    if not text.strip() or _invisible(text):
        hint = "give it some words to look for" if what == "query" else "give it some words to remember"
        raise ValueError(f"{what} is empty or whitespace-only (zero-width characters count as space); {hint}")
    if "\x00" in text:
        raise ValueError(f"{what} contains a NUL character (\\x00); remove it before storing")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ValueError(f"{what} is not valid Unicode ({error.reason} at {error.start})") from None
    return text


def _invisible(text: str) -> bool:
    """Whether every character is white space or an invisible format character
    (zero-width space and joiners, word joiner, byte-order mark: Unicode ``Cf``)."""
    return all(char.isspace() or unicodedata.category(char) == "Cf" for char in text)


def unstorable(value: object) -> str | None:
    """Why a JSON value cannot be stored durably, or ``None`` if it can.

    Looks at every string in it (keys included): PostgreSQL cannot store a NUL
    character, and a lone surrogate cannot be written as UTF-8. Checking the
    strings themselves, not their JSON text, keeps a literal ``\\u0000`` storable.
    """
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return "contains a NUL character (\\x00)"
            try:
                item.encode("utf-8")
            except UnicodeEncodeError as error:
                return f"is not valid Unicode ({error.reason} at {error.start})"
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return None


def storable_text(text: str) -> str:
    """``text`` with what durable stores cannot hold taken out: NUL characters removed,
    lone surrogates replaced by ``?``.

    The engine refuses such text (:func:`require_text`); adapters, which remember what
    people *said*, clean it with this instead of failing a whole conversation.
    """
    if "\x00" in text:
        text = text.replace("\x00", "")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "replace").decode("utf-8")
    return text


def split_sentences(text: str) -> list[str]:
    """Split text into sentences at ., !, ?, … followed by space, and at line breaks.

    Deliberately simple and deterministic: it only has to find the units that
    extractive summaries pick and that retrieval de-duplicates, and it must split a
    summary it built (one sentence per line) back into exactly those sentences.
    """
    return [part.strip() for part in _SENTENCE_END.split(text) if part and part.strip()]


def count_tokens(text: str) -> int:
    """Approximate LLM tokens: words and punctuation marks, counted separately.

    Close to what BPE tokenizers give for English prose without needing one; pass
    your own counter as ``MemTreeConfig(token_counter=...)`` for exact budgets.
    """
    return len(_TOKEN.findall(text))


def count_words(text: str) -> int:
    """Whitespace-separated words (the benchmark's budget unit)."""
    return len(text.split())


def fold(text: str) -> str:
    """Case- and whitespace-folded text, for comparing sentences. (``str.split``
    splits at exactly the characters ``\\s`` matches, and is several times faster
    than the regex: every insert folds the sentences of each summary on its path.)"""
    return " ".join(text.split()).casefold()


def preview(text: str, width: int = 80) -> str:
    """One line of at most ``width`` characters, cut at a word boundary and ended
    with "…" when it is shortened ("14 January…", never "14 Januar…").

    A single word longer than half the line is cut inside, so a long URL or
    identifier still shows its start rather than nothing."""
    flat = _SPACE.sub(" ", text).strip()
    if len(flat) <= width:
        return flat
    room = max(1, width - 1)
    head = flat[:room]
    if flat[room] != " ":  # the cut falls inside a word: end at the last whole one
        space = head.rfind(" ")
        if space >= room // 2:
            head = head[:space]
    return head.rstrip(" ,;:·–—-") + "…"


def tokenize_words(text: str) -> list[str]:
    """Lower-cased word tokens (for hashing and lexical scoring)."""
    return [token.casefold() for token in re.findall(r"\w+", text, re.UNICODE)]


def date_of(text: str) -> str | None:
    """The date a text starts with (within its first 60 characters), as written:
    ``8 May, 2023`` of ``1:56 pm on 8 May, 2023 Caroline: hi``; ``None`` if none."""
    match = _DATE.search(text[:60])
    return match.group(1) if match else None
