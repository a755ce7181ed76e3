"""What a store refuses and how: foreign files, newer schemas, damaged rows, busy
writers, closed stores; schema migrations; who closes what."""

from __future__ import annotations

import hashlib
import sqlite3
import sys
from pathlib import Path

import pytest

from memtree import HashingEmbedder, IncompatibleStoreError, MemTree, MemTreeConfig, PostgresStore, SQLiteStore
from memtree.store import migrations, sqlite
from memtree.store.codec import CorruptDataError
from memtree.store.migrations import Migration

CONFIG = MemTreeConfig(theta0=0.2)


def open_memory(location: str | Path, **kwargs: object) -> MemTree:
    return MemTree.open(location, embedder=HashingEmbedder(32), config=CONFIG, **kwargs)  # type: ignore[arg-type]


def fingerprint(folder: Path) -> dict[str, str]:
    """Every file in the folder with a hash of its bytes."""
    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in sorted(folder.iterdir())}


# -- SQLite: what is refused, untouched -----------------------------------------------------------


def test_a_file_that_is_not_sqlite_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("my precious notes, not a database\n" * 200)
    before = fingerprint(tmp_path)
    with pytest.raises(IncompatibleStoreError, match=r"notes\.txt is not a memtree memory file.*untouched"):
        open_memory(path)
    assert fingerprint(tmp_path) == before


def test_another_applications_sqlite_database_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
        connection.execute("INSERT INTO users (name) VALUES ('ada')")
    connection.close()
    before = fingerprint(tmp_path)
    with pytest.raises(IncompatibleStoreError, match=r"another application \(tables: users\).*untouched"):
        SQLiteStore(path)
    with pytest.raises(ValueError, match="not a memtree memory"):
        open_memory(path)
    assert fingerprint(tmp_path) == before


def test_a_newer_schema_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "memory.db"
    with open_memory(path) as memory:
        memory.add("something worth keeping")
    with sqlite3.connect(path) as connection:  # what a future memtree would have written
        connection.execute("INSERT INTO memtree_schema VALUES (99, 'from the future', 0)")
    connection.close()
    before = fingerprint(tmp_path)
    with pytest.raises(IncompatibleStoreError, match=r"schema version 99.*only knows versions up to 1.*upgrade"):
        open_memory(path)
    assert fingerprint(tmp_path) == before


def test_an_empty_file_or_empty_database_becomes_a_memory(tmp_path: Path) -> None:
    empty = tmp_path / "empty.db"
    empty.touch()
    bare = tmp_path / "bare.db"
    sqlite3.connect(bare).close()
    for path in (empty, bare):
        with open_memory(path) as memory:
            memory.add("first")
        with open_memory(path) as memory:
            assert [leaf.text for leaf in memory.leaves()] == ["first"]


def test_a_new_file_is_a_wal_database_with_a_schema_version(tmp_path: Path) -> None:
    path = tmp_path / "memory.db"
    open_memory(path).close()
    with sqlite3.connect(path) as connection:
        assert connection.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert connection.execute("PRAGMA application_id").fetchone()[0] == sqlite.APPLICATION_ID
        assert connection.execute("SELECT version FROM memtree_schema").fetchall() == [(1,)]
    connection.close()


