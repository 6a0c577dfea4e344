"""One conversation, three wire protocols: identical canonical form, prompt ids and records.

The conversation (system, user, assistant reasoning + tool call, tool result) is written in
OpenAI Chat, Anthropic Messages and OpenAI Responses. Each adapter must parse it to the
same canonical messages and tools; sent through the real proxy, each must put the same
token ids on the backend wire and leave the same training segment in the recorder.
"""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest

from proxy.adapters.anthropic_messages import AnthropicMessagesAdapter
from proxy.adapters.base import Adapter
from proxy.adapters.openai_chat import OpenAIChatAdapter
from proxy.adapters.openai_responses import OpenAIResponsesAdapter
from proxy.adapters.signing import ReasoningSigner
from proxy.canonical import ChatRequest
from tests.proxy.conftest import SHELL_TOOL, Proxy
from tests.support.tap import BackendTap

SYSTEM = "You are a careful agent."
USER = "List the files, please."
THOUGHT = "I should run ls."
ARGUMENTS = '{"command":"ls"}'
RESULT = "a.txt\nb.txt\n"
FUNCTION = SHELL_TOOL["function"]


def chat_body() -> dict[str, Any]:
    return {
        "model": "m",
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": USER},
            {
                "role": "assistant",
                "content": "",
                "reasoning_content": THOUGHT,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "bash", "arguments": ARGUMENTS},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": RESULT},
        ],
        "tools": [SHELL_TOOL],
        "max_tokens": 64,
    }


def messages_body(signer: ReasoningSigner) -> dict[str, Any]:
    thinking = {"type": "thinking", "thinking": THOUGHT, "signature": signer.sign(THOUGHT)}
    tool_use = {"type": "tool_use", "id": "call_1", "name": "bash", "input": {"command": "ls"}}
    result = {"type": "tool_result", "tool_use_id": "call_1", "content": RESULT}
    tool = {
        "name": "bash",
        "description": FUNCTION["description"],
        "input_schema": FUNCTION["parameters"],
    }
    return {
        "model": "m",
        "system": SYSTEM,
        "messages": [
            {"role": "user", "content": USER},
            {"role": "assistant", "content": [thinking, tool_use]},
            {"role": "user", "content": [result]},
        ],
        "tools": [tool],
        "max_tokens": 64,
    }


def responses_body(signer: ReasoningSigner) -> dict[str, Any]:
    return {
        "model": "m",
        "instructions": SYSTEM,
        "input": [
            {"role": "user", "content": USER},
            {
                "type": "reasoning",
                "id": "rs_1",
                "summary": [],
                "encrypted_content": signer.seal(THOUGHT),
            },
            {"type": "function_call", "call_id": "call_1", "name": "bash", "arguments": ARGUMENTS},
            {"type": "function_call_output", "call_id": "call_1", "output": RESULT},
        ],
        "tools": [{"type": "function", **FUNCTION}],
        "max_output_tokens": 64,
    }


@pytest.fixture(scope="module")
def signer(proxy: Proxy) -> ReasoningSigner:
    return ReasoningSigner(proxy.settings.effective_signing_secret)


def bodies(signer: ReasoningSigner) -> list[tuple[Adapter, str, dict[str, Any]]]:
    return [
        (OpenAIChatAdapter(), "/v1/chat/completions", chat_body()),
        (AnthropicMessagesAdapter(signer), "/v1/messages", messages_body(signer)),
        (OpenAIResponsesAdapter(signer), "/v1/responses", responses_body(signer)),
    ]


def test_same_canonical_request(signer: ReasoningSigner) -> None:
    parsed: list[ChatRequest] = [
        adapter.parse_request(orjson.dumps(body)) for adapter, _, body in bodies(signer)
    ]
    chat, messages, responses = parsed
    assert chat.messages[2].reasoning == THOUGHT
    for other in (messages, responses):
        assert other.messages == chat.messages
        assert other.tools == chat.tools
        assert other.tool_choice == chat.tool_choice
        assert other.sampling == chat.sampling


def test_same_prompt_ids_and_recorded_segments(
    proxy: Proxy, tap: BackendTap, signer: ReasoningSigner
) -> None:
    prompts: list[list[int]] = []
    segments: list[dict[str, Any]] = []
    for _, path, body in bodies(signer):
        session = proxy.new_session()
        tap.reset()
        response = httpx.post(f"{proxy.url}/s/{session['key']}{path}", json=body, timeout=60)
        assert response.status_code == 200, response.text
        (exchange,) = tap.generates
        prompts.append(exchange.body["input_ids"])
        (segment,) = proxy.trajectory(session["id"])["segments"]
        segments.append(segment)
    assert prompts[0] == prompts[1] == prompts[2]
    for key in ("tokens", "loss_mask", "logprobs", "routed_experts"):
        assert segments[0][key] == segments[1][key] == segments[2][key], key
