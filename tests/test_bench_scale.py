"""``memtree bench scale``: the report it writes, its verdict, its input checks, its
synthetic texts, and the exactness of the engine's search paths it times against
brute force."""

from __future__ import annotations

import json
import re
from pathlib import Path

import faiss
import numpy as np
import pytest
from cli_runner import memtree, ok, refused

from memtree.index import VectorIndex
from memtree.retrieval import Filters, LexicalShare, first_limit, rank_collapsed
from memtree.state import TreeState
from memtree_bench.scale import (
    ScaleReport,
    ScaleSettings,
    SizeResult,
    exhaustive_hybrid,
    parse_sizes,
    random_unit_vectors,
    rows_updated_per_insert,
)
from memtree_bench.scale_report import verdict
from memtree_bench.zipf import ZipfWords

TIMINGS = (
    "upkeep", "upkeep_vector", "upkeep_lexical", "rebuild", "query_hybrid", "query_hybrid_one_thread", "query_dense",
    "query_dense_leaves",
    "query_lexical", "query_faiss", "query_faiss_copy",
)  # fmt: skip


@pytest.mark.slow
def test_the_command_writes_markdown_json_and_png_for_each_size(tmp_path: Path) -> None:
    out = tmp_path / "results"
    done = ok(
        memtree(
            "bench", "scale", "--sizes", "1000,200", "--dim", "32", "--queries", "40", "--inserts", "40",
            "--rebuilds", "5", "--threads", "1", "--out", out,
        )
    )  # fmt: skip
    assert "Wrote" in done.stdout
    assert {path.name for path in out.iterdir()} == {"scale.md", "scale.json", "scale.png"}
    assert (out / "scale.png").read_bytes().startswith(b"\x89PNG")

    data = json.loads((out / "scale.json").read_text())
    assert data["settings"]["sizes"] == [1000, 200] and data["settings"]["dimension"] == 32
    assert data["settings"]["lexical_weight"] == 0.3  # the engine's default: the hybrid path is what is timed
    assert data["machine"]["command"].startswith("memtree bench scale --sizes 1000,200")
    assert data["machine"]["faiss threads"] == "1"
    assert int(data["machine"]["BM25 helper threads"]) >= 0
    results = data["results"]
    assert [r["n"] for r in results] == [200, 1000]
    for r in results:
        assert r["rows_updated_per_insert"] == rows_updated_per_insert(r["n"])
        assert r["rows_written_per_insert"] == r["rows_updated_per_insert"] + 2
        assert r["matrix_bytes"] == r["n"] * 32 * 4 < r["index_bytes"]
        assert r["lexical_bytes"] > 0 and r["build_lexical_seconds"] > 0 and r["build_vector_seconds"] > 0
        assert r["upkeep"]["count"] == 40 and r["query_hybrid"]["count"] == 40 and r["rebuild"]["count"] == 5
        for timing in TIMINGS:
            assert 0 < r[timing]["min"] <= r[timing]["p50"] <= r[timing]["p95"] <= r[timing]["max"] < 1.0
        assert r["upkeep"]["p50"] >= r["upkeep_lexical"]["p50"]  # the total includes both parts
        assert r["dense_same_results"] == 1.0
        assert r["hybrid_exact"] == 1.0 and r["hybrid_checked"] == 20
        assert r["query_ratio"] == pytest.approx(r["query_hybrid"]["p50"] / r["query_faiss"]["p50"])
        assert r["hybrid_paired_ratio"] > 0 and r["dense_paired_ratio"] > 0 and r["leaves_paired_ratio"] > 0
        assert r["hybrid_one_thread_paired_ratio"] > 0
        assert r["postings_per_query"] > 0

    markdown = (out / "scale.md").read_text()
    assert "![upkeep and query time versus N](scale.png)" in markdown
    for n in ("200", "1,000"):
        assert re.search(rf"^\| {n} \| \d+ \+ 2 \| [\d,]+ \|", markdown, re.MULTILINE), n  # upkeep row
        cells = r"\| [\d.,]+ " * 5
        assert re.search(rf"^\| {n} {cells}\| \**[\d.]+", markdown, re.MULTILINE), n  # query row
    for key in ("cpu", "cores", "ram", "python", "numpy", "faiss", "memtree", "date", "command", "load"):
        assert f"| {key} |" in markdown


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--sizes", "1000,lots"],
            "--sizes: expected whole numbers separated by commas (e.g. 10000,100k,1M), got 'lots'",
        ),
        (["--sizes", "0"], "--sizes: every size must be at least 1, got '0'"),
        (["--sizes", "-5"], "got '-5'"),
        (["--sizes", "100", "--dim", "0"], "--dim must be at least 1, got 0"),
        (["--sizes", "100", "--queries", "0"], "--queries must be at least 1, got 0"),
        (["--sizes", "100", "--seconds", "0"], "--seconds must be positive, got 0.0"),
        (["--sizes", "100", "--threads", "-1"], "--threads must be 0 (the libraries' default) or more, got -1"),
    ],
)
def test_bad_input_is_one_clear_line(tmp_path: Path, args: list[str], message: str) -> None:
    refused(memtree("bench", "scale", *args, "--out", tmp_path), message)
    assert not any(tmp_path.iterdir())


