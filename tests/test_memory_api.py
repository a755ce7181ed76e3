"""The MemTree surface: async twins, namespaces, stats, export, source ids."""

from __future__ import annotations

import json

import pytest

from memtree import ROOT_ID, HashingEmbedder, MemoryBackend, MemTree, MemTreeConfig, viz

FACTS = [
    "Dana keeps bees on her roof in Oslo.",
    "Dana's bees made twelve jars of honey.",
    "Eli is learning the cello.",
    "Eli practices cello scales every morning.",
    "Dana sold honey at the Saturday market.",
]


def make(**kw: object) -> MemTree:
    return MemTree(embedder=HashingEmbedder(64), config=MemTreeConfig(theta0=0.15), **kw)  # type: ignore[arg-type]


async def test_async_twins_match_sync_results() -> None:
    sync, other = make(), make()
    for fact in FACTS:
        sync.add(fact)
    for fact in FACTS:
        await other.aadd(fact)
    assert [r.text for r in sync.retrieve("bees honey", k=4)] == [
        r.text for r in await other.aretrieve("bees honey", k=4)
    ]
    ids = await other.aadd_many(["Fay paints murals.", "Fay painted a whale."])
    assert len(ids) == 2 and len(other) == 7
    await other.adelete(ids[0])
    assert len(other) == 6 and other.check_integrity() == []


def test_add_many_keeps_order_metadata_timestamps_and_source_ids() -> None:
    memory = make()
    ids = memory.add_many(
        FACTS,
        metadata=[{"i": i} for i in range(5)],
        timestamps=[f"2024-01-0{i + 1}" for i in range(5)],
        source_ids=[f"msg-{i}" for i in range(5)],
    )
    for i, leaf_id in enumerate(ids):
        node = memory.get(leaf_id)
        assert (node.text, node.metadata, node.source_id) == (FACTS[i], {"i": i}, f"msg-{i}")
        assert node.time is not None and node.time.day == i + 1
    assert memory.find(source_id="msg-3") == [ids[3]]
    assert [n.id for n in memory.leaves()] == ids


def test_summary_timestamp_is_the_latest_below() -> None:
    memory = make()
    memory.add_many(FACTS, timestamps=[1000.0, 5000.0, 2000.0, 3000.0, 4000.0])
    for node in memory.walk():
        if node.id != ROOT_ID and not node.is_leaf:
            below = [memory.get(leaf).timestamp for leaf in memory.leaf_ids_under(node.id)]
            assert node.timestamp == max(below)


def test_namespaces_are_isolated_in_a_shared_store() -> None:
    store = MemoryBackend()
    alice = make(store=store, namespace=("users", "alice"))
    bob = alice.with_namespace(("users", "bob"))
    alice.add("I like green tea.")
    bob.add("I like green tea.")
    bob.add("I ride a red bicycle.")
    assert len(alice) == 1 and len(bob) == 2
    assert {r.id for r in alice.retrieve("tea")} <= {n.id for n in alice.walk()}
    assert all(r.id not in {n.id for n in alice.walk()} for r in bob.retrieve("tea bicycle", k=10))
    assert alice.namespaces() == [("users", "alice"), ("users", "bob")]
    assert alice.namespaces(prefix="users") == [("users", "alice"), ("users", "bob")]
    assert bob.delete_namespace() is True
    assert len(bob) == 0 and len(alice) == 1
    assert alice.namespaces() == [("users", "alice")]


def test_two_memory_objects_on_one_store_see_each_others_writes() -> None:
    store = MemoryBackend()
    first, second = make(store=store), make(store=store)
    first.add(FACTS[0])
    second.add(FACTS[1])
    assert len(first) == 2 and len(second) == 2
    assert first.check_integrity() == [] and second.check_integrity() == []
    second.delete(first.leaves()[0].id)
    assert len(first) == 1 and first.leaves()[0].text == FACTS[1]


def test_stats_report_shape_and_costs() -> None:
    memory = make()
    ancestors_per_insert = []
    for fact in FACTS:
        node = memory.get(memory.add(fact))
        ancestors_per_insert.append(node.depth - 1)  # summaries between it and the root
    stats = memory.stats()
    assert stats.leaves == 5 and stats.nodes == stats.leaves + stats.summaries
    assert stats.inserts == 5
    assert stats.aggregation_calls == sum(ancestors_per_insert) > 0
    assert stats.llm_calls == 0  # extractive summaries call no model
    # One call per insert for the leaf and its sentences, and the offline summarizer's
    # own calls for sentences it had not seen: a summary's vector is made from its
    # sentences' (parent_embedding="sentences"), with no call of its own.
    sentence_calls = memory.aggregator.embedding_calls  # type: ignore[attr-defined]
    assert stats.embedding_calls == 5 + sentence_calls
    assert stats.max_depth == max(n.depth for n in memory.walk())
    assert 0 < stats.largest_root_share <= 1
    assert sum(stats.depth_histogram.values()) == stats.nodes
    assert json.dumps(stats.as_dict())


