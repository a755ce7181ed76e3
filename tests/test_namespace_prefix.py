"""``list_namespaces(prefix)`` reads only the namespaces under the prefix (issue 25
row 10: ``MemTreeStore.search`` listed all 2,000 namespaces of a file per call)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from memtree.store import MemoryBackend, SQLiteBackend, Store
from memtree.store.postgres import PostgresBackend

NAMES = [
    ("a",),
    ("a", "b"),
    ("a", "b", "c"),
    ("a", "bc"),
    ("ab",),
    ("a", 'q"uote'),
    ("a", "50%_off"),
    ("ä", "ö"),
    ("x", "a", "b"),
]


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "memory":
        store: Store = MemoryBackend()
    elif request.param == "sqlite":
        store = SQLiteBackend(tmp_path / "m.db")
    else:
        store = PostgresBackend(request.getfixturevalue("postgres_dsn"))
    for name in NAMES:
        store.put_records(name, "kind", {"k": {"v": 1}})
    store.put_records(("a", "gone"), "kind", {"k": None})  # a namespace row without data
    yield store
    store.close()


@pytest.mark.parametrize(
    ("prefix", "expected"),
    [
        ((), sorted(NAMES)),
        (("a",), [("a",), ("a", "50%_off"), ("a", "b"), ("a", "b", "c"), ("a", "bc"), ("a", 'q"uote')]),
        (("a", "b"), [("a", "b"), ("a", "b", "c")]),
        (("a", "50%"), []),
        (("a", 'q"uote'), [("a", 'q"uote')]),
        (("ä",), [("ä", "ö")]),
        (("nothing",), []),
    ],
)
def test_prefixes_match_whole_labels_only(
    backend: Store, prefix: tuple[str, ...], expected: list[tuple[str, ...]]
) -> None:
    assert backend.list_namespaces(prefix) == expected


def sqlite_steps(tmp_path: Path, others: int) -> int:
    """SQLite virtual-machine steps of one ``list_namespaces(prefix)`` in a file with
    ``others`` unrelated namespaces (deterministic, unlike a timing)."""
    store = SQLiteBackend(tmp_path / f"steps{others}.db")
    for i in range(others):
        store.put_records(("other", f"n{i}"), "kind", {"k": {"v": i}})
    store.put_records(("users", "alice"), "kind", {"k": {"v": 1}})
    steps = 0

    def count() -> int:
        nonlocal steps
        steps += 1
        return 0

    store.head(("users", "alice"))  # leaves one reader idle in the pool
    with store._pool_lock:
        idle = list(store._idle)
    for connection in idle:  # the reader the listing will use
        connection.set_progress_handler(count, 1)
    assert idle, "expected an idle reader connection"
    assert store.list_namespaces(("users",)) == [("users", "alice")]
    store.close()
    return steps


def test_a_prefix_listing_does_not_check_every_namespace_for_data(tmp_path: Path) -> None:
    few, many = sqlite_steps(tmp_path, 20), sqlite_steps(tmp_path, 1000)
    # Comparing a name is a few steps; checking a namespace for data is many more.
    # Measured: about 22 steps per unrelated namespace when each is checked for
    # data (the old query), about 6 when only its name is compared.
    assert many - few < 1000 * 12, (few, many)
