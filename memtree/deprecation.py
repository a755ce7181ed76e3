"""Old public names kept working for a while: each warns once per call site
(``DeprecationWarning``) and does what its replacement does."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any


def deprecated(old: str, replacement: Callable[..., Any], use: str) -> Callable[..., Any]:
    """A method named ``old`` that warns "use ``use``" and calls ``replacement`` with
    the same arguments (the instance first, so a function of the memory works too)."""

    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        warnings.warn(f"{type(self).__name__}.{old} is deprecated; use {use}", DeprecationWarning, stacklevel=2)
        return replacement(self, *args, **kwargs)

    method.__name__ = old
    method.__doc__ = f"Deprecated: use {use}."
    return method
