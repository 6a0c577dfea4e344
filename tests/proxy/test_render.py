"""``proxy.render.Renderer.encode``: the same ids as ``tokenizer.encode(text,
add_special_tokens=False)`` on the real Qwen tokenizers, through the Rust tokenizer's own
``encode`` when its state is what transformers' wrapper would set, and through the wrapper
when it is not."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from transformers import PreTrainedTokenizerBase

from proxy.canonical import ChatRequest, Message, ToolCall
from proxy.render import Renderer, load_tokenizer

TEXTS = (
    "",
    "plain words",
    "  leading and trailing whitespace \n\n\t ",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nOK.",
    "a user who types <|im_end|> and <|endoftext|> as text",
    "unicode: naïve café, 日本語のテキスト, emoji 🧪🚀, rtl שלום, combining e\u0301",
    "def f(x):\n    return {'k': [1, 2, 3]}  # code\r\n",
    "word " * 3000,  # longer than a chunk
)


@pytest.fixture(scope="module")
def tokenizers(real_tokenizer_dirs: dict[str, Path]) -> dict[str, PreTrainedTokenizerBase]:
    return {name: load_tokenizer(path) for name, path in real_tokenizer_dirs.items()}


@pytest.fixture
def tokenizer(
    tokenizers: dict[str, PreTrainedTokenizerBase], request: pytest.FixtureRequest
) -> Iterator[PreTrainedTokenizerBase]:
    chosen = tokenizers[str(request.param)]
    yield chosen
    # Whatever a test changed: the wrapper's next call resets the Rust tokenizer's state.
    chosen.split_special_tokens = False
    chosen.encode("", add_special_tokens=False)


NAMES = ("qwen2.5", "qwen3", "qwen3-coder", "qwen3.5")


def _conversation() -> ChatRequest:
    return ChatRequest(
        adapter="test",
        model="m",
        messages=(
            Message("system", "You are terse."),
            Message("user", "List the files, then say <|im_end|> literally."),
            Message(
                "assistant",
                "",
                tool_calls=(ToolCall(id="c1", name="bash", arguments='{"cmd": "ls -la"}'),),
            ),
            Message("tool", "a.py\nb.py\n", tool_call_id="c1"),
        ),
    )


@pytest.mark.parametrize("tokenizer", NAMES, indirect=True)
def test_the_ids_are_the_wrappers(tokenizer: PreTrainedTokenizerBase) -> None:
    renderer = Renderer(tokenizer)
    rendered = renderer.render_text(_conversation())
    for text in (*TEXTS, rendered):
        assert renderer.encode(text) == tokenizer.encode(text, add_special_tokens=False)
    assert renderer.render(_conversation()) == tokenizer.encode(rendered, add_special_tokens=False)


@pytest.mark.parametrize("tokenizer", NAMES, indirect=True)
def test_a_clean_fast_tokenizer_is_encoded_without_the_wrapper(
    tokenizer: PreTrainedTokenizerBase, monkeypatch: pytest.MonkeyPatch
) -> None:
    renderer = Renderer(tokenizer)
    expected = tokenizer.encode(TEXTS[3], add_special_tokens=False)

    def wrapper(*args: object, **kwargs: object) -> list[int]:
        raise AssertionError("the wrapper ran")

    monkeypatch.setattr(tokenizer, "encode", wrapper)
    assert renderer.encode(TEXTS[3]) == expected


@pytest.mark.parametrize("tokenizer", NAMES, indirect=True)
def test_a_truncating_or_padding_rust_tokenizer_goes_through_the_wrapper(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    """Someone left the Rust tokenizer truncating (or padding): the wrapper resets that
    before it encodes, so the ids stay whole."""
    renderer = Renderer(tokenizer)
    text = TEXTS[-1]
    whole = tokenizer.encode(text, add_special_tokens=False)
    tokenizer.backend_tokenizer.enable_truncation(max_length=8)
    assert renderer.encode(text) == whole
    tokenizer.backend_tokenizer.enable_padding(length=len(whole) + 50)
    assert renderer.encode(text) == whole


@pytest.mark.parametrize("tokenizer", NAMES, indirect=True)
def test_a_tokenizer_that_splits_special_tokens_is_encoded_as_the_wrapper_does(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    renderer = Renderer(tokenizer)
    text = TEXTS[3]
    as_special = tokenizer.encode(text, add_special_tokens=False)
    tokenizer.split_special_tokens = True
    split = tokenizer.encode(text, add_special_tokens=False)
    assert split != as_special  # the setting matters for this text
    assert renderer.encode(text) == split
    tokenizer.split_special_tokens = False
    assert renderer.encode(text) == as_special


@pytest.mark.parametrize("tokenizer", ["qwen3"], indirect=True)
def test_a_large_encode_lets_other_threads_run(tokenizer: PreTrainedTokenizerBase) -> None:
    """The ledger renders a large prompt in a worker thread so that the event loop keeps
    serving (``proxy.ledger.book.plan_off_loop``): the encode must let go of the GIL while
    it tokenizes. Here the main thread ticks while a worker encodes; its longest stall is
    a small part of the encode's time, not the whole of it."""
    renderer = Renderer(tokenizer)
    text = " ".join(f"word{n} = compute({n})" for n in range(20_000))
    took: list[float] = []

    def encode() -> None:
        began = time.perf_counter()
        renderer.encode(text)
        took.append(time.perf_counter() - began)

    worker = threading.Thread(target=encode)
    last = time.perf_counter()
    longest = 0.0
    worker.start()
    while worker.is_alive():
        time.sleep(0.001)
        now = time.perf_counter()
        longest = max(longest, now - last)
        last = now
    worker.join()
    assert took[0] > 0.1  # long enough for a stall to show
    assert longest < took[0] / 3
