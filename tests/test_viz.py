"""Pictures of the tree: Mermaid and DOT always parse, whatever the stored text;
PNG/SVG through Graphviz; the HTML page is self-contained and escapes text."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
from diagram_checks import decode_entities, dot_to_svg, parse_dot, parse_mermaid
from headless import browser  # noqa: F401 - a fixture
from hypothesis import given
from hypothesis import strategies as st
from tree_facts import FACTS

from memtree import ROOT_ID, HashingEmbedder, MemTree, MemTreeConfig, viz
from memtree.viz import GraphvizNotFoundError
from memtree.viz.dot import escape_dot
from memtree.viz.graphviz import dot_program
from memtree.viz.mermaid import escape_mermaid
from memtree.viz.picture import printable

NASTY = [
    'He said "hi" <script>window.__pwned = 1</script> & left',
    "A #hashtag; #quot; and `backticks` and back\\slash \\N \\l",
    "Line one\nline two\r\nline three\ttabbed",
    "end --> graph TD; A-->B %% not a comment [x] (y) {z} |p|",
    "Unicode: café, 東京, emoji 🐕, RTL שלום",
    "control \x07 bell \x1b escape",
]

needs_dot = pytest.mark.skipif(dot_program() is None, reason="Graphviz dot is not installed (apt-get install graphviz)")


def build(texts: list[str]) -> MemTree:
    memory = MemTree(embedder=HashingEmbedder(64), config=MemTreeConfig(theta0=0.2))
    memory.add_many(texts, timestamps=[f"2024-05-{day:02d}" for day in range(1, len(texts) + 1)])
    return memory


@pytest.fixture(scope="module")
def memory() -> MemTree:
    built = build(FACTS + NASTY)
    assert built.stats().summaries >= 1, "the pictures should show summaries too"
    return built


def flat(text: str) -> str:
    return " ".join(printable(text).split())


def test_mermaid_is_a_tree_of_every_node_with_its_text(memory: MemTree) -> None:
    diagram = parse_mermaid(viz.to_mermaid(memory))
    nodes = list(memory.walk())
    assert diagram.direction == "LR"
    assert len(diagram.labels) == len(nodes)
    assert diagram.labels["n0"] == ["root", f"{len(memory)} leaves"]
    shown_leaves = {" ".join(lines[1:]) for lines in diagram.labels.values() if lines[0].startswith("leaf")}
    assert shown_leaves == {flat(text) for text in FACTS + NASTY}
    summaries = [lines for lines in diagram.labels.values() if lines[0].endswith("leaves") and lines[0] != "root"]
    assert len(summaries) == memory.stats().summaries
    assert parse_mermaid(viz.to_mermaid(memory, direction="TB")).direction == "TB"


def test_dot_is_a_tree_that_graphviz_parses(memory: MemTree) -> None:
    source = viz.to_dot(memory)
    tooltips = parse_dot(source)
    assert len(tooltips) == len(list(memory.walk()))
    assert {" ".join(printable(text).splitlines()) for text in FACTS + NASTY} <= set(tooltips.values())
    if dot_program() is None:
        pytest.skip("Graphviz dot is not installed (apt-get install graphviz): checked the DOT structure only")
    svg = dot_to_svg(source)
    assert svg.count('class="node"') == len(tooltips)
    assert "&lt;script&gt;window.__pwned = 1&lt;/script&gt;" in svg
    assert "<script>" not in svg


def test_depth_cut_stands_in_for_what_is_below(memory: MemTree) -> None:
    diagram = parse_mermaid(viz.to_mermaid(memory, max_depth=1))
    depth_one = [node for node in memory.walk() if node.depth == 1]
    more = [lines for lines in diagram.labels.values() if lines[0].startswith("…")]
    cut = [node for node in depth_one if node.children]
    assert len(more) == len(cut) >= 1
    hidden = sum(int(re.match(r"… (\d+) more nodes", lines[0]).group(1)) for lines in more)  # type: ignore[union-attr]
    assert hidden == len(list(memory.walk())) - 1 - len(depth_one)
    assert len(parse_dot(viz.to_dot(memory, max_depth=1))) == len(diagram.labels)


def test_mermaid_parses_and_renders_in_mermaid_itself(memory: MemTree, browser: Any) -> None:  # noqa: F811
    script = os.environ.get("MEMTREE_MERMAID_JS")
    if not script or not Path(script).is_file():
        pytest.skip("MEMTREE_MERMAID_JS does not name mermaid.min.js (.ci/run fetches it with npm pack mermaid)")
    page = browser.new_page()
    try:
        page.set_content("<html><body><div id='out'></div></body></html>")
        page.add_script_tag(path=script)
        for source in (viz.to_mermaid(memory), viz.to_mermaid(memory, max_depth=1, direction="TB")):
            result = page.evaluate(
                """async (source) => {
                    mermaid.initialize({startOnLoad: false, securityLevel: "strict"});
                    await mermaid.parse(source);
                    const {svg} = await mermaid.render("tree" + Math.random().toString(36).slice(2), source);
                    document.getElementById("out").innerHTML = svg;
                    const box = document.getElementById("out");
                    return {text: box.textContent, scripts: box.querySelectorAll("script").length};
                }""",
                source,
            )
            assert result["scripts"] == 0
            shown = re.sub(r"\s+", "", result["text"])  # wrapped lines are separate text elements
            assert "<script>window.__pwned=1</script>" in shown and 'Hesaid"hi"' in shown
        assert page.evaluate("window.__pwned") is None
    finally:
        page.close()


@needs_dot
def test_png_and_svg_through_graphviz(memory: MemTree, tmp_path: Path) -> None:
    target = tmp_path / "tree.png"
    image = viz.to_png(memory, target, max_depth=2)
    assert image.startswith(b"\x89PNG\r\n\x1a\n") and target.read_bytes() == image
    svg = viz.to_svg(memory, direction="TB")
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg


def test_missing_graphviz_names_the_install_command(memory: MemTree, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(GraphvizNotFoundError, match="apt-get install graphviz"):
        viz.to_png(memory)


@pytest.mark.parametrize(
    ("options", "message"),
    [({"max_depth": 0}, "max_depth"), ({"width": 3}, "width"), ({"direction": "UP"}, "direction")],
)
def test_bad_picture_options_name_the_option(memory: MemTree, options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        viz.to_mermaid(memory, **options)
    with pytest.raises(ValueError, match=message):
        viz.to_dot(memory, **options)


def test_empty_memory_pictures() -> None:
    empty = MemTree(embedder=HashingEmbedder(16))
    assert parse_mermaid(viz.to_mermaid(empty)).labels == {"n0": ["root", "empty memory"]}
    assert list(parse_dot(viz.to_dot(empty))) == ["n0"]
    assert page_data(viz.to_html(empty))["nodes"] == []


def page_data(page: str) -> dict[str, Any]:
    match = re.search(r'<script type="application/json" id="memtree-data">(.*?)</script>', page, re.S)
    assert match is not None
    return json.loads(match.group(1))  # type: ignore[no-any-return]


def test_html_is_one_self_contained_file_with_text_escaped(memory: MemTree) -> None:
    page = viz.to_html(memory, queries=["Pepper greyhound bicycles"], k=3, title="<b>Maya's</b> memory")
    assert page.count("<script") == 2 and page.count("</script>") == 2  # the data and the code, nothing else
    assert not re.search(r"(?:src|href|url)\s*[=(]\s*[\"']?(?:https?:)?//", page, re.I), "no network references"
    assert "default-src 'none'" in page
    assert "<title>&lt;b&gt;Maya&#x27;s&lt;/b&gt; memory</title>" in page
    data = page_data(page)
    assert [node["id"] for node in data["nodes"]] == [node.id for node in memory.walk()]
    assert {node["text"] for node in data["nodes"] if node["leaf"]} == set(FACTS + NASTY)  # exact, unflattened
    assert data["nodes"][0]["id"] == ROOT_ID and data["nodes"][0]["leaves"] == len(memory)
    expected = [hit.id for hit in memory.retrieve("Pepper greyhound bicycles", k=3)]
    (preset,) = data["queries"]
    assert [data["nodes"][hit["node"]]["id"] for hit in preset["hits"]] == expected
    assert [hit["rank"] for hit in preset["hits"]] == [1, 2, 3]


def test_html_max_depth_leaves_deeper_nodes_out(memory: MemTree) -> None:
    data = page_data(viz.to_html(memory, max_depth=1))
    assert all(node["depth"] <= 1 for node in data["nodes"])
    assert data["omitted"] == len(list(memory.walk())) - len(data["nodes"]) > 0
    with pytest.raises(ValueError, match="expand_depth"):
        viz.to_html(memory, expand_depth=-1)


@given(st.text())
def test_mermaid_escaping_round_trips_any_text(text: str) -> None:
    escaped = escape_mermaid(text)
    assert not set(escaped) & set('"<>`\\\n\r')
    assert decode_entities(escaped) == " ".join(text.splitlines())


@given(st.text())
def test_dot_escaping_round_trips_any_text(text: str) -> None:
    escaped = escape_dot(text)
    assert not re.search(r'(?<!\\)(?:\\\\)*"', escaped), "an unescaped quote would end the string"
    assert re.sub(r"\\(.)", r"\1", escaped) == " ".join(printable(text).splitlines())
