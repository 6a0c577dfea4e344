"""Differential tests: our output parser against SGLang 0.5.23's own detectors (issue 14).

The corpus is what models sample: answers written by each real template in its own format
(``tests.support.real_policy``: tool calls with strings, integers, booleans, optionals,
enums, objects, lists, unicode, parallel calls, reasoning, text before calls), plus
hand-written edge cases (malformed blocks, unknown tools, missing tags). Each text is
parsed by our ``OutputParser`` from the real tokenizer's ids (whole and in random chunks),
and by SGLang's ``qwen3`` reasoning detector followed by its ``qwen25`` or ``qwen3_coder``
tool-call detector (whole, and streamed chunk by chunk), as SGLang serves a request with
``--reasoning-parser qwen3 --tool-call-parser ...``.

Compared: the tool calls (name and arguments, as JSON), the reasoning (SGLang leaves the
markup's newlines in, ours drops them: compared stripped) and the text before the first
call (SGLang's non-streaming parse drops text after a call, and malformed blocks: we keep
both, as its streaming does). The differences found must be exactly ``KNOWN``, each a
documented, deliberate departure (see ``proxy.parsing.tool_formats``), so the count in the
closing note stays true in both directions.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from transformers import PreTrainedTokenizerBase

from proxy.canonical import (
    ChatRequest,
    Message,
    ReasoningDelta,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolSpec,
)
from proxy.parsing.parser import OutputParser
from proxy.render import Renderer, load_tokenizer
from proxy.settings import ToolParser
from tests.support.optional import unavailable
from tests.support.real_models import BY_NAME, REAL_TEMPLATES
from tests.support.real_policy import sampled_text
from tests.support.sglang_package import SGLangUnavailable
from tests.support.sglang_parsers import (
    SGLangParsers,
    SGLangResult,
    sglang_parsers,
)

TOOLS = (
    ToolSpec(
        "bash",
        "Run a shell command.",
        {
            "type": "object",
            "properties": {
                "command": {"type": "string"},
                "timeout": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
                "background": {"type": "boolean"},
                "ratio": {"type": "number"},
                "env": {"type": "object"},
                "argv": {"type": "array", "items": {"type": "string"}},
                "mode": {"enum": ["fast", "slow"]},
                "level": {"enum": [1, 2, 3]},
            },
            "required": ["command"],
        },
    ),
    ToolSpec(
        "read", "Read a file.", {"type": "object", "properties": {"path": {"type": "string"}}}
    ),
)


def call(name: str, **arguments: object) -> ToolCall:
    return ToolCall("c", name, json.dumps(arguments))


ANSWERS: dict[str, Message] = {
    "one call": Message("assistant", "", None, (call("read", path="src/main.py"),)),
    "typed": Message(
        "assistant",
        "",
        "Check it.",
        (
            call("bash", command="ls -la", timeout=30, background=True, ratio=0.5, level=2),
            call("bash", command="sleep 1", timeout=None, background=False, mode="slow"),
        ),
    ),
    "structured": Message(
        "assistant",
        "Running it.",
        None,
        (call("bash", command="env", env={"A": "1", "B": [1, True]}, argv=["ls", "-l"]),),
    ),
    "multiline unicode": Message(
        "assistant",
        "",
        "Write the file.\nCarefully.",
        (call("bash", command="cat > a.py <<'EOF'\nprint('Grüße 👋 你好')\n\nx = 1\nEOF"),),
    ),
    "text only": Message("assistant", "The answer is 42.", "Think it over."),
    "parallel reads": Message(
        "assistant", "", None, tuple(call("read", path=f"f{i}.txt") for i in range(4))
    ),
}

HANDWRITTEN: dict[ToolParser, dict[str, str]] = {
    ToolParser.QWEN3: {
        "no newlines": '<tool_call>{"name": "read", "arguments": {"path": "a"}}</tool_call>',
        "unknown tool": '<tool_call>\n{"name": "rm", "arguments": {}}\n</tool_call>',
        "bad json": '<tool_call>\n{"name": "read", "arguments": {"path": }\n</tool_call>',
        "a list": (
            '<tool_call>\n[{"name": "read", "arguments": {"path": "a"}}, '
            '{"name": "read", "arguments": {"path": "b"}}]\n</tool_call>'
        ),
        "parameters": '<tool_call>\n{"name": "read", "parameters": {"path": "a"}}\n</tool_call>',
        "string arguments": (
            '<tool_call>\n{"name": "read", "arguments": "{\\"path\\": \\"a\\"}"}\n</tool_call>'
        ),
        "text after": (
            'Let me.\n<tool_call>\n{"name": "read", "arguments": {"path": "a"}}\n</tool_call>'
            "\nThen more."
        ),
        "tag in reasoning": (
            "<think>\nmaybe <tool_call> later\n</think>\n\n"
            '<tool_call>\n{"name": "read", "arguments": {"path": "a"}}\n</tool_call>'
        ),
    },
    ToolParser.QWEN3_CODER: {
        "unknown tool": (
            "<tool_call>\n<function=grep>\n<parameter=q>\nx\n</parameter>\n</function>\n"
            "</tool_call>"
        ),
        "no closing parameter": (
            "<tool_call>\n<function=bash>\n<parameter=command>\nls\n<parameter=timeout>\n5\n"
            "</function>\n</tool_call>"
        ),
        "two functions": (
            "<tool_call>\n<function=read>\n<parameter=path>\na\n</parameter>\n</function>\n"
            "<function=read>\n<parameter=path>\nb\n</parameter>\n</function>\n</tool_call>"
        ),
        "left open": "<tool_call>\n<function=read>\n<parameter=path>\na\n</parameter>\n",
        "python values": (
            "<tool_call>\n<function=bash>\n<parameter=command>\nnull\n</parameter>\n"
            "<parameter=background>\nFalse\n</parameter>\n<parameter=env>\n{'k': None}\n"
            "</parameter>\n<parameter=timeout>\nNone\n</parameter>\n</function>\n</tool_call>"
        ),
        "no wrapper": "<function=read>\n<parameter=path>\na\n</parameter>\n</function>",
        "text after": (
            "Ok.\n<tool_call>\n<function=read>\n<parameter=path>\na\n</parameter>\n</function>\n"
            "</tool_call>\nAnd then."
        ),
    },
}

# (case, what differs) -> why. Every other comparison must agree.
KNOWN: dict[tuple[str, str], str] = {
    # SGLang hands the harness arguments that are a JSON string; we parse the object in it.
    ("qwen3/string arguments", "calls"): "arguments as a string",
    ("qwen3/string arguments", "calls (stream)"): "arguments as a string",
    # A block that holds no call stays in the content as text; SGLang drops it.
    ("qwen3/unknown tool", "content"): "malformed kept",
    ("qwen3/bad json", "content"): "malformed kept",
    # SGLang's own streaming departs from its non-streaming parse, which we follow: it
    # streams a name-only call for a block whose JSON then breaks, and fails on a list.
    ("qwen3/bad json", "calls (stream)"): "SGLang streaming",
    ("qwen3/a list", "calls (stream)"): "SGLang streaming",
    # SGLang's non-streaming reasoning split looks for </think> first; streaming (and we)
    # close reasoning at the <tool_call>, which is what SGLang streams to a harness.
    ("qwen3/tag in reasoning", "reasoning"): "streamed semantics",
    ("qwen3/tag in reasoning", "content"): "streamed semantics",
    # A <function=...> with no <tool_call> around it is text to us, as to SGLang's
    # non-streaming parse; SGLang's streaming calls it.
    ("qwen3_coder/no wrapper", "calls (stream)"): "unwrapped function",
    # SGLang's XML streaming never closes the arguments of a block left open.
    ("qwen3_coder/left open", "calls (stream)"): "unclosed block",
}


@dataclass(frozen=True)
class Case:
    name: str
    parser: ToolParser
    template: str
    text: str
    in_reasoning: bool


@pytest.fixture(scope="module")
def sglang() -> SGLangParsers:
    try:
        return sglang_parsers()
    except SGLangUnavailable as exc:
        unavailable(f"SGLang's parsers unavailable: {exc}")


@pytest.fixture(scope="module")
def tokenizers(real_tokenizer_dirs: dict[str, Path]) -> dict[str, PreTrainedTokenizerBase]:
    return {name: load_tokenizer(path) for name, path in real_tokenizer_dirs.items()}


def corpus(tokenizers: dict[str, PreTrainedTokenizerBase]) -> list[Case]:
    cases: list[Case] = []
    for template in REAL_TEMPLATES:
        tokenizer = tokenizers[template.name]
        for thinking in (None, False):
            request = ChatRequest(
                adapter="test",
                model="m",
                messages=(Message("user", "Do the task."),),
                tools=TOOLS,
                enable_thinking=thinking,
            )
            prompt = Renderer(tokenizer).render_text(request)
            for label, answer in ANSWERS.items():
                if thinking is False:  # the prompt pre-fills an empty think block
                    answer = replace(answer, reasoning=None)
                cases.append(
                    Case(
                        f"{template.name}/{label}/{thinking}",
                        template.tool_parser,
                        template.name,
                        sampled_text(tokenizer, request, answer),
                        prompt.rstrip().endswith("<think>"),
                    )
                )
    for parser, texts in HANDWRITTEN.items():
        vocabulary = "qwen3" if parser is ToolParser.QWEN3 else "qwen3-coder"
        for label, text in texts.items():
            cases.append(Case(f"{parser}/{label}", parser, vocabulary, text, False))
    return cases


def ours(tokenizer: PreTrainedTokenizerBase, case: Case, rng: random.Random | None) -> SGLangResult:
    ids = [*tokenizer.encode(case.text, add_special_tokens=False), tokenizer.eos_token_id]
    parser = OutputParser(
        tokenizer=tokenizer,
        tool_parser=case.parser,
        tools=TOOLS,
        starts_in_reasoning=case.in_reasoning,
    )
    events = []
    start = 0
    while start < len(ids):
        size = rng.randint(1, 4) if rng else len(ids)
        events += parser.feed(ids[start : start + size])
        start += size
    events += parser.finish()
    calls = tuple((e.call.name, e.call.arguments) for e in events if isinstance(e, ToolCallDelta))
    before_call: list[str] = []
    for event in events:
        if isinstance(event, ToolCallDelta):
            break
        if isinstance(event, TextDelta):
            before_call.append(event.text)
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    return SGLangResult(reasoning, "".join(before_call), calls)


def text_chunks(tokenizer: PreTrainedTokenizerBase, text: str, rng: random.Random) -> list[str]:
    """The text as a detokenizer streams it: whole characters, a few tokens at a time."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    chunks, shown, end = [], "", 0
    while end < len(ids):
        end = min(len(ids), end + rng.randint(1, 4))
        decoded = str(tokenizer.decode(ids[:end], skip_special_tokens=True))
        if decoded.endswith("\ufffd") and end < len(ids):
            continue
        chunks.append(decoded[len(shown) :])
        shown = decoded
    return chunks


