"""Context feedback: a leaf whose own words miss the question is found through the
memory it hangs with (the README quickstart's Pepper case), the speaker a question
names is preferred, and the reported similarity stays the plain cosine."""

from __future__ import annotations

import numpy as np

from memtree import HashingEmbedder, MemTree, MemTreeConfig
from memtree.feedback import boosted, named_speaker, names_in


def test_the_quickstart_finds_what_maya_s_dog_is_afraid_of(local_embedder: object) -> None:
    memory = MemTree(embedder=local_embedder)
    memory.add("Maya adopted a rescue greyhound called Pepper.", timestamp="2024-04-28")
    memory.add("Pepper is scared of bicycles.", timestamp="2024-06-16", metadata={"topic": "dog"})
    memory.add("Leo ate chicken ramen with yuzu in Kyoto.", timestamp="2024-04-28")
    hits = memory.retrieve("What is Maya's dog afraid of?", k=3, token_budget=200)
    assert "Pepper is scared of bicycles." in [hit.text for hit in hits[:2]]
    without = memory.retrieve("What is Maya's dog afraid of?", k=3, context_feedback=0)
    assert "Pepper is scared of bicycles." not in [hit.text for hit in without]  # under the floor (cosine 0.27)
    unfloored = memory.retrieve("What is Maya's dog afraid of?", k=3, context_feedback=0, min_similarity=None)
    assert unfloored[-1].text == "Pepper is scared of bicycles."  # and last below it, as before
    assert memory.retrieve("What is 17 times 3?") == []  # the floor still keeps unrelated questions empty
    # The score ranks; the similarity is still the plain cosine with the question.
    vector = memory.embed_query("What is Maya's dog afraid of?")
    for hit in hits:
        assert np.isclose(hit.similarity, float(memory.get(hit.id).embedding @ vector), atol=1e-5)


def test_a_question_naming_one_speaker_prefers_what_that_speaker_said() -> None:
    memory = MemTree(embedder=HashingEmbedder(64), config=MemTreeConfig(theta0=0.99))
    reply = memory.add("8 May 2023 Caroline: Melanie, your pottery bowl is lovely!")
    own = memory.add("8 May 2023 Melanie: I go camping with the kids and I love painting sunsets.")
    other = memory.add("8 May 2023 Caroline: I went to a support group meeting.")
    state = memory._state
    ranked = [(reply, 0.50), (own, 0.45), (other, 0.30)]
    assert named_speaker(memory._index, state, ranked, "What activities does Melanie do?") == "Melanie"
    assert named_speaker(memory._index, state, ranked, "What do Melanie and Caroline do?") is None  # two: no preference
    assert [node for node, _ in boosted(memory._index, state, ranked, "Melanie")] == [own, reply, other]
    assert boosted(memory._index, state, ranked, None) == ranked


def test_feedback_off_in_the_config_ranks_as_the_first_ranking() -> None:
    texts = ["Alice adopted a grey cat named Miso.", "Miso sleeps on the piano.", "Bob runs marathons in Berlin."]
    on = MemTree(embedder=HashingEmbedder(64))
    off = MemTree(embedder=HashingEmbedder(64), config=MemTreeConfig(context_feedback=0.0))
    for memory in (on, off):
        memory.add_many(texts)
    assert [h.text for h in off.retrieve("Alice's cat", k=3)] == [
        h.text for h in on.retrieve("Alice's cat", k=3, context_feedback=0)
    ]


def test_names_are_capitalized_words_inside_sentences_the_query_lacks() -> None:
    leaf = "28 April 2024 Maya: We adopted a greyhound called Pepper. Leo's friend Ana from Porto came. I'm glad."
    assert names_in(leaf, "What is Maya's dog afraid of?", "Maya") == ("Pepper", "Ana", "Porto")
    assert names_in("Pepper is scared of bicycles.", "What is Pepper afraid of?", None) == ()


def test_two_equally_good_first_matches_give_no_feedback_so_rankings_do_not_depend_on_ids() -> None:
    """A tie at the top would let the random leaf ids choose whose context moves the
    query; two memories built alike must rank alike."""
    texts = [
        "Maya adopted a rescue greyhound called Pepper.",
        "Maya works night shifts as a nurse in Oslo.",
        "Maya loves cardamom buns from the corner bakery.",
    ]
    scores = []
    for _ in range(8):
        memory = MemTree(embedder=HashingEmbedder(64), config=MemTreeConfig(theta0=0.2, min_similarity=None))
        memory.add_many(texts)
        hits = memory.retrieve("greyhound nurse ramen", k=3, leaves_only=True)
        scores.append(sorted((hit.text, round(hit.score, 6)) for hit in hits))
    assert all(ranking == scores[0] for ranking in scores)
