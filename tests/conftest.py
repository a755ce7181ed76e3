"""Shared fixtures: fast deterministic embedders and memories built on them."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence

import numpy as np
import pytest
from openai_server import FakeOpenAIServer

from memtree import ROOT_ID, HashingEmbedder, MemTree, MemTreeConfig
from memtree.embed import Embedder, Matrix

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Tests never reach a real API: a key in the developer's shell would switch the
# default models to OpenAI. Tests that want OpenAI point it at tests/openai_server.py.
for _name in ("OPENAI_API_KEY", "OPENAI_BASE_URL"):
    os.environ.pop(_name, None)


class TableEmbedder(Embedder):
    """Embeds texts by looking them up in a table of hand-built vectors.

    Texts not in the table (summaries written by aggregators) get the normalized sum
    of the vectors of table texts they contain, so parents stay near their members.
    """

    def __init__(self, table: dict[str, Sequence[float]]) -> None:
        self.table = {text: np.asarray(vector, dtype=np.float32) for text, vector in table.items()}
        self.dimension = len(next(iter(self.table.values())))

    def embed(self, texts: Sequence[str]) -> Matrix:
        rows = []
        for text in texts:
            if text in self.table:
                vector = self.table[text]
            else:
                parts = [v for key, v in self.table.items() if key in text]
                if not parts:
                    raise KeyError(f"TableEmbedder has no vector for {text!r}")
                vector = np.sum(parts, axis=0)
            rows.append(vector / np.linalg.norm(vector))
        return np.asarray(rows, dtype=np.float32)


def path_to_root(memory: MemTree, node_id: str) -> list[str]:
    """Ids of a node's ancestors below the root, deepest first."""
    out, node = [], memory.get(node_id)
    while node.parent not in (None, ROOT_ID):
        node = memory.get(node.parent)
        out.append(node.id)
    return out


def unit(*values: float) -> list[float]:
    vector = np.asarray(values, dtype=np.float64)
    return list(vector / np.linalg.norm(vector))


@pytest.fixture
def hashing_memory() -> MemTree:
    """A memory with feature-hashing embeddings, a fixed θ0 and extractive summaries."""
    return MemTree(embedder=HashingEmbedder(64), config=MemTreeConfig(theta0=0.2))


@pytest.fixture
def openai_server() -> Iterator[FakeOpenAIServer]:
    """An OpenAI-compatible server on 127.0.0.1 (see tests/openai_server.py)."""
    with FakeOpenAIServer() as server:
        yield server


@pytest.fixture(scope="session")
def local_embedder():
    """The real offline model (loaded once per test session)."""
    from memtree import LocalEmbedder

    embedder = LocalEmbedder()
    embedder.embed(["warm up"])
    return embedder


@pytest.fixture(scope="session")
def postgres_server():
    """A throwaway PostgreSQL server for the whole session (skips if none can start)."""
    from pg_server import PostgresServer, PostgresUnavailable

    try:
        server = PostgresServer().start()
    except PostgresUnavailable as error:
        pytest.skip(str(error))
    yield server
    server.stop()


@pytest.fixture
def postgres_dsn(postgres_server) -> str:
    """The DSN of a fresh, empty database on the session's PostgreSQL server."""
    return postgres_server.create_database()
