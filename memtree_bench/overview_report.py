"""The overview benchmark's report: Markdown tables and a small JSON of means.

Halves are kept apart (the conversations the defaults were tuned on, and the
others), and so are the tree kinds (extractive, model-written). The goal tables
compare ``memtree overview`` with the best flat baseline of each family and budget
(:data:`~memtree_bench.overview_methods.FLAT_BASELINES`, chosen on the same
questions, which favours the baseline), as a mean paired difference with a 95%
bootstrap interval over the questions; "all families" weighs each family alike
(each resampled within itself).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from memtree_bench.coverage import RESTATED_MIN, RESTATED_SHARE
from memtree_bench.overview_bench import EXTRACTIVE, MODEL_WRITTEN, OverviewRun, Score
from memtree_bench.overview_methods import FLAT_BASELINES
from memtree_bench.overview_questions import FAMILIES
from memtree_bench.report import markdown_table, write_json, write_markdown

OVERVIEW_ROW = "memtree overview"
RESAMPLES = 2000
TUNING, HELD_OUT = "tuning", "held out"

Key = tuple[str, str, str, str, int]
"""(half, trees, row, family, budget)."""


def _half(run: OverviewRun, conversation: int) -> str:
    return TUNING if conversation in run.settings.tuning else HELD_OUT


def _grouped(run: OverviewRun) -> dict[Key, dict[tuple[str, int], Score]]:
    """Scores by (half, trees, row, family, budget), each keyed by its question
    (conversation, number) so rows pair up."""
    grouped: dict[Key, dict[tuple[str, int], Score]] = defaultdict(dict)
    for score in run.scores:
        key = (_half(run, score.conversation), score.trees, score.row, score.family, score.budget)
        grouped[key][(score.sample_id, score.question)] = score
    return grouped


def _mean(values: Sequence[float]) -> float:
    return statistics.fmean(values) if values else math.nan


def _fmt(value: float, digits: int = 3) -> str:
    return "–" if value is None or math.isnan(value) else f"{value:.{digits}f}"


def _points(value: float) -> str:
    return "–" if math.isnan(value) else f"{value * 100:+.1f}"


def paired_interval(
    differences: Sequence[Sequence[float]], resamples: int = RESAMPLES, seed: int = 0
) -> tuple[float, float, float]:
    """The mean over groups of each group's mean difference, and its 95% bootstrap
    interval (each group resampled within itself)."""
    groups = [np.asarray(group, dtype=np.float64) for group in differences if len(group)]
    if not groups:
        return math.nan, math.nan, math.nan
    rng = np.random.default_rng(seed)
    point = float(np.mean([group.mean() for group in groups]))
    draws = np.zeros(resamples)
    for group in groups:
        picks = rng.integers(0, len(group), size=(resamples, len(group)))
        draws += group[picks].mean(axis=1)
    draws /= len(groups)
    low, high = np.percentile(draws, [2.5, 97.5])
    return point, float(low), float(high)


class Tables:
    """The run's numbers, ready for tables: means and paired differences."""

    def __init__(self, run: OverviewRun) -> None:
        self.run = run
        self.grouped = _grouped(run)
        self.rows = list(dict.fromkeys(score.row for score in run.scores))
        self.variants = {score.row for score in run.scores if score.variant}
        self.halves = [h for h in (TUNING, HELD_OUT) if any(k[0] == h for k in self.grouped)]
        self.kinds = [k for k in (EXTRACTIVE, MODEL_WRITTEN) if any(key[1] == k for key in self.grouped)]

    def scores(self, half: str, kind: str, row: str, family: str, budget: int) -> dict[tuple[str, int], Score]:
        return self.grouped.get((half, kind, row, family, budget), {})

    def mean(self, half: str, kind: str, row: str, family: str, budget: int, what: str = "coverage") -> float:
        values = [getattr(s, what) for s in self.scores(half, kind, row, family, budget).values()]
        return _mean([v for v in values if v is not None])

    def count(self, half: str, kind: str, family: str) -> int:
        budget = self.run.settings.budgets[0]
        return len(self.scores(half, kind, self.rows[0], family, budget))

    def best_flat(self, half: str, kind: str, family: str, budget: int) -> str:
        present = [row for row in FLAT_BASELINES if self.scores(half, kind, row, family, budget)]
        return max(present, key=lambda row: self.mean(half, kind, row, family, budget)) if present else ""

    def difference(
        self, half: str, kind: str, row: str, baseline: str | None, family: str | None, budget: int
    ) -> tuple[float, float, float, str]:
        """``row`` minus ``baseline`` (``None``: the best flat baseline of each family),
        over one family or (``None``) all families alike; also the baseline's name."""
        families = [family] if family is not None else [f for f in FAMILIES if self.count(half, kind, f)]
        groups, names = [], []
        for name in families:
            base = baseline or self.best_flat(half, kind, name, budget)
            names.append(base)
            mine, theirs = self.scores(half, kind, row, name, budget), self.scores(half, kind, base, name, budget)
            groups.append([mine[q].coverage - theirs[q].coverage for q in mine if q in theirs])
        point, low, high = paired_interval(groups)
        label = names[0] if len(set(names)) == 1 else "best flat per family"
        return point, low, high, label


