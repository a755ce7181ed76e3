"""The tree as one self-contained HTML page to browse: no server, no network.

The page (template, CSS and JavaScript in ``assets/``) shows the tree collapsible
node by node and level by level, a node's full text and metadata on click, and a
search box. The page has no embedding model, so its search is honest about what
it can do:

* typed queries are matched **lexically** (BM25 over the node texts, computed in
  the page), which finds words, not meanings;
* queries given when the page is written (``queries=``) are answered by
  ``MemTree.retrieve`` with the real embedder, and the page shows exactly those
  results (ranks and scores) when such a query is chosen or typed.

Every stored text reaches the page as JSON inside ``<script type="application/json">``
with ``<``, ``>`` and ``&`` escaped, and the page writes it with ``textContent``
only, so text such as ``<script>`` shows as text. A Content-Security-Policy in the
page forbids any network access.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from importlib import resources
from typing import Any

from memtree.node import ROOT_ID, Node, to_datetime
from memtree.state import TreeState
from memtree.viz.picture import day


@dataclass(frozen=True)
class HtmlQuery:
    """A query answered by the memory's retriever when the page was written.

    ``hits`` are ``(node id, score)`` pairs, best first, as ``retrieve`` returned them.
    """

    query: str
    hits: Sequence[tuple[str, float]]
    mode: str = "collapsed"


def moment(timestamp: float | None) -> str | None:
    """A readable UTC time: ``2024-05-07`` at midnight, else ``2024-05-07 14:05 UTC``."""
    if timestamp is None:
        return None
    when = to_datetime(timestamp)
    if when is None:  # a number no date can hold: shown raw, never a failed page
        return repr(timestamp)
    if when.hour == when.minute == when.second == 0:
        return when.strftime("%Y-%m-%d")
    return when.strftime("%Y-%m-%d %H:%M:%S UTC")


def _node_record(node: Node, index_of: dict[str, int], leaf_total: int, included: list[str]) -> dict[str, Any]:
    return {
        "id": node.id,
        "text": node.text,
        "depth": node.depth,
        "leaf": node.is_leaf,
        "leaves": leaf_total if node.id == ROOT_ID else node.leaf_count,
        "parent": index_of[node.parent] if node.parent is not None else -1,
        "children": [index_of[child] for child in included],
        "hidden": len(node.children) - len(included),
        "time": moment(node.timestamp),
        "day": day(node.timestamp),
        "created": moment(node.created_at),
        "updated": moment(node.updated_at),
        "source": node.source_id,
        "stale": node.stale,
        "meta": node.metadata,
    }


def page_data(
    state: TreeState,
    *,
    title: str,
    namespace: str,
    queries: Sequence[HtmlQuery] = (),
    expand_depth: int = 1,
    max_depth: int | None = None,
    k: int = 10,
) -> dict[str, Any]:
    """Everything the page shows, as JSON-ready data (nodes by index, the root first)."""
    order = [
        node
        for node in state.walk()
        if max_depth is None or node.depth <= max_depth  # children of a cut node are dropped below
    ]
    index_of = {node.id: i for i, node in enumerate(order)}
    nodes = []
    for node in order:
        included = [child for child in node.children if child in index_of]
        nodes.append(_node_record(node, index_of, state.leaf_total, included))
    shown = []
    for query in queries:
        hits = [
            {"node": index_of[node_id], "score": round(float(score), 4), "rank": rank}
            for rank, (node_id, score) in enumerate(query.hits, start=1)
            if node_id in index_of
        ]
        shown.append({"query": query.query, "mode": query.mode, "hits": hits})
    leaves = sum(1 for node in state.nodes.values() if node.is_leaf)
    return {
        "title": title,
        "namespace": namespace,
        "generated": datetime.now(tz=UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "stats": {
            "leaves": leaves,
            "summaries": sum(1 for node in state.nodes.values() if not node.is_leaf and node.id != ROOT_ID),
            "depth": state.depth,
        },
        "omitted": len(state.nodes) - len(order) if state.root is not None else 0,
        "expand_depth": expand_depth,
        "k": k,
        "nodes": nodes if state.root is not None else [],
        "queries": shown,
    }


_SCRIPT_UNSAFE = {ord("<"): "\\u003c", ord(">"): "\\u003e", ord("&"): "\\u0026", 0x2028: "\\u2028", 0x2029: "\\u2029"}
_SLOT = re.compile(r"/\*@(TITLE|CSS|JS|DATA)@\*/")


def json_for_script(data: Any) -> str:
    """JSON that cannot close or comment out the ``<script>`` element holding it."""
    return json.dumps(data, ensure_ascii=False, separators=(",", ":")).translate(_SCRIPT_UNSAFE)


@cache
def _asset(name: str) -> str:
    return resources.files("memtree.viz").joinpath("assets", name).read_text(encoding="utf-8")


def answer_queries(
    retrieve: Callable[..., Sequence[Any]],
    queries: str | Sequence[str],
    *,
    k: int | None,
    mode: str | None,
    shown_mode: str,
) -> list[HtmlQuery]:
    """Each of ``queries`` answered by ``retrieve`` (a memory's), for the page to
    highlight exactly the nodes the memory retrieves for it."""
    asked = [queries] if isinstance(queries, str) else list(queries)
    return [
        HtmlQuery(query, [(hit.id, hit.score) for hit in retrieve(query, k=k, mode=mode)], mode or shown_mode)
        for query in asked
    ]


def page_of(
    state: TreeState,
    *,
    title: str = "memtree",
    namespace: str = "default",
    queries: Sequence[HtmlQuery] = (),
    expand_depth: int = 1,
    max_depth: int | None = None,
    k: int = 10,
) -> str:
    """One self-contained HTML page to browse the tree (see the module docstring).

    ``expand_depth`` is how deep the tree is open when the page loads (the rest is a
    click away); ``max_depth`` leaves out deeper nodes entirely (for very large
    trees); ``k`` is the default number of lexical search results.
    """
    for name, value, low in (("expand_depth", expand_depth, 0), ("k", k, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    if max_depth is not None and (isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < 1):
        raise ValueError(f"max_depth must be a positive integer or None, got {max_depth!r}")
    data = page_data(
        state,
        title=title,
        namespace=namespace,
        queries=queries,
        expand_depth=expand_depth,
        max_depth=max_depth,
        k=k,
    )
    slots = {
        "TITLE": html.escape(title),
        "CSS": _asset("tree_view.css"),
        "JS": _asset("tree_view.js"),
        "DATA": json_for_script(data),
    }
    # One pass, so text inside the data can never be taken for a slot.
    return _SLOT.sub(lambda match: slots[match.group(1)], _asset("tree_view.html"))
