"""Checks that a Mermaid or DOT picture of a tree is well-formed.

``parse_mermaid`` reads the subset of Mermaid that ``to_mermaid`` writes, strictly:
any line it does not recognise, an unescaped quote or angle bracket in a label, a
stray ``#``, an edge to an undeclared box, or a shape that is not a tree fails.
Mermaid's own parser runs too where its script is available (see test_viz.py).
"""

from __future__ import annotations

import html
import re
import shutil
import subprocess
from dataclasses import dataclass

_BOX = re.compile(r'^    (n\d+)(\(\[|\[)"([^"\n]*)"(\]\)|\])$')
_EDGE = re.compile(r"^    (n\d+) --> (n\d+)$")
_CLASSDEF = re.compile(r"^    classDef (\w+) [\w:#,. -]+$")
_CLASS = re.compile(r"^    class (n\d+(?:,n\d+)*) (\w+)$")
_ENTITY = re.compile(r"#(\w+);")
_TAGS = ("<b>", "</b>", "<br/>")


@dataclass
class Diagram:
    direction: str
    labels: dict[str, list[str]]  # box -> decoded label lines (title first)
    edges: list[tuple[str, str]]
    classes: dict[str, str]


def decode_entities(text: str) -> str:
    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        return chr(int(name)) if name.isdigit() else html.unescape(f"&{name};")

    return _ENTITY.sub(one, text)


def parse_mermaid(source: str) -> Diagram:
    lines = source.rstrip("\n").split("\n")
    header = re.fullmatch(r"flowchart (LR|TB)", lines[0])
    assert header, f"first line is not a flowchart header: {lines[0]!r}"
    diagram = Diagram(header.group(1), {}, [], {})
    class_names: set[str] = set()
    for line in lines[1:]:
        if box := _BOX.match(line):
            key, opening, label, closing = box.groups()
            assert {"[": "]", "([": "])"}[opening] == closing, line
            assert key not in diagram.labels, f"box {key} declared twice"
            assert "`" not in label and "\\" not in label, line
            parts = label.split("<br/>")
            for part in parts:
                bare = part.replace("<b>", "").replace("</b>", "")
                assert "<" not in bare and ">" not in bare, f"raw angle bracket in {line!r}"
                assert not re.search(r"#(?!\w+;)", bare), f"stray # in {line!r}"
            decoded = [decode_entities(part.replace("<b>", "").replace("</b>", "")) for part in parts]
            diagram.labels[key] = decoded
        elif edge := _EDGE.match(line):
            diagram.edges.append((edge.group(1), edge.group(2)))
        elif definition := _CLASSDEF.match(line):
            class_names.add(definition.group(1))
        elif member := _CLASS.match(line):
            assert member.group(2) in class_names, f"class {member.group(2)} is not defined"
            for key in member.group(1).split(","):
                diagram.classes[key] = member.group(2)
        else:
            raise AssertionError(f"not a line to_mermaid writes: {line!r}")
    check_tree(list(diagram.labels), diagram.edges)
    assert set(diagram.classes) == set(diagram.labels), "every box has exactly one class"
    return diagram


def check_tree(boxes: list[str], edges: list[tuple[str, str]]) -> None:
    """Edges join declared boxes into one tree rooted at ``n0``."""
    declared = set(boxes)
    parents: dict[str, str] = {}
    for parent, child in edges:
        assert parent in declared and child in declared, f"edge {parent} -> {child} to an undeclared box"
        assert child not in parents, f"{child} has two parents"
        parents[child] = parent
    assert "n0" in declared and "n0" not in parents
    assert set(parents) == declared - {"n0"}, "every box but the root has a parent"


_DOT_BOX = re.compile(r'^    (n\d+) \[label="((?:[^"\\]|\\.)*)", tooltip="((?:[^"\\]|\\.)*)", .*\];$')
_DOT_EDGE = re.compile(r"^    (n\d+) -> (n\d+);$")


def parse_dot(source: str) -> dict[str, str]:
    """Box -> tooltip (unescaped) of a ``to_dot`` digraph, checking it is a tree."""
    lines = source.rstrip("\n").split("\n")
    assert lines[0] == "digraph memtree {" and lines[-1] == "}"
    tooltips: dict[str, str] = {}
    edges = []
    for line in lines[1:-1]:
        if box := _DOT_BOX.match(line):
            tooltips[box.group(1)] = re.sub(r"\\(.)", r"\1", box.group(3))
        elif edge := _DOT_EDGE.match(line):
            edges.append((edge.group(1), edge.group(2)))
        else:
            assert line.startswith(("    graph [", "    node [", "    edge [")), f"unexpected DOT line {line!r}"
    check_tree(list(tooltips), edges)
    return tooltips


def dot_to_svg(source: str) -> str:
    """Graphviz's own parse and layout of ``source`` (the caller skips without ``dot``)."""
    program = shutil.which("dot")
    assert program is not None
    done = subprocess.run([program, "-Tsvg"], input=source.encode(), capture_output=True, check=False, timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    assert not done.stderr.strip(), f"dot warned: {done.stderr.decode()}"
    return done.stdout.decode("utf-8")