def test_bad_paths_say_what_to_pass(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="InMemoryStore"):
        SQLiteStore(":memory:")
    with pytest.raises(IsADirectoryError, match="is a folder"):
        SQLiteStore(tmp_path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        SQLiteStore(tmp_path / "missing" / "memory.db")


def test_migrations_run_once_in_order_and_keep_the_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "memory.db"
    with open_memory(path) as memory:
        leaf = memory.add("kept across the upgrade", metadata={"k": 1})
    upgrade = Migration(
        2, "index leaves by source id", ("CREATE INDEX memtree_nodes_source ON memtree_nodes (source_id)",)
    )
    monkeypatch.setattr(sqlite, "SQLITE_MIGRATIONS", (*sqlite.SQLITE_MIGRATIONS, upgrade))
    for _ in range(2):  # the second open finds nothing to do
        with open_memory(path) as memory:
            assert memory.get(leaf).metadata == {"k": 1} and memory.check_integrity() == []
    with sqlite3.connect(path) as connection:
        assert [row[0] for row in connection.execute("SELECT version FROM memtree_schema ORDER BY version")] == [1, 2]
        indexes = {row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
        assert "memtree_nodes_source" in indexes
    connection.close()
    monkeypatch.undo()  # an older memtree meets the upgraded file
    with pytest.raises(IncompatibleStoreError, match="version 2"):
        open_memory(path)


def test_migration_versions_must_be_consecutive() -> None:
    with pytest.raises(RuntimeError, match=r"1\.\.n"):
        migrations.pending([Migration(1, "a", ()), Migration(3, "c", ())], 0, "x")


def test_a_damaged_row_is_reported_not_loaded(tmp_path: Path) -> None:
    path = tmp_path / "memory.db"
    with open_memory(path) as memory:
        leaf = memory.add("a fact")
    with sqlite3.connect(path) as connection:
        connection.execute("UPDATE memtree_nodes SET embedding = x'0102' WHERE id = ?", (leaf,))
    connection.close()
    with pytest.raises(CorruptDataError, match="a stored embedding has 2 bytes where 32 float32 values"):
        open_memory(path)


def test_a_busy_writer_makes_others_time_out_clearly(tmp_path: Path) -> None:
    path = tmp_path / "memory.db"
    open_memory(path).close()
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")  # another process holds the write lock
    try:
        memory = MemTree(store=SQLiteStore(path, busy_timeout=0.1), embedder=HashingEmbedder(32), config=CONFIG)
        with pytest.raises(TimeoutError, match=r"another process held the write lock for more than 0\.1s"):
            memory.add("waits in vain")
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    memory.add("gets through now")
    assert [leaf.text for leaf in memory.leaves()] == ["gets through now"]
    memory.store.close()


# -- who closes what --------------------------------------------------------------------------


def test_open_owns_its_store_and_closing_closes_it(tmp_path: Path) -> None:
    with open_memory(tmp_path / "memory.db", namespace=("users", "ada")) as memory:
        assert isinstance(memory.store, SQLiteStore) and memory.namespace == ("users", "ada")
        memory.add("Ada likes tea.")
    with pytest.raises(RuntimeError, match="is closed"):
        memory.store.head(memory.namespace)
    memory.close()  # closing twice is fine
    with pytest.raises(TypeError, match=r"MemTree\(store=\.\.\.\)"):
        MemTree.open(tmp_path / "memory.db", store=SQLiteStore(tmp_path / "other.db"))


def test_a_store_passed_in_stays_open(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "memory.db")
    MemTree(store=store, embedder=HashingEmbedder(32), config=CONFIG).close()
    assert store.list_namespaces() == []
    store.close()


def test_bad_arguments_to_open_close_the_store_again(tmp_path: Path) -> None:
    with pytest.raises(TypeError):
        MemTree.open(tmp_path / "memory.db", embedder="not an embedder")
    with pytest.raises(TypeError, match="file path or a postgresql:// DSN"):
        MemTree.open(42)  # type: ignore[arg-type]


# -- PostgreSQL ------------------------------------------------------------------------------


def test_open_with_a_dsn_makes_a_postgres_store(postgres_dsn: str) -> None:
    for dsn in (postgres_dsn, postgres_dsn.replace("postgresql://", "postgres://", 1)):
        with open_memory(dsn, namespace="pg") as memory:
            assert isinstance(memory.store, PostgresStore)
            memory.add("stored in PostgreSQL")
            assert "127.0.0.1" in repr(memory.store)


def test_postgres_refuses_a_newer_schema_and_foreign_tables(postgres_server) -> None:  # type: ignore[no-untyped-def]
    import psycopg

    newer = postgres_server.create_database()
    PostgresStore(newer).close()
    with psycopg.connect(newer, autocommit=True) as connection:
        connection.execute("INSERT INTO memtree_schema VALUES (7, 'from the future', 0)")
    with pytest.raises(IncompatibleStoreError, match=r"schema version 7.*upgrade"):
        PostgresStore(newer)

    foreign = postgres_server.create_database()
    with psycopg.connect(foreign, autocommit=True) as connection:
        connection.execute("CREATE TABLE memtree_nodes (x int)")
    with pytest.raises(IncompatibleStoreError, match="memtree_nodes exist but were not made by memtree"):
        PostgresStore(foreign)
    with psycopg.connect(foreign, autocommit=True) as connection:
        assert connection.execute("SELECT to_regclass('memtree_schema')").fetchone()[0] is None  # nothing created


def test_postgres_writers_time_out_clearly(postgres_dsn: str) -> None:
    holder_store = PostgresStore(postgres_dsn)
    store = PostgresStore(postgres_dsn, lock_timeout=0.2)
    memory = MemTree(store=store, namespace="busy", embedder=HashingEmbedder(32), config=CONFIG)
    holder = holder_store.begin(("busy",))
    try:
        with pytest.raises(TimeoutError, match=r"another writer held namespace \('busy',\) for more than 0\.2s"):
            memory.add("waits in vain")
        other = memory.with_namespace("free")
        other.add("another namespace is not blocked")
    finally:
        holder.rollback()
    memory.add("gets through now")
    assert len(memory) == 1
    holder_store.close()
    store.close()


def test_an_unreachable_server_is_a_connection_error() -> None:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(ConnectionError, match=f"cannot connect to PostgreSQL at host=127.0.0.1 port={port}"):
        PostgresStore(f"postgresql://nobody:secret@127.0.0.1:{port}/memory")


def test_without_psycopg_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)
    with pytest.raises(ImportError, match=r"pip install 'memtree-llm\[postgres\]'"):
        PostgresStore("postgresql://localhost/memory")
