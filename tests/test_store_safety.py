"""What a store refuses and how: foreign files, newer schemas, damaged rows, busy
writers, closed stores; schema migrations; who closes what."""

from __future__ import annotations

import hashlib
import os
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from memtree import HashingEmbedder, IncompatibleStoreError, MemTree, MemTreeConfig, PostgresBackend, SQLiteBackend
from memtree.store import MemoryBackend, as_store, migrations, sqlite
from memtree.store.codec import CorruptDataError
from memtree.store.migrations import Migration
from memtree.store.sqlite import SQLITE_MIGRATIONS

CONFIG = MemTreeConfig(theta0=0.2)
CHILD_ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")]),
}


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
    with pytest.raises(IncompatibleStoreError, match=r"another application \(table users\).*untouched"):
        SQLiteBackend(path)
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
    latest = SQLITE_MIGRATIONS[-1].version
    with pytest.raises(
        IncompatibleStoreError, match=rf"schema version 99.*only knows versions up to {latest}.*upgrade"
    ):
        open_memory(path)
    assert fingerprint(tmp_path) == before


def leave_in_wal(path: Path, *statements: str) -> None:
    """Run ``statements`` in a process that dies before any checkpoint, as a killed
    writer would: the commits stay in ``-wal`` (with its ``-shm``) beside ``path``."""
    code = (
        "import os, sqlite3, sys\n"
        "connection = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
        "connection.execute('PRAGMA journal_mode = WAL')\n"
        "connection.execute('PRAGMA wal_autocheckpoint = 0')\n"
        "for statement in sys.argv[2:]:\n"
        "    connection.execute(statement)\n"
        "os._exit(0)\n"
    )
    subprocess.run([sys.executable, "-c", code, str(path), *statements], check=True)


def memtree_file_with_newer_schema_in_wal(folder: Path) -> Path:
    path = folder / "memory.db"
    with open_memory(path) as memory:
        memory.add("something worth keeping")
    leave_in_wal(path, "INSERT INTO memtree_schema VALUES (99, 'from the future', 0)")
    return path


def foreign_database_in_wal(folder: Path) -> Path:
    path = folder / "app.db"
    leave_in_wal(path, "CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)", "INSERT INTO users VALUES (1, 'ada')")
    return path


WAL_CASES: list[tuple[Callable[[Path], Path], str]] = [
    (memtree_file_with_newer_schema_in_wal, r"schema version 99.*upgrade"),
    (foreign_database_in_wal, r"another application \(table users\).*untouched"),
]


@pytest.mark.parametrize(("make", "message"), WAL_CASES)
def test_commits_still_in_the_wal_are_seen_and_a_refusal_keeps_every_byte(
    tmp_path: Path, make: Callable[[Path], Path], message: str
) -> None:
    path = make(tmp_path)
    before = fingerprint(tmp_path)
    assert {f"{path.name}-wal", f"{path.name}-shm"} <= set(before)  # the refusal has a WAL to spoil
    for _ in range(2):
        with pytest.raises(IncompatibleStoreError, match=message):
            SQLiteBackend(path)
        assert fingerprint(tmp_path) == before  # main file, -wal and -shm


@pytest.mark.parametrize(("make", "message"), WAL_CASES)
def test_a_wal_without_its_shm_is_read_from_a_copy(tmp_path: Path, make: Callable[[Path], Path], message: str) -> None:
    path = make(tmp_path)
    Path(f"{path}-shm").unlink()  # as when someone copied the file and its -wal by hand
    before = fingerprint(tmp_path)
    with pytest.raises(IncompatibleStoreError, match=message):
        SQLiteBackend(path)
    assert fingerprint(tmp_path) == before  # in particular, no -shm made beside it


