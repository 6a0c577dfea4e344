from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

import pytest

from kernel.errors import LegoError
from proxy.parsing.detokenize import IncrementalDetokenizer, special_token_ids

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

TEXTS = [
    "plain ascii text, nothing special",
    "emoji 😀🎉👩‍👩‍👧 and CJK 中文字符 mixed: ünïcödé",
    "<think>\n推理 🤔\n</think>\n\n<tool_call>\n{}\n</tool_call>",
    "🚀" * 20,
]


def encode(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text  # the fixture tokenizer round-trips
    return list(ids)


def token_id(tokenizer: PreTrainedTokenizerBase, token: str) -> int:
    found = tokenizer.convert_tokens_to_ids(token)
    assert isinstance(found, int)
    return found


def chunks(ids: Sequence[int], rng: random.Random) -> list[list[int]]:
    out: list[list[int]] = []
    i = 0
    while i < len(ids):
        n = rng.randint(1, 4)
        out.append(list(ids[i : i + n]))
        i += n
    return out


def detokenize(tokenizer: PreTrainedTokenizerBase, pieces: list[list[int]]) -> list[str]:
    detok = IncrementalDetokenizer(tokenizer)
    out = [detok.feed(piece) for piece in pieces]
    out.append(detok.finish())
    return out


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("seed", range(5))
def test_pieces_concatenate_to_the_decoded_text(
    tokenizer: PreTrainedTokenizerBase, text: str, seed: int
) -> None:
    pieces = detokenize(tokenizer, chunks(encode(tokenizer, text), random.Random(seed)))
    assert "".join(pieces) == text
    assert not any("\ufffd" in piece for piece in pieces)


def test_a_character_split_across_tokens_is_held_until_complete(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    ids = encode(tokenizer, "😀")
    assert len(ids) > 1  # the emoji's bytes are separate tokens
    detok = IncrementalDetokenizer(tokenizer)
    assert [detok.feed([i]) for i in ids] == [""] * (len(ids) - 1) + ["😀"]
    assert detok.finish() == ""


def test_an_incomplete_character_is_released_as_decoded_at_finish(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    ids = encode(tokenizer, "ok 😀")
    detok = IncrementalDetokenizer(tokenizer)
    assert detok.feed(ids[:-1]) == ""  # ends inside the emoji: nothing is safe yet
    assert detok.finish() == tokenizer.decode(ids[:-1])
    assert detok.finish() == ""


def test_special_tokens_produce_no_text_but_markup_tokens_do(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    specials = [token_id(tokenizer, t) for t in ("<|im_start|>", "<|endoftext|>")]
    im_end = token_id(tokenizer, "<|im_end|>")
    assert set(specials) | {im_end} <= special_token_ids(tokenizer)
    think = encode(tokenizer, "<think>")
    hi = encode(tokenizer, "hi")
    detok = IncrementalDetokenizer(tokenizer)
    assert detok.feed([specials[0], *think]) == "<think>"
    assert detok.feed([specials[1]]) == ""
    assert detok.feed([*hi, im_end]) == "hi"
    assert detok.finish() == ""
    assert detok.token_count == 2 + len(think) + len(hi) + 1


class CountingTokenizer:
    """The real tokenizer, recording how many ids each decode call was given."""

    def __init__(self, inner: PreTrainedTokenizerBase) -> None:
        self._inner = inner
        self.window_sizes: list[int] = []

    def __getattr__(self, name: str) -> Any:
        if name == "backend_tokenizer":
            return None  # every decode goes through ``decode``, to be counted
        return getattr(self._inner, name)

    def decode(self, ids: list[int], **kwargs: Any) -> Any:
        self.window_sizes.append(len(ids))
        return self._inner.decode(ids, **kwargs)


def test_each_feed_decodes_only_a_small_window(tokenizer: PreTrainedTokenizerBase) -> None:
    ids = encode(tokenizer, " ".join(TEXTS) * 40)
    counting = CountingTokenizer(tokenizer)
    detok = IncrementalDetokenizer(cast("PreTrainedTokenizerBase", counting))
    out = [detok.feed([i]) for i in ids]
    out.append(detok.finish())
    assert "".join(out) == tokenizer.decode(ids)
    assert len(ids) > 2000
    # Multi-token characters widen a window for a few feeds; it never grows with the output.
    assert max(counting.window_sizes) <= 16


def brute_tokens_for_chars(tokenizer: PreTrainedTokenizerBase, ids: list[int], n: int) -> int:
    if n == 0:
        return 0
    for k in range(len(ids) + 1):
        text = tokenizer.decode(ids[:k])
        if len(text) >= n and text[n - 1] != "\ufffd":
            return k
    raise AssertionError("unreachable")


@pytest.mark.parametrize("chunk", [1, 3, 1000])
def test_tokens_for_chars_matches_a_brute_force_search(
    tokenizer: PreTrainedTokenizerBase, chunk: int
) -> None:
    ids = encode(tokenizer, TEXTS[1])
    detok = IncrementalDetokenizer(tokenizer)
    text = "".join(detok.feed(ids[i : i + chunk]) for i in range(0, len(ids), chunk))
    text += detok.finish()
    for n in range(len(text) + 1):
        assert detok.tokens_for_chars(n) == brute_tokens_for_chars(tokenizer, ids, n)
    detok.stop_tracking()
    with pytest.raises(LegoError):
        detok.tokens_for_chars(1)


class AddedTokenReads:
    """Counts walks of the tokenizer's added tokens (what ``special_token_ids`` does)."""

    def __init__(self, inner: PreTrainedTokenizerBase) -> None:
        self._inner = inner
        self.walks = 0

    def __getattr__(self, name: str) -> Any:
        if name == "added_tokens_decoder":
            self.walks += 1
        return getattr(self._inner, name)


def test_special_ids_given_once_serve_every_detokenizer(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    """The pipeline makes a detokenizer per turn: the special ids it passes are computed
    once (0.1 ms a walk on Qwen3.5's added tokens), and decode exactly as computed ones."""
    counting = AddedTokenReads(tokenizer)
    as_tokenizer = cast("PreTrainedTokenizerBase", counting)
    special = special_token_ids(as_tokenizer, keep=("<think>",))
    assert counting.walks == 1
    ids = [*encode(tokenizer, TEXTS[2]), token_id(tokenizer, "<|im_end|>")]
    given = IncrementalDetokenizer(as_tokenizer, keep=("<think>",), special=special)
    text = given.feed(ids) + given.finish()
    assert counting.walks == 1  # no walk per detokenizer
    computed = IncrementalDetokenizer(tokenizer, keep=("<think>",))
    assert text == computed.feed(ids) + computed.finish()
    assert "<|im_end|>" not in text
    assert "<think>" in text


def test_the_fast_tokenizers_own_decode_gives_what_decode_gives(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    """The detokenizer calls the Rust tokenizer directly (``backend_tokenizer``); a
    tokenizer without one is decoded through ``decode``; both return the same pieces."""
    ids = encode(tokenizer, " ".join(TEXTS) * 3)
    plain = CountingTokenizer(tokenizer)
    fast, slow = (
        IncrementalDetokenizer(tokenizer),
        IncrementalDetokenizer(cast("PreTrainedTokenizerBase", plain)),
    )
    for step in range(0, len(ids), 2):
        assert fast.feed(ids[step : step + 2]) == slow.feed(ids[step : step + 2])
    assert fast.finish() == slow.finish()
    assert plain.window_sizes  # the tokenizer without a backend was decoded through decode