def json_calls(calls: tuple[tuple[str, str], ...]) -> list[tuple[str, object]]:
    out: list[tuple[str, object]] = []
    for name, arguments in calls:
        try:
            out.append((name, json.loads(arguments)))
        except ValueError:
            out.append((name, f"invalid JSON: {arguments!r}"))
    return out


def test_our_parser_agrees_with_sglangs_detectors(
    sglang: SGLangParsers, tokenizers: dict[str, PreTrainedTokenizerBase]
) -> None:
    rng = random.Random(14)
    differences: dict[tuple[str, str], str] = {}
    cases = corpus(tokenizers)
    for case in cases:
        tokenizer = tokenizers[case.template]
        key = case.name
        whole = sglang.parse_non_stream(
            case.parser, case.text, TOOLS, in_reasoning=case.in_reasoning
        )
        streamed = sglang.parse_stream(
            case.parser,
            text_chunks(tokenizer, case.text, rng),
            TOOLS,
            in_reasoning=case.in_reasoning,
        )
        mine = ours(tokenizer, case, None)
        assert ours(tokenizer, case, rng) == mine, case.name  # chunking changes nothing
        checks = {
            "calls": (json_calls(mine.calls), json_calls(whole.calls)),
            "calls (stream)": (json_calls(mine.calls), json_calls(streamed.calls)),
            "reasoning": (mine.reasoning.strip(), whole.reasoning.strip()),
            "content": (mine.content.strip(), whole.content.strip()),
        }
        for aspect, (got, expected) in checks.items():
            if got != expected:
                differences[(key, aspect)] = f"ours {got!r} / SGLang {expected!r}"
    unexpected = {k: v for k, v in differences.items() if k not in KNOWN}
    assert unexpected == {}, "\n".join(f"{k}: {v}" for k, v in unexpected.items())
    stale = sorted(set(KNOWN) - set(differences))
    assert stale == [], f"documented differences that no longer occur: {stale}"
    template_cases = [c for c in cases if c.name.count("/") == 2]
    assert len(template_cases) == len(REAL_TEMPLATES) * 2 * len(ANSWERS)
    assert not [k for k in differences if k[0] in {c.name for c in template_cases}]
    print(  # the closing note's count
        f"\n{len(cases)} texts ({len(template_cases)} written by the real templates): "
        f"{len({k[0] for k in differences if 'calls' in k[1]})} with tool-call differences"
    )
    assert BY_NAME["qwen3.5"].tool_parser is ToolParser.QWEN3_CODER
