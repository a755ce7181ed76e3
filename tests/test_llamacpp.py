"""The local llama.cpp chat model: bad model paths fail at construction and store nothing;
a real small GGUF model (``MEMTREE_TEST_GGUF``, e.g. SmolLM2-135M-Instruct) writes
guarded summaries, honours the token cap and the timeout."""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path

import pytest
from cli_runner import memtree, refused

from memtree import ROOT_ID, HashingEmbedder, LLMAggregator, MemTree, MemTreeConfig
from memtree.models.llamacpp import LlamaCppChatModel, check_gguf
from memtree.models.resolve import resolve_chat_model
from memtree.retry import RetryPolicy

MODEL_ENV = "MEMTREE_TEST_GGUF"
MODEL_PATH = os.environ.get(MODEL_ENV, "")


def real_model_missing() -> str | None:
    if importlib.util.find_spec("llama_cpp") is None:
        return "llama-cpp-python is not installed (pip install 'memtree-llm[llamacpp]')"
    if not MODEL_PATH:
        return f"no test model: set {MODEL_ENV} to a small chat GGUF file (e.g. SmolLM2-135M-Instruct, 98 MB)"
    if not Path(MODEL_PATH).is_file():
        return f"{MODEL_ENV}={MODEL_PATH} is not a file"
    return None


needs_model = pytest.mark.skipif(real_model_missing() is not None, reason=real_model_missing() or "")


def test_a_missing_model_file_fails_before_a_memory_file_is_made(tmp_path: Path) -> None:
    db = tmp_path / "memory.db"
    missing = tmp_path / "nowhere" / "model.gguf"
    expected = re.escape(f"no GGUF model at {missing}: pass the path of a .gguf file")
    with pytest.raises(FileNotFoundError, match=expected):
        MemTree.open(db, embedder=HashingEmbedder(), llm=f"llama-cpp:{missing}")
    assert not db.exists()


def test_a_file_that_is_not_gguf_is_refused_with_its_first_bytes(tmp_path: Path) -> None:
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"PK\x03\x04 a zip, not a model")
    with pytest.raises(ValueError, match=r"is not a GGUF model file \(it starts with b'PK\\x03\\x04', not b'GGUF'\)"):
        LlamaCppChatModel(fake)
    with pytest.raises(ValueError, match=re.escape("is a folder; pass the path of the .gguf model file inside it")):
        check_gguf(tmp_path)
    with pytest.raises(ValueError, match="llm='llama-cpp:' needs the model file"):
        resolve_chat_model("llama-cpp:")


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="llama-cpp-python is not installed")
def test_a_damaged_gguf_file_is_refused_by_llama_cpp_with_its_name(tmp_path: Path) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF\x03\x00\x00\x00 then garbage")
    with pytest.raises(ValueError, match=re.escape(f"llama.cpp could not load {broken}")):
        LlamaCppChatModel(broken, n_threads=1)


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is not None, reason="llama-cpp-python is installed")
def test_without_llama_cpp_the_error_names_the_extra(tmp_path: Path) -> None:
    header_only = tmp_path / "model.gguf"
    header_only.write_bytes(b"GGUF\x03\x00\x00\x00")
    with pytest.raises(ImportError, match=r"pip install 'memtree-llm\[llamacpp\]'"):
        LlamaCppChatModel(header_only)


def test_cli_refuses_a_bad_llm_and_stores_nothing(tmp_path: Path) -> None:
    db = tmp_path / "memory.db"
    refused(
        memtree("add", "--llm", f"llama-cpp:{tmp_path / 'none.gguf'}", "Maya got the job.", db=db), "no GGUF model at"
    )
    refused(memtree("add", "--llm", "llama:model.gguf", "Maya got the job.", db=db), "unknown --llm 'llama:model.gguf'")
    assert not db.exists()


@pytest.fixture(scope="module")
def model() -> LlamaCppChatModel:
    return LlamaCppChatModel(MODEL_PATH, n_threads=1, max_tokens=32, n_ctx=2048)


@needs_model
def test_the_real_model_answers_within_the_token_cap(model: LlamaCppChatModel) -> None:
    completion = model.complete("Name one colour of the sky.")
    assert completion.text.strip()
    assert completion.completion_tokens is not None and 0 < completion.completion_tokens <= 32
    assert completion.prompt_tokens is not None and completion.prompt_tokens > 0
    capped = LlamaCppChatModel(MODEL_PATH, n_threads=1, max_tokens=3, n_ctx=512)
    short = capped.complete("Write a long story about a dragon who learns to cook.")
    assert short.truncated and short.completion_tokens == 3


