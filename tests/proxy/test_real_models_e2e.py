"""The real Qwen2.5, Qwen3, Qwen3-Coder and Qwen3.5 templates end to end (issue 14).

For each real template: a proxy started with ``tokenizer_path`` at that template's real
tokenizer (SQLite and Postgres), a real engine serving a tiny random model built for that
vocabulary and replying, by script, in the template's own answer format
(``tests.support.real_policy``), and a tap on the wire between them. The official
``openai`` and ``anthropic`` SDKs drive multi-turn tool loops with what harnesses do to the
history (reasoning dropped, arguments re-encoded, trailing whitespace trimmed), parallel
calls, a tool error, a long unicode tool output and literal ``<tool_call>`` / ``</think>``
text in a tool output and a user message. Every continuation must extend the previous
turn's exact prompt + sampled ids; with ``keep_reasoning=false`` the turn after a new user
query forks with ``reasoning_dropped`` recorded and its prompt is the template's whole
render.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from transformers import PreTrainedTokenizerBase

from engine.config import EngineConfig
from engine.loopback import running_engine
from engine.tiny import ensure_tiny_model
from kernel.threaded import serve
from proxy.canonical import ChatRequest, Message, ToolCall, ToolSpec
from proxy.render import load_tokenizer
from tests.proxy.conftest import Proxy, proxy_on_database
from tests.support.real_models import BUILD_VERSION, REAL_TEMPLATES, default_cache
from tests.support.real_policy import BASH_SCHEMA, READ_SCHEMA, THINKING, sampled_text
from tests.support.tap import BackendTap

OPENAI_TOOLS: Any = [
    {"type": "function", "function": {"name": n, "description": "Run.", "parameters": schema}}
    for n, schema in (("bash", BASH_SCHEMA), ("read", READ_SCHEMA))
]
ANTHROPIC_TOOLS: Any = [
    {"name": "bash", "description": "Run.", "input_schema": BASH_SCHEMA},
    {"name": "read", "description": "Read.", "input_schema": READ_SCHEMA},
]
FIRST_ARGS = [
    ("bash", {"command": "ls -la", "timeout": 30, "background": True}),
    ("read", {"path": "a.txt"}),
]
LONG_OUTPUT = "".join(
    f"línea {i}: Grüße 👋 你好 <tool_call> not a call </think> {'é' * (i % 5)}\n" for i in range(80)
)
QUESTION = "Is `</think>` a tag? And <tool_call>? FINAL_CHECK"


def answers(thinking: bool) -> dict[str, Message]:
    why = (lambda text: text) if thinking else (lambda text: None)
    calls = tuple(ToolCall(f"c{i}", n, json.dumps(a)) for i, (n, a) in enumerate(FIRST_ARGS))
    return {
        "FINAL_CHECK": Message("assistant", "Both are tags.", why("Answer it.")),
        "<tool_response>": Message("assistant", "a.txt is missing.  ", why("Summarize.")),
        "START": Message("assistant", "", why("List, then read."), calls),
    }


def script(tokenizer: PreTrainedTokenizerBase, name: str) -> dict[str, Any]:
    """Replies in the template's own format, chosen by a marker in the prompt's tail."""
    request = ChatRequest(
        adapter="test",
        model="m",
        messages=(Message("user", "x"),),
        tools=(ToolSpec("bash", "Run.", BASH_SCHEMA), ToolSpec("read", "Read.", READ_SCHEMA)),
    )
    rules = [
        {"match": marker, "reply": sampled_text(tokenizer, request, answer)}
        for marker, answer in answers(name in THINKING).items()
    ]
    return {"rules": rules, "default": "OK."}


@dataclass
class RealStack:
    name: str
    tokenizer: PreTrainedTokenizerBase
    proxy: Proxy
    tap: BackendTap


@pytest.fixture(scope="module", params=[t.name for t in REAL_TEMPLATES])
def real_engine(
    request: pytest.FixtureRequest,
    real_tokenizer_dirs: dict[str, Path],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[str, Path, BackendTap]]:
    name = str(request.param)
    # Random weights from a fixed seed, built once for the vocabulary: cached beside it.
    model = default_cache() / "models" / BUILD_VERSION / name
    ensure_tiny_model(model, tokenizer_from=real_tokenizer_dirs[name])
    path = tmp_path_factory.mktemp(f"script-{name}") / "policy.json"
    path.write_text(json.dumps(script(load_tokenizer(model), name)))
    with running_engine(
        EngineConfig(model_path=model, script_path=path, enable_return_routed_experts=True)
    ) as url:
        tap = BackendTap(upstream=url)
        with serve(tap.app()) as tap_url:
            tap.url = tap_url
            yield name, model, tap


async def _stack(
    request: pytest.FixtureRequest,
    engine: tuple[str, Path, BackendTap],
    tmp_path_factory: pytest.TempPathFactory,
    **settings: Any,
) -> AsyncIterator[RealStack]:
    name, model, tap = engine
    async for proxy in proxy_on_database(request, tap.url, model, tmp_path_factory, **settings):
        yield RealStack(name, load_tokenizer(model), proxy, tap)


DATABASES = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture(scope="module", params=DATABASES)
async def stack(
    request: pytest.FixtureRequest,
    real_engine: tuple[str, Path, BackendTap],
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[RealStack]:
    async for built in _stack(request, real_engine, tmp_path_factory):
        yield built


@pytest.fixture(scope="module", params=DATABASES)
async def stack_dropping_reasoning(
    request: pytest.FixtureRequest,
    real_engine: tuple[str, Path, BackendTap],
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[RealStack]:
    async for built in _stack(request, real_engine, tmp_path_factory, keep_reasoning=False):
        yield built


def extends(tap: BackendTap, earlier: int, later: int) -> bool:
    a, b = tap.generates[earlier], tap.generates[later]
    prefix = a.body["input_ids"] + a.final["output_ids"]
    return bool(b.body["input_ids"][: len(prefix)] == prefix)


def openai_echo(message: Any) -> dict[str, Any]:
    """The assistant message as a harness sends it back: no reasoning, arguments
    re-encoded compactly with their keys reversed, trailing whitespace trimmed."""
    out: dict[str, Any] = {"role": "assistant", "content": (message.content or "").rstrip()}
    calls = []
    for call in message.tool_calls or []:
        arguments = dict(reversed(json.loads(call.function.arguments).items()))
        compact = json.dumps(arguments, separators=(",", ":"))
        function = {"name": call.function.name, "arguments": compact}
        calls.append({"id": call.id, "type": "function", "function": function})
    if calls:
        out["tool_calls"] = calls
    return out


def openai_loop(stack: RealStack) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    session = stack.proxy.new_session()
    client = openai.OpenAI(base_url=session["openai_base_url"], api_key="x", max_retries=0)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "START: list the files, then read a.txt."},
    ]
    first = client.chat.completions.create(model="m", messages=messages, tools=OPENAI_TOOLS)  # type: ignore[arg-type]
    calls = first.choices[0].message.tool_calls or []
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == FIRST_ARGS  # type: ignore[union-attr]
    messages.append(openai_echo(first.choices[0].message))
    messages.append({"role": "tool", "tool_call_id": calls[0].id, "content": LONG_OUTPUT})
    messages.append({"role": "tool", "tool_call_id": calls[1].id, "content": "Error: no a.txt"})
    second = client.chat.completions.create(model="m", messages=messages, tools=OPENAI_TOOLS)  # type: ignore[arg-type]
    assert (second.choices[0].message.content or "").rstrip() == "a.txt is missing."
    messages.append(openai_echo(second.choices[0].message))
    messages.append({"role": "user", "content": QUESTION})
    third = client.chat.completions.create(model="m", messages=messages, tools=OPENAI_TOOLS)  # type: ignore[arg-type]
    assert third.choices[0].message.content == "Both are tags."
    return session, messages


def test_openai_tool_loop_extends_every_turn(stack: RealStack) -> None:
    stack.tap.reset()
    session, _ = openai_loop(stack)
    assert extends(stack.tap, 0, 1)
    assert extends(stack.tap, 1, 2)
    turns = stack.proxy.trajectory(session["id"])["turns"]
    assert [(t["classification"], t["fork_reason"]) for t in turns] == [
        ("root", None),
        ("extend", None),
        ("extend", None),
    ]


def test_anthropic_tool_loop_extends_every_turn(stack: RealStack) -> None:
    session = stack.proxy.new_session()
    client = anthropic.Anthropic(base_url=session["anthropic_base_url"], api_key="x", max_retries=0)
    stack.tap.reset()
    messages: list[Any] = [{"role": "user", "content": "START: list the files, then read a.txt."}]
    first = client.messages.create(
        model="m", max_tokens=512, messages=messages, tools=ANTHROPIC_TOOLS
    )
    uses = [b for b in first.content if b.type == "tool_use"]
    assert [(b.name, b.input) for b in uses] == FIRST_ARGS
    assert first.stop_reason == "tool_use"
    thinking = [b for b in first.content if b.type == "thinking"]
    assert [b.thinking.strip() for b in thinking] == (
        ["List, then read."] if stack.name in THINKING else []
    )
    messages.append({"role": "assistant", "content": [b.model_dump() for b in first.content]})
    messages.append({"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": uses[0].id, "content": LONG_OUTPUT},
        {"type": "tool_result", "tool_use_id": uses[1].id, "content": "Error: no a.txt",
         "is_error": True},
    ]})  # fmt: skip
    second = client.messages.create(
        model="m", max_tokens=512, messages=messages, tools=ANTHROPIC_TOOLS
    )
    assert [b.text.rstrip() for b in second.content if b.type == "text"] == ["a.txt is missing."]
    assert extends(stack.tap, 0, 1)
    turns = stack.proxy.trajectory(session["id"])["turns"]
    assert [t["classification"] for t in turns] == ["root", "extend"]


def test_without_kept_reasoning_a_new_query_forks_to_the_whole_render(
    stack_dropping_reasoning: RealStack,
) -> None:
    stack = stack_dropping_reasoning
    stack.tap.reset()
    session, messages = openai_loop(stack)
    turns = stack.proxy.trajectory(session["id"])["turns"]
    kinds = [(t["classification"], t["fork_reason"]) for t in turns]
    assert extends(stack.tap, 0, 1)
    if stack.name not in THINKING:
        assert kinds == [("root", None), ("extend", None), ("extend", None)]
        return
    assert kinds == [("root", None), ("extend", None), ("fork", "reasoning_dropped")]
    for message in messages:
        for call in message.get("tool_calls", ()):
            call["function"]["arguments"] = json.loads(call["function"]["arguments"])
    whole = stack.tokenizer.apply_chat_template(
        messages, tools=OPENAI_TOOLS, add_generation_prompt=True, tokenize=False
    )
    expected = stack.tokenizer.encode(whole, add_special_tokens=False)
    assert stack.tap.generates[2].body["input_ids"] == expected
