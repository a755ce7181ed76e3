"""Which namespace of the memory a run's memories live in, following LangGraph and
LangMem: a namespace *template* whose ``"{name}"`` parts are filled per run from
the agent's runtime context (``create_agent(..., context_schema=...)`` and
``agent.invoke(..., context={"user_id": "maya"})``) or its config
(``config={"configurable": {"user_id": "maya"}}``), such as the default
:data:`DEFAULT_NAMESPACE`, ``("memories", "{user_id}")``.

Unlike LangMem, a part with no value in the run is an error, not the literal
``"{user_id}"``: a template left unfilled would put every user in one namespace,
which for a memory is a privacy leak. Sharing one namespace between all users is
a choice made explicitly, with a fixed namespace (no ``{...}`` part).
"""

from __future__ import annotations

import string
from collections.abc import Callable, Mapping
from typing import Any

from langgraph.config import get_config
from langgraph.runtime import Runtime

from memtree.store import Namespace, NamespaceKey, namespace_key

DEFAULT_NAMESPACE: NamespaceKey = ("memories", "{user_id}")
"""Where the memory middleware keeps a user's memories when no namespace is given:
one namespace per ``user_id`` of the run (LangMem's convention)."""

NamespaceChoice = Namespace | Callable[[Runtime[Any]], Namespace] | None
"""What ``MemTreeMemoryMiddleware(namespace=...)`` takes: ``None`` (the default,
:data:`DEFAULT_NAMESPACE`), a template, a fixed (shared) namespace, or a function of
the LangGraph ``Runtime``."""


class MissingNamespaceValue(ValueError):
    """A namespace template has a part the run gives no value for."""


def fields_of(part: str) -> list[str]:
    """The ``{name}`` fields of one namespace part (``"user-{user_id}"`` -> ``["user_id"]``)."""
    return [name for _, name, _, _ in string.Formatter().parse(part) if name is not None]


class NamespaceTemplate:
    """A namespace filled per run: each ``{name}`` in its parts takes the run's value
    of ``name``, looked up in the runtime context (an attribute of a dataclass or
    pydantic context, or a key of a dict one), then in ``config["configurable"]``.

    Example::

        template = NamespaceTemplate(("memories", "{org_id}", "{user_id}"))
        template(runtime)  # ("memories", "acme", "maya") for context {"org_id": "acme", "user_id": "maya"}
    """

    def __init__(self, template: Namespace) -> None:
        self.template = namespace_key(template)
        self.fields = [name for part in self.template for name in fields_of(part)]
        for name in self.fields:
            if not name.isidentifier():
                raise ValueError(f"namespace template {self.template!r}: {{{name}}} is not a field name")

    def __call__(self, runtime: Runtime[Any] | None) -> NamespaceKey:
        values = {name: run_value(runtime, name) for name in self.fields}
        missing = [name for name, value in values.items() if value is None]
        if missing:
            raise MissingNamespaceValue(missing_message(self.template, missing))
        return namespace_key(tuple(part.format_map(values) for part in self.template))

    def __repr__(self) -> str:
        return f"NamespaceTemplate({self.template!r})"


def run_value(runtime: Runtime[Any] | None, name: str) -> str | None:
    """The run's value of ``name`` as text (the runtime context first, then the
    config's ``configurable``); ``None`` when the run has none, or an empty one."""
    context = getattr(runtime, "context", None)
    value = context.get(name) if isinstance(context, Mapping) else getattr(context, name, None)
    if value is None:
        try:
            value = (get_config().get("configurable") or {}).get(name)
        except RuntimeError:  # outside a LangGraph run: no config to read
            value = None
    if value is None or isinstance(value, bool) or not isinstance(value, (str, int)):
        return None
    text = str(value).strip()
    return text or None


def missing_message(template: NamespaceKey, missing: list[str]) -> str:
    """Why a run has no namespace, and the ways to give it one."""
    names = ", ".join(missing)
    first = missing[0]
    default = " (the default: one namespace per user)" if template == DEFAULT_NAMESPACE else ""
    return (
        f"the memory namespace {template!r}{default} needs {names}, and this run has none: pass it in the "
        f"agent's context (create_agent(..., context_schema=...), agent.invoke(..., context={{{first!r}: ...}})) "
        f"or in config={{'configurable': {{{first!r}: ...}}}}; or choose the namespace yourself: another "
        "template, a function namespace=lambda runtime: (...), or a fixed namespace=('shared',) to share one "
        "memory between all users on purpose"
    )


def namespace_chooser(choice: NamespaceChoice) -> Callable[[Runtime[Any] | None], NamespaceKey]:
    """The function that gives a run its namespace, from ``namespace=``: a bad fixed
    namespace or template fails here, at construction."""
    if choice is None:
        return NamespaceTemplate(DEFAULT_NAMESPACE)
    if callable(choice):
        function = choice

        def chosen(runtime: Runtime[Any] | None) -> NamespaceKey:
            if runtime is None:
                raise ValueError("namespace is a function of the runtime, but this call has no runtime")
            return namespace_key(function(runtime))

        return chosen
    key = namespace_key(choice)
    if any(fields_of(part) for part in key):
        return NamespaceTemplate(key)
    return lambda runtime: key  # a fixed namespace: shared by every run, as asked
