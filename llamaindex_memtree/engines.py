"""The keyword arguments LlamaIndex's query and chat engines take.

``BaseIndex.as_query_engine(**kwargs)`` and ``as_chat_engine(**kwargs)`` hand all
their keyword arguments to ``index.as_retriever(**kwargs)`` *and* to the engine
they build, so a retriever sees the engine's options (``response_mode``,
``system_prompt``…) next to its own. To refuse only what nobody takes, the
engines' options are read from the signatures of the factories those methods
call, so they follow the installed LlamaIndex version.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from llama_index.core.chat_engine import (
    CondensePlusContextChatEngine,
    CondenseQuestionChatEngine,
    ContextChatEngine,
    SimpleChatEngine,
)
from llama_index.core.query_engine import RetrieverQueryEngine

_FACTORIES: tuple[Callable[..., Any], ...] = (
    RetrieverQueryEngine.from_args,
    ContextChatEngine.from_defaults,
    CondensePlusContextChatEngine.from_defaults,
    CondenseQuestionChatEngine.from_defaults,
    SimpleChatEngine.from_defaults,
)
_NAMED = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


@functools.cache
def engine_options() -> frozenset[str]:
    """Names of the keyword arguments the query and chat engines built by
    ``as_query_engine`` / ``as_chat_engine`` accept."""
    names = {
        parameter.name
        for factory in _FACTORIES
        for parameter in inspect.signature(factory).parameters.values()
        if parameter.kind in _NAMED
    }
    return frozenset(names - {"retriever", "query_engine"})
