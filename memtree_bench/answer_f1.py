"""LoCoMo's answer scores: token F1 as the benchmark's own evaluation computes it, and
answer containment.

LoCoMo (Maharana et al., 2024) scores a reader's answer against the gold answer with
a token F1 after normalizing both (lower case; commas, punctuation and the words
``a``, ``an``, ``the``, ``and`` removed; each word Porter-stemmed). Multi-hop answers
(category 1) list several parts separated by commas: each gold part takes the best F1
over the answer's parts, and the question scores their mean. An open-domain gold
answer (category 3) keeps only what comes before a ``;``. Containment is 1 when the
normalized gold answer appears whole in the normalized answer.

Example::

    f1("Pepper, a greyhound", "greyhound named Pepper", category=4)  # 0.8
"""

from __future__ import annotations

import re
import string
from collections import Counter
from functools import lru_cache

_ARTICLES = re.compile(r"\b(a|an|the|and)\b", re.IGNORECASE)
_PUNCTUATION = str.maketrans("", "", string.punctuation)


@lru_cache(maxsize=1)
def _stemmer() -> object:
    from nltk.stem import PorterStemmer  # no data download needed

    return PorterStemmer()


def normalize(text: str) -> str:
    """LoCoMo's normalization (before stemming)."""
    text = str(text).replace(",", "")
    text = _ARTICLES.sub(" ", text)
    text = text.translate(_PUNCTUATION)
    return " ".join(text.lower().split())


def _tokens(text: str) -> list[str]:
    stem = _stemmer().stem  # type: ignore[attr-defined]
    return [stem(word) for word in normalize(text).split()]


def token_f1(answer: str, gold: str) -> float:
    """Token F1 of two normalized, stemmed texts (0 when they share no token)."""
    predicted, wanted = _tokens(answer), _tokens(gold)
    common = sum((Counter(predicted) & Counter(wanted)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted), common / len(wanted)
    return 2 * precision * recall / (precision + recall)


def f1(answer: str, gold: str, category: int) -> float:
    """The question's F1 as LoCoMo computes it for its category."""
    gold = str(gold)
    if category == 1:
        parts = [part for part in answer.split(",") if part.strip()] or [answer]
        wanted = [part for part in gold.split(",") if part.strip()] or [gold]
        return sum(max(token_f1(part, goal) for part in parts) for goal in wanted) / len(wanted)
    if category == 3:
        gold = gold.split(";")[0]
    return token_f1(answer, gold)


def contains(answer: str, gold: str) -> float:
    """1.0 when the normalized gold answer appears whole in the normalized answer."""
    wanted = normalize(gold)
    return float(bool(wanted) and f" {wanted} " in f" {normalize(answer)} ")
