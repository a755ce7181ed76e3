"""How much retrieved context an LLM can take in one call.

LlamaIndex's query engines pack the retrieved nodes into the LLM's context
window; what does not fit goes to a refine call with the first answer as input.
Ten summaries and leaves can overflow a 4k window: the answer then costs two
calls, and with ``MockLLM`` (which echoes its prompt, so the "answer so far" is
as long as the first prompt) the refine prompt cannot fit at all and LlamaIndex
raises ``Calculated available context size -44 was not non-negative``. The
index's engines therefore cap the retrieved context at a share of the window
(:func:`context_budget`), so one call always holds it.
"""

from __future__ import annotations

from typing import Any

from llama_index.core.constants import DEFAULT_NUM_OUTPUTS

CONTEXT_SHARE = 0.5
"""Share of what the LLM can read (its window less its output) that retrieved
context may fill. The rest is for the prompt template, the question, the nodes'
metadata lines, a chat engine's history, and for the difference between memtree's
token count (words and punctuation) and the model's tokenizer."""


def context_budget(llm: Any) -> int | None:
    """The token budget for the context of one call of ``llm`` (a LlamaIndex
    ``LLM``): :data:`CONTEXT_SHARE` of its context window less its output tokens;
    ``None`` when its metadata says nothing usable (no cap).

    Example::

        context_budget(MockLLM())  # 1822: (3900 - 256) // 2
    """
    metadata = getattr(llm, "metadata", None)
    window = getattr(metadata, "context_window", None)
    output = getattr(metadata, "num_output", None)
    if not isinstance(window, int) or isinstance(window, bool) or window <= 0:
        return None
    if not isinstance(output, int) or isinstance(output, bool) or output < 0:  # -1: not set
        output = DEFAULT_NUM_OUTPUTS
    budget = int((window - output) * CONTEXT_SHARE)
    return budget if budget > 0 else None
