"""Draw the README's pictures from the offline demo memory.

Writes ``docs/demo-tree.png`` (Graphviz: the memory of the conversation's first
30 turns, top three levels) and
``docs/tree-view.png`` (a screenshot of the HTML view in headless Chromium).
Run from the repository root: ``python docs/make_pictures.py``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from PIL import Image
from playwright.sync_api import sync_playwright

from memtree import MemTree, viz
from memtree.demo import demo_memory, load_demo_conversation

HERE = Path(__file__).resolve().parent
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"]


def main() -> None:
    turns, questions = load_demo_conversation()
    with demo_memory() as memory:
        first = turns[:30]
        memory.add_many([turn.text for turn in first], timestamps=[turn.timestamp for turn in first])
        viz.to_png(memory, HERE / "demo-tree.png", max_depth=3, width=64)
    with MemTree() as memory:
        memory.add_many(
            [turn.text for turn in turns],
            timestamps=[turn.timestamp for turn in turns],
            metadata=[{"speaker": turn.speaker, "session": turn.session} for turn in turns],
        )
        page = viz.to_html(memory, queries=questions, k=6, expand_depth=2, title="memtree demo")
    with tempfile.TemporaryDirectory() as folder:
        target = Path(folder) / "demo.html"
        target.write_text(page, encoding="utf-8")
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
            view = browser.new_page(viewport={"width": 1400, "height": 820})
            view.goto(target.as_uri())
            view.locator("#tree li.hit.leaf > .row").first.click()
            view.screenshot(path=str(HERE / "tree-view.png"))
            browser.close()
    for name in ("demo-tree.png", "tree-view.png"):
        shrink(HERE / name)


def shrink(path: Path) -> None:
    """64 colours are enough for these flat pictures and keep each file near 100 KB
    (the repository carries every version of them)."""
    picture = Image.open(path).convert("RGB")
    picture.quantize(colors=64, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)


if __name__ == "__main__":
    main()