def test_export_and_outline() -> None:
    memory = make()
    memory.add_many(FACTS)
    tree = viz.to_dict(memory)
    assert tree["id"] == ROOT_ID

    def count(node: dict) -> int:  # type: ignore[type-arg]
        return (
            int(node["is_leaf"]) + sum(count(child) for child in node["children"])
            if node["id"] != ROOT_ID
            else sum(count(c) for c in node["children"])
        )

    assert count(tree) == 5
    outline = memory.format_tree()
    assert outline.startswith("root · 5 leaves")
    assert "Eli is learning the cello." in outline
    assert make().format_tree() == "(empty memory)"


def test_auto_theta0_calibrates_and_is_remembered() -> None:
    store = MemoryBackend()
    config = MemTreeConfig(theta0="auto", calibration_samples=4, calibration_quantile=0.5)
    memory = MemTree(embedder=HashingEmbedder(64), store=store, config=config)
    assert memory.stats().theta0 == config.auto_theta0_start
    memory.add_many(FACTS)  # the first insert has no neighbour; the next four are samples
    calibrated = memory.stats().theta0
    assert calibrated != config.auto_theta0_start
    reopened = MemTree(embedder=HashingEmbedder(64), store=store, config=config)
    assert reopened.stats().theta0 == pytest.approx(calibrated)


def test_records_live_beside_the_tree_and_go_with_the_namespace() -> None:
    store = MemoryBackend()
    key = ("chat", "s1")
    store.put_records(key, "messages", {"0002": {"text": "b"}, "0001": {"text": "a"}})
    store.put_records(key, "messages", {"0003": {"text": "c"}, "0002": None})
    assert list(store.get_records(key, "messages")) == ["0001", "0003"]  # first-written order
    assert store.get_records(key, "messages", ["0003", "nope"]) == {"0003": {"text": "c"}}
    assert store.get_records(key, "other") == {}
    assert store.list_namespaces() == [key]
    got = store.get_records(key, "messages")
    got["0001"]["text"] = "changed"  # callers get copies
    assert store.get_records(key, "messages")["0001"] == {"text": "a"}
    assert store.delete_records(key, "messages") == 2
    assert store.list_namespaces() == []
    store.put_records(key, "messages", {"1": {"x": 1}})
    assert store.delete_namespace(key) is True
    assert store.get_records(key, "messages") == {}


class CountingEmbedder(HashingEmbedder):
    def __init__(self) -> None:
        super().__init__(64)
        self.texts: list[str] = []

    def embed(self, texts):  # type: ignore[no-untyped-def]
        self.texts.extend(texts)
        return super().embed(texts)


def test_a_stored_text_is_not_embedded_again() -> None:
    embedder = CountingEmbedder()
    memory = MemTree(embedder=embedder, aggregator=None, config=MemTreeConfig(theta0=0.15))
    first = memory.add(FACTS[0])
    second, third = memory.add_many(FACTS[1:3])
    embedder.texts.clear()
    assert memory.add(FACTS[0]) == first
    ids = memory.add_many([FACTS[1], FACTS[3], FACTS[2]])
    assert (ids[0], ids[2]) == (second, third)
    assert FACTS[0] not in embedder.texts and FACTS[1] not in embedder.texts and FACTS[2] not in embedder.texts
    assert FACTS[3] in embedder.texts and len(memory) == 4


def test_the_root_counts_every_leaf_wherever_it_is_read() -> None:
    memory = make()
    for fact in FACTS:
        memory.add(fact)
    walked = next(iter(memory.walk()))
    assert walked.id == ROOT_ID
    assert walked.leaf_count == memory.get(ROOT_ID).leaf_count == viz.to_dict(memory)["leaf_count"] == len(FACTS)
    assert viz.to_dict(make())["leaf_count"] == 0


def test_the_offline_summarizers_sentence_embeddings_are_counted() -> None:
    memory = MemTree(embedder=HashingEmbedder(64), config=MemTreeConfig(theta0=-1.0))
    texts = [
        " ".join(f"Dana's bees visited garden {i} on day {d}, a long sunny trip." for d in range(6)) for i in range(6)
    ]
    memory.add_many(texts)  # the batch is embedded up front; the summarizer embeds sentences itself
    sentence_calls = memory.aggregator.embedding_calls  # type: ignore[attr-defined]
    assert sentence_calls > 0
    leaf_calls = 1
    assert memory.stats().embedding_calls <= leaf_calls + 5 + sentence_calls


def test_add_embeds_a_texts_sentences_with_it_in_one_call() -> None:
    """``add`` asks the summarizer which sentences it will need and embeds them with
    the leaf: one embedding call per insert for both, all counted."""
    memory = MemTree(embedder=HashingEmbedder(64), config=MemTreeConfig(theta0=-1.0))
    for i in range(6):
        memory.add(" ".join(f"Dana's bees visited garden {i} on day {d}, a long sunny trip." for d in range(6)))
    assert memory.aggregator.embedding_calls == 0  # type: ignore[attr-defined]
    stats = memory.stats()
    assert stats.embedding_calls <= 6 + 5  # a leaf with its sentences, and the summaries an insert changed
    assert stats.embedded_texts >= 6 * (1 + 6)
