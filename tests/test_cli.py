"""The ``memtree`` command, run in subprocesses against temporary databases."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from cli_runner import as_json, memtree, ok, refused
from diagram_checks import dot_to_svg, parse_dot, parse_mermaid
from tree_facts import FACTS

from memtree.viz.graphviz import dot_program


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A database holding FACTS (module-scoped: read-only tests share it)."""
    db = tmp_path_factory.mktemp("cli") / "memory.db"
    ok(memtree("add", *FACTS, "--timestamp", "2024-05-01", "--meta", "source=chat", db=db))
    return db


def test_add_texts_then_query_finds_them(built: Path) -> None:
    hits = as_json(memtree("query", "what is Pepper the greyhound scared of", "-k", "3", "--json", db=built))
    assert hits[0]["text"] == "Pepper the greyhound is scared of bicycles."
    assert hits[0]["is_leaf"] and hits[0]["time"] == "2024-05-01" and hits[0]["metadata"] == {"source": "chat"}
    assert [hit["rank"] for hit in hits] == list(range(1, len(hits) + 1)) and len(hits) <= 3
    table = ok(memtree("query", "what is Pepper the greyhound scared of", "-k", "3", db=built)).stdout
    assert all(column in table for column in ("score", "depth", "kind", "time", "text"))
    first_row = next(line for line in table.splitlines() if re.match(r"\W*1\W", line))
    assert "Pepper the greyhound is scared of bicycles." in first_row and "leaf" in first_row


def test_query_options(built: Path) -> None:
    leaves = as_json(memtree("query", "ramen Kyoto", "--leaves-only", "--json", "-k", "20", db=built))
    assert leaves and all(hit["is_leaf"] for hit in leaves)
    traversal = as_json(memtree("query", "ramen Kyoto", "--mode", "traversal", "--json", db=built))
    assert any("ramen" in hit["text"] for hit in traversal)
    budgeted = as_json(memtree("query", "ramen Kyoto", "--budget", "12", "--json", db=built))
    assert sum(len(hit["context"].split()) for hit in budgeted) <= 12
    assert as_json(memtree("query", "ramen", "--where", "source=email", "--json", db=built)) == []


def test_add_reports_what_was_already_remembered(tmp_path: Path) -> None:
    db = tmp_path / "m.db"
    first = as_json(memtree("add", "Eli plays the cello.", "Eli plays the cello.", "--json", db=db))
    assert first["added"] == 1 and first["already_remembered"] == 1 and len(set(first["ids"])) == 1
    assert "Remembered 1 new item" in ok(memtree("add", "Eli tunes the cello.", db=db)).stdout


def test_add_jsonl_file_keeps_timestamps_metadata_and_source_ids(tmp_path: Path) -> None:
    db = tmp_path / "m.db"
    lines = [
        {"text": "Leo flew to Tokyo.", "timestamp": "2024-04-01T09:30:00Z", "metadata": {"speaker": "Leo"}},
        {"text": "Maya booked a vineyard wedding.", "metadata": {"speaker": "Maya"}, "source_id": "msg-2"},
        {"text": "Leo ate ramen in Kyoto.", "timestamp": "2024-04-03", "metadata": {"speaker": "Leo", "turn": 3}},
    ]
    source = tmp_path / "turns.jsonl"
    source.write_text("\n".join(json.dumps(line) for line in lines) + "\n\n", encoding="utf-8")
    done = ok(memtree("add", "--file", source, db=db))
    assert "Remembered 3 new items" in done.stdout
    hits = as_json(memtree("query", "Leo Tokyo Kyoto", "--where", "speaker=Leo", "--json", "-k", "5", db=db))
    assert {hit["text"] for hit in hits} == {"Leo flew to Tokyo.", "Leo ate ramen in Kyoto."}
    by_text = {hit["text"]: hit for hit in hits}
    assert by_text["Leo flew to Tokyo."]["time"] == "2024-04-01 09:30:00 UTC"
    assert by_text["Leo ate ramen in Kyoto."]["metadata"] == {"speaker": "Leo", "turn": 3}
    wedding = as_json(memtree("query", "vineyard wedding", "--json", "-k", "1", db=db))[0]
    assert wedding["source_id"] == "msg-2" and wedding["timestamp"] is None


