"""LangChain and LlamaIndex models passed straight to MemTree, the plain-callable
chat model, and the resolver's errors for anything else."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
from langchain_core.embeddings import DeterministicFakeEmbedding
from langchain_core.language_models import FakeListChatModel, GenericFakeChatModel
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.prompts import PromptTemplate
from llama_index.core.embeddings import MockEmbedding
from llama_index.core.llms import MockLLM

from memtree import ROOT_ID, Aggregator, ExtractiveAggregator, HashingEmbedder, LLMAggregator, MemTree, MemTreeConfig
from memtree.llm import CallableChatModel, ChatModel, Completion
from memtree.model_usage import recording
from memtree.models import (
    LangChainChatModel,
    LangChainEmbedder,
    LlamaIndexChatModel,
    LlamaIndexEmbedder,
    resolve_chat_model,
    resolve_embedder,
)
from memtree.retry import ModelResponseError, RetryPolicy
from memtree.stats import Counters

DEEP = MemTreeConfig(theta0=-1.0, near_duplicate=1.0)
TEXTS = ["tea with lemon", "tea with honey", "tea with milk", "coffee black"]
FAST = RetryPolicy(max_attempts=3, initial_delay=0.0, timeout=10.0)


def summaries(memory: MemTree) -> list[str]:
    return [node.text for node in memory.walk() if node.id != ROOT_ID and not node.is_leaf]


def test_langchain_models_work_as_passed() -> None:
    replies = [f"summary {i}" for i in range(20)]
    memory = MemTree(
        embedder=DeterministicFakeEmbedding(size=32),
        llm=FakeListChatModel(responses=replies),
        config=DEEP,
    )
    assert isinstance(memory.embedder, LangChainEmbedder)
    assert isinstance(memory.aggregator, LLMAggregator) and isinstance(memory.aggregator.model, LangChainChatModel)
    for text in TEXTS:
        memory.add(text)
    assert len(memory) == 4 and memory.check_integrity() == []
    assert summaries(memory) and set(summaries(memory)) <= set(replies)
    stats = memory.stats()
    assert stats.llm_calls == stats.extra["llm_requests"] > 0
    vector = DeterministicFakeEmbedding(size=32).embed_documents([TEXTS[0]])[0]
    np.testing.assert_allclose(memory.get(memory.leaves()[0].id).embedding, vector / np.linalg.norm(vector), atol=1e-6)
    assert memory.retrieve(TEXTS[2], k=1)[0].text == TEXTS[2]


def test_langchain_usage_metadata_reaches_stats() -> None:
    messages = iter(
        AIMessage(content=f"merged {i}", usage_metadata={"input_tokens": 10, "output_tokens": 2, "total_tokens": 12})
        for i in range(100)
    )
    memory = MemTree(embedder=HashingEmbedder(32), llm=GenericFakeChatModel(messages=messages), config=DEEP)
    for text in TEXTS:
        memory.add(text)
    stats = memory.stats()
    assert stats.llm_calls > 0
    assert (stats.prompt_tokens, stats.completion_tokens) == (10 * stats.llm_calls, 2 * stats.llm_calls)


def test_a_langchain_runnable_chain_is_accepted() -> None:
    chain = (
        PromptTemplate.from_template("{prompt}") | FakeListChatModel(responses=["chained summary"]) | StrOutputParser()
    )
    model = resolve_chat_model(chain)
    assert isinstance(model, LangChainChatModel)
    assert model.complete("anything").text == "chained summary"


def test_a_runnable_that_returns_no_text_fails_at_once_and_leaves_the_summaries_stale() -> None:
    from langchain_core.runnables import RunnableLambda

    calls: list[str] = []

    def numbers(prompt: str) -> int:
        calls.append(prompt)
        return 42

    model = LangChainChatModel(RunnableLambda(numbers), retry=FAST)
    with pytest.raises(TypeError, match="returned int, which holds no text; end the runnable with a chat model"):
        model.complete("merge these")
    assert len(calls) == 1  # not retried: it would return a number every time
    memory = MemTree(embedder=HashingEmbedder(32), llm=RunnableLambda(numbers), config=DEEP)
    memory.add_many(TEXTS[:3])
    assert len(memory) == 3 and memory.stats().stale > 0


class FlakyChatModel(BaseChatModel):
    """A LangChain chat model that times out, then answers empty, then answers."""

    calls: int = 0

    @property
    def _llm_type(self) -> str:
        return "flaky"

    def _generate(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **_: Any) -> ChatResult:
        self.calls += 1
        if self.calls == 1:
            raise TimeoutError("provider timed out")
        text = "" if self.calls == 2 else "finally a summary"
        return ChatResult(generations=[ChatGeneration(message=AIMessage(content=text))])


def test_langchain_failures_are_retried_by_the_shared_policy() -> None:
    flaky = FlakyChatModel()
    model = LangChainChatModel(flaky, retry=FAST)
    counters = Counters()
    with recording(counters):
        assert model.complete("merge these").text == "finally a summary"
    assert flaky.calls == 3 and counters.get("retries") == 2 and counters.get("llm_requests") == 3


async def test_langchain_async_paths() -> None:
    memory = MemTree(
        embedder=DeterministicFakeEmbedding(size=32),
        llm=FakeListChatModel(responses=[f"async summary {i}" for i in range(20)]),
        config=DEEP,
    )
    ids = await memory.aadd_many(TEXTS)
    assert len(ids) == 4 and memory.stats().stale == 0
    hits = await memory.aretrieve(TEXTS[1], k=1)
    assert hits[0].text == TEXTS[1]
    embedder = LangChainEmbedder(DeterministicFakeEmbedding(size=16))
    np.testing.assert_allclose(await embedder.aembed_query("q"), embedder.embed_query("q"), atol=1e-6)


def test_llamaindex_models_work_as_passed() -> None:
    memory = MemTree(embedder=MockEmbedding(embed_dim=16), llm=MockLLM(max_tokens=8), config=DEEP)
    assert isinstance(memory.embedder, LlamaIndexEmbedder)
    assert isinstance(memory.aggregator, LLMAggregator)
    assert isinstance(memory.aggregator.model, LlamaIndexChatModel)
    for text in TEXTS:
        memory.add(text)
    assert len(memory) == 4 and memory.check_integrity() == []
    # MockEmbedding gives every text the same vector: near-duplicates become siblings.
    assert all(node.depth == 1 for node in memory.leaves())

    model = LlamaIndexChatModel(MockLLM())  # echoes the prompt
    assert model.complete("echo me").text == "echo me"


async def test_llamaindex_async_paths_and_summaries() -> None:
    embedder = LlamaIndexEmbedder(MockEmbedding(embed_dim=8))
    vectors = await embedder.aembed(["a", "b"])
    assert vectors.shape == (2, 8) and np.allclose(np.linalg.norm(vectors, axis=1), 1.0)
    assert (await embedder.aembed_query("q")).shape == (8,)
    memory = MemTree(embedder=HashingEmbedder(32), llm=MockLLM(max_tokens=6), config=DEEP)
    await memory.aadd_many(TEXTS)
    assert summaries(memory) and all(text.strip() for text in summaries(memory))
    assert memory.stats().llm_calls == memory.stats().extra["llm_requests"]


def test_callable_chat_models_sync_and_async() -> None:
    async def shout(prompt: str) -> str:
        await asyncio.sleep(0)
        return prompt.upper()

    model = CallableChatModel(shout)
    assert model.complete("hi").text == "HI"
    assert asyncio.run(model.acomplete("hi")).text == "HI"
    reporting = CallableChatModel(lambda prompt: Completion("ok", prompt_tokens=3, completion_tokens=1))
    counters = Counters()
    with recording(counters):
        reporting.complete("x")
    assert (counters.get("prompt_tokens"), counters.get("completion_tokens")) == (3, 1)
    with pytest.raises(TypeError, match="expected str"):
        CallableChatModel(lambda prompt: 42, retry=FAST).complete("x")  # type: ignore[arg-type,return-value]


def test_a_custom_chat_model_gets_retries_and_empty_reply_checks() -> None:
    class Sometimes(ChatModel):
        retry = FAST

        def __init__(self) -> None:
            self.replies = ["", "  ", "ok"]

        def _complete(self, prompt: str, timeout: float | None) -> Completion:
            return Completion(self.replies.pop(0))

    assert Sometimes().complete("x").text == "ok"
    never = Sometimes()
    never.replies = ["", "", ""]
    with pytest.raises(ModelResponseError, match="empty reply"):
        never.complete("x")


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        (object(), "builtins.object"),
        ("gpt-4o", "str 'gpt-4o'"),
        (42, "builtins.int"),
    ],
)
def test_unknown_llm_objects_are_type_errors_naming_the_supported_kinds(value: object, kind: str) -> None:
    with pytest.raises(TypeError) as caught:
        MemTree(embedder=HashingEmbedder(), llm=value)
    message = str(caught.value)
    for supported in ("memtree ChatModel", "LangChain chat model", "LlamaIndex LLM", "callable", "'openai'"):
        assert supported in message
    assert kind in message


def test_models_passed_in_the_wrong_place_say_where_they_go() -> None:
    with pytest.raises(TypeError, match="pass it as embedder="):
        MemTree(embedder=HashingEmbedder(), llm=DeterministicFakeEmbedding(size=8))
    with pytest.raises(TypeError, match="pass it as aggregator="):
        resolve_chat_model(ExtractiveAggregator())
    with pytest.raises(TypeError, match="pass chat models and prompt -> text callables as llm="):
        MemTree(embedder=HashingEmbedder(), aggregator=FakeListChatModel(responses=["x"]))  # type: ignore[arg-type]
    with pytest.raises(TypeError) as caught:
        MemTree(embedder=FakeListChatModel(responses=["x"]))
    for supported in ("memtree Embedder", "LangChain Embeddings", "LlamaIndex BaseEmbedding", "'openai'", "'local"):
        assert supported in str(caught.value)


def test_names_and_objects_resolve_to_memtree_models() -> None:
    hashing = HashingEmbedder(8)
    assert resolve_embedder(hashing) is hashing
    local = resolve_embedder("local:/models/minilm")
    assert local.name == "LocalEmbedder(/models/minilm)"  # not loaded until used
    assert isinstance(resolve_embedder(MockEmbedding(embed_dim=4)), LlamaIndexEmbedder)
    model = CallableChatModel(lambda prompt: "x")
    assert resolve_chat_model(model) is model
    assert isinstance(LLMAggregator(lambda prompt: "x").model, CallableChatModel)
    assert isinstance(LLMAggregator(MockLLM()).model, LlamaIndexChatModel)
    assert issubclass(LLMAggregator, Aggregator)


def test_importing_memtree_imports_no_model_framework() -> None:
    code = (
        "import sys, memtree, memtree.models\n"
        "loaded = sorted({m.split('.')[0] for m in sys.modules} & {'openai', 'langchain_core', 'llama_index'})\n"
        "print(','.join(loaded))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == ""
