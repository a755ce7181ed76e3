"""Trees the LoCoMo benchmark built, kept on disk so research reruns in seconds.

Building a conversation's tree with a local model costs about half an hour; scoring
a way of reading it costs seconds. ``memtree bench locomo --keep-trees DIR`` saves
every tree it builds as a SQLite memory file (``MemTree.open`` reads it) beside a
JSON sidecar that says how it was built: the conversation and its turn count, the
engine config, the summary writer and the model file's sha256, the aggregation
mode, the memtree commit, a fingerprint of the summary code, the insert timings and
the tree file's own sha256.
``--trees DIR`` scores the run's rows on those files instead of building them, and
refuses a file whose sidecar does not match the run (another slice, another model).
A build saves a checkpoint after each session, so a killed run resumes where it was
(``.partial.jsonl`` and ``.partial.json`` beside the tree until it is finished), and
logs every guarded model reply (``.replies.jsonl``).

The files are derived from the benchmark's data: keep them out of the repository
(LoCoMo is CC BY-NC 4.0). A report that read them records their sha256.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memtree.config import MemTreeConfig
from memtree.summary_guard import GuardedReply

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


SUMMARY_CODE = ("aggregate.py", "summary_guard.py")
"""The engine's modules that decide what a summary says: the writers and their
prompts, and the guards that reject a model's reply."""


def summary_code_sha256() -> str:
    """A fingerprint of this checkout's summary code (:data:`SUMMARY_CODE`): its
    syntax tree without comments and docstrings, so only a change to what the code
    does (or to a prompt, which is a string constant) changes it. The recipe leaves
    it out, so a tree saved by older code is still found and read; a sidecar records
    it, so reading such a tree says that its summaries are the older code's."""
    import ast

    import memtree

    digest = hashlib.sha256()
    for name in SUMMARY_CODE:
        module = ast.parse((Path(memtree.__file__).parent / name).read_text(encoding="utf-8"))
        for node in ast.walk(module):
            body = getattr(node, "body", None)
            if (
                isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                and body
                and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                node.body = body[1:] or [ast.Pass()]
        digest.update(ast.dump(module).encode())
    return digest.hexdigest()


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

    def replies_path(self, sample_id: str, recipe: TreeRecipe) -> Path:
        """The JSON Lines log of every guarded model reply written while building the
        tree (``benchmarks/summary_guard_audit.py`` re-checks it without the model)."""
        return self.tree_path(sample_id, recipe).with_suffix(".replies.jsonl")

    def reply_logger(self, sample_id: str, recipe: TreeRecipe, keep: int = 0) -> Callable[[GuardedReply], None]:
        """An ``LLMAggregator.on_reply`` callback that appends each reply to
        :meth:`replies_path`. The log keeps its first ``keep`` lines (the replies of a
        checkpoint the build resumes from) and drops the rest, so a rebuilt tree gets
        a new log and a resumed one no replies its checkpoint lost."""
        path = self.replies_path(sample_id, recipe)
        self.folder.mkdir(parents=True, exist_ok=True)
        kept = path.read_text(encoding="utf-8").splitlines(keepends=True)[:keep] if keep and path.is_file() else []
        path.write_text("".join(kept), encoding="utf-8")
        lock = threading.Lock()

        def log(reply: GuardedReply) -> None:
            verdict = reply.verdict
            line = {
                "summary": reply.summary,
                "new_texts": list(reply.new_texts),
                "count": reply.count,
                "reply": reply.reply,
                "truncated": reply.truncated,
                "guard": verdict.guard if verdict else None,
                "reason": verdict.reason if verdict else None,
                "attempt": reply.attempt,
                "restored": reply.restored,
            }
            with lock, path.open("a", encoding="utf-8") as stream:
                stream.write(json.dumps(line, ensure_ascii=False) + "\n")

        return log

    def checkpoint_paths(self, sample_id: str, recipe: TreeRecipe) -> tuple[Path, Path]:
        """A build in progress: the tree so far as a JSONL backup, and its progress
        (sessions done, their timings and counters)."""
        tree = self.tree_path(sample_id, recipe)
        return tree.with_suffix(".partial.jsonl"), tree.with_suffix(".partial.json")

    def save_checkpoint(self, memory: Any, sample_id: str, recipe: TreeRecipe, progress: dict[str, Any]) -> None:
        """Keep a build's state after a whole session, so a killed build (a model's
        hours) resumes from there: both files are written under temporary names and
        renamed, the tree first, so the progress never names a tree not on disk."""
        backup, state = self.checkpoint_paths(sample_id, recipe)
        self.folder.mkdir(parents=True, exist_ok=True)
        partial = backup.with_name(".writing-" + backup.name)
        memory.export_jsonl(partial)
        os.replace(partial, backup)
        partial = state.with_name(".writing-" + state.name)
        partial.write_text(json.dumps(progress, default=str) + "\n")
        os.replace(partial, state)

    def load_checkpoint(self, sample_id: str, recipe: TreeRecipe, turns: int) -> tuple[Path, dict[str, Any]] | None:
        """The checkpoint of an unfinished build of this conversation slice, or ``None``
        (none, or one of another slice: that one is started over)."""
        backup, state = self.checkpoint_paths(sample_id, recipe)
        if not backup.is_file() or not state.is_file():
            return None
        progress: dict[str, Any] = json.loads(state.read_text())
        if progress.get("turns") != turns or progress.get("recipe_key") != recipe.key:
            return None
        return backup, progress

    def drop_checkpoint(self, sample_id: str, recipe: TreeRecipe) -> None:
        for path in self.checkpoint_paths(sample_id, recipe):
            path.unlink(missing_ok=True)

    def in_progress(self, sample_id: str, recipe: TreeRecipe) -> BuildInProgress:
        """The checkpoints and reply log of a build of this tree."""
        return BuildInProgress(self, sample_id, recipe)

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
                "summary_code_sha256": summary_code_sha256(),
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
        if facts.get("summary_code_sha256") != summary_code_sha256():
            warnings.warn(
                f"{tree.name} was built by other summary code than this checkout's "
                f"(memtree commit {facts.get('memtree_commit', 'unknown')}; {', '.join(SUMMARY_CODE)} differ or "
                "were not recorded): its summaries are what that code wrote. Build it again into another "
                "folder to score this code's summaries.",
                stacklevel=2,
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


@dataclass(frozen=True)
class BuildInProgress:
    """One tree being built into ``trees``: its checkpoints and its reply log."""

    trees: SavedTrees
    sample_id: str
    recipe: TreeRecipe

    def resume_from(self, turns: int) -> tuple[Path, dict[str, Any]] | None:
        return self.trees.load_checkpoint(self.sample_id, self.recipe, turns)

    def reply_logger(self, keep: int = 0) -> Callable[[GuardedReply], None]:
        return self.trees.reply_logger(self.sample_id, self.recipe, keep)

    def checkpoint(self, memory: Any, progress: dict[str, Any]) -> None:
        self.trees.save_checkpoint(memory, self.sample_id, self.recipe, {**progress, "recipe_key": self.recipe.key})

    def finish(self) -> None:
        self.trees.drop_checkpoint(self.sample_id, self.recipe)


def config_dict(config: MemTreeConfig) -> dict[str, Any]:
    """Every field of ``config`` that JSON can hold (the token counter is a function)."""
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.name != "token_counter"}
