"""The HTML tree view, written by ``memtree show --format html``, in headless Chromium."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from cli_runner import as_json, memtree, ok
from headless import browser  # noqa: F401 - a fixture
from tree_facts import FACTS as SHARED_FACTS

from memtree import viz

FACTS = [
    *SHARED_FACTS,
    'A tricky note: <script>window.__pwned = 1</script> "quoted" & <b>bold</b>',
]
QUESTION = "Where did Leo eat ramen in Kyoto?"


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A memory, its page (with QUESTION answered) and what the CLI says about both."""
    folder = tmp_path_factory.mktemp("html")
    db = folder / "memory.db"
    ok(memtree("add", *FACTS, "--meta", "source=chat", "--timestamp", "2024-05-01", db=db))
    page = folder / "tree.html"
    ok(memtree("show", "--format", "html", "--query", QUESTION, "-k", "4", "--out", page, db=db))
    return {
        "db": db,
        "page": page,
        "hits": as_json(memtree("query", QUESTION, "-k", "4", "--json", db=db)),
        "stats": as_json(memtree("stats", "--json", db=db)),
    }


@pytest.fixture
def page(browser: Any, made: dict[str, Any]) -> Any:  # noqa: F811
    opened = browser.new_page(viewport={"width": 1400, "height": 900})
    problems: list[str] = []
    opened.on("pageerror", lambda error: problems.append(f"page error: {error}"))
    opened.on("console", lambda message: problems.append(f"console: {message.text}") if message.type == "error" else 0)
    opened.on("request", lambda request: problems.append(request.url) if not request.url.startswith("file:") else 0)
    opened.goto(made["page"].as_uri())
    yield opened
    opened.close()
    assert problems == [], "the page must work offline without errors"


def data(page: Any) -> dict[str, Any]:
    return json.loads(page.locator("#memtree-data").text_content())  # type: ignore[no-any-return]


def hit_ids(page: Any) -> list[str]:
    ranked = page.eval_on_selector_all(
        "#tree li.hit",
        "items => items.map(li => [li.querySelector(':scope > .row > .rank').textContent, li.dataset.id])",
    )
    return [node_id for _, node_id in sorted(ranked, key=lambda pair: int(re.match(r"#(\d+)", pair[0]).group(1)))]


def visible_rows(page: Any) -> int:
    return page.eval_on_selector_all(  # type: ignore[no-any-return]
        "#tree li.node[data-index]", "items => items.filter(li => li.offsetParent !== null).length"
    )


def test_page_shows_the_root_children_and_the_retrieved_nodes(page: Any, made: dict[str, Any], tmp_path: Path) -> None:
    tree = data(page)
    top = page.eval_on_selector_all("#tree > li.node", "items => items.map(li => li.dataset.id)")
    assert len(top) == made["stats"]["root_children"]
    assert top == [tree["nodes"][child]["id"] for child in tree["nodes"][0]["children"]]
    assert page.locator("#root-row").text_content() == f"root · {len(FACTS)} leaves"
    # The question given to `show --query` is answered by memtree's retriever, exactly as `query` answers it.
    assert page.locator("#search").input_value() == QUESTION
    assert hit_ids(page) == [hit["id"] for hit in made["hits"]]
    assert page.locator("#results li").count() == len(made["hits"])
    assert "retrieved by memtree" in page.locator("#search-info").text_content()
    shot = tmp_path / "tree-view.png"
    page.screenshot(path=str(shot))
    assert shot.read_bytes().startswith(b"\x89PNG") and shot.stat().st_size > 10_000


def test_clicking_a_node_shows_its_full_text_and_metadata(page: Any, tmp_path: Path) -> None:
    text = "Leo ate chicken ramen with yuzu in Kyoto."
    page.click("#expand-all")
    page.locator("#tree li.node.leaf", has_text=text).locator(":scope > .row").click()
    details = page.locator("#detail-body")
    assert details.locator(".fulltext").text_content() == text
    fields = details.locator(".fields").text_content()
    assert "meta · source" in fields and "chat" in fields and "2024-05-01" in fields
    page.screenshot(path=str(tmp_path / "clicked.png"))
    tricky = FACTS[-1]
    page.fill("#search", "tricky note")
    page.press("#search", "Enter")
    page.locator("#tree li.hit.leaf > .row").first.click()
    assert details.locator(".fulltext").text_content() == tricky
    assert page.evaluate("window.__pwned") is None
    assert page.locator("#detail-body b").count() == 0, "stored text is shown as text, never as markup"


