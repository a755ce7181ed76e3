"""Embedders: the offline local model and the hashing embedder."""

from __future__ import annotations

import numpy as np
import pytest

from memtree import HashingEmbedder, LocalEmbedder, MemTree, MemTreeConfig
from memtree.embed import Embedder, check_embeddings


@pytest.mark.slow
def test_local_embedder_is_offline_normalized_and_semantic(local_embedder: LocalEmbedder) -> None:
    vectors = local_embedder.embed(["A kitten is sleeping.", "A small cat naps.", "Bond yields rose sharply."])
    assert vectors.shape == (3, 384) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2] + 0.3
    assert local_embedder.dimension == 384
    assert "all-MiniLM-L6-v2" in local_embedder.name


@pytest.mark.slow
def test_memory_with_local_embedder_finds_paraphrases(local_embedder: LocalEmbedder) -> None:
    memory = MemTree(embedder=local_embedder, config=MemTreeConfig(theta0=0.4))
    memory.add_many(
        [
            "My sister got married in a vineyard last September.",
            "I repaired the brakes on my mountain bike.",
            "Our team shipped the new billing service on Friday.",
        ]
    )
    top = memory.retrieve("wedding", k=1, leaves_only=True)[0]
    assert "married" in top.text


def test_hashing_embedder_is_deterministic_and_word_sensitive() -> None:
    a, b = HashingEmbedder(128), HashingEmbedder(128)
    x = a.embed(["the red fox", "the red fox", "quantum physics lecture"])
    np.testing.assert_array_equal(x, b.embed(["the red fox", "the red fox", "quantum physics lecture"]))
    np.testing.assert_allclose(np.linalg.norm(x, axis=1), 1.0, atol=1e-6)
    assert x[0] @ x[1] == pytest.approx(1.0)
    assert x[0] @ x[2] < 0.5
    assert np.isfinite(a.embed(["!!!"])).all()
    with pytest.raises(ValueError):
        HashingEmbedder(2)


def test_check_embeddings_normalizes_and_names_problems() -> None:
    rows = check_embeddings([[3.0, 4.0]], 1, None, "X")
    np.testing.assert_allclose(rows, [[0.6, 0.8]])
    with pytest.raises(ValueError, match="embedding dimension 2 does not match this memory's 3"):
        check_embeddings([[3.0, 4.0]], 1, 3, "X")
    with pytest.raises(ValueError, match="not a numeric array"):
        check_embeddings([["a", "b"]], 1, None, "X")


def test_the_local_embedder_runs_on_the_callers_thread() -> None:
    """A local model's arithmetic is not handed to a helper thread with a timeout:
    the thread could not stop it, and numpy's BLAS there ignored the encoder's
    one-thread limit (350-550 ms of CPU per short text on a busy machine, not 15)."""
    import threading

    class Spy(LocalEmbedder):  # the local embedder's settings, vectors from hashing
        def __init__(self) -> None:
            super().__init__()
            self.threads: set[int] = set()
            self.hashing = HashingEmbedder(64)

        @property
        def dimension(self) -> int:
            return 64

        def embed(self, texts):  # type: ignore[no-untyped-def]
            self.threads.add(threading.get_ident())
            return self.hashing.embed(texts)

        def embed_query(self, text):  # type: ignore[no-untyped-def]
            return self.embed([text])[0]

        def embed_parts(self, texts, parts):  # type: ignore[no-untyped-def]
            return Embedder.embed_parts(self, texts, parts)  # through embed, which records the thread

    spy = Spy()
    memory = MemTree(embedder=spy, config=MemTreeConfig(theta0=0.0, min_similarity=None))  # hashing's scale
    memory.add("Maya adopted a greyhound called Pixel. Pixel is afraid of thunder.")
    memory.add("Maya walks Pixel in Regent's Park every morning.")
    assert memory.retrieve("Who is Pixel?", k=1)
    assert spy.threads == {threading.get_ident()}
