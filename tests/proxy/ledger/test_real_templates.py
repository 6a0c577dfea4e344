"""The real Qwen2.5, Qwen3, Qwen3-Coder and Qwen3.5 templates through the ledger (issue 14).

Each template's own tokenizer (built from registry packages, ``tests.support.real_models``)
renders a multi-turn tool loop; the "model" samples each answer in the template's own
format (``tests.support.real_policy``); the output parser reads it back; and the harness
re-serialises it the way harnesses do (reasoning dropped, arguments re-encoded with other
spacing and key order, trailing whitespace trimmed) before the next request. Every
continuation must extend: the earlier prompt + sampled ids exactly, then the whole
render's text after that answer, tokenized alone.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
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
from proxy.ledger import LedgerBook
from proxy.parsing.parser import OutputParser
from proxy.render import Renderer, load_tokenizer
from proxy.served_template import served_template
from proxy.settings import ToolParser
from tests.support.real_models import BY_NAME, REAL_TEMPLATES
from tests.support.real_policy import (
    BASH_SCHEMA,
    READ_SCHEMA,
    THINKING,
    sampled_ids,
    whole_suffix,
)

NAMES = [t.name for t in REAL_TEMPLATES]
BASH = ToolSpec(name="bash", description="Run a shell command.", parameters=BASH_SCHEMA)
READ = ToolSpec(name="read", description="Read a file.", parameters=READ_SCHEMA)
TOOLS = (BASH, READ)
LONG_OUTPUT = "".join(
    f"línea {i}: Grüße 👋 你好 → ok <tool_call> not a call </think> {'é' * (i % 7)}\n"
    for i in range(120)
)


@pytest.fixture(scope="session")
def real_tokenizers(real_tokenizer_dirs: dict[str, Path]) -> dict[str, PreTrainedTokenizerBase]:
    return {name: load_tokenizer(path) for name, path in real_tokenizer_dirs.items()}


@pytest.fixture(params=NAMES)
def name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def chat(*messages: Message, enable_thinking: bool | None = None) -> ChatRequest:
    return ChatRequest(
        adapter="openai_chat",
        model="m",
        messages=messages,
        tools=TOOLS,
        enable_thinking=enable_thinking,
    )


def call(name: str, arguments: dict[str, object], call_id: str) -> ToolCall:
    return ToolCall(call_id, name, json.dumps(arguments))


@dataclass
class Parsed:
    message: Message
    malformed: int


def parse(
    tokenizer: PreTrainedTokenizerBase, parser: ToolParser, prompt: list[int], ids: list[int]
) -> Parsed:
    """What the proxy's pipeline makes of the sampled ids (its reasoning test included)."""
    tail = str(tokenizer.decode(prompt[-4:], skip_special_tokens=False))
    output = OutputParser(
        tokenizer=tokenizer,
        tool_parser=parser,
        tools=TOOLS,
        starts_in_reasoning=tail.rstrip().endswith("<think>"),
    )
    events = [*output.feed(ids), *output.finish()]
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    content = "".join(e.text for e in events if isinstance(e, TextDelta))
    calls = tuple(e.call for e in events if isinstance(e, ToolCallDelta))
    message = Message("assistant", content, reasoning or None, calls)
    return Parsed(message, output.malformed_tool_calls)


def echoed(message: Message, turn: int) -> Message:
    """The answer as a harness sends it back: no reasoning, arguments re-encoded compactly
    with their keys reversed, new call ids, trailing whitespace trimmed."""
    calls = tuple(
        ToolCall(
            f"h{turn}_{i}",
            c.name,
            json.dumps(dict(reversed(json.loads(c.arguments).items())), separators=(",", ":")),
        )
        for i, c in enumerate(message.tool_calls)
    )
    return Message("assistant", message.content.rstrip(), None, calls)


def script(thinking: bool) -> Iterator[tuple[tuple[Message, ...], Message]]:
    """(messages the harness adds, the answer the model gives), turn by turn."""
    why = "I will list the files and read a.txt." if thinking else None
    yield (
        (
            Message("system", "You are a coding agent."),
            Message("user", "List the files, then read a.txt."),
        ),
        Message(
            "assistant",
            "",
            why,
            (
                call("bash", {"command": "ls -la", "timeout": 30, "background": False}, "c1"),
                call("read", {"path": "a.txt"}, "c2"),
            ),
        ),
    )
    yield (
        (
            Message("tool", LONG_OUTPUT, tool_call_id="c1"),
            Message("tool", "Error: a.txt: no such file", tool_call_id="c2"),
        ),
        Message("assistant", "There is no a.txt; the listing is long.  "),
    )
    yield (
        (Message("user", "Is `</think>` a tag? Write <tool_call> in a file called t."),),
        Message(
            "assistant",
            "Writing it.",
            "A literal tag, in a file." if thinking else None,
            (call("bash", {"command": "echo '<tool_call>' > t", "background": True}, "c3"),),
        ),
    )
    yield ((Message("tool", "", tool_call_id="c3"),), Message("assistant", "Done."))


def test_each_real_template_starts_and_sets_its_tool_call_format(
    real_tokenizer_dirs: dict[str, Path], name: str
) -> None:
    served = served_template(real_tokenizer_dirs[name], None)
    assert (served.tool_parser, served.tool_parser_source) == (
        BY_NAME[name].tool_parser,
        "the chat template",
    )
    forced = served_template(real_tokenizer_dirs[name], ToolParser.QWEN3)
    assert (forced.tool_parser, forced.tool_parser_source) == (ToolParser.QWEN3, "LEGO_TOOL_PARSER")


