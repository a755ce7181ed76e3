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
import math
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from langgraph.store.base import TTLConfig

logger = logging.getLogger(__name__)

TTL_CONFIG_KEYS = ("default_ttl", "refresh_on_read", "sweep_interval_minutes", "omit_expired")
"""The ``TTLConfig`` keys ``MemTreeStore`` accepts."""


def check_ttl_minutes(value: object, what: str = "ttl") -> float:
    """A LangGraph TTL in minutes, checked: a positive finite number. Zero, a
    negative number, NaN, infinity or anything but a number raise naming ``what``,
    before anything is stored."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} must be a number of minutes (or None: never expire), got {type(value).__name__}")
    if math.isnan(value):
        raise ValueError(f"{what} is NaN; pass a positive number of minutes (or None: never expire)")
    if math.isinf(value):
        raise ValueError(f"{what} is infinite; pass None for an item that never expires")
    if value <= 0:
        raise ValueError(f"{what} must be a positive number of minutes (or None: never expire), got {value!r}")
    return float(value)


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
        check_ttl_minutes(interval, "TTLConfig sweep_interval_minutes")
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

    def __init__(self, sweep: Callable[[], int]) -> None:
        self._sweep = sweep
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, interval_minutes: float) -> None:
        if self.running:
            return
        interval = check_ttl_minutes(interval_minutes, "sweep_interval_minutes") * 60.0
        self._stop.clear()

        def loop() -> None:
            while not self._stop.wait(interval):
                started = time.monotonic()
                try:
                    swept = self._sweep()
                except Exception:  # the next sweep retries; a sweeper that dies sweeps nothing again
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
