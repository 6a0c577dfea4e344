"""The Qwen3-format chat template, rendered through transformers as the proxy will."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

TOOLS_SYSTEM = (
    "<|im_start|>system\nYou code.\n\n# Tools\n\nYou may call one or more functions to assist "
    "with the user query.\n\nYou are provided with function signatures within <tools></tools> "
    "XML tags:\n<tools>\n"
    '{"type": "function", "function": {"name": "ls", "parameters": {"type": "object"}}}\n'
    "</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
)
TOOLS = [{"type": "function", "function": {"name": "ls", "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module")
def tok(tiny_model_dir: Path) -> Any:
    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


def render(tok: Any, messages: list[dict[str, Any]], **kwargs: Any) -> str:
    text: str = tok.apply_chat_template(messages, tokenize=False, **kwargs)
    return text


def test_plain_turns_and_generation_prompt(tok: Any) -> None:
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}]
    assert render(tok, messages, add_generation_prompt=True) == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert (
        render(tok, messages) == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
    )


def test_enable_thinking_false_prefills_empty_think(tok: Any) -> None:
    text = render(
        tok, [{"role": "user", "content": "hi"}], add_generation_prompt=True, enable_thinking=False
    )
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


def test_list_content_is_joined(tok: Any) -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assert render(tok, [{"role": "user", "content": parts}]) == "<|im_start|>user\nab<|im_end|>\n"


def test_tools_tool_calls_and_grouped_results(tok: Any) -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You code."},
        {"role": "user", "content": "list"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "need ls",
            "tool_calls": [
                {"type": "function", "function": {"name": "ls", "arguments": {"path": "."}}},
                {"type": "function", "function": {"name": "ls", "arguments": '{"path":"/"}'}},
            ],
        },
        {"role": "tool", "content": "a.py"},
        {"role": "tool", "content": "etc"},
    ]
    assert render(tok, messages, tools=TOOLS, add_generation_prompt=True) == (
        TOOLS_SYSTEM + "<|im_start|>user\nlist<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nneed ls\n</think>\n\n"
        '<tool_call>\n{"name": "ls", "arguments": {"path": "."}}\n</tool_call>\n'
        '<tool_call>\n{"name": "ls", "arguments": {"path":"/"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\na.py\n</tool_response>\n"
        "<tool_response>\netc\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


def test_reasoning_dropped_before_last_user_query(tok: Any) -> None:
    messages = [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a1", "reasoning_content": "r1"},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "<think>\nr2\n</think>\n\na2"},
    ]
    assert render(tok, messages) == (
        "<|im_start|>user\nq1<|im_end|>\n<|im_start|>assistant\na1<|im_end|>\n"
        "<|im_start|>user\nq2<|im_end|>\n<|im_start|>assistant\n<think>\nr2\n</think>\n\na2"
        "<|im_end|>\n"
    )


def test_tool_response_user_turn_is_not_a_query(tok: Any) -> None:
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a", "reasoning_content": "r"},
        {"role": "user", "content": "<tool_response>\nx\n</tool_response>"},
    ]
    assert "<think>\nr\n</think>\n\na" in render(tok, messages)


def test_content_with_text_before_tool_call(tok: Any) -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": "Let me look.",
            "tool_calls": [{"function": {"name": "ls", "arguments": {}}}],
        },
    ]
    assert render(tok, messages).endswith(
        '<|im_start|>assistant\nLet me look.\n<tool_call>\n{"name": "ls", "arguments": {}}\n'
        "</tool_call><|im_end|>\n"
    )
