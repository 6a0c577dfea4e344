"""Regression (Claude Code 2.1.197): the billing-header system block is not prompt text.

Claude Code's first ``system`` block is ``x-anthropic-billing-header: cc_version=<version>.
<hash>; cc_entrypoint=sdk-cli;`` where the hash is taken from the first user message. After
``/compact`` the first user message is the summary, so the hash changed, the rendered system
prompt changed with it, and the ledger classified the compacted conversation as
``fork/unknown`` instead of ``fork/compaction``. The adapter now drops that block.
"""

from __future__ import annotations

from typing import Any

import orjson

from proxy.adapters.anthropic_messages import AnthropicMessagesAdapter
from proxy.adapters.signing import ReasoningSigner

MAIN_PROMPT = "You are an interactive agent that helps users with software engineering tasks."


def body(billing_hash: str, first_user_message: str) -> dict[str, Any]:
    return {
        "model": "lego-policy",
        "max_tokens": 32000,
        "system": [
            {
                "type": "text",
                "text": f"x-anthropic-billing-header: cc_version=2.1.197.{billing_hash}; "
                "cc_entrypoint=sdk-cli;",
            },
            {
                "type": "text",
                "text": "You are a Claude agent, built on Anthropic's Claude Agent SDK.",
                "cache_control": {"type": "ephemeral"},
            },
            {"type": "text", "text": MAIN_PROMPT, "cache_control": {"type": "ephemeral"}},
        ],
        "messages": [{"role": "user", "content": first_user_message}],
    }


def parse(payload: dict[str, Any]) -> Any:
    adapter = AnthropicMessagesAdapter(ReasoningSigner(b"k" * 32))
    return adapter.parse_request(orjson.dumps(payload))


def test_billing_header_block_is_dropped_and_named() -> None:
    request = parse(body("b53", "create out.txt"))
    system = request.messages[0]
    assert system.role == "system"
    assert system.content == (
        "You are a Claude agent, built on Anthropic's Claude Agent SDK.\n\n" + MAIN_PROMPT
    )
    assert "system[].x-anthropic-billing-header" in request.ignored_fields


def test_system_prompt_is_the_same_before_and_after_compaction() -> None:
    before = parse(body("b53", "create out.txt"))
    after = parse(body("f9d", "This session is being continued from a previous conversation"))
    assert before.messages[0] == after.messages[0]


def test_a_plain_string_system_prompt_is_kept_whole() -> None:
    payload = body("b53", "hi") | {"system": "x-anthropic-billing-header: kept as text"}
    request = parse(payload)
    assert request.messages[0].content == "x-anthropic-billing-header: kept as text"
    assert "system[].x-anthropic-billing-header" not in request.ignored_fields
