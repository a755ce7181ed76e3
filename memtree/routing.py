"""Where a new text goes: the depth-adaptive threshold and the descent from the root.

Pure decisions over the current tree and similarity scores; no model calls, no
writes. See ``design.md`` §1 for the rules this implements.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from memtree.config import MemTreeConfig
from memtree.node import ROOT_ID
from memtree.state import TreeView

Scorer = Callable[[str, Sequence[str]], npt.NDArray[np.float32]]
"""Cosine similarity of the new text to each of the given children of the node named first."""

RouteReason = Literal["empty", "below-threshold", "near-duplicate", "depth-cap", "split"]


def threshold(depth: int, tree_depth: int, theta0: float, config: MemTreeConfig) -> float:
    """θ(d) = θ0 · exp(λ · d / D), clamped to ``config.max_threshold``.

    ``D`` is ``config.threshold_depth`` or else the tree's current depth, at least 1.
    Normalizing by ``D`` keeps θ below 1 at any depth, so texts can keep descending
    as the tree grows (the literal ``θ0·e^{λd}`` passes 1.0 at depth 2).
    """
    normalizer = max(1, config.threshold_depth if config.threshold_depth is not None else tree_depth)
    return min(config.max_threshold, theta0 * math.exp(config.decay * depth / normalizer))


@dataclass(frozen=True)
class Route:
    """Where a new leaf goes.

    ``path`` lists the summaries the text descended into, top-down (the root is
    implicit). The new leaf hangs under ``parent`` (the last of ``path``, or the
    root), unless ``split`` names a leaf that reached: then a new summary takes that
    leaf's place under ``parent`` with the old leaf and the new one as children.
    """

    path: tuple[str, ...]
    parent: str
    split: str | None
    reason: RouteReason
    best_scores: tuple[float, ...]


def route(state: TreeView, score: Scorer, theta0: float, config: MemTreeConfig) -> Route:
    """Descend from the root by the rules of design.md §1."""
    tree_depth = state.depth
    node = state.nodes.get(ROOT_ID)
    if node is None:  # the first insert creates the root
        return Route((), ROOT_ID, None, "empty", ())
    path: list[str] = []
    best_scores: list[float] = []
    while True:
        depth = node.depth
        if not node.children:
            return Route(tuple(path), node.id, None, "empty", tuple(best_scores))
        if depth + 2 > config.depth_cap:  # a leaf hung any deeper would pass the cap
            return Route(tuple(path), node.id, None, "depth-cap", tuple(best_scores))
        scores = score(node.id, node.children)
        best = int(np.argmax(scores))
        best_score = float(scores[best])
        best_scores.append(best_score)
        if best_score < threshold(depth, tree_depth, theta0, config):
            return Route(tuple(path), node.id, None, "below-threshold", tuple(best_scores))
        child = state.nodes[node.children[best]]
        if child.is_leaf:
            if best_score >= config.near_duplicate:
                return Route(tuple(path), node.id, None, "near-duplicate", tuple(best_scores))
            return Route(tuple(path), node.id, child.id, "split", tuple(best_scores))
        path.append(child.id)
        node = child
