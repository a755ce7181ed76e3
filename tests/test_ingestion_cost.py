"""What an insert embeds: each text once, and nothing it already has a vector for."""

from __future__ import annotations

from collections.abc import Sequence

from memtree import Aggregator, ExtractiveAggregator, HashingEmbedder, MemTree, MemTreeConfig
from memtree.embed import Matrix
from memtree.node import Vector


class RecordingEmbedder(HashingEmbedder):
    """Hashing vectors; remembers every text it was asked to embed, per call."""

    def __init__(self) -> None:
        super().__init__(64)
        self.calls: list[list[str]] = []

    def embed(self, texts: Sequence[str]) -> Matrix:
        self.calls.append(list(texts))
        return super().embed(texts)


class KeepsTheFirstText(Aggregator):
    """A summary that never changes once written: the first text it was given."""

    def aggregate(self, summary: str, new_texts: Sequence[str], count: int, *, centroid: Vector | None = None) -> str:
        return summary or new_texts[0]

    @property
    def calls_model(self) -> bool:
        return False


def test_a_summary_whose_text_did_not_change_is_not_embedded_again() -> None:
    embedder = RecordingEmbedder()
    memory = MemTree(embedder=embedder, aggregator=KeepsTheFirstText(), config=MemTreeConfig(theta0=-1.0))
    texts = [f"note {i} about the harbour and its {i} boats" for i in range(10)]
    for text in texts:
        memory.add(text)
    assert memory.stats().max_depth >= 5  # θ0 = -1: every text descends, a long chain of summaries
    # Each insert embeds its leaf and the summary made by splitting a leaf; the
    # summaries above, whose texts stay the same, keep their embeddings.
    assert sum(len(call) for call in embedder.calls) == 1 + 2 * (len(texts) - 1)
    assert memory.check_integrity() == []


def test_a_one_sentence_leaf_lends_its_vector_to_the_summarizer() -> None:
    embedder = RecordingEmbedder()
    aggregator = ExtractiveAggregator(max_words=6, min_words=6)
    memory = MemTree(embedder=embedder, aggregator=aggregator, config=MemTreeConfig(theta0=-1.0))
    for i in range(8):
        memory.add(f"Dana's bees visited garden number {i} today.")
    assert aggregator.embedding_calls == 0  # every candidate sentence was a leaf, embedded once
    embedded = [text for call in embedder.calls for text in call]
    leaves = [node.text for node in memory.leaves()]
    assert all(embedded.count(text) == 1 for text in leaves)


def test_a_longer_text_s_sentences_go_in_the_leaf_s_call() -> None:
    embedder = RecordingEmbedder()
    memory = MemTree(embedder=embedder, config=MemTreeConfig(theta0=-1.0))
    memory.add("The ferry left at noon. It reached the island by two.")
    assert embedder.calls[0] == [
        "The ferry left at noon. It reached the island by two.",
        "The ferry left at noon.",
        "It reached the island by two.",
    ]