def test_add_plain_text_by_line_by_paragraph_and_from_stdin(tmp_path: Path) -> None:
    db = tmp_path / "m.db"
    notes = tmp_path / "notes.txt"
    notes.write_text("First note: tea.\n\n  Second note: coffee. \nThird note: cocoa.\n", encoding="utf-8")
    ok(memtree("add", "--file", notes, "--no-progress", db=db))
    assert as_json(memtree("stats", "--json", db=db))["leaves"] == 3
    essay = tmp_path / "essay.txt"
    essay.write_text("Para one line one.\nPara one line two.\n\n\nPara two.\n", encoding="utf-8")
    other = tmp_path / "p.db"
    ok(memtree("add", "--file", essay, "--paragraphs", db=other))
    texts = {hit["text"] for hit in as_json(memtree("query", "para line", "--json", "-k", "5", db=other))}
    assert texts == {"Para one line one.\nPara one line two.", "Para two."}
    ok(memtree("add", "--file", "-", "--format", "jsonl", db=db, stdin='{"text": "A note from stdin."}\n'))
    assert as_json(memtree("stats", "--json", db=db))["leaves"] == 4


def test_show_text_mermaid_dot_and_svg(built: Path, tmp_path: Path) -> None:
    outline = ok(memtree("show", db=built)).stdout
    assert outline.startswith(f"root · {len(FACTS)} leaves") and "Pepper" in outline
    shallow = ok(memtree("show", "--depth", "1", db=built)).stdout
    assert "[d2" not in shallow
    mermaid = parse_mermaid(ok(memtree("show", "--format", "mermaid", db=built)).stdout)
    nodes = as_json(memtree("stats", "--json", db=built))["nodes"]
    assert len(mermaid.labels) == nodes + 1
    dot = ok(memtree("show", "--format", "dot", "--direction", "TB", db=built)).stdout
    assert len(parse_dot(dot)) == nodes + 1 and "rankdir=TB" in dot
    if dot_program() is None:
        pytest.skip("Graphviz dot is not installed (apt-get install graphviz): SVG and PNG not checked")
    assert dot_to_svg(dot).count('class="node"') == nodes + 1
    ok(memtree("show", "--out", tmp_path / "tree.svg", db=built))
    assert "<svg" in (tmp_path / "tree.svg").read_text(encoding="utf-8")


def test_show_png_and_html_files(built: Path, tmp_path: Path) -> None:
    page = tmp_path / "tree.html"
    done = ok(memtree("show", "--out", page, "--query", "ramen in Kyoto", db=built))
    assert "wrote the html picture" in done.stderr
    html = page.read_text(encoding="utf-8")
    assert html.startswith("<!doctype html>") and "ramen in Kyoto" in html
    if dot_program() is None:
        pytest.skip("Graphviz dot is not installed (apt-get install graphviz): PNG not checked")
    image = tmp_path / "tree.png"
    ok(memtree("show", "--format", "png", "--out", image, "--depth", "2", db=built))
    assert image.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_stats_json_and_table(built: Path) -> None:
    stats = as_json(memtree("stats", "--json", db=built))
    assert stats["leaves"] == len(FACTS) and stats["nodes"] == stats["leaves"] + stats["summaries"]
    assert stats["namespace"] == "default" and stats["namespaces"] == ["default"]
    assert stats["embedder"] == "HashingEmbedder(64)"
    table = ok(memtree("stats", db=built)).stdout
    assert "[default]" in table and re.search(rf"leaves \(texts remembered\)\W+{len(FACTS)}\b", table)


