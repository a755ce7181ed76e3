"""The index struct LlamaIndex keeps for a :class:`~llamaindex_memtree.MemTreeIndex`.

LlamaIndex stores one small JSON "index struct" per index in its index store and
finds the index class again from the struct's type string. A MemTreeIndex's
struct says where its tree lives (the engine store and namespace) and, for a tree
held in memory, under which storage-context key its persisted copy is found. It
also keeps what a load needs to rebuild the memory as it was and to recognize it:
the memory's config (its plain fields) and a few of the index's leaves. The tree
itself is never copied into the struct: it is the engine's.

:func:`register` adds the type to LlamaIndex's two registries, so that
``load_index_from_storage`` gives back a MemTreeIndex once ``llamaindex_memtree``
is imported (see :data:`MEMTREE_INDEX_TYPE` for what happens before).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, fields
from datetime import timedelta
from typing import Any, cast

from llama_index.core.data_structs.data_structs import IndexStruct
from llama_index.core.data_structs.registry import INDEX_STRUCT_TYPE_TO_INDEX_STRUCT_CLASS
from llama_index.core.data_structs.struct_type import IndexStructType
from llama_index.core.indices.registry import INDEX_STRUCT_TYPE_TO_INDEX_CLASS

from memtree import MemTreeConfig

logger = logging.getLogger(__name__)

MEMTREE_INDEX_TYPE = "memtree (import llamaindex_memtree before loading)"
"""The struct type string written to ``index_store.json``.

LlamaIndex finds index classes in two plain dicts filled at import time and has no
plugin (entry point) registry for them, so ``load_index_from_storage`` in a process
that has not imported ``llamaindex_memtree`` fails with ``KeyError: <this string>``.
The string is written to say how to fix that, since it is all the error shows."""

LEGACY_INDEX_TYPES: tuple[str, ...] = ("memtree",)
"""Type strings written by earlier versions; loaded as MemTreeIndexes too (and
written with :data:`MEMTREE_INDEX_TYPE` when persisted again)."""

UNSTORED_CONFIG_FIELDS = frozenset({"token_counter"})
"""Config fields that are code, not data: a loaded memory gets their defaults."""

SAMPLED_SOURCE_IDS = 8
"""How many of an index's node ids its struct keeps to recognize its tree."""


@dataclass
class MemTreeIndexStruct(IndexStruct):
    """Where a MemTreeIndex's tree lives.

    ``namespace`` is the engine namespace of the tree; ``store`` the class name of
    the engine store that held it when the index was built; ``snapshot`` the key
    in ``StorageContext.vector_stores`` under which ``persist`` writes a tree held
    in memory (``None`` when the tree lives in a durable store); ``timestamp_key``
    the node metadata key read as each leaf's event time; ``aggregation`` how
    inserts write summaries (``None``: the memory's default).

    ``config`` holds the memory's :class:`~memtree.MemTreeConfig` as plain values
    (all but ``token_counter``), so a load without ``memory=`` retrieves as the
    built index did. ``leaf_count`` (the memory's leaves at the last change made
    through the index) and ``source_ids`` (node ids of up to
    :data:`SAMPLED_SOURCE_IDS` of its leaves) let a load tell whether a memory
    passed in really holds this index's tree. All three are ``None`` / empty in
    structs persisted before they existed.
    """

    namespace: list[str] = field(default_factory=lambda: ["default"])
    store: str = "MemoryBackend"
    snapshot: str | None = None
    timestamp_key: str | None = None
    aggregation: str | None = None
    config: dict[str, Any] | None = None
    leaf_count: int | None = None
    source_ids: list[str] = field(default_factory=list)

    @classmethod
    def get_type(cls) -> IndexStructType:
        # Not a member of LlamaIndex's enum, which cannot be extended; the registries
        # are plain dicts and the enum is a str enum, so the string works as a key.
        return cast(IndexStructType, MEMTREE_INDEX_TYPE)


def config_fields(config: MemTreeConfig) -> dict[str, Any]:
    """The plain (JSON) fields of a config, for :attr:`MemTreeIndexStruct.config`
    (a ``timedelta`` ``default_ttl`` as seconds, which the config takes too)."""
    names = [item.name for item in fields(config) if item.name not in UNSTORED_CONFIG_FIELDS]
    plain = {name: getattr(config, name) for name in names}
    if isinstance(plain.get("default_ttl"), timedelta):
        plain["default_ttl"] = plain["default_ttl"].total_seconds()
    return plain


RENAMED_CONFIG_FIELDS = {"retrieve_threshold": "min_score"}
"""Config fields an older memtree recorded under another name, and their names now."""


def stored_config(struct: MemTreeIndexStruct) -> MemTreeConfig | None:
    """The config a struct recorded, validated again; ``None`` if it recorded none.

    Fields this version does not know (a struct written by a newer memtree) are
    left out with a warning; a value the config refuses raises ``ValueError``
    naming the index.
    """
    if struct.config is None:
        return None
    recorded = {RENAMED_CONFIG_FIELDS.get(name, name): value for name, value in struct.config.items()}
    known = {item.name for item in fields(MemTreeConfig)} - UNSTORED_CONFIG_FIELDS
    unknown = sorted(set(recorded) - known)
    if unknown:
        logger.warning(
            "index %s: ignoring stored config fields this memtree does not know: %s",
            struct.index_id,
            ", ".join(unknown),
        )
    try:
        return MemTreeConfig(**{name: value for name, value in recorded.items() if name in known})
    except (TypeError, ValueError) as error:
        raise ValueError(
            f"index {struct.index_id}: the stored memory config is invalid ({error}); pass memory=MemTree(config=...) "
            "to load it with a config of your own"
        ) from None


def register(index_cls: type[Any]) -> None:
    """Map the memtree struct types (this one and earlier ones) to the struct class
    and ``index_cls``."""
    for name in (MEMTREE_INDEX_TYPE, *LEGACY_INDEX_TYPES):
        key = cast(IndexStructType, name)
        INDEX_STRUCT_TYPE_TO_INDEX_STRUCT_CLASS[key] = MemTreeIndexStruct
        INDEX_STRUCT_TYPE_TO_INDEX_CLASS[key] = index_cls
