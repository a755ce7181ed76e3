"""How a tree's summaries relate to the leaves they stand for, without a judge model.

Two shares, over every summary node (the root excluded) of a built memory:

* **abstraction**: the share of summaries that use at least one content word (four
  letters or more, not a function word) that none of the leaves below them uses.
  An extractive summary scores 0 by construction: every word is copied. A model
  that rewrites ("Melanie adopted a dog" for "we brought home a puppy") scores
  above 0; the mean share of such words per summary says how much it rewrote.
* **invention**: the share of summaries that state a name or number (the facts
  :func:`memtree.summary_guard.key_facts` finds: capitalized words inside a
  sentence, digit runs; times of day left out) that none of their leaves contains.
  A date the model misreads, a person it made up, a count it guessed: each is an
  invented fact, and a reader given that summary is told something false.

Words are compared folded (lower case, possessive ``'s`` dropped), so "Melanie's"
in a summary matches "Melanie" in a leaf.
"""

from __future__ import annotations

import statistics
from typing import Any

from memtree.node import ROOT_ID
from memtree.summary_guard import content_words, key_facts, stated_words


def summary_quality(memory: Any) -> dict[str, float]:
    """``abstraction``, ``novel_word_share``, ``invention``, ``invented_facts`` (mean
    per summary) and ``summaries`` (how many were checked) for ``memory``'s tree;
    the shares are 0 for a tree without summaries."""
    summaries = [node for node in memory.walk() if node.id != ROOT_ID and not node.is_leaf]
    abstracted = 0
    invented = 0
    novel_shares: list[float] = []
    invented_counts: list[int] = []
    for node in summaries:
        leaves = memory.get_many(memory.leaf_ids_under(node.id))
        leaf_text = "\n".join(leaf.text for leaf in leaves.values())
        words = content_words(node.text)
        novel = words - content_words(leaf_text)
        made_up = key_facts(node.text) - stated_words(leaf_text)
        abstracted += bool(novel)
        invented += bool(made_up)
        novel_shares.append(len(novel) / len(words) if words else 0.0)
        invented_counts.append(len(made_up))
    count = len(summaries)
    return {
        "summaries": float(count),
        "abstraction": abstracted / count if count else 0.0,
        "novel_word_share": statistics.fmean(novel_shares) if novel_shares else 0.0,
        "invention": invented / count if count else 0.0,
        "invented_facts": statistics.fmean(invented_counts) if invented_counts else 0.0,
    }
