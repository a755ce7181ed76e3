"""Text made storable: the adapters clean what they pass to the tree rather than refuse it."""

from __future__ import annotations

from memtree.text import storable_text


def storable(text: str) -> str:
    """``text`` without NUL characters or lone surrogates, stripped.

    The engine refuses both (PostgreSQL cannot store NUL; surrogates are not UTF-8);
    adapters remember what users *said*, so they clean such text instead of failing.
    """
    return storable_text(text).strip()
