from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest

from kernel.errors import LegoError
from proxy.canonical import (
    JsonValue,
    OutputEvent,
    ReasoningDelta,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolSpec,
)
from proxy.parsing import OutputParser
from proxy.settings import ToolParser

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

SCHEMA: dict[str, JsonValue] = {
    "type": "object",
    "properties": {
        "path": {"type": "string"},
        "content": {"type": "string"},
        "count": {"type": "integer"},
        "force": {"type": "boolean"},
        "argv": {"type": "array"},
    },
}
TOOLS = (ToolSpec("write_file", "write a file", SCHEMA), ToolSpec("bash", "run", SCHEMA))
STOP = "END!"


def ids_of(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def token_id(tokenizer: PreTrainedTokenizerBase, token: str) -> int:
    found = tokenizer.convert_tokens_to_ids(token)
    assert isinstance(found, int)
    return found


def im_end(tokenizer: PreTrainedTokenizerBase) -> int:
    return token_id(tokenizer, "<|im_end|>")


def fold(events: Sequence[OutputEvent]) -> list[OutputEvent]:
    """Merge adjacent reasoning/text deltas: the result must not depend on chunking."""
    folded: list[OutputEvent] = []
    for event in events:
        previous = folded[-1] if folded else None
        if isinstance(event, ReasoningDelta) and isinstance(previous, ReasoningDelta):
            folded[-1] = ReasoningDelta(previous.text + event.text)
        elif isinstance(event, TextDelta) and isinstance(previous, TextDelta):
            folded[-1] = TextDelta(previous.text + event.text)
        else:
            folded.append(event)
    return folded


def run(
    parser: OutputParser,
    ids: Sequence[int],
    sizes: Sequence[int] | None = None,
    matched_stop: str | None = None,
) -> list[OutputEvent]:
    events: list[OutputEvent] = []
    i = 0
    for size in sizes or [len(ids)]:
        events += parser.feed(ids[i : i + size])
        i += size
    assert i >= len(ids)
    events += parser.finish(matched_stop)
    assert not any(isinstance(e, (ReasoningDelta, TextDelta)) and not e.text for e in events)
    return events


def make(tokenizer: PreTrainedTokenizerBase, **kwargs: object) -> OutputParser:
    options: dict[str, object] = {"tool_parser": ToolParser.QWEN3, "tools": TOOLS}
    options.update(kwargs)
    return OutputParser(tokenizer=tokenizer, **options)  # type: ignore[arg-type]


def chunkings(n: int, rng: random.Random) -> list[list[int]]:
    plans = [[size] * (n // size + 1) for size in (1, 2, 3, 7)]
    for _ in range(3):
        plan: list[int] = []
        while sum(plan) < n:
            plan.append(rng.choice([1, 1, 2, 3, 5, 8, 13, 40]))
        plans.append(plan)
    plans.append([n])
    return plans


# -- a random, well-understood output and the events it must produce ---------------------

WORDS = [
    "hello", "wörld", "中文", "字符", "🎉", "👩‍💻", "tool", "call", "ENDING", "EN", "a<b",
    "x < y", "<tool", "</tool", "<thin", "think>", "{json}", "naïve", "日本語", "🚀🚀",
]  # fmt: skip


def words(rng: random.Random, lo: int = 1, hi: int = 6) -> str:
    out = rng.choice(WORDS)
    for _ in range(rng.randint(lo, hi) - 1):
        out += rng.choice([" ", " ", "\n", ", "]) + rng.choice(WORDS)
    return out


def random_arguments(rng: random.Random) -> dict[str, JsonValue]:
    args: dict[str, JsonValue] = {"path": f"src/{rng.choice(['a', '字', '🎉'])}.py"}
    if rng.random() < 0.7:
        args["content"] = words(rng, 1, 12) + rng.choice(["", "\n", "\n\tindent", ' "q" \\'])
    if rng.random() < 0.5:
        args["count"] = rng.randint(-5, 10**6)
    if rng.random() < 0.5:
        args["force"] = rng.random() < 0.5
    if rng.random() < 0.5:
        args["argv"] = ["ls", words(rng, 1, 2)]
    return args


def call_block(
    parser: ToolParser, name: str, args: dict[str, JsonValue], rng: random.Random
) -> str:
    if parser is ToolParser.QWEN3:
        payload = {"name": name, "arguments": args}
        return f"<tool_call>\n{json.dumps(payload, ensure_ascii=rng.random() < 0.5)}\n</tool_call>"
    body = ""
    for key, value in args.items():
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        body += f"<parameter={key}>\n{text}\n</parameter>\n"
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


def malformed_block(parser: ToolParser, rng: random.Random) -> str:
    if parser is ToolParser.QWEN3:
        body = rng.choice(['{"name": "nope", "arguments": {}}', '{"name": "bash", "arguments": {'])
    else:
        # A call to an unknown tool is a call in this format (as in SGLang); a function tag
        # without its closing ">" holds none.
        body = rng.choice(["<function=nope\n</function>", "no function here"])
    return f"<tool_call>\n{body}\n</tool_call>"


@dataclass(frozen=True)
class Scenario:
    output: str
    expected: list[OutputEvent]
    reasoning_prefix: str | None  # the output up to and including </think>
    malformed: int
    matched_stop: str | None


def scenario(parser: ToolParser, rng: random.Random) -> Scenario:
    output = ""
    expected: list[OutputEvent] = []
    reasoning_prefix = None
    if rng.random() < 0.6:
        reasoning = words(rng, 1, 10)
        output += f"<think>\n{reasoning}\n</think>"
        reasoning_prefix = output
        output += "\n\n"
        expected.append(ReasoningDelta(reasoning))
    kinds = [rng.choice(["text", "call", "call", "bad"]) for _ in range(rng.randint(0, 5))]
    kinds = [k for i, k in enumerate(kinds) if not (k == "text" and i and kinds[i - 1] == "text")]
    if rng.random() < 0.2:
        kinds.append("open")  # a block still open when generation ends
    malformed = 0
    previous = None
    for kind in kinds:
        separator = rng.choice(["", "\n", "\n\n", " "]) if previous else ""
        keep_separator = previous is not None and "call" not in (previous, kind)
        output += separator
        if keep_separator:
            expected.append(TextDelta(separator))
        if kind == "text":
            piece = words(rng)
            output += piece
            expected.append(TextDelta(piece))
        elif kind == "call":
            name = rng.choice(TOOLS).name
            args = random_arguments(rng)
            output += call_block(parser, name, args, rng)
            index = sum(isinstance(e, ToolCallDelta) for e in expected)
            call = ToolCall(f"call_{index}", name, json.dumps(args, ensure_ascii=False))
            expected.append(ToolCallDelta(index, call))
        elif kind == "bad":
            piece = malformed_block(parser, rng)
            output += piece
            expected.append(TextDelta(piece))
            malformed += 1
        else:
            piece = "<tool_call>\n" + words(rng)
            output += piece
            expected.append(TextDelta(piece))
            malformed += 1
        previous = kind
    matched_stop = None
    if rng.random() < 0.3:
        output += STOP
        matched_stop = STOP
    return Scenario(output, fold(expected), reasoning_prefix, malformed, matched_stop)


@pytest.mark.parametrize("tool_parser", list(ToolParser))
@pytest.mark.parametrize("seed", range(25))
def test_random_outputs_parse_the_same_under_every_chunking(
    tokenizer: PreTrainedTokenizerBase, tool_parser: ToolParser, seed: int
) -> None:
    rng = random.Random(seed)
    case = scenario(tool_parser, rng)
    ids = [*ids_of(tokenizer, case.output), im_end(tokenizer)]
    reasoning_tokens = 0
    if case.reasoning_prefix is not None:
        reasoning_tokens = len(ids_of(tokenizer, case.reasoning_prefix))
    for plan in chunkings(len(ids), rng):
        parser = make(tokenizer, tool_parser=tool_parser, stop=(STOP,))
        events = run(parser, ids, plan, case.matched_stop)
        assert fold(events) == case.expected, (case.output, plan)
        assert parser.malformed_tool_calls == case.malformed
        assert parser.has_tool_calls == any(isinstance(e, ToolCallDelta) for e in case.expected)
        assert parser.reasoning_tokens == reasoning_tokens


# -- specific behaviour ---------------------------------------------------------------------


def test_reasoning_text_and_a_call_stream_as_they_complete(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    parser = make(tokenizer)
    head = "<think>\nI should list 📁 files.\n</think>\n\nLet me look."
    call = '\n<tool_call>\n{"name": "bash", "arguments": {"argv": ["ls"]}}\n</tool_call>'
    first = parser.feed(ids_of(tokenizer, head))
    assert first == [ReasoningDelta("I should list 📁 files."), TextDelta("Let me look.")]
    second = parser.feed(ids_of(tokenizer, call))
    assert second == [ToolCallDelta(0, ToolCall("call_0", "bash", '{"argv": ["ls"]}'))]
    assert parser.finish() == []
    assert parser.has_tool_calls
    assert parser.reasoning_tokens == len(ids_of(tokenizer, head.split("\n\n")[0]))


def test_text_is_held_only_while_it_may_be_a_tag(tokenizer: PreTrainedTokenizerBase) -> None:
    parser = make(tokenizer)
    assert fold(parser.feed(ids_of(tokenizer, "see <tool"))) == [TextDelta("see")]
    assert fold(parser.feed(ids_of(tokenizer, "box> now"))) == [TextDelta(" <toolbox> now")]
    assert parser.finish() == []


def test_stop_string_is_trimmed_only_when_it_matched(tokenizer: PreTrainedTokenizerBase) -> None:
    ids = ids_of(tokenizer, "answer 42 END!")
    trimmed = run(make(tokenizer, stop=(STOP,)), ids, matched_stop=STOP)
    kept = run(make(tokenizer, stop=(STOP,)), ids)
    assert fold(trimmed) == [TextDelta("answer 42 ")]
    assert fold(kept) == [TextDelta("answer 42 END!")]


def test_stop_string_inside_reasoning(tokenizer: PreTrainedTokenizerBase) -> None:
    ids = ids_of(tokenizer, "<think>\nhmm 🤔 END!")
    parser = make(tokenizer, stop=(STOP,))
    assert fold(run(parser, ids, [1] * len(ids), STOP)) == [ReasoningDelta("hmm 🤔 ")]
    assert parser.reasoning_tokens == len(ids)


def test_template_opened_reasoning(tokenizer: PreTrainedTokenizerBase) -> None:
    parser = make(tokenizer, starts_in_reasoning=True)
    ids = [*ids_of(tokenizer, "step 1\n</think>\n\nDone ✅"), im_end(tokenizer)]
    assert fold(run(parser, ids, [2] * len(ids))) == [
        ReasoningDelta("step 1"),
        TextDelta("Done ✅"),
    ]
    assert parser.reasoning_tokens == len(ids_of(tokenizer, "step 1\n</think>"))


def test_no_think_tag_means_no_reasoning(tokenizer: PreTrainedTokenizerBase) -> None:
    parser = make(tokenizer)
    text = "plan\n</think>\n\nanswer"
    assert fold(run(parser, ids_of(tokenizer, text))) == [TextDelta(text)]
    assert parser.reasoning_tokens == 0


def test_tool_call_inside_reasoning_closes_it(tokenizer: PreTrainedTokenizerBase) -> None:
    parser = make(tokenizer, tool_parser=ToolParser.QWEN3_CODER)
    head = "<think>\nneed a file\n"
    block = "<tool_call>\n<function=bash>\n<parameter=count>\n3\n</parameter>\n</function>\n"
    block += "</tool_call>"
    events = run(parser, ids_of(tokenizer, head + block), [3] * 40)
    assert fold(events) == [
        ReasoningDelta("need a file"),
        ToolCallDelta(0, ToolCall("call_0", "bash", '{"count": 3}')),
    ]
    assert parser.reasoning_tokens == len(ids_of(tokenizer, head))


@pytest.mark.parametrize(
    "options", [{"tools_enabled": False}, {"tools": ()}], ids=["disabled", "no-tools"]
)
def test_without_tools_everything_is_text(
    tokenizer: PreTrainedTokenizerBase, options: dict[str, object]
) -> None:
    parser = make(tokenizer, **options)
    body = '\n\n<tool_call>\n{"name": "bash", "arguments": {}}\n</tool_call>\n'
    events = run(parser, ids_of(tokenizer, "<think>\nx <tool_call> y\n</think>\n\nok" + body))
    assert fold(events) == [ReasoningDelta("x <tool_call> y"), TextDelta("ok" + body)]
    assert parser.malformed_tool_calls == 0
    assert not parser.has_tool_calls


def test_call_ids_use_the_prefix_and_count_only_good_calls(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    good = '<tool_call>\n{"name": "bash", "arguments": {}}\n</tool_call>'
    bad = "<tool_call>\n{oops}\n</tool_call>"
    parser = make(tokenizer, call_id_prefix="toolu_turn7_")
    events = run(parser, ids_of(tokenizer, f"{good}\n{bad}\n{good}\nthanks"))
    assert fold(events) == [
        ToolCallDelta(0, ToolCall("toolu_turn7_0", "bash", "{}")),
        TextDelta(bad),
        ToolCallDelta(1, ToolCall("toolu_turn7_1", "bash", "{}")),
        TextDelta("thanks"),
    ]
    assert parser.malformed_tool_calls == 1


def test_special_tokens_inside_the_output_produce_nothing(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    im_start = token_id(tokenizer, "<|im_start|>")
    ids = [*ids_of(tokenizer, "a"), im_start, *ids_of(tokenizer, "b"), im_end(tokenizer)]
    assert fold(run(make(tokenizer), ids, [1] * len(ids))) == [TextDelta("ab")]


def test_a_long_argument_streamed_token_by_token(tokenizer: PreTrainedTokenizerBase) -> None:
    content = "def f():\n    return '🎉 中文'\n" * 400
    args: dict[str, JsonValue] = {"path": "big.py", "content": content}
    block = call_block(ToolParser.QWEN3_CODER, "write_file", args, random.Random(0))
    ids = ids_of(tokenizer, block)
    parser = make(tokenizer, tool_parser=ToolParser.QWEN3_CODER)
    events: list[OutputEvent] = []
    for token in ids:
        events += parser.feed([token])
    assert events == [
        ToolCallDelta(0, ToolCall("call_0", "write_file", json.dumps(args, ensure_ascii=False)))
    ]
    assert parser.finish() == []


def test_feeding_after_finish_is_a_bug(tokenizer: PreTrainedTokenizerBase) -> None:
    parser = make(tokenizer)
    parser.finish()
    with pytest.raises(LegoError):
        parser.feed([1])
    with pytest.raises(LegoError):
        parser.finish()