def test_a_database_another_process_has_open_is_refused_without_disturbing_it(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    code = (
        "import sqlite3, sys\n"
        "connection = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
        "connection.execute('PRAGMA journal_mode = WAL')\n"
        "connection.execute('PRAGMA wal_autocheckpoint = 0')\n"
        "connection.execute('CREATE TABLE users (name TEXT)')\n"
        "print('ready', flush=True)\n"
        "sys.stdin.readline()\n"
        "connection.execute(\"INSERT INTO users VALUES ('grace')\")\n"
        "print(connection.execute('SELECT count(*) FROM users').fetchone()[0], flush=True)\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert holder.stdin is not None and holder.stdout is not None
    try:
        assert holder.stdout.readline() == "ready\n"
        before = fingerprint(tmp_path)
        with pytest.raises(IncompatibleStoreError, match=r"another application \(table users\)"):
            SQLiteBackend(path)
        assert fingerprint(tmp_path) == before
        holder.stdin.write("go on\n")
        holder.stdin.flush()
        assert holder.stdout.readline() == "1\n"  # the owner carries on writing
    finally:
        holder.stdin.close()
        holder.wait()
        holder.stdout.close()
    assert holder.returncode == 0


def another_process_can_lock(path: Path) -> bool:
    """Whether another process could take SQLite's exclusive lock on ``path`` now
    (its lock bytes start at 1 GiB: pending, reserved, then the shared range)."""
    code = (
        "import fcntl, sys\n"
        "with open(sys.argv[1], 'rb+') as file:\n"
        "    try:\n"
        "        fcntl.lockf(file, fcntl.LOCK_EX | fcntl.LOCK_NB, 512, 0x40000000)\n"
        "    except OSError:\n"
        "        print('held')\n"
        "    else:\n"
        "        print('free')\n"
    )
    answer = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True)
    return answer.stdout.strip() == "free"


@pytest.mark.parametrize("refused", [False, True])
def test_checking_a_file_keeps_the_locks_this_process_holds_on_it(tmp_path: Path, refused: bool) -> None:
    # Closing any descriptor of a database file drops every POSIX lock the process
    # holds on it, so the check must read the file through SQLite only.
    path = tmp_path / "memory.db"
    open_memory(path).close()
    if refused:
        sqlite_file(path, "CREATE TABLE users (name TEXT)")
    reader = sqlite3.connect(path, isolation_level=None)
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM sqlite_master").fetchone()  # holds a shared lock from here
    try:
        assert not another_process_can_lock(path)
        if refused:
            with pytest.raises(IncompatibleStoreError, match=r"objects memtree did not make \(table users\)"):
                SQLiteBackend(path)
        else:
            SQLiteBackend(path).close()
        assert not another_process_can_lock(path)  # the reader's lock survived the check
    finally:
        reader.execute("COMMIT")
        reader.close()


def sqlite_file(path: Path, *statements: str) -> Path:
    connection = sqlite3.connect(path)
    for statement in statements:
        connection.execute(statement)
    connection.commit()
    connection.close()
    return path


def memtree_file(path: Path, *statements: str) -> Path:
    open_memory(path).close()
    return sqlite_file(path, *statements)


ODD_FILES: dict[str, tuple[Callable[[Path], Path], str]] = {
    "one byte": (
        lambda folder: _written(folder / "x.txt", b"x"),
        r"x\.txt is not a memtree memory file \(not a readable SQLite database: its 1 byte\(s\) hold no database "
        r"page\); memtree left it untouched",
    ),
    "a short text": (
        lambda folder: _written(folder / "hi.txt", b"hello world\n"),
        r"hi\.txt is not a memtree memory file \(not a readable SQLite database: file is not a database\).*untouched",
    ),
    "a damaged database": (
        lambda folder: _written(folder / "cut.db", b"SQLite format 3\x00" + bytes(84)),
        r"cut\.db is not a memtree memory file \(not a readable SQLite database: .*untouched",
    ),
    "only a view": (
        lambda folder: sqlite_file(folder / "view.db", "CREATE VIEW answer AS SELECT 42 AS value"),
        r"another application \(view answer\)",
    ),
    "another application_id, no tables": (
        lambda folder: sqlite_file(folder / "appid.db", "PRAGMA application_id = 1234"),
        r"another application \(application_id 0x000004d2; memtree's is 0x4d454d54\)",
    ),
    "a user_version, no tables": (
        lambda folder: sqlite_file(folder / "versioned.db", "PRAGMA user_version = 7"),
        r"another application \(user_version 7, which memtree never sets\)",
    ),
    "memtree's tables and a view": (
        lambda folder: memtree_file(folder / "m.db", "CREATE VIEW leaves AS SELECT text FROM memtree_nodes"),
        r"m\.db holds memtree's tables but also objects memtree did not make \(view leaves\).*drop them",
    ),
    "memtree's tables and an index": (
        lambda folder: memtree_file(folder / "m.db", "CREATE INDEX by_text ON memtree_nodes (text)"),
        r"objects memtree did not make \(index by_text\)",
    ),
    "memtree's tables and a trigger": (
        lambda folder: memtree_file(
            folder / "m.db",
            "CREATE TRIGGER audit AFTER INSERT ON memtree_nodes BEGIN SELECT 1; END",
        ),
        r"objects memtree did not make \(trigger audit\)",
    ),
    "memtree's tables and another table": (
        lambda folder: memtree_file(folder / "m.db", "CREATE TABLE users (name TEXT)"),
        r"objects memtree did not make \(table users\)",
    ),
}


def _written(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("case", list(ODD_FILES))
def test_files_that_are_not_memtree_memories_are_refused_byte_identical(tmp_path: Path, case: str) -> None:
    make, message = ODD_FILES[case]
    path = make(tmp_path)
    before = fingerprint(tmp_path)
    with pytest.raises(IncompatibleStoreError, match=message):
        SQLiteBackend(path)
    with pytest.raises(ValueError, match=message):  # IncompatibleStoreError is a ValueError
        open_memory(path)
    assert fingerprint(tmp_path) == before


def _checkpoint_one_then_leave_one_in_the_wal(path: Path) -> None:
    """A memory file with one checkpointed insert and a second one that only its WAL
    holds: a child process inserted it and exited without closing (as if killed)."""
    with open_memory(path) as memory:
        memory.add("checkpointed")
    code = (
        "import os, sys\n"
        "from memtree import HashingEmbedder, MemTree, MemTreeConfig\n"
        "memory = MemTree.open(sys.argv[1], embedder=HashingEmbedder(32), config=MemTreeConfig(theta0=0.2))\n"
        "memory.add('acknowledged, then killed')\n"
        "os._exit(0)\n"
    )
    subprocess.run([sys.executable, "-c", code, str(path)], check=True, env=CHILD_ENV)


def test_a_memtree_file_whose_last_insert_is_only_in_the_wal_opens_with_it(tmp_path: Path) -> None:
    path = tmp_path / "memory.db"
    _checkpoint_one_then_leave_one_in_the_wal(path)
    assert Path(f"{path}-wal").stat().st_size > 0
    Path(f"{path}-shm").unlink()  # the check reads a copy; the store then recovers the WAL
    with open_memory(path) as memory:
        assert sorted(leaf.text for leaf in memory.leaves()) == ["acknowledged, then killed", "checkpointed"]
        assert memory.check_integrity() == []


def test_a_wal_index_locked_by_another_process_is_read_from_a_copy(tmp_path: Path) -> None:
    """A process opening or recovering the WAL holds the -shm's DMS byte exclusively
    (and a killed writer's successor may): reading in place then fails with
    SQLITE_PROTOCOL, which says nothing about the file; the check reads a copy."""
    path = tmp_path / "memory.db"
    _checkpoint_one_then_leave_one_in_the_wal(path)
    shm = Path(f"{path}-shm")
    assert Path(f"{path}-wal").stat().st_size > 0 and shm.exists()
    holder = (  # an exclusive POSIX lock on byte 128 (the DMS slot), held until stdin closes
        "import fcntl, os, sys\n"
        "fd = os.open(sys.argv[1], os.O_RDWR)\n"
        "fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 128)\n"
        "print('locked', flush=True)\n"
        "sys.stdin.read()\n"
    )
    with subprocess.Popen(
        [sys.executable, "-c", holder, str(shm)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    ) as child:
        assert child.stdout is not None and child.stdout.readline() == b"locked\n"
        in_place = sqlite3.connect(f"file:{path}?mode=ro&readonly_shm=1", uri=True)
        with pytest.raises(sqlite3.OperationalError, match="locking protocol"):
            in_place.execute("PRAGMA page_count").fetchone()
        in_place.close()
        assert sqlite.inspect(path, sqlite.SQLITE_MIGRATIONS) == sqlite.SQLITE_MIGRATIONS[-1].version
        assert child.stdin is not None
        child.stdin.close()
    with open_memory(path) as memory:
        assert sorted(leaf.text for leaf in memory.leaves()) == ["acknowledged, then killed", "checkpointed"]


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
        versions = connection.execute("SELECT version FROM memtree_schema ORDER BY version").fetchall()
        assert versions == [(1,), (2,), (3,)]
    connection.close()


def test_bad_paths_say_what_to_pass(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="MemoryBackend"):
        SQLiteBackend(":memory:")
    with pytest.raises(IsADirectoryError, match="is a folder"):
        SQLiteBackend(tmp_path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        SQLiteBackend(tmp_path / "missing" / "memory.db")


def test_migrations_run_once_in_order_and_keep_the_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "memory.db"
    with open_memory(path) as memory:
        leaf = memory.add("kept across the upgrade", metadata={"k": 1})
    latest = sqlite.SQLITE_MIGRATIONS[-1].version
    upgrade = Migration(
        latest + 1, "index leaves by source id", ("CREATE INDEX memtree_nodes_source ON memtree_nodes (source_id)",)
    )
    monkeypatch.setattr(sqlite, "SQLITE_MIGRATIONS", (*sqlite.SQLITE_MIGRATIONS, upgrade))
    for _ in range(2):  # the second open finds nothing to do
        with open_memory(path) as memory:
            assert memory.get(leaf).metadata == {"k": 1} and memory.check_integrity() == []
    with sqlite3.connect(path) as connection:
        versions = connection.execute("SELECT version FROM memtree_schema ORDER BY version").fetchall()
        assert [row[0] for row in versions] == list(range(1, latest + 2))
        indexes = {row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
        assert "memtree_nodes_source" in indexes
    connection.close()
    monkeypatch.undo()  # an older memtree meets the upgraded file
    with pytest.raises(IncompatibleStoreError, match=f"version {latest + 1}"):
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
        memory = MemTree(store=SQLiteBackend(path, busy_timeout=0.1), embedder=HashingEmbedder(32), config=CONFIG)
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
        assert isinstance(memory.store, SQLiteBackend) and memory.namespace == ("users", "ada")
        memory.add("Ada likes tea.")
    with pytest.raises(RuntimeError, match="is closed"):
        memory.store.head(memory.namespace)
    memory.close()  # closing twice is fine
    with pytest.raises(TypeError, match=r"MemTree\(store=\.\.\.\)"):
        MemTree.open(tmp_path / "memory.db", store=SQLiteBackend(tmp_path / "other.db"))


def test_a_store_passed_in_stays_open(tmp_path: Path) -> None:
    store = SQLiteBackend(tmp_path / "memory.db")
    MemTree(store=store, embedder=HashingEmbedder(32), config=CONFIG).close()
    assert store.list_namespaces() == []
    store.close()


def test_bad_arguments_to_open_close_the_store_again(tmp_path: Path) -> None:
    with pytest.raises(TypeError):
        MemTree.open(tmp_path / "memory.db", embedder="not an embedder")
    with pytest.raises(TypeError, match="file path or a postgresql:// DSN"):
        MemTree.open(42)  # type: ignore[arg-type]


def test_as_store_opens_a_path_and_owns_it(tmp_path: Path) -> None:
    for location in (str(tmp_path / "a.db"), tmp_path / "b.db"):
        store, owned = as_store(location)
        assert isinstance(store, SQLiteBackend) and owned
        assert store.path == Path(location) and store.path.exists()
        store.close()


def test_as_store_takes_a_store_as_given_and_makes_an_in_memory_one_for_none(tmp_path: Path) -> None:
    given = SQLiteBackend(tmp_path / "memory.db")
    assert as_store(given) == (given, False)  # the caller's to close
    given.close()
    store, owned = as_store(None)
    assert isinstance(store, MemoryBackend) and not owned


def test_as_store_refuses_other_kinds_naming_what_it_accepts(tmp_path: Path) -> None:
    for value in (42, b"memory.db", ["memory.db"], MemoryBackend):
        with pytest.raises(TypeError, match=r"store must be a Store .*a SQLite file path or a postgresql:// DSN, got"):
            as_store(value)  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


def test_as_store_opens_a_postgres_dsn_and_owns_it(postgres_dsn: str) -> None:
    store, owned = as_store(postgres_dsn)
    assert isinstance(store, PostgresBackend) and owned
    store.close()


# -- PostgreSQL ------------------------------------------------------------------------------


def test_open_with_a_dsn_makes_a_postgres_store(postgres_dsn: str) -> None:
    for dsn in (postgres_dsn, postgres_dsn.replace("postgresql://", "postgres://", 1)):
        with open_memory(dsn, namespace="pg") as memory:
            assert isinstance(memory.store, PostgresBackend)
            memory.add("stored in PostgreSQL")
            assert "127.0.0.1" in repr(memory.store)


def test_postgres_refuses_a_newer_schema_and_foreign_tables(postgres_server) -> None:  # type: ignore[no-untyped-def]
    import psycopg

    newer = postgres_server.create_database()
    PostgresBackend(newer).close()
    with psycopg.connect(newer, autocommit=True) as connection:
        connection.execute("INSERT INTO memtree_schema VALUES (7, 'from the future', 0)")
    with pytest.raises(IncompatibleStoreError, match=r"schema version 7.*upgrade"):
        PostgresBackend(newer)

    foreign = postgres_server.create_database()
    with psycopg.connect(foreign, autocommit=True) as connection:
        connection.execute("CREATE TABLE memtree_nodes (x int)")
    with pytest.raises(IncompatibleStoreError, match="memtree_nodes exist but were not made by memtree"):
        PostgresBackend(foreign)
    with psycopg.connect(foreign, autocommit=True) as connection:
        assert connection.execute("SELECT to_regclass('memtree_schema')").fetchone()[0] is None  # nothing created


def test_postgres_writers_time_out_clearly(postgres_dsn: str) -> None:
    holder_store = PostgresBackend(postgres_dsn)
    store = PostgresBackend(postgres_dsn, lock_timeout=0.2)
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
        PostgresBackend(f"postgresql://nobody:secret@127.0.0.1:{port}/memory")


def test_without_psycopg_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)
    with pytest.raises(ImportError, match=r"pip install 'memtree-llm\[postgres\]'"):
        PostgresBackend("postgresql://localhost/memory")