@needs_model
def test_a_call_past_its_timeout_stops_and_leaves_the_summary_stale(model: LlamaCppChatModel) -> None:
    slow = LlamaCppChatModel(
        MODEL_PATH, n_threads=1, max_tokens=48, n_ctx=2048, retry=RetryPolicy(max_attempts=1, timeout=0.001)
    )
    with pytest.raises(TimeoutError, match=r"LlamaCppChatModel\(.*\) took longer than its timeout"):
        slow.complete("Name one colour of the sky.")
    memory = MemTree(embedder=HashingEmbedder(64), llm=slow, config=MemTreeConfig(theta0=-1.0))
    memory.add("Maya adopted a greyhound called Pixel.")
    memory.add("Maya walks Pixel in Regent's Park every morning.")
    assert len(memory.leaves()) == 2 and memory.stats().stale == 1


@needs_model
def test_a_memory_written_by_the_real_model_keeps_only_summaries_that_pass_the_guards(
    model: LlamaCppChatModel,
) -> None:
    memory = MemTree(embedder=HashingEmbedder(64), aggregator=LLMAggregator(model), config=MemTreeConfig(theta0=-1.0))
    texts = [
        "14 January 2024 Maya: I started a pottery class at the community center.",
        "22 February 2024 Maya: I got the job at Google as a designer!",
        "3 March 2024 Maya: My sister Rosa visited from Lisbon for 5 days.",
    ]
    for text in texts:
        memory.add(text)
    stats = memory.stats()
    checked = stats.extra["summaries_checked"]
    guards = sum(value for name, value in stats.extra.items() if name.startswith("summary_guard_"))
    retries, fallbacks = stats.extra.get("summary_retries", 0), stats.extra.get("summary_fallbacks", 0)
    restored = stats.extra.get("summary_dates_restored", 0)
    assert checked == stats.llm_calls + retries > 0  # one reply per merge, and one per retry
    # A rejected reply is mended (only its date was missing), or asked for again, then falls back.
    assert guards == restored + retries + fallbacks <= checked
    assert stats.stale == 0 and stats.aggregation_failures == 0
    assert sorted(node.text for node in memory.leaves()) == sorted(texts)
    for node in memory.walk():
        if node.id != ROOT_ID and not node.is_leaf:
            assert node.text.strip()


def test_a_call_queued_behind_a_long_one_gets_its_whole_timeout() -> None:
    # A deferred flush hands the one llama.cpp context a session's summaries at once:
    # a call that waits its turn longer than the timeout must still run, and the
    # timeout counts from when it gets the model (counting the wait failed most of a
    # LoCoMo flush's calls). No model file needed: the context is a stand-in.
    import threading
    from types import SimpleNamespace

    first_started, release_first = threading.Event(), threading.Event()

    def create_chat_completion(**options: object) -> list[dict[str, object]]:
        if not first_started.is_set():
            first_started.set()
            release_first.wait(30)  # the first call holds the model until released
        return [{"choices": [{"delta": {"content": "ok"}, "finish_reason": "stop"}]}]

    model = object.__new__(LlamaCppChatModel)
    model.path = Path("stand-in.gguf")
    model.model, model.max_tokens, model.temperature, model.system_prompt = "stand-in.gguf", 8, 0.0, None
    model.retry = RetryPolicy(max_attempts=1, timeout=0.05)
    model._llama = SimpleNamespace(create_chat_completion=create_chat_completion, tokenize=lambda text, add_bos: [1])
    model._lock = threading.Lock()
    replies: list[str] = []
    first = threading.Thread(target=lambda: replies.append(model._complete("first", None).text))
    first.start()
    assert first_started.wait(30)
    second = threading.Thread(target=lambda: replies.append(model._complete("second", 0.05).text))
    second.start()
    second.join(0.3)  # queued longer than its 0.05 s timeout
    assert second.is_alive()  # still waiting for the model, not failed
    release_first.set()
    first.join(30)
    second.join(30)
    assert replies == ["ok", "ok"]


@needs_model
def test_n_threads_also_bounds_the_threads_that_read_the_prompt(model: LlamaCppChatModel) -> None:
    # llama-cpp-python reads prompts on every core unless told; two single-thread
    # processes on two cores then spun four threads and ran 3-4x slower
    assert model._llama.context_params.n_threads == 1
    assert model._llama.context_params.n_threads_batch == 1
    chosen = LlamaCppChatModel(MODEL_PATH, n_threads=1, n_ctx=512, model_options={"n_threads_batch": 2})
    assert chosen._llama.context_params.n_threads_batch == 2
