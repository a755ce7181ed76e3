"""Executes notebooks/llamaindex_query_engine.ipynb offline and checks what it shows."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
from openai_server import FakeOpenAIServer

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


def run_notebook(environment: dict[str, str | None]) -> object:
    """The notebook run top to bottom by a kernel on this interpreter, with this
    checkout on the path and ``environment`` (``None`` removes a variable) applied
    to the kernel's environment."""
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    probe = nbformat.v4.new_code_cell(
        "import sys, llamaindex_memtree\nprint(sys.executable)\nprint(llamaindex_memtree.__file__)"
    )
    probe.metadata["tags"] = ["probe"]
    notebook.cells.append(probe)
    changes = {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])), **environment}
    saved = {name: os.environ.get(name) for name in changes}
    for name, value in changes.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
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


def errors_of(notebook: object) -> list[object]:
    """The error outputs of every code cell."""
    cells = notebook.cells  # type: ignore[attr-defined]
    return [
        out for cell in cells if cell.cell_type == "code" for out in cell.outputs if out.get("output_type") == "error"
    ]


@pytest.fixture(scope="module")
def executed() -> object:
    """The notebook run offline (no OpenAI key)."""
    return run_notebook({"OPENAI_API_KEY": None, "OPENAI_BASE_URL": None, "HF_HUB_OFFLINE": "1"})


@pytest.mark.slow
def test_notebook_runs_on_this_interpreter_without_errors(executed: object) -> None:
    assert not errors_of(executed)
    assert output_of(executed, "setup").strip() == "answering model: MockLLM"
    interpreter, package = output_of(executed, "probe").split()
    assert Path(interpreter).resolve() == Path(sys.executable).resolve()
    assert Path(package).resolve() == ROOT / "llamaindex_memtree" / "__init__.py"  # this checkout's code


@pytest.mark.slow
def test_notebook_shows_a_tree_of_the_twelve_articles(executed: object) -> None:
    tree = output_of(executed, "tree")
    leaves = int(re.match(r"root · (\d+) leaves", tree).group(1))  # type: ignore[union-attr]
    assert leaves >= 24  # about three chunks per article
    assert re.search(r"^[├└]─ \[summary of \d+\]", tree, re.M)  # summaries under the root
    assert re.search(r"^[│ ]  +[├└]─ [^\[]", tree, re.M)  # leaves below them (a chunk's own text, no tag)


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


@pytest.mark.slow
def test_notebook_uses_openai_models_when_a_key_is_set() -> None:
    """The real-model path, against the local OpenAI-compatible server."""
    with FakeOpenAIServer() as server:
        notebook = run_notebook(
            {"OPENAI_API_KEY": server.api_key, "OPENAI_BASE_URL": server.url, "HF_HUB_OFFLINE": "1"}
        )
        requests = list(server.requests)
    assert not errors_of(notebook)
    assert output_of(notebook, "setup").strip() == "answering model: OpenAI"
    chats = [r for r in requests if r.endpoint == "chat"]
    embeddings = [r for r in requests if r.endpoint == "embeddings"]
    assert {r.body["model"] for r in embeddings} == {"text-embedding-3-small"}
    assert {r.body["model"] for r in chats} == {"gpt-4o-mini"}
    assert {r.headers["authorization"] for r in requests} == {f"Bearer {server.api_key}"}
    # the tree: every chunk embedded by the server, its summaries written by the server's model
    stats_line = next(line for line in output_of(notebook, "tree").splitlines() if line.startswith("root"))
    leaves = int(re.match(r"root · (\d+) leaves", stats_line).group(1))  # type: ignore[union-attr]
    embedded = [
        text
        for r in embeddings
        for text in ([r.body["input"]] if isinstance(r.body["input"], str) else r.body["input"])
    ]
    assert leaves >= 24 and len(embedded) >= leaves
    assert re.search(r"^[├└]─ \[summary of \d+\]", output_of(notebook, "tree"), re.M)
    assert any("New entries to fold in:" in str(r.body["messages"]) for r in chats)  # memtree's aggregation prompt
    # the answer step: the server's model got the retrieved context and answered
    answer = output_of(notebook, "query-engine")
    assert answer.startswith("Reply: ")  # the server's reply, not MockLLM's echo of the prompt
    qa_prompts = [
        r.body["messages"][-1]["content"]
        for r in chats
        if "What should I feed my sourdough starter?" in str(r.body["messages"])
    ]
    assert qa_prompts and "Feed it by discarding most of it" in qa_prompts[-1]
    assert output_of(notebook, "persist").strip().splitlines()[1:] == ["same tree: True", "same results: True"]
