"""Every wire adapter implements the ``Adapter`` hooks, with their signatures, in their order.

``Adapter`` is a ``Protocol`` (structural, not runtime-checkable), so this reads the hooks
off it and compares each adapter class against them: a missing hook, a renamed or
re-ordered parameter, or hooks defined out of the contract's order (sibling adapters keep
the same section order, so a diff between two shows only protocol differences) fail here.
"""

from __future__ import annotations

import inspect

import pytest

from proxy.adapters.anthropic_messages import AnthropicMessagesAdapter
from proxy.adapters.base import Adapter
from proxy.adapters.openai_chat import OpenAIChatAdapter
from proxy.adapters.openai_responses import OpenAIResponsesAdapter

ADAPTERS = (OpenAIChatAdapter, AnthropicMessagesAdapter, OpenAIResponsesAdapter)
HOOKS = [
    name
    for name, value in vars(Adapter).items()
    if inspect.isfunction(value) and not name.startswith("_")
]


def _parameters(function: object) -> list[tuple[str, inspect._ParameterKind]]:
    return [(p.name, p.kind) for p in inspect.signature(function).parameters.values()]  # type: ignore[arg-type]


def test_the_contract_has_its_hooks() -> None:
    assert HOOKS[:2] == ["parse_request", "render_response"]
    assert "stream_error" in HOOKS


@pytest.mark.parametrize("adapter", ADAPTERS, ids=lambda a: a.__name__)
def test_every_hook_is_implemented_with_the_contract_signature(adapter: type) -> None:
    for hook in HOOKS:
        implemented = getattr(adapter, hook, None)
        assert callable(implemented), f"{adapter.__name__} lacks {hook}"
        assert _parameters(implemented) == _parameters(getattr(Adapter, hook)), hook


@pytest.mark.parametrize("adapter", ADAPTERS, ids=lambda a: a.__name__)
def test_hooks_are_defined_in_the_contract_order(adapter: type) -> None:
    defined = [name for name in vars(adapter) if name in HOOKS]
    assert defined == HOOKS


def test_each_adapter_has_its_own_name() -> None:
    names = [getattr(adapter, "name", None) for adapter in ADAPTERS]
    assert all(isinstance(name, str) for name in names)
    assert len(set(names)) == len(ADAPTERS)
