"""Which summary guard rejects which model replies, and would the current guards?

``memtree bench locomo --keep-trees DIR`` logs every guarded model reply of a tree
it builds (``<conversation>__<recipe>.replies.jsonl``: the summary and new texts the
model was asked to merge, its raw reply and the verdict at build time). This script
reads those logs and re-checks every reply with the guards of the code it runs
with, without calling the model, so a guard change is measured on the same replies
the model wrote:

    python benchmarks/summary_guard_audit.py /work/trees/*.replies.jsonl \\
        --out benchmarks/results --name summary_guard_audit

It reports, per guard, how many replies failed it when the tree was built and how
many fail it now, how the rejected share depends on the size of the merge (words of
the earlier summary, number of new texts), and which words the ``facts`` and
``invented`` guards name most (folded to their kind: a number, a number word, a
month, a name), never the texts themselves: the logs are derived from LoCoMo
(CC BY-NC 4.0) and stay out of the repository. ``--show N`` prints N rejected
replies per guard to the terminal, to read them. A tree built with the retry prompt
logs a second line for each merge whose first reply was rejected (``"attempt": 2``),
judged here against that prompt; the shares are per reply, not per merge.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from memtree.aggregate import LLMAggregator  # noqa: E402
from memtree.llm import Completion  # noqa: E402
from memtree.summary_guard import GUARDS, NUMBER_WORDS  # noqa: E402
from memtree.text import count_words  # noqa: E402
from memtree_bench.report import markdown_table  # noqa: E402

_MONTHS = frozenset(
    "january february march april may june july august september october november december".split(" ")  # noqa: SIM905
)
_QUOTED = re.compile(r"'([^']+)'")


def read_logs(paths: Iterable[Path]) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    for path in paths:
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                record = json.loads(line)
                record["log"] = f"{path.parent.name}/{path.name}"
                records.append(record)
    return records


def recheck(records: list[dict[str, Any]], baseline: ModuleType | None = None) -> None:
    """Add ``guard_now`` and ``reason_now``: the verdict of the current guards; with a
    ``baseline`` module (another commit's guards), ``guard_then`` too."""
    checker = LLMAggregator(lambda prompt: "", guarded=True)
    for record in records:
        completion = Completion(record["reply"], truncated=bool(record["truncated"]))
        template = checker.retry_prompt if record.get("attempt", 1) == 2 else None  # the prompt it answered
        verdict, kept = checker.check(
            completion, record["summary"], record["new_texts"], int(record["count"]), template=template
        )
        record["guard_now"] = verdict.guard if verdict else None
        record["reason_now"] = verdict.reason if verdict else None
        record["restored_now"] = verdict is not None and kept is not None  # stored with the date put back
        record["fallback_now"] = kept is None
        record["fallback_built"] = bool(record["guard"]) and not record.get("restored")  # a log may say it was mended
        if baseline is not None:
            then = baseline.check_summary(
                baseline.clean_reply(record["reply"]),
                summary=record["summary"],
                new_texts=record["new_texts"],
                **checker.guard_context(record["summary"], record["new_texts"], int(record["count"]), template),
                truncated=bool(record["truncated"]),
                max_words=checker.max_words,
            )
            record["guard_then"] = then.guard if then else None


def guards_at(commit: str) -> ModuleType:
    """``memtree/summary_guard.py`` as it was at ``commit`` (read with ``git show``), as a
    module: the same replies judged by the guards of before a change."""
    source = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{commit}:memtree/summary_guard.py"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    name = f"summary_guard_at_{commit}"
    module = ModuleType(name)
    sys.modules[name] = module  # dataclasses look their module up
    exec(compile(source, f"memtree/summary_guard.py@{commit}", "exec"), module.__dict__)
    return module


def kind_of(word: str) -> str:
    """What kind of fact a guard named: a number, a number word, a month, a name."""
    if word.isdigit():
        return "digits"
    if word in NUMBER_WORDS:
        return "number word"
    if word in _MONTHS:
        return "month"
    return "name or other capitalized word"


def named_kinds(records: Sequence[dict[str, Any]], guard: str, field: str) -> Counter[str]:
    kinds: Counter[str] = Counter()
    for record in records:
        if record.get(field) == guard:
            reason = record["reason" if field == "guard" else "reason_now"] or ""
            if "keeps none of the words" in reason:
                kinds["none of the new texts' words kept"] += 1
                continue
            for word in _QUOTED.findall(reason):
                kinds[kind_of(word)] += 1
    return kinds


def size_bucket(record: dict[str, Any]) -> str:
    words = count_words(record["summary"])
    if words == 0:
        return "no earlier summary"
    if words <= 40:
        return "earlier summary 1-40 words"
    return "earlier summary > 40 words"


def texts_bucket(record: dict[str, Any]) -> str:
    n = len(record["new_texts"])
    return "1 new text" if n == 1 else ("2-5 new texts" if n <= 5 else "6+ new texts")


def share(records: Sequence[dict[str, Any]], field: str) -> str:
    if not records:
        return "–"
    rejected = sum(1 for record in records if record.get(field))
    return f"{rejected}/{len(records)} ({100 * rejected / len(records):.0f}%)"


def report(
    records: list[dict[str, Any]], logs: list[Path], baseline_commit: str | None = None
) -> tuple[str, dict[str, Any]]:
    total = len(records)
    baseline = baseline_commit is not None
    built = Counter(record["guard"] for record in records if record["guard"])
    now = Counter(record["guard_now"] for record in records if record["guard_now"])
    then = Counter(record["guard_then"] for record in records if record.get("guard_then"))
    guard_rows = [
        [guard, *([str(then[guard])] if baseline else []), str(built[guard]), str(now[guard])] for guard in GUARDS
    ]
    guard_rows.append(
        [
            "**rejected in all**",
            *([share(records, "guard_then")] if baseline else []),
            share(records, "guard"),
            share(records, "guard_now"),
        ]
    )
    guard_rows.append(
        [
            "of which stored with the date restored",
            *(["–"] if baseline else []),
            "–",
            share(records, "restored_now"),
        ]
    )
    guard_rows.append(
        [
            "**not stored (rejected, not mended)**",
            *(["–"] if baseline else []),
            share(records, "fallback_built"),
            share(records, "fallback_now"),
        ]
    )
    then_header = [f"guards of {baseline_commit}"] if baseline else []
    buckets: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        buckets.setdefault(size_bucket(record), []).append(record)
        buckets.setdefault(texts_bucket(record), []).append(record)
    order = [
        "no earlier summary",
        "earlier summary 1-40 words",
        "earlier summary > 40 words",
        "1 new text",
        "2-5 new texts",
        "6+ new texts",
    ]
    size_rows = [
        [name, *([share(buckets[name], "guard_then")] if baseline else []), share(buckets[name], "guard"),
         share(buckets[name], "guard_now")]
        for name in order
        if name in buckets
    ]  # fmt: skip
    per_log = [
        [
            name,
            str(len(group)),
            *([share(group, "guard_then")] if baseline else []),
            share(group, "guard"),
            share(group, "guard_now"),
            share(group, "fallback_now"),
        ]
        for name in sorted({record["log"] for record in records})
        for group in [[record for record in records if record["log"] == name]]
    ]
    kind_rows = []
    for guard in ("facts", "invented"):
        built_kinds, current = named_kinds(records, guard, "guard"), named_kinds(records, guard, "guard_now")
        for kind in sorted(set(built_kinds) | set(current)):
            kind_rows.append([guard, kind, str(built_kinds[kind]), str(current[kind])])
    lines = [
        "# Which guard rejects which model summaries",
        "",
        f"{total} guarded replies of the local model, logged while building the trees of "
        f"{len(logs)} log file(s); "
        "re-checked here with the guards of this commit, without calling the model. "
        "A reply that states no date and is rejected only for leaving out the new texts' date is now stored "
        "with the date put back "
        "(`restore_dates`): it still counts as rejected by `facts`, but as stored.",
        "",
        "## Rejections per guard (the first guard a reply fails names it)",
        "",
        *markdown_table(["guard", *then_header, "when built", "now"], guard_rows),
        "",
        "## Per log (each tree's log says which commit's guards judged it when built)",
        "",
        *markdown_table(
            ["log", "replies", *then_header, "rejected when built", "rejected now", "not stored now"],
            per_log,
        ),
        "",
        "## Rejected share by the size of the merge",
        "",
        *markdown_table(["merge", *then_header, "when built", "now"], size_rows),
        "",
        "## What the fact guards named (counted per word named)",
        "",
        *markdown_table(["guard", "kind of word", "when built", "now"], kind_rows, numeric_from=2),
        "",
    ]
    data = {
        "replies": total,
        "logs": sorted(path.name for path in logs),
        "built": dict(built),
        "now": dict(now),
        "dates_restored_now": sum(1 for record in records if record["restored_now"]),
        "fallbacks_now": sum(1 for record in records if record["fallback_now"]),
        "baseline": {"commit": baseline_commit, "rejected": dict(then)} if baseline else None,
        "by_size": {row[0]: row[1:] for row in size_rows},
        "per_log": {row[0]: row[1:] for row in per_log},
        "named_kinds": [dict(zip(("guard", "kind", "built", "now"), row, strict=True)) for row in kind_rows],
    }
    return "\n".join(lines), data


def show(records: list[dict[str, Any]], per_guard: int) -> None:
    for guard in GUARDS:
        chosen = [record for record in records if record["guard_now"] == guard][:per_guard]
        for record in chosen:
            print(f"=== {guard}: {record['reason_now']}")
            print(f"  summary ({count_words(record['summary'])} words): {record['summary'][:300]}")
            for text in record["new_texts"][:8]:
                print(f"  + {text[:160]}")
            print(f"  reply: {record['reply'][:400]}\n")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("logs", type=Path, nargs="+", help="*.replies.jsonl files written by --keep-trees")
    parser.add_argument("--out", type=Path, default=None, help="directory for <name>.md and <name>.json")
    parser.add_argument("--name", default="summary_guard_audit")
    parser.add_argument("--show", type=int, default=0, help="print this many rejected replies per guard")
    parser.add_argument("--baseline-commit", default=None, help="also judge the replies with this commit's guards")
    args = parser.parse_args(argv)
    records = read_logs(args.logs)
    if not records:
        raise SystemExit("the logs hold no replies (was the tree built with a guarded model?)")
    recheck(records, guards_at(args.baseline_commit) if args.baseline_commit else None)
    text, data = report(records, list(args.logs), args.baseline_commit)
    print(text)
    if args.show:
        show(records, args.show)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"{args.name}.md").write_text(text)
        (args.out / f"{args.name}.json").write_text(json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    main()
