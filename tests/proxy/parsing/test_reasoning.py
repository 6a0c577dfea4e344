from __future__ import annotations

import pytest

from proxy.parsing.reasoning import ReasoningSplitter, Split


def run(
    text: str, *, chunk: int | None = None, starts: bool = False, tool_close: bool = True
) -> tuple[str, str, ReasoningSplitter]:
    splitter = ReasoningSplitter(starts_in_reasoning=starts, closes_on_tool_call=tool_close)
    size = chunk or max(len(text), 1)
    splits = [splitter.push(text[i : i + size]) for i in range(0, len(text), size)]
    splits.append(splitter.finish())
    reasoning = "".join(s.reasoning for s in splits)
    content = "".join(s.content for s in splits)
    return reasoning, content, splitter


CASES = [
    # Qwen3 with thinking: the newline after <think>, before </think>, after </think> go.
    ("<think>\nplan\n</think>\n\nanswer", False, ("plan", "answer")),
    ("<think>\n\n</think>\n\nanswer", False, ("", "answer")),
    ("  \n<think>plan</think>answer", False, ("plan", "answer")),
    # Only one newline is markup on each side inside the block.
    ("<think>\n\nplan\n\n</think>\n\n\nanswer\n", False, ("\nplan\n", "answer\n")),
    # Only newlines after </think> are stripped, not other whitespace.
    ("<think>p</think>\n  answer", False, ("p", "  answer")),
    # No opening tag at the start: no reasoning, nothing stripped.
    ("plan\n</think>\n\nanswer", False, ("", "plan\n</think>\n\nanswer")),
    ("\n\nanswer <think>x</think>", False, ("", "\n\nanswer <think>x</think>")),
    ("<thinking>x", False, ("", "<thinking>x")),
    ("  <thi", False, ("", "  <thi")),
    # The template opened the block in the prompt.
    ("\nplan\n</think>\n\nanswer", True, ("plan", "answer")),
    ("just answer", True, ("just answer", "")),
    # Reasoning that never closes keeps everything, its final newline included.
    ("<think>\nplan\n", False, ("plan\n", "")),
    ("<think>\nplan </thin", False, ("plan </thin", "")),
    # A tool call inside reasoning closes it; the tag stays in the content.
    ("<think>\nplan\n<tool_call>\n{}", False, ("plan", "<tool_call>\n{}")),
    # Emoji and CJK are ordinary text.
    ("<think>\n计划 🚀\n</think>\n\n答案 ✅", False, ("计划 🚀", "答案 ✅")),
]


@pytest.mark.parametrize(("text", "starts", "expected"), CASES)
@pytest.mark.parametrize("chunk", [1, 2, 3, 5, None])
def test_split(text: str, starts: bool, expected: tuple[str, str], chunk: int | None) -> None:
    reasoning, content, _ = run(text, chunk=chunk, starts=starts)
    assert (reasoning, content) == expected


def test_tool_call_does_not_close_reasoning_when_tools_are_off() -> None:
    reasoning, content, _ = run("<think>\na<tool_call>b\n</think>\n\nc", tool_close=False)
    assert (reasoning, content) == ("a<tool_call>b", "c")


@pytest.mark.parametrize(
    ("text", "end"),
    [
        ("<think>\nplan\n</think>\n\nanswer", len("<think>\nplan\n</think>")),
        ("<think>\nplan\n<tool_call>x", len("<think>\nplan\n")),
        ("answer", None),
        ("<think>\nplan", None),
    ],
)
def test_reasoning_end_offset(text: str, end: int | None) -> None:
    for chunk in (1, 4, None):
        assert run(text, chunk=chunk)[2].reasoning_end == end


def test_reasoning_streams_before_the_block_closes() -> None:
    splitter = ReasoningSplitter(starts_in_reasoning=False, closes_on_tool_call=True)
    assert splitter.push("<think>\nstep one\n") == Split(reasoning="step one")
    assert splitter.in_reasoning
    assert splitter.push("step two </") == Split(reasoning="\nstep two ")
    assert splitter.push("think>\n") == Split()
    assert not splitter.in_reasoning
    assert splitter.push("\nhi") == Split(content="hi")
