"""LangChain and LangGraph adapters for memtree.

* :class:`MemTreeChatMessageHistory`: an exact chat log whose exchanges grow a memory tree.
* :class:`MemTreeRetriever`: a memory tree as a LangChain retriever (``route_overviews="always"``:
  its overview mode).
* :class:`MemTreeStore`: a LangGraph ``BaseStore`` whose semantic search is MemTree retrieval.
* :class:`MemTreeMemoryMiddleware`: agent middleware that records each exchange and
  puts the memories relevant to the user's latest message in the system prompt (an
  overview of the memory when the message asks for one).
* :class:`LocalEmbeddings`: memtree's offline all-MiniLM-L6-v2 as a LangChain ``Embeddings``.
"""

from langchain_memtree.embeddings import LocalEmbeddings
from langchain_memtree.history import MemTreeChatMessageHistory
from langchain_memtree.middleware import (
    MEMORY_HEADER,
    OVERVIEW_HEADER,
    MemTreeMemoryMiddleware,
    format_memories,
    format_overview,
)
from langchain_memtree.retriever import MemTreeRetriever, to_document
from langchain_memtree.store import MemTreeStore

__all__ = [
    "MEMORY_HEADER",
    "OVERVIEW_HEADER",
    "LocalEmbeddings",
    "MemTreeChatMessageHistory",
    "MemTreeMemoryMiddleware",
    "MemTreeRetriever",
    "MemTreeStore",
    "format_memories",
    "format_overview",
    "to_document",
]
