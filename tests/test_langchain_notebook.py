"""notebooks/langchain_agent_memory.ipynb runs offline and recalls the early sessions."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from openai_server import FakeOpenAIServer

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


def test_the_notebook_uses_no_deprecated_langchain_class() -> None:
    """The chat-history adapter builds on langchain-core's deprecated BaseChatMessageHistory;
    the notebook shows the middleware instead."""
    code = "".join(cell.source for cell in nbformat.read(NOTEBOOK, as_version=4).cells)
    assert "MemTreeMemoryMiddleware" in code
    assert "MemTreeChatMessageHistory" not in code and "RunnableWithMessageHistory" not in code


def run_notebook(monkeypatch: pytest.MonkeyPatch) -> nbformat.NotebookNode:
    """Execute the notebook in a kernel that imports this checkout; return it with outputs."""
    # The kernel inherits this environment: this checkout first on the path, no downloads.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
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
    assert all(output.get("name") != "stderr" for cell in notebook.cells for output in cell.get("outputs", []))
    return notebook


@pytest.mark.slow
def test_notebook_runs_offline_and_recalls_early_sessions(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    notebook = run_notebook(monkeypatch)

    assert stdout(notebook.cells[1]).startswith("model: scripted fake (offline)")
    summary = json.loads(stdout(notebook.cells[-2]))
    assert summary["rounds_remembered"] == 8  # six replayed, two from the live session
    assert summary["rounds_per_day"] == ROUNDS_PER_DAY  # each round recorded once, on its session's date
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


@pytest.mark.slow
def test_notebook_with_an_api_key_uses_openai_for_the_tree_and_the_agent(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real-model path, against the local OpenAI-compatible server: memtree's
    OpenAI embedder and chat model build the tree, langchain-openai runs the agent."""
    with FakeOpenAIServer() as server:
        monkeypatch.setenv("OPENAI_API_KEY", server.api_key)
        monkeypatch.setenv("OPENAI_BASE_URL", server.url)
        notebook = run_notebook(monkeypatch)
    assert stdout(notebook.cells[1]).startswith("model: OpenAI (real)")
    summary = json.loads(stdout(notebook.cells[-2]))
    assert summary["rounds_remembered"] == 8 and summary["rounds_per_day"] == ROUNDS_PER_DAY
    # every answer is the server's deterministic reply to the question the agent sent it
    assert [result["answer"] for result in summary["results"]] == [f"Reply: {q}" for q in QUESTIONS]
    assert "Assistant: Reply: I booked my flights to Lisbon for September 12th." in stdout(notebook.cells[7])

    embedded = [r for r in server.requests if r.endpoint == "embeddings"]
    assert embedded and {r.body["model"] for r in embedded} == {"text-embedding-3-small"}
    inputs = [text for r in embedded for text in r.body["input"]]
    wedding = "User: My sister Ingrid is getting married in Tromsø in August!"
    assert f"{wedding}\nAssistant: How exciting! Will you be part of the wedding?" in inputs  # a round, as a leaf
    assert all(question in inputs for question in QUESTIONS)  # each question embedded to search the tree
    chats = [r.body for r in server.requests if r.endpoint == "chat"]
    agent_calls = [body for body in chats if body["messages"][0]["role"] == "system"]
    assert [body["messages"][-1]["content"] for body in agent_calls][-4:] == QUESTIONS
    for body, result in zip(agent_calls[-4:], summary["results"], strict=True):
        # what the notebook shows as recalled is exactly what the model was sent
        assert body["messages"][0]["content"] == f"You are Maya's friendly assistant.\n\n{result['memories']}"
        assert result["memories"].startswith("## Relevant memories from earlier conversations\n- ")
        assert any(f"- ({day})" in result["memories"] for day in ("2024-04-28", "2024-05-20", "2024-06-16"))
    memories = {result["question"]: result["memories"] for result in summary["results"]}
    assert "Ingrid is getting married in Tromsø" in memories["Where is Ingrid's wedding again?"]
    assert "I booked my flights to Lisbon for September 12th." in memories["When do I fly to Lisbon?"]


ROUNDS_PER_DAY = {"2024-04-28": 2, "2024-05-20": 2, "2024-06-16": 2, "2024-07-30": 2}

QUESTIONS = [
    "Remind me, what is my dog called?",
    "Where is Ingrid's wedding again?",
    "What job did I start in May?",
    "When do I fly to Lisbon?",
]


def stdout(cell: dict) -> str:
    return "".join(output.get("text", "") for output in cell.get("outputs", []) if output.get("name") == "stdout")