def test_namespaces_are_separate_trees(tmp_path: Path) -> None:
    db = tmp_path / "m.db"
    ok(memtree("add", "Alice likes green tea.", "--namespace", "users/alice", db=db))
    ok(memtree("add", "Bob likes black coffee.", "-n", "users/bob", db=db))
    alice = as_json(memtree("query", "likes", "--json", "-n", "users/alice", db=db))
    assert [hit["text"] for hit in alice] == ["Alice likes green tea."]
    assert as_json(memtree("stats", "--json", "-n", "users/bob", db=db))["namespaces"] == ["users/alice", "users/bob"]


def test_export_then_import_into_another_database(built: Path, tmp_path: Path) -> None:
    backup = tmp_path / "backup.jsonl"
    done = ok(memtree("export", backup, db=built))
    assert re.search(r"exported \d+ lines", done.stderr)
    copy = tmp_path / "copy.db"
    imported = as_json(memtree("import", backup, "--json", db=copy))
    assert imported["imported"] > 0
    question = ("query", "Pepper greyhound sofa", "--json")
    assert as_json(memtree(*question, db=copy)) == as_json(memtree(*question, db=built))
    assert without_export_time(ok(memtree("export", db=built)).stdout) == without_export_time(backup.read_text())


def without_export_time(jsonl: str) -> list[dict[str, object]]:
    records = [json.loads(line) for line in jsonl.splitlines()]
    records[0].pop("exported_at", None)
    return records


def test_repair_checks_the_tree(built: Path) -> None:
    done = ok(memtree("repair", db=built))
    assert "Repaired 0 stale summaries." in done.stdout and "The tree is sound." in done.stdout
    assert as_json(memtree("repair", "--json", db=built)) == {"repaired": 0, "still_stale": 0, "problems": []}


# -- bad input: a clear message, exit status 1, no traceback, nothing stored ---------


def test_png_without_graphviz_says_how_to_install_it(built: Path, tmp_path: Path) -> None:
    no_dot = {"PATH": str(tmp_path)}  # python is called by its full path; dot cannot be found
    refused(memtree("show", "--out", tmp_path / "tree.png", db=built, env=no_dot), "apt-get install graphviz")
    assert not (tmp_path / "tree.png").exists()


def test_missing_unreadable_and_non_utf8_files(tmp_path: Path) -> None:
    db = tmp_path / "m.db"
    refused(memtree("add", "--file", tmp_path / "nope.txt", db=db), "nope.txt: no such file")
    refused(memtree("add", "--file", tmp_path, db=db), "is a folder")
    latin = tmp_path / "latin1.txt"
    latin.write_bytes("café au lait\n".encode("latin-1"))
    refused(memtree("add", "--file", latin, db=db), "is not UTF-8 text (byte 0xe9 at offset 3)")
    empty = tmp_path / "empty.txt"
    empty.write_text("\n \n", encoding="utf-8")
    refused(memtree("add", "--file", empty, db=db), "holds nothing to remember")
    assert not db.exists(), "a failed add must not even create the database"
    # An unreadable file (run as an unprivileged user, also under root): test_cli_files.py.


def test_malformed_jsonl_adds_nothing_unless_skip_bad(tmp_path: Path) -> None:
    db = tmp_path / "m.db"
    ok(memtree("add", "Already here.", db=db))
    source = tmp_path / "bad.jsonl"
    source.write_text(
        "\n".join(
            [
                '{"text": "good one"}',
                '{"text": "broken',
                "[1, 2]",
                '{"txt": "typo"}',
                '{"text": "bad time", "timestamp": "yesterday"}',
                '{"text": "good two", "metadata": {"k": 1}}',
            ]
        ),
        encoding="utf-8",
    )
    message = refused(memtree("add", "--file", source, db=db), "nothing was added", "--skip-bad")
    for number, reason in [(2, "not valid JSON"), (3, "got an array"), (4, 'unknown field "txt"'), (5, "yesterday")]:
        assert re.search(rf"line {number}: .*{re.escape(reason)}", message), (number, message)
    assert "line 1" not in message and "line 6" not in message
    assert as_json(memtree("stats", "--json", db=db))["leaves"] == 1
    done = ok(memtree("add", "--file", source, "--skip-bad", db=db))
    assert "skipping 4 bad line(s)" in done.stderr and "Remembered 2 new items" in done.stdout
    assert as_json(memtree("stats", "--json", db=db))["leaves"] == 3


