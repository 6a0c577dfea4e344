"""Per-turn CPU cost of the history ledger against re-rendering the whole conversation.

Builds agent sessions (tool call, ~500-token tool result, repeat) with the project's tiny
tokenizer, or any tokenizer directory given with ``--tokenizer`` (a real Qwen3.5 one:
``python -m tests.support.real_models`` builds them), up to about 1k, 10k and 100k
tokens, then times, at each length, a turn through the ledger (``plan`` with incremental
rendering + ``commit``) of the next turn, a real extend of the last one (repeated with
other tool results), and the baseline the ledger replaces (whole-conversation render +
tokenize of the same requests), in the same run.
Targets (issue 3): the ledger's turn at 100k within 2x of its turn at 1k, and at least 20x
below the baseline.

    python -m bench.turn_cost [--repeats 25] [--tokenizer DIR]

Each answer is sampled in the served template's own format (its render of the answer as
the last message, after the generation prompt), tokenized alone, plus eos.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from engine.tiny import build_tokenizer
from proxy.canonical import ChatRequest, Message, ToolCall, ToolSpec
from proxy.ledger import LedgerBook
from proxy.render import Renderer

LENGTHS = (1_000, 10_000, 100_000)
REPEATS = 25
TOOLS = (
    ToolSpec(
        name="bash",
        description="Run a shell command.",
        parameters={"type": "object", "properties": {"command": {"type": "string"}}},
    ),
)
SYSTEM = Message(role="system", content="You are a coding agent. " * 20)
OUTPUT_LINE = "drwxr-xr-x  2 user user 4096 Jan  1 00:00 src/module_{}.py\n"


def answer(turn: int) -> Message:
    call = ToolCall(id=f"c{turn}", name="bash", arguments=f'{{"command":"ls -la dir{turn}"}}')
    return Message(role="assistant", content="", reasoning="Look again.", tool_calls=(call,))


def result(turn: int, salt: int = 0) -> Message:
    text = "".join(OUTPUT_LINE.format(turn * 100 + i + salt * 7919) for i in range(24))
    return Message(role="tool", content=text, tool_call_id=f"c{turn}")


def sampled(
    tokenizer: PreTrainedTokenizerBase, messages: list[Message], message: Message
) -> tuple[int, ...]:
    """The template's own text for the answer, as a model trained on it writes it."""
    renderer = Renderer(tokenizer)
    opening = renderer.render_text(request(messages[:2]))
    whole = renderer.render_text(request([*messages[:2], message]), generation_prompt=False)
    eos = tokenizer.eos_token_id
    assert eos is not None
    assert whole.startswith(opening)
    text = whole[len(opening) : whole.index(str(tokenizer.decode([eos])), len(opening))]
    return (*tokenizer.encode(text, add_special_tokens=False), eos)


def request(messages: list[Message]) -> ChatRequest:
    # Fresh objects each turn, as an adapter decoding the harness's JSON would make.
    copies = tuple(Message(**{f: getattr(m, f) for f in m.__slots__}) for m in messages)
    return ChatRequest(adapter="openai_chat", model="m", messages=copies, tools=TOOLS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=REPEATS, help="extends timed per length")
    parser.add_argument(
        "--tokenizer", type=Path, default=None, help="tokenizer directory (default: the tiny one)"
    )
    args = parser.parse_args()
    repeats = args.repeats
    if args.tokenizer is not None:
        tokenizer: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(str(args.tokenizer))
    else:
        with tempfile.TemporaryDirectory() as directory:
            build_tokenizer(Path(directory))
            tokenizer = AutoTokenizer.from_pretrained(directory)
    book = LedgerBook(tokenizer)
    book.self_check()
    renderer = Renderer(tokenizer)
    print(f"tokenizer: {args.tokenizer or 'tiny (built)'}, vocabulary {len(tokenizer)}")
    session = uuid.uuid4().hex
    history = [SYSTEM, Message(role="user", content="Explore the repository.")]
    turn = 0
    rows = []
    for target in LENGTHS:
        while True:  # grow the session through the ledger up to the target length
            req = request(history)
            message = answer(turn)
            plan = book.plan(session, req)
            output = sampled(tokenizer, history, message)
            book.commit(session, plan, req, output, message, f"t{turn}")
            assert plan.classification in ("root", "extend")
            history += [message, result(turn)]
            turn += 1
            if len(plan.prompt_ids) >= target:
                break
        # Time the turn after it, many times over: each repetition sends the same history
        # with another tool result (a real extend of the same turn, at the same length;
        # re-sending one identical request would time the retry look-up instead).
        answered = history[:-1]  # ends with the last committed turn's answer
        ledger_s: list[float] = []
        baseline_s: list[float] = []
        for repetition in range(repeats):
            req = request([*answered, result(turn - 1, salt=repetition + 1)])
            message = answer(turn)
            output = sampled(tokenizer, history, message)
            started = time.perf_counter()
            plan = book.plan(session, req)
            book.commit(session, plan, req, output, message, uuid.uuid4().hex)
            ledger_s.append(time.perf_counter() - started)
            assert plan.classification == "extend"
            started = time.perf_counter()
            renderer.render(req)
            baseline_s.append(time.perf_counter() - started)
        rows.append(
            (
                target,
                len(plan.prompt_ids),
                statistics.median(ledger_s),
                statistics.median(baseline_s),
            )
        )
    first = rows[0][2]
    header = ("target", "prompt", "ledger ms", "vs 1k", "whole ms", "speed-up")
    print("{:>8} {:>8} {:>10} {:>7} {:>10} {:>9}".format(*header))
    for target, prompt_len, ledger, baseline in rows:
        print(
            f"{target:>8} {prompt_len:>8} {ledger * 1e3:>10.3f} {ledger / first:>6.2f}x "
            f"{baseline * 1e3:>10.3f} {baseline / ledger:>8.1f}x"
        )


if __name__ == "__main__":
    main()
