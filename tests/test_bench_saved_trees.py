"""`memtree bench locomo --keep-trees / --trees`: trees built once (a local model takes
half an hour a conversation) and scored again in seconds, never silently mismatched."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from memtree.aggregate import ExtractiveAggregator, LLMAggregator
from memtree.embed import HashingEmbedder
from memtree.tree import MemTree
from memtree_bench.locomo import load_locomo
from memtree_bench.methods import IngestCost, TreeBuilder
from memtree_bench.saved_trees import SavedTrees, TreeRecipe, model_name
from tests.cli_runner import memtree, ok, refused
from tests.test_bench_locomo import small_locomo  # noqa: F401 - the fixture

RUN = ("--embedder", "hashing", "--budgets", "20,1000", "--no-paper", "--no-raptor", "--no-qa")


def test_kept_trees_score_exactly_as_the_run_that_built_them(small_locomo: Path, tmp_path: Path) -> None:  # noqa: F811
    trees = tmp_path / "trees"
    ok(memtree("bench", "locomo", "--data", small_locomo, *RUN, "--keep-trees", trees,
               "--out", tmp_path, "--name", "built", embedder=None))  # fmt: skip
    saved = sorted(p.name for p in trees.iterdir())
    # Two trees (the defaults' and the flat one), each a SQLite file and its sidecar, nothing half-written.
    assert len(saved) == 4 and all(name.startswith("tiny-1__") for name in saved)
    sidecars = [json.loads(p.read_text()) for p in sorted(trees.glob("*.json"))]
    for sidecar in sidecars:
        tree = trees / f"tiny-1__{sidecar['recipe_key']}.db"
        assert sidecar["tree_sha256"] == hashlib.sha256(tree.read_bytes()).hexdigest()
        assert sidecar["conversation"] == "tiny-1" and sidecar["turns"] == 6
        assert sidecar["recipe"]["aggregator"] == "extractive" and sidecar["memtree_commit"]
        assert len(sidecar["insert_seconds"]) == 6 and "theta0" in sidecar["config"]
    ok(memtree("bench", "locomo", "--data", small_locomo, *RUN, "--trees", trees,
               "--out", tmp_path, "--name", "read", embedder=None))  # fmt: skip
    built = json.loads((tmp_path / "built.json").read_text())["results"]
    read = json.loads((tmp_path / "read.json").read_text())["results"]
    for row in ("flat hybrid", "memtree", "memtree, leaves only", "memtree traversal"):
        for key in ("recall", "recall_by_category", "answer_recall", "shape", "insert_ms", "saved_trees"):
            assert read[row][key] == built[row][key], (row, key)
    assert read["memtree"]["saved_trees"] and read["flat dense"]["saved_trees"] == []
    markdown = (tmp_path / "read.md").read_text()
    assert "## Saved trees" in markdown and sidecars[0]["tree_sha256"] in markdown


def test_trees_refuses_a_missing_tree_or_another_slice(small_locomo: Path, tmp_path: Path) -> None:  # noqa: F811
    refused(
        memtree("bench", "locomo", "--data", small_locomo, *RUN, "--trees", tmp_path / "none", embedder=None),
        "no such folder; build the trees first with --keep-trees",
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    refused(
        memtree("bench", "locomo", "--data", small_locomo, *RUN, "--trees", empty, embedder=None),
        "no saved tree for conversation tiny-1",
    )
    trees = tmp_path / "trees"
    ok(memtree("bench", "locomo", "--data", small_locomo, *RUN, "--keep-trees", trees, "--sessions", "1",
               "--out", tmp_path, embedder=None))  # fmt: skip
    refused(
        memtree("bench", "locomo", "--data", small_locomo, *RUN, "--trees", trees, "--out", tmp_path, embedder=None),
        "holds 3 turns of conversation tiny-1, but this run reads 6",
    )


def test_a_saved_tree_is_read_without_its_summary_writer(small_locomo: Path, tmp_path: Path) -> None:  # noqa: F811
    (conversation,) = load_locomo(small_locomo)
    embedder = HashingEmbedder(64)
    writers: list[str] = []

    def counted_writer() -> ExtractiveAggregator:
        writers.append("made")
        return ExtractiveAggregator(embedder)

    recipe = TreeRecipe.of({}, "llm", model_name("llama-cpp:/models/qwen.gguf"), "eager")
    assert recipe.describe()["model"] == "llama-cpp:qwen.gguf"  # the file's name, not where it lies
    saved = SavedTrees(tmp_path)
    first = TreeBuilder(embedder, aggregator_factory=counted_writer, saved=saved, recipe=recipe)
    memory, cost = first.build(conversation.turns, conversation.sample_id)
    leaves = sorted(leaf.text for leaf in memory.leaves())
    nodes = sorted((node.id, node.text) for node in memory.walk())
    first.close()
    again = TreeBuilder(embedder, aggregator_factory=counted_writer, saved=saved, recipe=recipe, reuse_only=True)
    reread, reread_cost = again.build(conversation.turns, conversation.sample_id)
    assert writers == ["made"]  # the model (here a stand-in) is never needed to read a saved tree
    assert sorted(leaf.text for leaf in reread.leaves()) == leaves
    assert sorted((node.id, node.text) for node in reread.walk()) == nodes  # the same tree, summaries and all
    assert reread_cost.shape == cost.shape and reread_cost.insert_seconds == cost.insert_seconds
    again.close()


def test_a_failed_save_leaves_no_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    memory = MemTree(embedder=HashingEmbedder(32))
    memory.add("Ana adopted a grey cat named Miso.")
    recipe = TreeRecipe.of({}, "extractive", None, "eager")

    def broken_import(self: MemTree, source: object, *, skip_bad: bool = False) -> int:
        raise OSError("disk full")

    monkeypatch.setattr(MemTree, "import_jsonl", broken_import)
    with pytest.raises(OSError, match="disk full"):
        SavedTrees(tmp_path).save(memory, "c1", 1, recipe, {})
    assert list(tmp_path.iterdir()) == []  # no half tree a later run would take for a finished one


def test_a_killed_build_resumes_from_its_last_session_and_ends_as_an_unbroken_one(
    small_locomo: Path,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A model-written tree costs hours: a build killed in its second session must resume
    # after the first, and end with the tree, costs and reply log of a build never killed.
    (conversation,) = load_locomo(small_locomo)
    embedder = HashingEmbedder(64)
    recipe = TreeRecipe.of({}, "llm", "llama-cpp:stand-in.gguf", "deferred")

    def writer() -> LLMAggregator:
        return LLMAggregator(lambda prompt: "Ana and Ben talked.", guarded=True)  # every reply fails 'facts'

    def build(folder: Path) -> tuple[list[tuple[str, str]], IngestCost, list[str]]:
        saved = SavedTrees(folder)
        builder = TreeBuilder(embedder, aggregator_factory=writer, deferred=True, saved=saved, recipe=recipe)
        memory, cost = builder.build(conversation.turns, conversation.sample_id)
        nodes = sorted((node.text, str(node.source_id)) for node in memory.walk())
        builder.close()
        log = SavedTrees(folder).replies_path(conversation.sample_id, recipe).read_text().splitlines()
        return nodes, cost, log

    unbroken = build(tmp_path / "unbroken")
    sessions: list[int] = []
    original = TreeBuilder._ingest_deferred

    def killed_in_second_session(self: TreeBuilder, session: Any) -> None:
        sessions.append(session[0].session)
        if len(sessions) == 2:
            raise KeyboardInterrupt  # the session's turns are half in when the process dies
        original(self, session)

    monkeypatch.setattr(TreeBuilder, "_ingest_deferred", killed_in_second_session)
    folder = tmp_path / "resumed"
    with pytest.raises(KeyboardInterrupt):
        build(folder)
    saved = SavedTrees(folder)
    backup, progress = saved.checkpoint_paths(conversation.sample_id, recipe)
    assert json.loads(progress.read_text())["sessions_done"] == 1 and backup.is_file()
    assert not saved.has(conversation.sample_id, recipe)  # no finished tree yet
    monkeypatch.setattr(TreeBuilder, "_ingest_deferred", original)
    resumed = build(folder)
    assert resumed[0] == unbroken[0]  # the same nodes, summaries included
    # The same replies (a flush writes its summaries in no fixed order, so compared as sets).
    assert sorted(resumed[2]) == sorted(unbroken[2])
    assert len(unbroken[2]) == unbroken[1].quality["summaries_checked"] > 0
    assert resumed[1].aggregation_calls == unbroken[1].aggregation_calls
    assert resumed[1].quality["summary_fallbacks"] == unbroken[1].quality["summary_fallbacks"]
    assert len(resumed[1].insert_seconds) == len(conversation.turns)
    assert not backup.exists() and not progress.exists()  # a finished build leaves no checkpoint
    assert saved.has(conversation.sample_id, recipe)


def test_a_tree_built_by_other_summary_code_is_read_with_a_warning_naming_it(
    small_locomo: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """The recipe leaves the summary code out (reading an older tree with new ranking
    code is the point), so the sidecar records it and reading says when it differs."""
    import warnings

    from memtree_bench.saved_trees import summary_code_sha256

    (conversation,) = load_locomo(small_locomo)
    embedder = HashingEmbedder(64)
    recipe = TreeRecipe.of({}, "extractive", None, "eager")
    saved = SavedTrees(tmp_path)
    builder = TreeBuilder(
        embedder, aggregator_factory=lambda: ExtractiveAggregator(embedder), saved=saved, recipe=recipe
    )
    builder.build(conversation.turns, conversation.sample_id)
    builder.close()
    sidecar = saved.sidecar_path(saved.tree_path(conversation.sample_id, recipe))
    facts = json.loads(sidecar.read_text())
    assert facts["summary_code_sha256"] == summary_code_sha256()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # this checkout's own tree: read without a word
        saved.load_sidecar(conversation.sample_id, recipe, len(conversation.turns))
    sidecar.write_text(json.dumps({**facts, "summary_code_sha256": "0" * 64, "memtree_commit": "abc1234"}))
    with pytest.warns(UserWarning, match=r"tiny-1__\w+\.db was built by other summary code .*commit abc1234"):
        saved.load_sidecar(conversation.sample_id, recipe, len(conversation.turns))
    del facts["summary_code_sha256"]  # a sidecar written before the code was recorded
    sidecar.write_text(json.dumps(facts))
    with pytest.warns(UserWarning, match="differ or were not recorded"):
        saved.load_sidecar(conversation.sample_id, recipe, len(conversation.turns))