def test_search_box_highlights_the_nodes_a_lexical_query_finds(page: Any) -> None:
    page.fill("#search", "bicycles")
    page.press("#search", "Enter")
    found = hit_ids(page)
    assert found
    texts = {node["id"]: node["text"] for node in data(page)["nodes"]}
    assert all("bicycles" in texts[node_id].lower() for node_id in found)
    containing = [node_id for node_id, text in texts.items() if "bicycles" in text.lower()]
    assert sorted(found) == sorted(containing)
    assert "lexical" in page.locator("#search-info").text_content()
    for node_id in found:  # every highlighted node is visible: its ancestors were opened
        assert page.locator(f'#tree li[data-id="{node_id}"] > .row').is_visible()
    page.fill("#search", "")
    page.press("#search", "Enter")
    assert page.locator("#tree li.hit").count() == 0
    # Next to the empty box, the page says what typing does: words, not meanings.
    assert "words" in page.get_attribute("#search", "placeholder")
    note = page.locator("#search-info").text_content()
    assert "match words" in note and "not meanings" in note and "memtree's own retrieval" in note


def test_a_page_without_queries_says_beside_the_box_that_typing_matches_words(
    browser: Any,  # noqa: F811
    made: dict[str, Any],
    tmp_path: Path,
) -> None:
    plain = tmp_path / "plain.html"
    ok(memtree("show", "--out", plain, db=made["db"]))
    opened = browser.new_page()
    try:
        opened.goto(plain.as_uri())
        note = opened.locator("#search-info").text_content()
        assert "match words" in note and "not meanings" in note and "memtree show --query" in note
        assert opened.locator("#tree li.hit").count() == 0
    finally:
        opened.close()


def test_tree_opens_and_closes_by_node_and_by_level(page: Any, made: dict[str, Any]) -> None:
    nodes = made["stats"]["nodes"]
    page.fill("#search", "")
    page.press("#search", "Enter")
    page.click("#collapse-all")
    assert visible_rows(page) == made["stats"]["root_children"]
    page.click("#expand-all")
    assert visible_rows(page) == nodes
    page.fill("#depth", "1")
    assert visible_rows(page) == made["stats"]["root_children"]
    summary = page.locator("#tree > li.node.summary").first
    children = len(data(page)["nodes"][int(summary.get_attribute("data-index"))]["children"])
    summary.locator(":scope > .row > .caret").click()
    assert visible_rows(page) == made["stats"]["root_children"] + children
    summary.locator(":scope > .row > .caret").click()
    assert visible_rows(page) == made["stats"]["root_children"]


def test_keyboard_moves_the_selection_and_opens_nodes(page: Any, made: dict[str, Any]) -> None:
    page.click("#collapse-all")
    top = page.eval_on_selector_all("#tree > li.node", "items => items.map(li => li.dataset.id)")
    page.locator(f'#tree li[data-id="{top[0]}"] > .row').click()
    page.keyboard.press("ArrowDown")
    assert page.locator("#tree .row.selected").locator("xpath=..").get_attribute("data-id") == top[1]
    summary = page.locator("#tree > li.node.summary").first
    summary.locator(":scope > .row").click()
    page.keyboard.press("ArrowRight")
    assert "open" in summary.get_attribute("class")
    page.keyboard.press("ArrowLeft")
    assert "open" not in summary.get_attribute("class")


# -- hostile texts, metadata and namespaces (the adversarial run's payloads) -----------------

PAYLOADS = [
    "<script>window.pwned = 'script'; document.title = 'pwned'</script>",
    "\"><img src=x onerror=\"window.pwned = 'img'; document.title = 'pwned'\">",
    "</script><script>window.pwned = 'json breakout'</script>",
    "<!--<script>window.pwned = 'comment'</script>-->",
    "<svg onload=\"window.pwned = 'svg'\"></svg>",
    "<iframe srcdoc=\"<script>parent.pwned = 'iframe'</script>\"></iframe>",
    "<a href=\"javascript:window.pwned = 'link'\">click me</a>",
    "javascript:window.pwned = 'url'",
    "${window.pwned = 'template'}",
    "'; window.pwned = 'quote'; '",
    "{{constructor.constructor('window.pwned = \"angular\"')()}}",
    "<style>body { display: none }</style><b onmouseover=\"window.pwned = 'hover'\">bold</b>",
    "line\u2028separator\u2029and <\\/script> escapes \\u003cscript\\u003e",
    "<script>alert('dialog')</script><img src=x onerror=alert(1)>",
]
HOSTILE_NAMESPACE = ("<script>window.pwned = 'namespace'</script>", '"><img src=x onerror="window.pwned = \'ns\'">')
HOSTILE_TITLE = "</title><script>window.pwned = 'title'</script>"


