"""MemTreeMemoryBlock inside a real llama_index Memory, pushed past its short-term limit."""

from __future__ import annotations

import asyncio
import logging

import pytest
from llama_index.core.base.llms.types import ChatMessage, ImageBlock, TextBlock
from llama_index.core.memory import Memory
from llama_index.core.storage.chat_store.sql import MessageStatus
from llamaindex_corpus import make_memory

from llamaindex_memtree import MemTreeMemoryBlock
from memtree.text import count_tokens

CONVERSATION = [
    ("My greyhound Pepper is scared of bicycles.", "Poor Pepper! Bicycles can be scary for dogs."),
    ("I ate tonkotsu ramen in Kyoto last spring.", "Kyoto ramen sounds delicious."),
    ("Ana and I hiked the Rota Vicentina trail.", "The Atlantic cliffs on that trail are beautiful."),
    ("Pepper got a red collar for her birthday.", "A red collar will suit Pepper."),
    ("I am learning to make ramen noodles at home.", "Homemade ramen noodles need a long rest."),
    ("What should I cook tonight?", "How about a simple pasta?"),
]


@pytest.fixture
def chat() -> Memory:
    block = MemTreeMemoryBlock(memory=make_memory(), token_limit=30, similarity_top_k=4)
    memory = Memory.from_defaults(
        session_id="session-1",
        token_limit=120,
        chat_history_token_ratio=0.5,  # short-term memory holds about 60 tokens
        token_flush_size=20,
        memory_blocks=[block],
    )
    for user, assistant in CONVERSATION:
        memory.put(ChatMessage(role="user", content=user))
        memory.put(ChatMessage(role="assistant", content=assistant))
    return memory


def block_of(chat: Memory) -> MemTreeMemoryBlock:
    (block,) = chat.memory_blocks
    assert isinstance(block, MemTreeMemoryBlock)
    return block


def test_flushed_messages_become_leaves_in_order(chat: Memory) -> None:
    archived = chat.get_all(status=MessageStatus.ARCHIVED)
    active = chat.get_all(status=MessageStatus.ACTIVE)
    assert len(archived) >= 6 and active  # the queue overflowed, recent turns stayed
    leaves = block_of(chat).memory.leaves()
    assert [leaf.text for leaf in leaves] == [f"{m.role.value}: {m.content}" for m in archived]
    assert {leaf.metadata["session_id"] for leaf in leaves} == {"session-1"}
    assert [leaf.metadata["role"] for leaf in leaves] == [m.role.value for m in archived]
    stored = {leaf.text for leaf in leaves}
    assert not any(f"{m.role.value}: {m.content}" in stored for m in active)


def test_get_injects_the_memories_relevant_to_the_input(chat: Memory) -> None:
    messages = chat.get(input="Why is my greyhound Pepper scared of bicycles?")
    system = messages[0]
    assert system.role.value == "system"
    assert "<MemTreeMemory>" in system.content
    assert "user: My greyhound Pepper is scared of bicycles." in system.content


def test_block_content_fits_its_token_limit_and_ranks_by_relevance(chat: Memory) -> None:
    block = block_of(chat)
    question = ChatMessage(role="user", content="Where did I eat tonkotsu ramen?")
    content = asyncio.run(block.aget([ChatMessage(role="assistant", content="Hello"), question]))
    assert count_tokens(content) <= block.token_limit
    assert content.split("\n")[0] == "user: I ate tonkotsu ramen in Kyoto last spring."


def test_truncate_drops_the_least_relevant_memories_first() -> None:
    block = MemTreeMemoryBlock(memory=make_memory())
    content = "first memory here\nsecond memory here\nthird memory here"
    assert asyncio.run(block.atruncate(content, 3)) == "first memory here\nsecond memory here"
    assert asyncio.run(block.atruncate(content, 4)) == "first memory here"
    assert asyncio.run(block.atruncate(content, 100)) is None


def test_messages_without_text_are_not_stored_and_empty_input_reads_nothing() -> None:
    block = MemTreeMemoryBlock(memory=make_memory())
    image_only = ChatMessage(role="user", blocks=[ImageBlock(url="https://example.com/cat.png")])
    asyncio.run(block.aput([image_only, ChatMessage(role="user", blocks=[TextBlock(text="  ")])]))
    assert len(block.memory) == 0
    assert asyncio.run(block.aget([image_only])) == ""
    assert asyncio.run(block.aget([])) == ""


def test_block_refuses_something_that_is_not_a_memory() -> None:
    with pytest.raises(TypeError, match=r"memory must be a memtree\.MemTree"):
        MemTreeMemoryBlock(memory={"not": "a tree"})


def test_min_score_keeps_unrelated_memories_out(chat: Memory) -> None:
    block = block_of(chat)
    question = [ChatMessage(role="user", content="Where did I eat tonkotsu ramen?")]
    everything = asyncio.run(block.aget(question)).split("\n")
    block.min_score = 0.3
    relevant = asyncio.run(block.aget(question)).split("\n")
    assert relevant == ["user: I ate tonkotsu ramen in Kyoto last spring."]
    assert len(everything) > len(relevant)