def test_sizes_accept_thousands_and_millions() -> None:
    assert parse_sizes("10000, 100k,1M,2_000") == (10_000, 100_000, 1_000_000, 2_000)
    with pytest.raises(ValueError, match="got ''"):
        parse_sizes("10,,20")
    with pytest.raises(ValueError, match="sizes is empty"):
        ScaleSettings(sizes=())
    with pytest.raises(ValueError, match="leaf_words must be"):
        ScaleSettings(leaf_words=(5, 2))
    with pytest.raises(ValueError, match="lexical_weight must be positive"):
        ScaleSettings(lexical_weight=0.0)


def test_random_vectors_are_seeded_unit_vectors() -> None:
    first = random_unit_vectors(np.random.default_rng(7), 70_000, 8)
    again = random_unit_vectors(np.random.default_rng(7), 70_000, 8)
    np.testing.assert_array_equal(first, again)
    assert first.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(first, axis=1), 1.0, atol=1e-5)


def test_zipf_texts_are_seeded_sized_and_skewed() -> None:
    words = ZipfWords(size=1000, exponent=1.1)
    texts = words.texts(np.random.default_rng(3), 2000, 10, 26)
    assert texts == words.texts(np.random.default_rng(3), 2000, 10, 26)
    assert all(10 <= len(text.split()) <= 26 for text in texts)
    counts: dict[str, int] = {}
    for text in texts:
        for word in set(text.split()):
            counts[word] = counts.get(word, 0) + 1
    ranked = sorted(counts, key=counts.__getitem__, reverse=True)
    assert ranked[0] == "w1" and counts["w1"] > 0.5 * len(texts)  # the head is in most texts…
    assert np.median(list(counts.values())) < 0.01 * len(texts)  # …and most words are in few
    with pytest.raises(ValueError, match="Zipf exponent must be positive"):
        ZipfWords(exponent=0)


def test_engine_search_equals_faiss_brute_force_top10() -> None:
    """What the benchmark times as the dense path is the exact search: the same ids as the floor."""
    rng = np.random.default_rng(11)
    n, d = 3_000, 48
    matrix = random_unit_vectors(rng, n, d)
    is_leaf = rng.random(n) < 0.6
    engine = VectorIndex(d)
    engine.upsert([f"n{i}" for i in range(n)], matrix, is_leaf.tolist(), [float(i) for i in range(n)])
    floor = faiss.IndexFlatIP(d)
    floor.add(matrix)
    leaves = np.flatnonzero(is_leaf)
    leaf_floor = faiss.IndexFlatIP(d)
    leaf_floor.add(np.ascontiguousarray(matrix[leaves]))
    for query in random_unit_vectors(rng, 20, d):
        got = rank_collapsed(engine, TreeState(), query, 10, Filters())
        _, slots = floor.search(query.reshape(1, -1), 10)
        assert [node_id for node_id, _ in got] == [f"n{slot}" for slot in slots[0]]
        got_leaves = rank_collapsed(engine, TreeState(), query, 10, Filters(leaves_only=True))
        _, leaf_slots = leaf_floor.search(query.reshape(1, -1), 10)
        assert [node_id for node_id, _ in got_leaves] == [f"n{leaves[slot]}" for slot in leaf_slots[0]]


def test_hybrid_ranking_equals_the_exhaustive_computation() -> None:
    """The hybrid path the benchmark times (BM25 top-k by MaxScore, scores of the vector
    hits in the same pass) ranks exactly as scoring every matching node would, also
    after updates, on texts with the benchmark's skew."""
    rng = np.random.default_rng(5)
    n, d = 4_000, 32
    words = ZipfWords(size=2_000)
    engine = VectorIndex(d)
    ids = [f"n{i}" for i in range(n)]
    engine.upsert(ids, random_unit_vectors(rng, n, d), [True] * n, [None] * n)
    state = TreeState()
    assert state.lexical is not None
    state.lexical.upsert_many(ids, words.texts(rng, n, 10, 40))
    limit = first_limit(10)
    for round_ in range(3):
        for query, text in zip(random_unit_vectors(rng, 15, d), words.texts(rng, 15, 1, 6), strict=True):
            got = rank_collapsed(engine, state, query, limit, Filters(), LexicalShare(text, 0.3))
            expected = exhaustive_hybrid(engine, state.lexical, query, text, limit, 0.3)
            assert [i for i, _ in got] == [i for i, _ in expected], (round_, text)
            np.testing.assert_allclose([s for _, s in got], [s for _, s in expected], atol=1e-6)
        rewritten = [ids[int(i)] for i in rng.choice(n, 300, replace=False)]
        state.lexical.upsert_many(rewritten, words.texts(rng, 300, 30, 60))


