"""Text made storable: the adapters clean what they pass to the tree rather than refuse it."""

from __future__ import annotations


def storable(text: str) -> str:
    """``text`` without NUL characters or lone surrogates, stripped.

    The engine refuses both (PostgreSQL cannot store NUL; surrogates are not UTF-8);
    adapters remember what users *said*, so they clean such text instead of failing.
    """
    if "\x00" in text:
        text = text.replace("\x00", "")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "replace").decode("utf-8")
    return text.strip()
