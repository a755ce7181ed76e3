"""Trees the LoCoMo benchmark built, kept on disk so research reruns in seconds.

Building a conversation's tree with a local model costs about half an hour; scoring
a way of reading it costs seconds. ``memtree bench locomo --keep-trees DIR`` saves
every tree it builds as a SQLite memory file (``MemTree.open`` reads it) beside a
JSON sidecar that says how it was built: the conversation and its turn count, the
engine config, the summary writer and the model file's sha256, the aggregation
mode, the memtree commit, the insert timings and the tree file's own sha256.
``--trees DIR`` scores the run's rows on those files instead of building them, and
refuses a file whose sidecar does not match the run (another slice, another model).

The files are derived from the benchmark's data: keep them out of the repository
(LoCoMo is CC BY-NC 4.0). A report that read them records their sha256.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memtree.config import MemTreeConfig

SIDECAR_FORMAT = "memtree-bench-tree"
SIDECAR_VERSION = 1


@dataclass(frozen=True)
class TreeRecipe:
    """What makes two trees of one conversation the same tree: the row's changes to
    the engine's default config (``{}`` for the defaults), the summary writer
    (``extractive`` or ``llm``), the model's name (a file's base name, not its path,
    so a tree built on one machine is found on another) and the aggregation mode.

    The recipe names the changes, not the whole config, so a tree saved before a
    retrieval default changed is still found: reading it with new code is the point.
    The sidecar records the whole config the tree was built with."""

    overrides: tuple[tuple[str, Any], ...]
    aggregator: str
    model: str | None
    aggregation: str

    @classmethod
    def of(cls, overrides: dict[str, Any], aggregator: str, model: str | None, aggregation: str) -> TreeRecipe:
        return cls(tuple(sorted(overrides.items())), aggregator, model, aggregation)

    @property
    def config(self) -> MemTreeConfig:
        return MemTreeConfig(**dict(self.overrides))

    def describe(self) -> dict[str, Any]:
        return {
            "overrides": dict(self.overrides),
            "aggregator": self.aggregator,
            "model": self.model,
            "aggregation": self.aggregation,
        }

    @property
    def key(self) -> str:
        """A short stable name for the recipe (the file names carry it)."""
        text = json.dumps(self.describe(), sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:12]


def model_name(llm: str | None) -> str | None:
    """The model part of ``--llm`` as a recipe names it: ``llama-cpp:/a/b.gguf`` is
    ``llama-cpp:b.gguf``; ``openai:MODEL`` stays as it is."""
    if llm is None:
        return None
    kind, _, rest = llm.partition(":")
    if kind == "llama-cpp" and rest:
        return f"llama-cpp:{Path(rest).name}"
    return llm


def model_file_sha256(llm: str | None) -> str | None:
    """The sha256 of a local model file named by ``--llm llama-cpp:PATH`` (None for
    hosted models: there is no file to fingerprint)."""
    if llm is None or not llm.startswith("llama-cpp:"):
        return None
    path = Path(llm.partition(":")[2]).expanduser()
    return file_sha256(path) if path.is_file() else None


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while chunk := stream.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


class SavedTrees:
    """A folder of saved trees: ``<conversation>__<recipe key>.db`` and its
    ``.json`` sidecar."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder)

    def tree_path(self, sample_id: str, recipe: TreeRecipe) -> Path:
        safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in sample_id)
        return self.folder / f"{safe}__{recipe.key}.db"

    @staticmethod
    def sidecar_path(tree: Path) -> Path:
        return tree.with_suffix(".json")

    def has(self, sample_id: str, recipe: TreeRecipe) -> bool:
        tree = self.tree_path(sample_id, recipe)
        return tree.is_file() and self.sidecar_path(tree).is_file()

    def save(
        self, memory: Any, sample_id: str, turns: int, recipe: TreeRecipe, facts: dict[str, Any]
    ) -> dict[str, Any]:
        """Write ``memory`` (an in-memory ``MemTree``) to the folder as a SQLite memory
        with its sidecar, and return the sidecar. The file appears whole or not at all: it is written under a
        temporary name and renamed, so an interrupted run leaves no half tree that a
        later run would take for a finished one."""
        from memtree.tree import MemTree

        self.folder.mkdir(parents=True, exist_ok=True)
        target = self.tree_path(sample_id, recipe)
        handle, temporary = tempfile.mkstemp(dir=self.folder, prefix=".partial-", suffix=".db")
        os.close(handle)
        os.unlink(temporary)
        backup = Path(temporary).with_suffix(".jsonl")
        try:
            memory.export_jsonl(backup)
            with MemTree.open(temporary, embedder=memory.embedder, aggregator=memory.aggregator) as copy:
                copy.import_jsonl(backup)
            sidecar = {
                "format": SIDECAR_FORMAT,
                "version": SIDECAR_VERSION,
                "file": target.name,
                "conversation": sample_id,
                "turns": turns,
                "recipe": recipe.describe(),
                "recipe_key": recipe.key,
                "config": config_dict(recipe.config),
                "saved_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                **facts,
                "tree_sha256": file_sha256(Path(temporary)),
            }
            os.replace(temporary, target)
            self.sidecar_path(target).write_text(json.dumps(sidecar, indent=1, default=str) + "\n")
        finally:
            for leftover in (Path(temporary), backup, Path(temporary + "-wal"), Path(temporary + "-shm")):
                leftover.unlink(missing_ok=True)
        return sidecar

    def load_sidecar(self, sample_id: str, recipe: TreeRecipe, turns: int) -> dict[str, Any]:
        """The sidecar of the saved tree for this conversation and recipe, checked
        against the run: a missing tree or one built from another slice of the
        conversation is an error that says how to build the right one."""
        tree = self.tree_path(sample_id, recipe)
        sidecar = self.sidecar_path(tree)
        if not tree.is_file() or not sidecar.is_file():
            raise FileNotFoundError(
                f"no saved tree for conversation {sample_id} with recipe {recipe.key} "
                f"({json.dumps(recipe.describe(), default=str)}) in {self.folder}: expected {tree.name}; "
                f"build it with the same options and --keep-trees {self.folder}"
            )
        facts: dict[str, Any] = json.loads(sidecar.read_text())
        if facts.get("format") != SIDECAR_FORMAT or facts.get("recipe_key") != recipe.key:
            raise ValueError(f"{sidecar} is not the sidecar of a saved tree with recipe {recipe.key}")
        if facts.get("turns") != turns:
            raise ValueError(
                f"{tree.name} holds {facts.get('turns')} turns of conversation {sample_id}, "
                f"but this run reads {turns} (another --sessions slice?)"
            )
        return facts

    def open(self, sample_id: str, recipe: TreeRecipe, embedder: Any) -> Any:
        """The saved tree as a ``MemTree``. It is only read: its summaries are never
        rewritten, so no model is loaded (extractive summaries stand in as the writer)."""
        from memtree.aggregate import ExtractiveAggregator
        from memtree.tree import MemTree

        return MemTree.open(
            self.tree_path(sample_id, recipe),
            embedder=embedder,
            aggregator=ExtractiveAggregator(embedder),
            config=recipe.config,
        )


def config_dict(config: MemTreeConfig) -> dict[str, Any]:
    """Every field of ``config`` that JSON can hold (the token counter is a function)."""
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.name != "token_counter"}