def _result(n: int, *, upkeep: float, hybrid: float, dense: float = 1.0) -> SizeResult:
    def timing(p50: float) -> dict[str, float]:
        return {"p50": p50, "p95": p50 * 1.5, "mean": p50, "min": p50 / 2, "max": p50 * 3, "count": 30}

    floor = 1e-3 * n / 10_000
    return SizeResult(
        n=n, rows_updated_per_insert=rows_updated_per_insert(n), rows_added_per_insert=2, index_bytes=n * 1600,
        matrix_bytes=n * 1536, lexical_bytes=n * 300, upkeep=timing(upkeep), upkeep_vector=timing(upkeep / 4),
        upkeep_lexical=timing(upkeep * 3 / 4), rebuild=timing(floor * 2), build_vector_seconds=0.01,
        build_lexical_seconds=0.1, query_hybrid=timing(floor * hybrid), query_dense=timing(floor * dense),
        query_dense_leaves=timing(floor), query_lexical=timing(floor / 10), query_faiss=timing(floor),
        query_faiss_copy=timing(floor), query_faiss_leaves=timing(floor), query_numpy=timing(floor * 2),
        hybrid_paired_ratio=hybrid, dense_paired_ratio=dense, leaves_paired_ratio=1.0, dense_same_results=1.0,
        hybrid_exact=1.0, hybrid_checked=20, postings_per_query=1.1,
    )  # fmt: skip


def test_the_verdict_of_one_size_claims_no_trend() -> None:
    """One size cannot show growth with N: no "X at N = 2,000 and X at N = 2,000"."""
    lines = verdict(ScaleReport(ScaleSettings(sizes=(2_000,)), [_result(2_000, upkeep=72e-6, hybrid=1.1)]))
    text = "\n".join(lines)
    assert "72 µs at N = 2,000 (p50" in text and "says nothing about growth with N" in text
    assert "N = 2,000 and" not in text
    assert "1.10× at N = 2,000: within the 1.2× target at every N measured" in text


def test_the_verdict_names_each_size_above_the_target_and_growing_upkeep() -> None:
    results = [
        _result(10_000, upkeep=100e-6, hybrid=1.45),
        _result(100_000, upkeep=110e-6, hybrid=1.15),
        _result(1_000_000, upkeep=130e-6, hybrid=1.05, dense=1.3),
    ]
    text = "\n".join(verdict(ScaleReport(ScaleSettings(), results)))
    assert "1.45× at N = 10,000, 1.15× at N = 100,000, 1.05× at N = 1,000,000" in text
    assert "**above the 1.2× target at N = 10,000**; within it elsewhere" in text
    assert "**above the 1.2× target at N = 1,000,000**" in text  # the dense path's miss, named too
    assert "it does not grow with N (largest ÷ smallest p50 across the sizes 1.3×" in text
    assert "(its highest ratio)" in text and "N = 10,000 (its highest ratio)" in text

    growing = [_result(10_000, upkeep=100e-6, hybrid=1.0), _result(1_000_000, upkeep=500e-6, hybrid=1.0)]
    assert "**it grows with N** (largest ÷ smallest p50 across the sizes 5.0×" in "\n".join(
        verdict(ScaleReport(ScaleSettings(), growing))
    )


def test_a_report_renders_again_from_its_json(tmp_path: Path) -> None:
    from memtree_bench.report import machine_info
    from memtree_bench.scale import load_scale_report, run_scale
    from memtree_bench.scale_report import write_scale_report

    settings = ScaleSettings(sizes=(50, 120), dimension=8, queries=5, inserts=5, rebuilds=3, threads=1, vocabulary=500)
    report = run_scale(settings, progress=False)
    first, again = tmp_path / "first", tmp_path / "again"
    write_scale_report(report, first, machine_info(["test"]))
    loaded, info = load_scale_report(first / "scale.json")
    assert loaded.settings == settings and loaded.results == report.results
    write_scale_report(loaded, again, info)
    assert (again / "scale.md").read_text() == (first / "scale.md").read_text()
    assert (again / "scale.json").read_text() == (first / "scale.json").read_text()
