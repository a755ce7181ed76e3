"""notebooks/langchain_agent_memory.ipynb runs offline and recalls the early sessions."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "langchain_agent_memory.ipynb"

PROBE = """
import sys, memtree, langchain_memtree
print(sys.executable)
print(memtree.__file__)
print(langchain_memtree.__file__)
"""


@pytest.mark.slow
def test_notebook_runs_offline_and_recalls_early_sessions(monkeypatch: pytest.MonkeyPatch) -> None:
    # The kernel inherits this environment: this checkout first on the path, no API key, no downloads.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    notebook.cells.append(nbformat.v4.new_code_cell(PROBE))
    client = nbclient.NotebookClient(
        notebook, timeout=240, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK.parent)}}
    )
    client.execute()

    executable, memtree_file, adapter_file = stdout(notebook.cells[-1]).split()
    assert Path(executable).resolve() == Path(sys.executable).resolve()  # the kernel is this interpreter
    assert Path(memtree_file).resolve().is_relative_to(ROOT) and Path(adapter_file).resolve().is_relative_to(ROOT)

    assert stdout(notebook.cells[1]).startswith("model: scripted fake (offline)")
    assert all(output.get("name") != "stderr" for cell in notebook.cells for output in cell.get("outputs", []))
    summary = json.loads(stdout(notebook.cells[-2]))
    assert summary["messages_logged"] == 12  # the three early sessions, exactly
    assert summary["rounds_remembered"] == 8  # six from the history, two recorded by the middleware
    memories = {result["question"]: result["memories"] for result in summary["results"]}
    expected = {
        "Remind me, what is my dog called?": "His name is Pepper.",
        "Where is Ingrid's wedding again?": "My sister Ingrid is getting married in Tromsø in August!",
        "What job did I start in May?": "I started night shifts as a nurse at the children's hospital this week.",
        "When do I fly to Lisbon?": "I booked my flights to Lisbon for September 12th.",
    }
    for question, fact in expected.items():
        assert memories[question].startswith("## Relevant memories from earlier conversations\n- ")
        assert fact in memories[question], question
    shown = "".join(stdout(cell) for cell in notebook.cells if cell.cell_type == "code")
    assert "Q: Remind me, what is my dog called?" in shown and "2024-06-16 User: Pepper panicked" in shown


def stdout(cell: dict) -> str:
    return "".join(output.get("text", "") for output in cell.get("outputs", []) if output.get("name") == "stdout")