def second_session(block: MemTreeMemoryBlock, messages: list[tuple[str, str]]) -> Memory:
    """Another ``Memory`` (session 2) over the same block, pushed past its short-term limit."""
    memory = Memory.from_defaults(
        session_id="session-2",
        token_limit=120,
        chat_history_token_ratio=0.5,
        token_flush_size=20,
        memory_blocks=[block],
    )
    for user, assistant in messages:
        memory.put(ChatMessage(role="user", content=user))
        memory.put(ChatMessage(role="assistant", content=assistant))
    return memory


SESSION_2 = [
    ("My cat Miso sleeps on the bicycle seat.", "Miso has good taste."),
    ("I baked sourdough bread on Sunday.", "Fresh sourdough is the best."),
    ("The sourdough starter needs feeding.", "Feed it flour and water."),
    ("Miso the cat hates the vacuum.", "Many cats do."),
    ("What is the weather today?", "Sunny, I think."),
]


def test_a_session_reads_only_its_own_memories_from_a_shared_block(chat: Memory) -> None:
    block = block_of(chat)
    other = second_session(block, SESSION_2)
    sessions = {leaf.metadata["session_id"] for leaf in block.memory.leaves()}
    assert sessions == {"session-1", "session-2"}  # both sessions flushed into the one tree
    question = "Is my pet scared of bicycles?"
    seen_by_2 = other.get(input=question)[0].content
    assert "Miso sleeps on the bicycle seat" in seen_by_2 and "Pepper" not in seen_by_2
    assert "Pepper is scared of bicycles" in chat.get(input=question)[0].content
    text = asyncio.run(block.aget([ChatMessage(role="user", content=question)], session_id="session-3"))
    assert text == ""  # a session that stored nothing reads nothing
    # a block shared on purpose: every session reads every memory
    block.session_scoped, block.token_limit, block.similarity_top_k = False, 400, 20
    shared = asyncio.run(block.aget([ChatMessage(role="user", content=question)], session_id="session-2"))
    assert "Pepper is scared of bicycles" in shared and "Miso" in shared


def test_one_message_with_a_nul_byte_does_not_fail_the_flush(caplog: pytest.LogCaptureFixture) -> None:
    """The engine refuses NUL characters and lone surrogates; the block used to pass the
    whole flush to it at once, so one such message stored nothing (0 of 4) and
    ``Memory.put()`` raised. Now the others are stored as they are and the bad one
    cleaned, with a warning naming it."""
    block = MemTreeMemoryBlock(memory=make_memory())
    flushed = [
        ChatMessage(role="user", content="My greyhound Pepper is scared of bicycles."),
        ChatMessage(role="assistant", content="Poor\x00 Pepper!"),
        ChatMessage(role="user", content="I ate ramen in Kyoto \udc80 last spring."),
        ChatMessage(role="assistant", content="Kyoto ramen sounds delicious."),
    ]
    with caplog.at_level(logging.WARNING, logger="llamaindex_memtree"):
        asyncio.run(block.aput(flushed))
    assert [leaf.text for leaf in block.memory.leaves()] == [
        "user: My greyhound Pepper is scared of bicycles.",
        "assistant: Poor Pepper!",
        "user: I ate ramen in Kyoto ? last spring.",
        "assistant: Kyoto ramen sounds delicious.",
    ]
    warned = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warned) == 2
    assert warned[0].startswith("message 2 of 4 (assistant: 'Poor Pepper!'): its text contains a NUL character")
    assert warned[1].startswith("message 3 of 4 (user: 'I ate ramen in Kyoto ? last spring.'): its text is not valid")


def test_memory_put_does_not_raise_for_a_message_with_a_nul_byte() -> None:
    block = MemTreeMemoryBlock(memory=make_memory())
    chat = Memory.from_defaults(
        session_id="nul\x00session",  # metadata the durable stores cannot hold either
        token_limit=120,
        chat_history_token_ratio=0.5,
        token_flush_size=20,
        memory_blocks=[block],
    )
    conversation = [*CONVERSATION[:2], ("Pepper\x00 got a red collar.", "Red suits her."), *CONVERSATION[3:]]
    for user, assistant in conversation:
        chat.put(ChatMessage(role="user", content=user))
        chat.put(ChatMessage(role="assistant", content=assistant))
    archived = chat.get_all(status=MessageStatus.ARCHIVED)
    assert any("\x00" in str(message.content) for message in archived), "the NUL message was flushed"
    texts = [leaf.text for leaf in block.memory.leaves()]
    assert len(texts) == len(archived) and "user: Pepper got a red collar." in texts
    assert {leaf.metadata["session_id"] for leaf in block.memory.leaves()} == {"nulsession"}
