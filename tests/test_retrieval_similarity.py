"""``RetrievedNode.similarity``: the plain cosine of each result with the query,
whatever the ranking (hybrid or not, collapsed or traversal)."""

from __future__ import annotations

import numpy as np
import pytest

from memtree import HashingEmbedder, MemTree, MemTreeConfig

TEXTS = [
    "Maya adopted a rescue greyhound called Pepper.",
    "Pepper the greyhound is scared of bicycles.",
    "Leo ate tonkotsu ramen in Kyoto.",
    "The ramen broth in Kyoto was rich and creamy.",
    "Ana hiked the Rota Vicentina trail in Portugal.",
]


@pytest.mark.parametrize("mode", ["collapsed", "traversal"])
@pytest.mark.parametrize("lexical_weight", [0.0, 0.3])
def test_each_result_carries_its_cosine_with_the_query(mode: str, lexical_weight: float) -> None:
    embedder = HashingEmbedder(64)
    memory = MemTree(embedder=embedder, config=MemTreeConfig(theta0=0.2))
    memory.add_many(TEXTS)
    question = "Is Pepper the greyhound scared of bicycles?"
    hits = memory.retrieve(question, k=6, mode=mode, lexical_weight=lexical_weight)
    assert hits
    query = embedder.embed([question])[0]
    for hit in hits:
        vector = embedder.embed([hit.text])[0]
        assert hit.similarity == pytest.approx(float(np.dot(query, vector)), abs=1e-5)
    if lexical_weight > 0:
        assert any(hit.score != pytest.approx(hit.similarity) for hit in hits)  # the ranking is hybrid
