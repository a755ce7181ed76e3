"""A throwaway PostgreSQL server for tests and benchmarks, from the system's binaries.

``initdb`` + ``pg_ctl`` in a temporary folder, listening on a free loopback port
(and a Unix socket inside that folder), stopped and deleted afterwards. initdb
refuses to run as root, so under uid 0 (CI containers) the server runs as the
``postgres`` system user via ``runuser``.

Used by the ``postgres_server`` / ``postgres_dsn`` fixtures in ``conftest.py``;
adapter tests reuse those fixtures.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path


class PostgresUnavailable(RuntimeError):
    """No server can be started here; the message says why (tests skip with it)."""


def find_binaries() -> Path:
    """The folder holding ``initdb`` and ``pg_ctl`` (PATH first, then Debian's layout)."""
    initdb = shutil.which("initdb")
    if initdb and shutil.which("pg_ctl"):
        return Path(initdb).resolve().parent
    for folder in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if (Path(folder) / "initdb").exists() and (Path(folder) / "pg_ctl").exists():
            return Path(folder)
    raise PostgresUnavailable(
        "PostgreSQL server binaries (initdb, pg_ctl) not found; install them with "
        "`apt-get install postgresql` (.ci/run does)"
    )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class PostgresServer:
    """One running server; ``dsn(dbname)`` gives a connection string for a database on it."""

    def __init__(self, *, fsync: bool = False) -> None:
        self.bin = find_binaries()
        self.as_root = os.geteuid() == 0
        if self.as_root and shutil.which("runuser") is None:
            raise PostgresUnavailable("running as root and `runuser` is missing, so initdb cannot run")
        self.folder = Path(tempfile.mkdtemp(prefix="memtree-pg-"))
        self.data = self.folder / "data"
        self.port = 0
        self.user = "postgres"
        self.fsync = fsync
        self._running = False
        if self.as_root:
            shutil.chown(self.folder, "postgres", "postgres")
            self.folder.chmod(0o700)

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        command = [str(self.bin / args[0]), *args[1:]]
        if self.as_root:
            command = ["runuser", "-u", "postgres", "--", *command]
        return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)

    def start(self) -> PostgresServer:
        init = self._run("initdb", "-D", str(self.data), "-U", self.user, "-A", "trust", "-E", "UTF8", "--no-sync")
        if init.returncode != 0:
            raise PostgresUnavailable(f"initdb failed: {init.stderr.strip() or init.stdout.strip()}")
        options = [
            f"-c unix_socket_directories={self.folder}",
            "-c listen_addresses=127.0.0.1",
            "-c max_connections=100",
        ]
        if not self.fsync:  # a test server: durability of the server itself is not under test
            options += ["-c fsync=off", "-c synchronous_commit=off", "-c full_page_writes=off"]
        last_error = ""
        for _ in range(5):  # another process may take the free port before the server does
            self.port = _free_port()
            started = self._run(
                "pg_ctl", "-D", str(self.data), "-l", str(self.folder / "server.log"), "-w", "-t", "60",
                "-o", " ".join([f"-p {self.port}", *options]), "start",
            )  # fmt: skip
            if started.returncode == 0:
                self._running = True
                return self
            last_error = started.stderr.strip() or started.stdout.strip()
        raise PostgresUnavailable(f"pg_ctl could not start a server: {last_error}")

    def dsn(self, dbname: str = "postgres") -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{dbname}"

    def create_database(self) -> str:
        """A new empty database; returns its DSN."""
        import psycopg

        name = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.dsn(), autocommit=True) as connection:
            connection.execute(f'CREATE DATABASE "{name}"')
        return self.dsn(name)

    def stop(self) -> None:
        if self._running:
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
            self._running = False
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
