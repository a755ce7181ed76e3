"""``memtree bench scale``: the report it writes, its input checks, and the exactness
of the engine's search path it times against brute force."""

from __future__ import annotations

import json
import re
from pathlib import Path

import faiss
import numpy as np
import pytest
from cli_runner import memtree, ok, refused

from memtree.eval.scale import ScaleSettings, parse_sizes, random_unit_vectors, rows_updated_per_insert
from memtree.index import VectorIndex
from memtree.retrieval import Filters, rank_collapsed
from memtree.state import TreeState


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
    assert data["machine"]["command"].startswith("memtree bench scale --sizes 1000,200")
    assert data["machine"]["faiss threads"] == "1"
    results = data["results"]
    assert [r["n"] for r in results] == [200, 1000]
    for r in results:
        assert r["rows_updated_per_insert"] == rows_updated_per_insert(r["n"])
        assert r["rows_written_per_insert"] == r["rows_updated_per_insert"] + 2
        assert r["matrix_bytes"] == r["n"] * 32 * 4 < r["index_bytes"]
        assert r["upkeep"]["count"] == 40 and r["query_engine"]["count"] == 40 and r["rebuild"]["count"] == 5
        for timing in ("upkeep", "rebuild", "query_engine", "query_engine_leaves", "query_faiss", "query_faiss_copy"):
            assert 0 < r[timing]["min"] <= r[timing]["p50"] <= r[timing]["p95"] <= r[timing]["max"] < 1.0
        assert r["same_results"] == 1.0
        assert r["query_ratio"] == pytest.approx(r["query_engine"]["p50"] / r["query_faiss"]["p50"])
        assert r["paired_ratio"] > 0 and r["leaves_paired_ratio"] > 0

    markdown = (out / "scale.md").read_text()
    assert "![upkeep and query time versus N](scale.png)" in markdown
    for n in ("200", "1,000"):
        assert re.search(rf"^\| {n} \| [\d.,]+ \| \d+ \+ 2 \|", markdown, re.MULTILINE), n  # upkeep row
        assert re.search(rf"^\| {n} \| [\d.,]+ \| [\d.,]+ \| [\d.,]+ \| [\d.,]+ \| [\d.]+ \|", markdown, re.MULTILINE)
    for key in ("cpu", "cores", "ram", "python", "numpy", "faiss", "memtree", "date", "command"):
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


def test_random_vectors_are_seeded_unit_vectors() -> None:
    first = random_unit_vectors(np.random.default_rng(7), 70_000, 8)
    again = random_unit_vectors(np.random.default_rng(7), 70_000, 8)
    np.testing.assert_array_equal(first, again)
    assert first.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(first, axis=1), 1.0, atol=1e-5)


def test_engine_search_equals_faiss_brute_force_top10() -> None:
    """What the benchmark times as memtree is the exact search: the same ids as the floor."""
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


def test_a_report_renders_again_from_its_json(tmp_path: Path) -> None:
    from memtree.eval.report import machine_info
    from memtree.eval.scale import load_scale_report, run_scale, write_scale_report

    settings = ScaleSettings(sizes=(50, 120), dimension=8, queries=5, inserts=5, rebuilds=3, threads=1)
    report = run_scale(settings, progress=False)
    first, again = tmp_path / "first", tmp_path / "again"
    write_scale_report(report, first, machine_info(["test"]))
    loaded, info = load_scale_report(first / "scale.json")
    assert loaded.settings == settings and loaded.results == report.results
    write_scale_report(loaded, again, info)
    assert (again / "scale.md").read_text() == (first / "scale.md").read_text()
    assert (again / "scale.json").read_text() == (first / "scale.json").read_text()
