"""Pausing Python's cyclic garbage collector while a whole tree is loaded."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def paused_gc() -> Iterator[None]:
    """Run the block with the cyclic collector off (and back on after, if it was on).

    Reopening 100k nodes allocates a few hundred thousand objects; the collector
    would run hundreds of times meanwhile, each pass scanning every object made so
    far, although none of them is garbage. Reference counting still frees memory.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
