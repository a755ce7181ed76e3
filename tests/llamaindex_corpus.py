"""A small corpus and memories for the LlamaIndex adapter tests.

Three topics whose documents share words within a topic and hardly across, so the
(feature-hashing, lexical) test embedder groups them into a tree with summaries.
"""

from __future__ import annotations

from llama_index.core import Document
from llama_index.core.embeddings import BaseEmbedding
from llama_index.core.node_parser import SentenceSplitter

from memtree import HashingEmbedder, MemTree, MemTreeConfig

DOCUMENTS = {
    "dog-1": "Maya adopted a rescue greyhound called Pepper. Pepper the greyhound is scared of bicycles.",
    "dog-2": "Maya walks Pepper the greyhound every morning. Pepper the greyhound loves the river path.",
    "dog-3": "Pepper the greyhound got a new red collar from Maya. Maya bought Pepper a greyhound coat.",
    "ramen-1": "Leo ate tonkotsu ramen in Kyoto. The ramen broth in Kyoto was rich and creamy.",
    "ramen-2": "Leo learned to make ramen noodles at home. His ramen noodles need a long rest.",
    "hike-1": "Ana hiked the Rota Vicentina trail in Portugal. The trail follows the Atlantic cliffs.",
    "hike-2": "Ana packed blister plasters for the long trail. The cliffs trail ends in a fishing village.",
}


def documents(**metadata: object) -> list[Document]:
    """The corpus as documents with stable ids and a ``topic`` metadata field."""
    return [
        Document(
            text=text,
            doc_id=doc_id,
            metadata={"topic": doc_id.split("-")[0], **metadata},
            # kept out of chunk texts, so the splitter cuts at sentences
            excluded_embed_metadata_keys=["topic", *metadata],
            excluded_llm_metadata_keys=["topic", *metadata],
        )
        for doc_id, text in DOCUMENTS.items()
    ]


def sentence_splitter() -> SentenceSplitter:
    """Splits each document into one node per sentence (both are short)."""
    return SentenceSplitter(chunk_size=16, chunk_overlap=0)


def make_memory() -> MemTree:
    """Lexical embeddings, a low fixed θ0 (topics group) and no deduplication."""
    return MemTree(embedder=HashingEmbedder(256), config=MemTreeConfig(theta0=0.2, deduplicate=False))


class WordsEmbedding(BaseEmbedding):
    """A LlamaIndex embedding model that tells texts apart (feature hashing, offline)."""

    def _get_text_embedding(self, text: str) -> list[float]:
        return HashingEmbedder(64).embed([text])[0].tolist()

    def _get_query_embedding(self, query: str) -> list[float]:
        return self._get_text_embedding(query)

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return self._get_text_embedding(query)