def hostile_page(folder: Path) -> tuple[Path, list[str]]:
    """A memory whose texts, metadata keys and values, source ids, namespace, queries and
    title are all payloads; its page; and the texts of its leaves."""
    from memtree import HashingEmbedder, MemTree, MemTreeConfig

    texts = [f"Payload {i} about greyhound bicycles: {payload}" for i, payload in enumerate(PAYLOADS)]
    with MemTree(namespace=HOSTILE_NAMESPACE, embedder=HashingEmbedder(64), config=MemTreeConfig(theta0=0.2)) as memory:
        memory.add_many(
            texts,
            metadata=[{payload: payload, "url": "javascript:window.pwned = 'meta url'"} for payload in PAYLOADS],
            source_ids=PAYLOADS,
            timestamps=[1_714_521_600 + 3600 * i for i in range(len(PAYLOADS))],
        )
        assert memory.stats().summaries > 0, "summaries repeat the payloads too"
        page = viz.to_html(memory, queries=[PAYLOADS[0], PAYLOADS[2]], title=HOSTILE_TITLE, expand_depth=9)
    path = folder / "hostile.html"
    path.write_text(page, encoding="utf-8")
    return path, texts


def test_hostile_texts_metadata_and_namespaces_never_run_in_the_page(browser: Any, tmp_path: Path) -> None:  # noqa: F811
    path, texts = hostile_page(tmp_path)
    opened = browser.new_page(viewport={"width": 1400, "height": 900})
    events: list[str] = []
    opened.on("dialog", lambda dialog: (events.append(f"dialog: {dialog.message}"), dialog.dismiss()))
    opened.on("pageerror", lambda error: events.append(f"page error: {error}"))
    opened.on("request", lambda request: events.append(request.url) if request.url != path.as_uri() else 0)
    try:
        opened.set_default_timeout(10_000)
        opened.goto(path.as_uri())
        opened.click("#expand-all")
        # Each click renders that node's text and metadata (clicked by script: a payload
        # that hid the page must fail the assertions below, not time out here).
        clicked = opened.evaluate("[...document.querySelectorAll('#tree li.node > .row')].map(r => r.click()).length")
        assert clicked == len(data(opened)["nodes"]) - 1  # every node but the root
        opened.locator("#tree li.node.leaf", has_text="Payload 1 about").locator(":scope > .row").click()
        assert opened.locator("#detail-body .fulltext").text_content() == texts[1]
        for payload in PAYLOADS:  # typed into the search box, as a user pasting them would
            opened.fill("#search", payload)
            opened.press("#search", "Enter")
        opened.evaluate("document.querySelectorAll('a').forEach(link => link.click())")  # hidden ones too

        assert opened.evaluate("window.pwned") is None and opened.evaluate("window.parent.pwned") is None
        assert opened.title() == HOSTILE_TITLE, "the title is shown as text"
        assert opened.evaluate("document.scripts.length") == 2, "only the page's own data and code"
        assert (
            opened.evaluate("document.querySelectorAll('img, iframe, object, embed, style:not(head style)').length")
            == 0
        )
        assert opened.evaluate("document.querySelectorAll('svg').length") == 1, "only the page's logo"
        assert (
            opened.evaluate(
                "[...document.querySelectorAll('*')].filter(e => [...e.attributes].some(a => a.name.startsWith('on')))"
                ".length"
            )
            == 0
        )
        assert opened.evaluate("document.querySelectorAll('a[href^=\"javascript:\" i]').length") == 0
        shown = opened.locator("body").text_content()
        assert HOSTILE_NAMESPACE[0] in shown or "/".join(HOSTILE_NAMESPACE) in shown, "the namespace shows as text"
    finally:
        opened.close()
    assert events == [], "nothing ran, asked, fetched or failed"
