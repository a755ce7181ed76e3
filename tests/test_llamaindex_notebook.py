"""Executes notebooks/llamaindex_query_engine.ipynb offline and checks what it shows."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "llamaindex_query_engine.ipynb"

EXPECTED_BEST_LEAF = {
    "How do honey bees stay warm in winter?": "bees-winter-cluster",
    "When is honey ready to harvest?": "bees-honey-harvest",
    "Why is the soil near volcanoes so fertile?": "volcano-fertile-soil",
    "Why do some volcanoes explode instead of pouring out lava?": "volcano-lava-types",
    "What should I feed my sourdough starter?": "sourdough-starter",
    "How do I get a crisp crust on my bread?": "sourdough-baking",
    "How do I fix a punctured inner tube?": "bicycle-flat-tyre",
    "How often should I oil my bike chain?": "bicycle-chain-care",
}


def output_of(notebook: object, tag: str) -> str:
    """The printed output of the code cell tagged ``tag``."""
    for cell in notebook.cells:  # type: ignore[attr-defined]
        if tag in cell.metadata.get("tags", []):
            return "".join(out.get("text", "") for out in cell.outputs if out.get("name") == "stdout")
    raise AssertionError(f"no cell tagged {tag!r}")


@pytest.fixture(scope="module")
def executed() -> object:
    """The notebook run top to bottom by a kernel on this interpreter, offline."""
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    probe = nbformat.v4.new_code_cell(
        "import sys, llamaindex_memtree\nprint(sys.executable)\nprint(llamaindex_memtree.__file__)"
    )
    probe.metadata["tags"] = ["probe"]
    notebook.cells.append(probe)
    saved = {name: os.environ.get(name) for name in ("PYTHONPATH", "OPENAI_API_KEY", "HF_HUB_OFFLINE")}
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), saved["PYTHONPATH"]]))
    os.environ.pop("OPENAI_API_KEY", None)
    os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        # The "python3" kernel of the interpreter running the tests (ipykernel's own spec).
        client = nbclient.NotebookClient(
            notebook, kernel_name="python3", timeout=600, resources={"metadata": {"path": str(NOTEBOOK.parent)}}
        )
        client.execute()
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return notebook


@pytest.mark.slow
def test_notebook_runs_on_this_interpreter_without_errors(executed: object) -> None:
    errors = [out for cell in executed.cells if cell.cell_type == "code" for out in cell.outputs]  # type: ignore[attr-defined]
    assert not [out for out in errors if out.get("output_type") == "error"]
    assert output_of(executed, "setup").strip() == "answering model: MockLLM"
    interpreter, package = output_of(executed, "probe").split()
    assert Path(interpreter).resolve() == Path(sys.executable).resolve()
    assert Path(package).resolve() == ROOT / "llamaindex_memtree" / "__init__.py"  # this checkout's code


@pytest.mark.slow
def test_notebook_shows_a_tree_of_the_twelve_articles(executed: object) -> None:
    tree = output_of(executed, "tree")
    leaves = int(re.match(r"root · (\d+) leaves", tree).group(1))  # type: ignore[union-attr]
    assert leaves >= 24  # about three chunks per article
    assert re.search(r"\[d1 · \d+ leaves\]", tree)  # summaries under the root
    assert re.search(r"\[d[2-9] · leaf\]", tree)  # leaves below them


@pytest.mark.slow
def test_notebook_retrieves_the_right_article_for_each_question(executed: object) -> None:
    shown = dict(line.split(" -> ") for line in output_of(executed, "best-leaf").strip().splitlines())
    assert shown == EXPECTED_BEST_LEAF
    first = output_of(executed, "retrieve").splitlines()[0]
    assert first.endswith("[bees-winter-cluster]")


@pytest.mark.slow
def test_notebook_query_engine_answers_from_the_starter_article(executed: object) -> None:
    answer = output_of(executed, "query-engine")
    assert "Query: What should I feed my sourdough starter?" in answer  # MockLLM echoes its prompt
    assert "Feed it by discarding most of it and mixing the rest with fresh flour and water" in answer
    assert answer.strip().endswith("sources: ['sourdough-starter', 'sourdough-starter', 'sourdough-starter']")


@pytest.mark.slow
def test_notebook_saves_and_loads_the_same_index(executed: object) -> None:
    lines = output_of(executed, "persist").strip().splitlines()
    assert lines[0].startswith("MemTreeIndex with ") and lines[0].endswith(" leaves")
    assert lines[1:] == ["same tree: True", "same results: True"]
