from __future__ import annotations

from dataclasses import replace

import pytest

from proxy.canonical import TextDelta, ToolCall, ToolCallDelta, ToolSpec
from proxy.parsing.tool_calls import ContentEvent, ToolCallSplitter
from proxy.settings import ToolParser

TOOLS = {"bash": ToolSpec("bash", "run", {"properties": {"n": {"type": "integer"}}})}


def split(text: str, chunk: int) -> tuple[list[ContentEvent], int]:
    splitter = ToolCallSplitter(parser=ToolParser.QWEN3, tools=TOOLS, call_id_prefix="c")
    events: list[ContentEvent] = []
    for i in range(0, len(text), chunk):
        events += splitter.push(text[i : i + chunk])
    events += splitter.finish()
    return merge(events), splitter.malformed


def merge(events: list[ContentEvent]) -> list[ContentEvent]:
    out: list[ContentEvent] = []
    for event in events:
        if isinstance(event, TextDelta) and out and isinstance(out[-1], TextDelta):
            out[-1] = TextDelta(out[-1].text + event.text)
        else:
            out.append(event)
    return out


GOOD = '<tool_call>\n{"name": "bash", "arguments": {"n": 1}}\n</tool_call>'
CALL = ToolCall("c0", "bash", '{"n": 1}')

CASES: list[tuple[str, list[ContentEvent], int]] = [
    ("plain a<b and <tool, no call", [TextDelta("plain a<b and <tool, no call")], 0),
    (
        f"Ok.\n\n{GOOD}\n\nDone.\n",
        [TextDelta("Ok."), ToolCallDelta(0, CALL), TextDelta("Done.\n")],
        0,
    ),
    (f"{GOOD} {GOOD}", [ToolCallDelta(0, CALL), ToolCallDelta(1, replace(CALL, id="c1"))], 0),
    # A malformed block keeps its raw text and the whitespace around it.
    (
        "a \n<tool_call>\n{x}\n</tool_call> b",
        [TextDelta("a \n<tool_call>\n{x}\n</tool_call> b")],
        1,
    ),
    # Without its newline the tag opens no JSON block (SGLang's qwen25): it is text.
    ("a <tool_call>{x}</tool_call> b", [TextDelta("a <tool_call>{x}</tool_call> b")], 0),
    # A block still open at the end is text, with what preceded it.
    ('a\n<tool_call>\n{"name": "ba', [TextDelta('a\n<tool_call>\n{"name": "ba')], 1),
    (f"{GOOD}\n\n", [ToolCallDelta(0, CALL)], 0),
    ("<tool_cal", [TextDelta("<tool_cal")], 0),
    ("  ", [TextDelta("  ")], 0),
]


@pytest.mark.parametrize(("text", "expected", "malformed"), CASES)
@pytest.mark.parametrize("chunk", [1, 2, 5, 1000])
def test_split_under_any_chunking(
    text: str, expected: list[ContentEvent], malformed: int, chunk: int
) -> None:
    assert split(text, chunk) == (expected, malformed)


def test_a_closing_tag_split_across_pushes_is_found() -> None:
    splitter = ToolCallSplitter(parser=ToolParser.QWEN3_CODER, tools=TOOLS, call_id_prefix="c")
    assert splitter.push("<tool_call>\n<function=bash>\n<parameter=n>\n7\n</parameter>\n") == []
    assert splitter.push("</function>\n</tool_") == []
    assert splitter.push("call>") == [ToolCallDelta(0, ToolCall("c0", "bash", '{"n": 7}'))]
    assert splitter.finish() == []
