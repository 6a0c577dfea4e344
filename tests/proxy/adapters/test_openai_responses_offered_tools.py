"""Regression (Codex CLI 0.171): tools a harness offers but the local policy cannot call.

Codex sends, by default, a ``namespace`` group of sub-agent tools and the hosted
``web_search`` next to its function tools. The Responses adapter used to answer 400
``unsupported_option``, so an unmodified Codex could not start. They are now left out of
the model's prompt and named in ``ignored_fields``; forcing one with ``tool_choice`` is
still refused.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from kernel.errors import Unsupported
from proxy.adapters.openai_responses import OpenAIResponsesAdapter
from proxy.adapters.signing import ReasoningSigner

EXEC: dict[str, Any] = {
    "type": "function",
    "name": "exec_command",
    "description": "Runs a command in a PTY.",
    "strict": False,
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
}
# The shapes Codex 0.171.0 sends (descriptions shortened).
NAMESPACE: dict[str, Any] = {
    "type": "namespace",
    "name": "multi_agent_v1",
    "description": "Tools for spawning and managing sub-agents.",
    "tools": [
        {
            "type": "function",
            "name": "close_agent",
            "description": "Close an agent.",
            "strict": False,
            "parameters": {"type": "object", "properties": {"target": {"type": "string"}}},
        }
    ],
}
WEB_SEARCH: dict[str, Any] = {"type": "web_search", "external_web_access": True}


def parse(body: dict[str, Any]) -> Any:
    adapter = OpenAIResponsesAdapter(ReasoningSigner(b"k" * 32))
    return adapter.parse_request(orjson.dumps(body))


def test_codex_default_tool_set_is_accepted_and_unservable_tools_are_named() -> None:
    request = parse({"model": "m", "input": "hi", "tools": [EXEC, NAMESPACE, WEB_SEARCH]})
    assert [tool.name for tool in request.tools] == ["exec_command"]
    assert "tools[type=namespace]" in request.ignored_fields
    assert "tools[type=web_search]" in request.ignored_fields


@pytest.mark.parametrize("hosted", ["web_search_preview", "file_search", "code_interpreter"])
def test_other_hosted_tools_are_left_out(hosted: str) -> None:
    request = parse({"model": "m", "input": "hi", "tools": [{"type": hosted}]})
    assert request.tools == ()
    assert f"tools[type={hosted}]" in request.ignored_fields


def test_forcing_an_unservable_tool_is_still_refused() -> None:
    body = {
        "model": "m",
        "input": "hi",
        "tools": [EXEC, WEB_SEARCH],
        "tool_choice": {"type": "web_search"},
    }
    with pytest.raises(Unsupported) as caught:
        parse(body)
    assert caught.value.param == "tool_choice.type"
