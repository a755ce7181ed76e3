"""LangGraph's item expiry (``TTLConfig``, ``put(..., ttl=...)``) for ``MemTreeStore``.

The semantics are those of LangGraph's ``SqliteStore`` and ``PostgresStore``:

* ``ttl`` on ``put`` is in **minutes**; an item expires that long after it was last
  written or (with ``refresh_on_read``) read. ``TTLConfig.default_ttl`` applies to a
  ``put`` that does not pass ``ttl`` (an explicit ``ttl=None``: never expires).
* ``get`` and ``search`` refresh the expiry of what they return when the operation
  asks for it (``refresh_ttl``, default ``TTLConfig.refresh_on_read``, default ``True``).
* ``sweep_ttl()`` deletes expired items; ``start_ttl_sweeper()`` runs it every
  ``sweep_interval_minutes`` in a daemon thread (started by the store itself when
  the config names an interval).

One difference, on purpose: an expired item is never returned, listed or found,
even before a sweep deletes it (LangGraph's stores do that only with
``omit_expired=True``); memtree's engine hides expired leaves the same way
(``MemTree.add(ttl=...)``), so the tree behind a store agrees with its items.

An item's record keeps ``expires_at`` (POSIX seconds) and ``ttl_minutes``; its leaves
carry the same ``expires_at`` in the engine, so a reader of the tree
(``store.tree(ns)``, the middleware) stops seeing them at the same moment.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

from langgraph.store.base import TTLConfig

from memtree.inputs import ttl_seconds

logger = logging.getLogger(__name__)

TTL_CONFIG_KEYS = ("default_ttl", "refresh_on_read", "sweep_interval_minutes", "omit_expired")
"""The ``TTLConfig`` keys ``MemTreeStore`` accepts."""


MIN_SWEEP_SECONDS = 1.0
"""The shortest sweep interval: a sweeper that runs more often than every second is a busy loop."""

MAX_SWEEP_SECONDS = min(threading.TIMEOUT_MAX, 365 * 24 * 3600.0)
"""The longest sweep interval: a year (a thread cannot wait longer than
``threading.TIMEOUT_MAX``; a longer interval killed the sweeper with ``OverflowError``)."""


def check_ttl_minutes(value: object, what: str = "ttl") -> float:
    """A LangGraph TTL in minutes, checked by the engine's one TTL check
    (:func:`memtree.inputs.ttl_seconds`: the bounds of ``MemTree.add(ttl=...)``, in
    minutes). Anything else raises naming ``what``, before anything is stored."""
    if isinstance(value, timedelta):
        raise TypeError(f"{what} must be a number of minutes (or None: never expire), got a timedelta")
    return ttl_seconds(value, what, unit="minutes", seconds_per_unit=60.0) / 60.0


def check_sweep_minutes(value: object, what: str = "sweep_interval_minutes") -> float:
    """A sweep interval in minutes, checked: from 1 second to a year."""
    if isinstance(value, timedelta):
        raise TypeError(f"{what} must be a number of minutes, got a timedelta")
    seconds = ttl_seconds(
        value,
        what,
        unit="minutes",
        seconds_per_unit=60.0,
        shortest=MIN_SWEEP_SECONDS,
        longest=MAX_SWEEP_SECONDS,
    )
    return seconds / 60.0


def check_ttl_config(config: TTLConfig | Mapping[str, Any] | None) -> TTLConfig | None:
    """``config`` checked: known keys, a positive ``default_ttl`` (minutes) or ``None``,
    a bool ``refresh_on_read``, a positive ``sweep_interval_minutes`` or ``None``.
    ``omit_expired=False`` is refused: this store never returns an expired item."""
    if config is None:
        return None
    if not isinstance(config, Mapping):
        raise TypeError(f"ttl must be a TTLConfig dict, got {type(config).__name__}")
    unknown = [key for key in config if key not in TTL_CONFIG_KEYS]
    if unknown:
        raise ValueError(f"unknown TTLConfig key(s) {', '.join(map(repr, unknown))}; use {', '.join(TTL_CONFIG_KEYS)}")
    if config.get("default_ttl") is not None:
        check_ttl_minutes(config["default_ttl"], "TTLConfig default_ttl")
    refresh = config.get("refresh_on_read", True)
    if not isinstance(refresh, bool):
        raise TypeError(f"TTLConfig refresh_on_read must be True or False, got {refresh!r}")
    interval = config.get("sweep_interval_minutes")
    if interval is not None:
        check_sweep_minutes(interval, "TTLConfig sweep_interval_minutes")
    if config.get("omit_expired", True) is not True:
        raise ValueError(
            "MemTreeStore never returns expired items (it behaves as omit_expired=True); leave omit_expired out"
        )
    return TTLConfig(**config)  # type: ignore[typeddict-item]


def expiry_fields(ttl_minutes: float | None, now: float) -> dict[str, float | None]:
    """The record fields of an item written or read at ``now`` with this TTL."""
    if ttl_minutes is None:
        return {"expires_at": None, "ttl_minutes": None}
    return {"expires_at": now + ttl_minutes * 60.0, "ttl_minutes": ttl_minutes}


def is_expired(record: Mapping[str, Any], now: float) -> bool:
    """Whether an item record's expiry has passed (records without one never expire)."""
    expires_at = record.get("expires_at")
    return expires_at is not None and expires_at <= now


def refreshable(record: Mapping[str, Any]) -> bool:
    """Whether reading the item extends its expiry (it has a TTL)."""
    return record.get("ttl_minutes") is not None


class Sweeper:
    """A daemon thread calling ``sweep`` every ``interval_minutes`` until stopped
    (LangGraph's ``start_ttl_sweeper`` / ``stop_ttl_sweeper``). A failed sweep is
    logged and the next one runs on time."""

    def __init__(self, sweep: Callable[[], int], closed: Callable[[], bool] = lambda: False) -> None:
        self._sweep = sweep
        self._closed = closed
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, interval_minutes: float) -> None:
        interval = check_sweep_minutes(interval_minutes) * 60.0  # a bad value is refused even when running
        if self.running:
            return
        self._stop.clear()

        def loop() -> None:
            while not self._stop.wait(interval):
                started = time.monotonic()
                try:
                    if self._closed():
                        break
                    swept = self._sweep()
                except Exception:  # the next sweep retries; a sweeper that dies sweeps nothing again
                    if self._closed():  # the memory's store was closed under the store: nothing to sweep
                        break
                    logger.exception("MemTreeStore TTL sweep failed; retrying at the next interval")
                    continue
                if swept:
                    logger.info("MemTreeStore TTL sweep deleted %d items in %.2fs", swept, time.monotonic() - started)

        self._thread = threading.Thread(target=loop, daemon=True, name="memtree-ttl-sweeper")
        self._thread.start()

    def stop(self, timeout: float | None = None) -> bool:
        """Stop the thread; whether it stopped within ``timeout`` seconds."""
        thread = self._thread
        if thread is None:
            return True
        self._stop.set()
        thread.join(timeout)
        if thread.is_alive():
            return False
        self._thread = None
        return True
