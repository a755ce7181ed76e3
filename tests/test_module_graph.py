"""The library's modules form a layered graph: no import circles, each module
importable on its own, and the wheel carries the library without the harness."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from setuptools import find_packages

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("memtree", "langchain_memtree", "llamaindex_memtree", "memtree_bench")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules() -> dict[str, Path]:
    return {module_name(path): path for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules ``name`` imports anywhere in its file (top level or inside
    functions): ``from pkg import mod`` counts as importing ``pkg.mod``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package.split(".")[: len(package.split(".")) - node.level + 1], base]).strip(".")
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return {module for module in found if module in known and module != name}


def import_graph() -> dict[str, set[str]]:
    modules = all_modules()
    known = set(modules)
    return {name: imports_of(name, path, known) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle as a path (first module repeated at the end), or ``None``."""
    done: set[str] = set()
    stack: list[str] = []
    on_stack: set[str] = set()

    def visit(node: str) -> list[str] | None:
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target in on_stack:
                return [*stack[stack.index(target) :], target]
            if target not in done:
                cycle = visit(target)
                if cycle:
                    return cycle
        stack.pop()
        on_stack.discard(node)
        done.add(node)
        return None

    for start in sorted(graph):
        if start not in done:
            cycle = visit(start)
            if cycle:
                return cycle
    return None


def test_the_cycle_finder_finds_a_circle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_no_import_circles() -> None:
    graph = import_graph()
    assert "memtree.tree" in graph and "memtree.aggregate" in graph["memtree.model_choice"]
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


def test_no_arrow_climbs_back_to_the_facade() -> None:
    """Only the package, the command line and the adapters may import ``MemTree``'s
    module; everything below it is handed what it needs."""
    importers = {name for name, targets in import_graph().items() if "memtree.tree" in targets}
    allowed_prefixes = ("memtree.commands.", "langchain_memtree", "llamaindex_memtree", "memtree_bench")
    climbing = {
        name for name in importers if name not in {"memtree", "memtree.cli", "memtree.demo"}
        and not name.startswith(allowed_prefixes)
    }  # fmt: skip
    assert climbing == set()


@pytest.mark.slow
def test_each_module_imports_on_its_own() -> None:
    """Each module imported first in a clean slate of the project's modules (third-party
    modules stay loaded, which is what keeps this one subprocess cheap)."""
    names = sorted(name for name in all_modules() if not name.endswith("__main__"))  # those run the command
    script = (
        "import importlib, sys, traceback\n"
        f"prefixes = {PACKAGES!r}\n"
        "failed = []\n"
        "for name in sys.argv[1:]:\n"
        "    for loaded in [m for m in sys.modules if m.split('.')[0] in prefixes]:\n"
        "        del sys.modules[loaded]\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except Exception:\n"
        "        failed.append(name + ': ' + traceback.format_exc(limit=3))\n"
        "print('\\n'.join(failed))\n"
        "sys.exit(1 if failed else 0)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, *names], cwd=ROOT, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_wheel_carries_no_evaluation_code() -> None:
    """The packages pyproject.toml puts in the wheel: the library and its adapters,
    every subpackage of them, and not the harness (memtree_bench)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    include = config["tool"]["setuptools"]["packages"]["find"]["include"]
    shipped = set(find_packages(where=str(ROOT), include=include))
    assert "memtree_bench" not in shipped and not any(name.startswith("memtree_bench") for name in shipped)
    expected = {module_name(path.parent) for package in PACKAGES[:3] for path in (ROOT / package).rglob("__init__.py")}
    assert shipped == expected


def mapped_modules() -> list[str]:
    """The modules and subpackages the map in ``memtree/__init__.py`` names, in order
    (a line names one, or two as ``cli, commands/``)."""
    import memtree

    names: list[str] = []
    for line in (memtree.__doc__ or "").splitlines():
        words = line.split()
        if line.startswith("  ") and words:
            names += [words[0].rstrip(",/")] + ([words[1].rstrip("/")] if words[0].endswith(",") else [])
    return names


def test_the_package_docstring_maps_every_module() -> None:
    """``memtree/__init__.py`` names each top-level module and subpackage of the engine."""
    named = set(mapped_modules())
    engine = {path.stem for path in (ROOT / "memtree").glob("*.py")} - {"__init__", "__main__"}
    engine |= {path.name for path in (ROOT / "memtree").iterdir() if (path / "__init__.py").exists()} - {"data"}
    assert engine - named == set()


def test_imports_only_point_down_the_package_map() -> None:
    """The map in ``memtree/__init__.py`` lists the modules top to bottom; every import
    between two of them points to one listed below (no arrow climbs back up)."""
    rank = {name: position for position, name in enumerate(mapped_modules())}
    rank["__main__"] = -1  # ``python -m memtree`` sits above everything

    def top(module: str) -> str | None:
        parts = module.split(".")
        return parts[1] if parts[0] == "memtree" and len(parts) > 1 and parts[1] in rank else None

    climbing = []
    for source, targets in import_graph().items():
        for target in targets:
            above, below = top(source), top(target)
            if above and below and above != below and rank[below] <= rank[above]:
                climbing.append(f"{source} -> {target}")
    assert sorted(climbing) == []