def write_overview_report(run: OverviewRun, machine: list[str], out: Path, stem: str = "overview") -> list[Path]:
    """``<stem>.md`` and ``<stem>.json`` in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    tables = Tables(run)
    md, js = out / f"{stem}.md", out / f"{stem}.json"
    write_markdown(md, _markdown(tables, machine))
    write_json(js, _json(tables))
    return [md, js]


def _markdown(tables: Tables, machine: list[str]) -> list[str]:
    run = tables.run
    budgets = run.settings.budgets
    lines = ["# Overviews, time spans and aggregates: fact coverage on LoCoMo's annotations", "", *machine, ""]
    lines += _about(tables)
    for kind in tables.kinds:
        for half in reversed(tables.halves):
            lines += [f"## Goals: {half} conversations, {kind} trees", ""]
            lines += _goal_table(tables, half, kind, [b for b in (500, 250) if b in budgets])
    for kind in tables.kinds:
        for half in reversed(tables.halves):
            lines += [f"## Fact coverage: {half} conversations, {kind} trees", ""]
            lines += _family_tables(tables, half, kind, "coverage")
            lines += [f"## Evidence recall: {half} conversations, {kind} trees", ""]
            lines += _family_tables(tables, half, kind, "evidence_recall")
    lines += _trees(run)
    return lines


def _about(tables: Tables) -> list[str]:
    run = tables.run
    counts = []
    for kind in tables.kinds[:1]:
        for half in tables.halves:
            cells = [str(tables.count(half, kind, family)) for family in FAMILIES]
            conversations = sorted({s.sample_id for s in run.scores if _half(run, s.conversation) == half})
            counts.append([half, ", ".join(conversations), *cells])
    return [
        "Questions built without a model from the annotations the memory never sees "
        '(`memtree_bench/overview_questions.py`): **person** ("What do you know about {speaker}?"; gold: all '
        'of that speaker\'s observations), **day** ("What did {a} and {b} talk about on {session date}?"; '
        "gold: the observations and events of that day's sessions), **month** (\"What happened to {speaker} in "
        "{month}?\"; gold: that speaker's observations and events in the month's sessions) and **multi-hop** "
        "(LoCoMo's category 1 questions; gold: their evidence turns). Relative times count back from the "
        "latest turn of the conversation.",
        "",
        *markdown_table(["half", "conversations", *FAMILIES], counts, numeric_from=2),
        "",
        "**Fact coverage** (`memtree_bench/coverage.py`), the same rule for every method: a gold fact counts "
        "as covered by the share of its evidence turn's sentences found verbatim in the context (as evidence "
        f"recall counts a turn), or wholly when one sentence of the context holds at least {RESTATED_SHARE:.0%} "
        f"of its content words and at least {RESTATED_MIN} of them. Content words: lower-cased alphabetic words "
        "of three letters or more, not function words or chat filler, not the speakers' names, Porter-stemmed. "
        "Events (no evidence turn) can only be restated; a multi-hop fact is restated by any observation citing "
        "its turn. **Evidence recall**: the share of the gold facts' evidence turns' sentences in the context. "
        "Each method's context is cut at the word budget; the overview is asked for that many words.",
        "",
        "Rows: a seeded random sample of the asked turns (the floor: the asked speaker's turns, the asked "
        "span's, a multi-hop question's one named speaker's, else all); flat hybrid (cosine + BM25 over the "
        "turns, no tree); flat hybrid with the question's time range as a filter; flat hybrid with MMR "
        "(relevance weight 0.5 over its best 150); both, and both with relevance weight 0.3 (the best weight for "
        "day recaps on the tuning half); a RAPTOR-style tree built offline with extractive "
        "summaries (also beside the model-written trees: no model is run here); memtree `retrieve` ranking the "
        "question as a lookup (its time parsing and context feedback on); `retrieve` as users call it "
        "(overview requests routed to `overview`); `overview` itself (a multi-hop question is its own `about`).",
        "",
        f'Intervals: 95% paired bootstrap over the questions ({RESAMPLES} resamples); "all families" is the '
        "mean of the four families' means, each family resampled within itself.",
        "",
    ]


def _goal_table(tables: Tables, half: str, kind: str, budgets: Sequence[int]) -> list[str]:
    rows = []
    for budget in budgets:
        for family in [*FAMILIES, None]:
            if family is not None and not tables.count(half, kind, family):
                continue
            point, low, high, base = tables.difference(half, kind, OVERVIEW_ROW, None, family, budget)
            present = [f for f in FAMILIES if tables.count(half, kind, f)]
            mine = (
                tables.mean(half, kind, OVERVIEW_ROW, family, budget)
                if family
                else _mean([tables.mean(half, kind, OVERVIEW_ROW, f, budget) for f in present])
            )
            rows.append(
                [
                    str(budget),
                    family or "**all families**",
                    _fmt(mine),
                    base,
                    _fmt(mine - point) if not math.isnan(point) else "–",
                    f"{_points(point)} [{_points(low)}, {_points(high)}]",
                ]
            )
    lines = markdown_table(
        ["words", "family", "overview", "best flat baseline", "its coverage", "overview − it (points, 95%)"],
        rows,
        numeric_from=4,
    )
    time_rows = []
    for budget in budgets:
        for row in (OVERVIEW_ROW, "memtree retrieve, routed", "memtree retrieve"):
            groups = [f for f in ("day", "month") if tables.count(half, kind, f)]
            diffs = []
            for family in groups:
                ours, flat = (tables.scores(half, kind, r, family, budget) for r in (row, "flat hybrid"))
                diffs.append([ours[q].coverage - flat[q].coverage for q in ours if q in flat])
            point, low, high = paired_interval(diffs)
            time_rows.append([str(budget), row, f"{_points(point)} [{_points(low)}, {_points(high)}]"])
    return [
        *lines,
        "",
        "Span questions (day and month families, each naming a date or a month) against flat hybrid without "
        "time parsing:",
        "",
        *markdown_table(["words", "row", "minus flat hybrid (points, 95%)"], time_rows, numeric_from=2),
        "",
    ]


def _family_tables(tables: Tables, half: str, kind: str, what: str) -> list[str]:
    budgets = tables.run.settings.budgets
    lines = []
    for family in FAMILIES:
        if not tables.count(half, kind, family):
            continue
        body = []
        for row in tables.rows:
            values = [tables.mean(half, kind, row, family, budget, what) for budget in budgets]
            if all(math.isnan(v) for v in values):
                continue
            name = f"{row} (variant)" if row in tables.variants else row
            body.append([name, *(_fmt(v) for v in values)])
        lines += [f"**{family}** ({tables.count(half, kind, family)} questions)", ""]
        lines += markdown_table(["row", *(f"{b} words" for b in budgets)], body)
        lines += [""]
    return lines


def _trees(run: OverviewRun) -> list[str]:
    lines = ["## Trees read", ""]
    seen = {(entry["file"], entry["sha256"]) for entry in run.trees_read}
    lines += markdown_table(["file", "sha256"], sorted(seen), numeric_from=2)
    if run.missing:
        lines += ["", f"Model-written trees not found (not built yet): {', '.join(sorted(set(run.missing)))}."]
    lines += ["", f"Run time: {run.seconds / 60:.1f} min."]
    return lines


def _json(tables: Tables) -> dict[str, Any]:
    run = tables.run
    budgets = run.settings.budgets
    means: dict[str, Any] = {}
    for half in tables.halves:
        for kind in tables.kinds:
            for row in tables.rows:
                for family in FAMILIES:
                    if not tables.count(half, kind, family):
                        continue
                    means.setdefault(half, {}).setdefault(kind, {}).setdefault(row, {})[family] = {
                        str(budget): {
                            "coverage": tables.mean(half, kind, row, family, budget),
                            "evidence_recall": tables.mean(half, kind, row, family, budget, "evidence_recall"),
                        }
                        for budget in budgets
                    }
    goals: dict[str, Any] = {}
    for half in tables.halves:
        for kind in tables.kinds:
            for budget in budgets:
                for group in [*FAMILIES, None]:
                    if group is not None and not tables.count(half, kind, group):
                        continue
                    point, low, high, base = tables.difference(half, kind, OVERVIEW_ROW, None, group, budget)
                    goals.setdefault(half, {}).setdefault(kind, {}).setdefault(str(budget), {})[group or "all"] = {
                        "overview_minus_best_flat": point,
                        "interval": [low, high],
                        "best_flat": base,
                    }
    counts = {
        half: {kind: {f: tables.count(half, kind, f) for f in FAMILIES} for kind in tables.kinds}
        for half in tables.halves
    }
    conversations = {
        half: sorted({s.sample_id for s in run.scores if _half(run, s.conversation) == half}) for half in tables.halves
    }
    return {
        "budgets": list(budgets),
        "questions": counts,
        "conversations": conversations,
        "coverage_rule": {"restated_share": RESTATED_SHARE, "restated_min": RESTATED_MIN},
        "means": means,
        "overview_minus_best_flat": goals,
        "trees": sorted({(e["file"], e["sha256"]) for e in run.trees_read}),
        "missing_model_trees": sorted(set(run.missing)),
    }