def test_import_reports_the_bad_line_and_imports_nothing(built: Path, tmp_path: Path) -> None:
    backup = tmp_path / "backup.jsonl"
    ok(memtree("export", backup, db=built))
    lines = backup.read_text(encoding="utf-8").splitlines()
    lines.insert(2, "{not json")
    damaged = tmp_path / "damaged.jsonl"
    damaged.write_text("\n".join(lines) + "\n", encoding="utf-8")
    target = tmp_path / "target.db"
    refused(memtree("import", damaged, db=target), "line 3")
    assert not target.exists(), "a failed import leaves no new database behind"
    ok(memtree("add", "Already here.", db=target))
    refused(memtree("import", damaged, "-n", "restored", db=target), "line 3")
    assert as_json(memtree("stats", "--json", "-n", "restored", db=target))["leaves"] == 0
    assert as_json(memtree("stats", "--json", db=target))["leaves"] == 1, "an existing database is kept"
    refused(memtree("import", tmp_path / "missing.jsonl", db=target), "missing.jsonl: no such file")


def test_a_database_of_another_program_is_refused_and_left_untouched(tmp_path: Path) -> None:
    import sqlite3

    other = tmp_path / "app.db"
    with sqlite3.connect(other) as connection:
        connection.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
        connection.execute("INSERT INTO users (name) VALUES ('ada')")
    before = other.read_bytes()
    refused(memtree("add", "hello", db=other), "another application")
    refused(memtree("query", "hello", db=other), "another application")
    assert other.read_bytes() == before
    text = tmp_path / "notes.db"
    text.write_text("just some text, not a database\n", encoding="utf-8")
    refused(memtree("stats", db=text), "not a memtree memory")
    assert text.read_text(encoding="utf-8") == "just some text, not a database\n"


def test_reading_a_memory_that_does_not_exist(tmp_path: Path) -> None:
    for command in (["query", "anything"], ["show"], ["stats"], ["export"], ["repair"]):
        refused(memtree(*command, db=tmp_path / "typo.db"), "no memory at", "memtree add")
    assert not (tmp_path / "typo.db").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["query", "x", "--mode", "sideways"], "unknown --mode 'sideways'"),
        (["query", "x", "-k", "0"], "k must be a positive integer"),
        (["show", "--format", "gif"], "unknown --format 'gif'"),
        (["show", "--direction", "UP"], "unknown --direction"),
        (["show", "--query", "x"], "HTML view only"),
        (["query", "x", "--where", "novalue"], "--where takes KEY=VALUE"),
        (["query", "x", "--embedder", "word2vec"], "unknown --embedder 'word2vec'"),
        (["query", "x", "--embedder", "hashing:32"], "leave --embedder (and MEMTREE_EMBEDDER) out"),
        (["query", "x", "--embedder", "openai"], "OPENAI_API_KEY"),
        (["query", "x", "-n", "users//bob"], "namespace"),
    ],
)
def test_bad_options_are_named(built: Path, args: list[str], message: str) -> None:
    refused(memtree(*args, db=built), message)


def test_add_needs_something_to_add(tmp_path: Path) -> None:
    refused(memtree("add", db=tmp_path / "m.db"), "nothing to add")
    refused(memtree("add", "   ", db=tmp_path / "m.db"), "empty or whitespace-only")


@pytest.mark.slow
def test_default_embedder_answers_by_meaning(tmp_path: Path) -> None:
    """No --embedder: memtree's default (the local model) is used and kept."""
    db = tmp_path / "m.db"
    ok(memtree("add", *FACTS, db=db, embedder=None))
    hits = as_json(memtree("query", "Which animal lives with Maya?", "-k", "2", "--json", db=db, embedder=None))
    assert "greyhound" in hits[0]["text"]
    assert as_json(memtree("stats", "--json", db=db, embedder=None))["embedder"].startswith("LocalEmbedder")
