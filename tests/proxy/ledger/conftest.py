"""Ledger test helpers: the project's real tiny tokenizer and a simulated policy.

"Sampled ids" are made without a model: the assistant's text in the template's answer
format, tokenized (optionally piece by piece, for non-canonical splits), plus eos.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from engine.tiny import build_tokenizer
from proxy.canonical import ChatRequest, Message, ToolCall, ToolSpec
from proxy.ledger import LedgerBook, PromptPlan
from proxy.tokens import TokenIds

BASH = ToolSpec(
    name="bash",
    description="Run a shell command.",
    parameters={
        "type": "object",
        "properties": {"command": {"type": "string"}, "timeout": {"type": "integer"}},
    },
)
READ = ToolSpec(
    name="read",
    description="Read a file.",
    parameters={"type": "object", "properties": {"path": {"type": "string"}}},
)
TOOLS = (BASH, READ)
SYSTEM = Message(role="system", content="You are a coding agent. Use the tools.")


@pytest.fixture(scope="session")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> PreTrainedTokenizerBase:
    path: Path = tmp_path_factory.mktemp("ledger-tokenizer")
    build_tokenizer(path)
    loaded: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(str(path))
    return loaded


@pytest.fixture
def book(tokenizer: PreTrainedTokenizerBase) -> LedgerBook:
    return LedgerBook(tokenizer)


def request(*messages: Message, tools: tuple[ToolSpec, ...] = TOOLS, **extra: Any) -> ChatRequest:
    return ChatRequest(
        adapter="openai_chat", model="some-model", messages=messages, tools=tools, **extra
    )


def call(name: str, arguments: str, call_id: str = "call_1") -> ToolCall:
    return ToolCall(id=call_id, name=name, arguments=arguments)


def answer_text(message: Message) -> str:
    """The answer as the model writes it in the Qwen3 format (arguments verbatim)."""
    text = ""
    if message.reasoning:
        text += f"<think>\n{message.reasoning}\n</think>\n\n"
    text += message.content
    for index, tool_call in enumerate(message.tool_calls):
        if index or message.content:
            text += "\n"
        text += (
            f'<tool_call>\n{{"name": "{tool_call.name}", "arguments": '
            f"{tool_call.arguments}}}\n</tool_call>"
        )
    return text


def sampled(
    tokenizer: PreTrainedTokenizerBase,
    message: Message,
    *,
    pieces: Sequence[str] | None = None,
    eos: bool = True,
) -> tuple[int, ...]:
    parts = pieces if pieces is not None else [answer_text(message)]
    ids: list[int] = []
    for part in parts:
        ids += tokenizer.encode(part, add_special_tokens=False)
    if eos:
        assert tokenizer.eos_token_id is not None
        ids.append(tokenizer.eos_token_id)
    return tuple(ids)


@dataclass
class Driver:
    """Plays a session against a ledger and checks invariant 3 on every extend."""

    book: LedgerBook
    tokenizer: PreTrainedTokenizerBase
    session_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    tokens: dict[str, TokenIds] = field(default_factory=dict)
    plans: list[PromptPlan] = field(default_factory=list)

    def turn(
        self,
        req: ChatRequest,
        answer: Message,
        *,
        output: tuple[int, ...] | None = None,
        turn_id: str | None = None,
    ) -> PromptPlan:
        plan = self.book.plan(self.session_id, req)
        if plan.classification in ("extend", "realign"):
            assert plan.parent_turn_id is not None
            parent = self.tokens[plan.parent_turn_id]
            assert plan.prompt_ids[: len(parent)] == parent
            assert plan.reused_prefix_len == len(parent)
        if plan.classification == "fork":
            assert plan.fork_reason is not None
        ids = output if output is not None else sampled(self.tokenizer, answer)
        turn_id = turn_id or uuid.uuid4().hex
        self.book.commit(self.session_id, plan, req, ids, answer, turn_id)
        self.tokens[turn_id] = plan.prompt_ids + ids
        self.plans.append(plan)
        return plan