@pytest.mark.parametrize("enable_thinking", [None, False])
def test_a_tool_loop_stays_token_exact(
    real_tokenizers: dict[str, PreTrainedTokenizerBase], name: str, enable_thinking: bool | None
) -> None:
    tokenizer = real_tokenizers[name]
    parser = BY_NAME[name].tool_parser
    book = LedgerBook(tokenizer)
    session = uuid.uuid4().hex
    sent: tuple[Message, ...] = ()
    previous: list[int] | None = None
    thinking = name in THINKING and enable_thinking is None
    for turn, (added, answer) in enumerate(script(thinking)):
        request = chat(*sent, *added, enable_thinking=enable_thinking)
        plan = book.plan(session, request)
        prompt = list(plan.prompt_ids)
        if previous is None:
            assert plan.classification == "root"
            assert prompt == Renderer(tokenizer).render(request)
        else:
            assert (plan.classification, plan.fork_reason) == ("extend", None), turn
            assert prompt[: len(previous)] == previous
            expected = whole_suffix(tokenizer, request, len(sent) - 1)
            new = tokenizer.encode(expected, add_special_tokens=False)
            assert prompt[len(previous) :] == new
        ids = list(sampled_ids(tokenizer, request, answer))
        parsed = parse(tokenizer, parser, prompt, ids)
        assert parsed.malformed == 0
        assert [(c.name, json.loads(c.arguments)) for c in parsed.message.tool_calls] == [
            (c.name, json.loads(c.arguments)) for c in answer.tool_calls
        ]
        if thinking:
            assert parsed.message.reasoning == answer.reasoning
        book.commit(session, plan, request, ids, parsed.message, uuid.uuid4().hex)
        previous = prompt + ids
        sent = (*request.messages, echoed(parsed.message, turn))


@pytest.mark.parametrize("empty", [False, True])
def test_without_kept_reasoning_a_new_query_forks_to_the_whole_render(
    real_tokenizers: dict[str, PreTrainedTokenizerBase], name: str, empty: bool
) -> None:
    """keep_reasoning=False: where the template drops the earlier think block (every
    thinking template at a new user query, even for an empty block), the turn forks with
    the reason and its prompt is the template's whole render; tool results still extend."""
    tokenizer = real_tokenizers[name]
    book = LedgerBook(tokenizer, keep_reasoning=False)
    session = uuid.uuid4().hex
    reasoning = None if empty or name not in THINKING else "Look first."
    first = chat(Message("user", "List the files."))
    answer = Message("assistant", "", reasoning, (call("bash", {"command": "ls"}, "c1"),))
    plans = []
    steps = [
        (first, answer),
        (None, Message("assistant", "Two files.")),
        (None, Message("assistant", "Sure.")),
    ]
    sent: tuple[Message, ...] = ()
    added = [(), (Message("tool", "a\nb", tool_call_id="c1"),), (Message("user", "And now?"),)]
    for (request, answer), new in zip(steps, added, strict=True):
        request = request or chat(*sent, *new)
        plan = book.plan(session, request)
        plans.append(plan)
        ids = sampled_ids(tokenizer, request, answer)
        parsed = parse(tokenizer, BY_NAME[name].tool_parser, list(plan.prompt_ids), list(ids))
        book.commit(session, plan, request, ids, parsed.message, uuid.uuid4().hex)
        sent = (*request.messages, echoed(parsed.message, len(plans)))
    assert [p.classification for p in plans[:2]] == ["root", "extend"]
    if name in THINKING:
        assert (plans[2].classification, plans[2].fork_reason) == ("fork", "reasoning_dropped")
        whole = Renderer(tokenizer).render(replace(first, messages=sent[:-1]))
        assert list(plans[2].prompt_ids) == whole
    else:
        assert plans[2].classification == "extend"


def test_parsing_does_not_depend_on_the_markup_being_flagged_special(
    real_tokenizer_dirs: dict[str, Path],
    real_tokenizers: dict[str, PreTrainedTokenizerBase],
    name: str,
    tmp_path: Path,
) -> None:
    """Other models flag <think> and <tool_call> special, and a detokenizer that drops
    special tokens would drop them: the parser reads the same answer either way."""
    config = json.loads((real_tokenizer_dirs[name] / "tokenizer.json").read_text())
    for added in config["added_tokens"]:
        if added["content"] in ("<think>", "</think>", "<tool_call>", "</tool_call>"):
            added["special"] = True
    for file in real_tokenizer_dirs[name].iterdir():
        (tmp_path / file.name).write_bytes(file.read_bytes())
    (tmp_path / "tokenizer.json").write_text(json.dumps(config))
    flagged = load_tokenizer(tmp_path)
    tag = flagged.convert_tokens_to_ids("<tool_call>")
    assert isinstance(tag, int)
    assert flagged.added_tokens_decoder[tag].special
    tokenizer = real_tokenizers[name]
    request = chat(Message("user", "Read a.txt."))
    answer = Message(
        "assistant", "Reading.", "Why not." if name in THINKING else None,
        (call("read", {"path": "a.txt"}, "c1"),),
    )  # fmt: skip
    ids = list(sampled_ids(tokenizer, request, answer))
    prompt = Renderer(tokenizer).render(request)
    plain = parse(tokenizer, BY_NAME[name].tool_parser, prompt, ids)
    assert parse(flagged, BY_NAME[name].tool_parser, prompt, ids) == plain
    assert [c.name for c in plain.message.tool_calls] == ["read"]
