"""What a reader may see of summaries above a removed text: stand-ins, masks and the check.

A summary holds the text of the leaves below it. When a leaf is removed (deleted,
corrected in place, moved by an update, swept after it expired) the write that
removes it also stores, in the same transaction, a *stand-in* for every summary
that held it: the summary's live children's texts, one per line, held to
``summary_max_chars`` (:func:`interim_summary`), marked stale so a model rewrites
it later (:mod:`memtree.summaries`, :mod:`memtree.update`). So once a delete
returns, no summary in the store holds the text any more.

An expiry needs no write to happen: between the moment a leaf expires and the
sweep that deletes it, its ancestors still hold its text. Readers hide the expired
leaf itself (:meth:`~memtree.state.TreeState.hidden`) and here the summaries above
it: :func:`tainted` lists them (retrieval leaves them out, as if hidden),
:func:`masked_texts` gives each a stand-in made of what is still live below it
(``get``, ``walk``), and :func:`redacted` is the whole tree as a sweep would leave
it, for pictures that could not sweep first (a read-only store).

:func:`removed_text_problems` is the check (``check_integrity``, ``memtree check``):
a summary that still quotes a sentence of an expired leaf, or of a version of a leaf
that ``update`` replaced (kept in the leaf's history), which no live leaf below it
holds, is reported as a privacy problem; ``repair()`` rewrites it.
"""

from __future__ import annotations

from collections.abc import Iterable

from memtree.node import ROOT_ID, LeafVersion, Node
from memtree.state import TreeState
from memtree.store.base import ChangeBatch
from memtree.summary_guard import cap_summary
from memtree.text import fold, split_sentences

STANDIN_CHARS = 4000
"""How long a stand-in made at read time may be (``MemTreeConfig.summary_max_chars``'s default)."""


def interim_summary(texts: list[str], limit: int) -> str:
    """A stale summary's text until a model rewrites it: its children's texts, one
    per line, cut at a sentence end (else a space, else anywhere) within ``limit``."""
    joined = "\n".join(texts)
    cut = cap_summary(joined, limit)
    if cut is not None:
        return cut
    head = joined[:limit]
    space = head.rfind(" ")
    return head[:space] if space > 0 else head


def tainted(state: TreeState, now: float) -> frozenset[str]:
    """Summaries that hold the text of a leaf expired at ``now`` (not swept yet) and
    are not hidden themselves (some leaf below them is still live)."""
    expired = state.expired(now)
    if not expired:
        return frozenset()
    hidden = state.hidden(now)
    above = {ancestor.id for leaf_id in expired for ancestor in state.path_to_root(leaf_id)}
    return frozenset(above - hidden)


def unreadable(state: TreeState, now: float) -> frozenset[str]:
    """What no reader may show at ``now``: the nodes :meth:`TreeState.hidden` hides
    (expired leaves, summaries with nothing live below) and the :func:`tainted`
    summaries that still hold an expired leaf's text. Every read path masks this one
    set, so a new reader cannot forget half of it."""
    hidden = state.hidden(now)
    return hidden | tainted(state, now) if hidden else hidden


def masked_texts(state: TreeState, now: float, limit: int = STANDIN_CHARS) -> dict[str, str]:
    """The stand-in text of every :func:`tainted` summary, made of what is live below
    it (deepest first, so a tainted child gives its stand-in, not its text)."""
    marked = tainted(state, now)
    if not marked:
        return {}
    hidden = state.hidden(now)
    texts: dict[str, str] = {}
    for node_id in sorted(marked, key=lambda node_id: -state.nodes[node_id].depth):
        kids = [child for child in state.nodes[node_id].children if child not in hidden]
        texts[node_id] = interim_summary([texts.get(kid, state.nodes[kid].text) for kid in kids], limit)
    return texts


def redacted(state: TreeState, now: float, limit: int = STANDIN_CHARS) -> TreeState:
    """The tree as a reader may see it at ``now``: expired leaves and summaries of
    nothing else left out, the summaries above them in stand-in text (stale), leaf
    counts of what is live. ``state`` itself when nothing expired."""
    hidden = state.hidden(now)
    if not hidden:
        return state
    masked = masked_texts(state, now, limit)
    live_leaves: dict[str, int] = {}
    for node in sorted(state.nodes.values(), key=lambda node: -node.depth):
        if node.id in hidden:
            continue
        if node.is_leaf:
            live_leaves[node.id] = 1
        else:
            live_leaves[node.id] = sum(live_leaves.get(child, 0) for child in node.children)
    nodes: list[Node] = []
    for node in state.nodes.values():
        if node.id in hidden:
            continue
        copy = node.copy()
        copy.children = []
        if node.id in masked:
            copy.text, copy.stale = masked[node.id], True
        if not node.is_leaf and node.id != ROOT_ID:
            copy.leaf_count = live_leaves[node.id]
        nodes.append(copy)
    shown = TreeState(lexical=False)
    shown.apply(ChangeBatch(nodes, [], state.seq, state.generation or "redacted", state.info))
    return shown


def removed_text_problems(state: TreeState, versions: Iterable[LeafVersion], now: float) -> list[str]:
    """Every summary that still quotes a sentence of a removed text, described: an
    expired leaf not swept yet, or an earlier version of a leaf (its history) that
    no live leaf below the summary holds. (A model's paraphrase cannot be matched;
    stand-ins and extractive summaries quote their sentences, so they can.)"""
    removed: dict[str, list[tuple[str, str]]] = {}  # folded sentence -> (what, leaf id)
    for leaf_id in state.expired(now):
        for sentence in split_sentences(state.nodes[leaf_id].text):
            removed.setdefault(fold(sentence), []).append(("an expired leaf", leaf_id))
    for version in versions:
        if version.leaf_id in state.nodes:
            for sentence in split_sentences(version.text):
                removed.setdefault(fold(sentence), []).append(("a replaced version of leaf", version.leaf_id))
    if not removed:
        return []
    hidden = state.hidden(now)
    problems: list[str] = []
    for node in state.nodes.values():
        if node.is_leaf or node.id == ROOT_ID or node.id in hidden:
            continue
        quoted = {fold(sentence) for sentence in split_sentences(node.text)} & removed.keys()
        if not quoted:
            continue
        live = {
            fold(sentence)
            for leaf_id in state.leaf_ids_under(node.id)
            if leaf_id not in hidden
            for sentence in split_sentences(state.nodes[leaf_id].text)
        }
        for sentence in sorted(quoted - live):
            what, leaf_id = removed[sentence][0]
            problems.append(
                f"{node.id}: summary still holds text of {what} {leaf_id} (a privacy problem); "
                "repair() rewrites it from what is live"
            )
            break
    return problems


def leaked(state: TreeState, versions: Iterable[LeafVersion], now: float) -> list[str]:
    """Ids of the summaries :func:`removed_text_problems` reports (for ``repair()``)."""
    return [problem.split(":", 1)[0] for problem in removed_text_problems(state, versions, now)]
