"""proxy.backend_wire: SGLang's stream framed on the bytes as they arrive, whatever the chunk
boundaries (a TCP read may end anywhere, mid-line or mid-``\\r\\n``), and its chunks read
into ids and logprobs in either streaming mode, refusing what does not add up."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kernel.errors import BackendError
from proxy.backend_wire import SseData, read_delta

EVENTS = [
    orjson.dumps({"output_ids": [1, 2], "meta_info": {"completion_tokens": 2}}),
    orjson.dumps({"text": "ünïcödé: a 🎉 split across reads", "meta_info": {}}),
    b"[DONE]",
]


def stream(newline: bytes) -> bytes:
    return b"".join(b"data: " + event + newline + newline for event in EVENTS)


def framed(data: bytes, cuts: list[int]) -> list[bytes]:
    framing = SseData()
    payloads: list[bytes] = []
    at = 0
    for cut in [*sorted(cuts), len(data)]:
        payloads += framing.feed(data[at:cut])
        at = cut
    return payloads


@given(st.lists(st.integers(min_value=0, max_value=len(stream(b"\r\n"))), max_size=12))
def test_any_chunking_gives_the_same_payloads(cuts: list[int]) -> None:
    for newline in (b"\n", b"\r\n"):
        data = stream(newline)
        assert framed(data, [c for c in cuts if c <= len(data)]) == EVENTS


def test_only_data_lines_count() -> None:
    framing = SseData()
    data = b': keep-alive comment\nevent: message\nid: 7\nretry: 10\ndata:{"a":1}\n\n'
    assert framing.feed(data) == [b'{"a":1}']  # no space after the colon is fine too


def test_an_unterminated_last_line_is_not_an_event() -> None:
    framing = SseData()
    assert framing.feed(b'data: {"a":1}\n\ndata: {"b"') == [b'{"a":1}']
    assert framing.feed(b":2}") == []
    assert framing.feed(b"\n") == [b'{"b":2}']


def sglang_chunks(ids: list[int], cumulative: bool) -> list[dict[str, Any]]:
    """What SGLang streams for ``ids``, a chunk a token (``[logprob, id, null]`` triples)."""
    chunks = []
    for n in range(1, len(ids) + 1):
        sent = ids[:n] if cumulative else ids[n - 1 : n]
        triples = [[-0.5 * i, i, None] for i in sent]
        meta = {"completion_tokens": n, "output_token_logprobs": triples}
        chunks.append({"output_ids": sent, "meta_info": meta})
    return chunks


@given(st.lists(st.integers(min_value=0, max_value=150_000), min_size=1, max_size=20))
def test_either_streaming_mode_reads_to_the_same_ids_and_logprobs(reply: list[int]) -> None:
    for cumulative in (True, False):
        ids: list[int] = []
        logprobs: list[float] = []
        seen = 0
        for chunk in sglang_chunks(reply, cumulative):
            seen = read_delta(chunk, seen, ids, logprobs)
        assert seen == len(reply)
        assert ids == reply
        assert logprobs == [-0.5 * i for i in reply]


@pytest.mark.parametrize(
    ("chunk", "message"),
    [
        ({"output_ids": [1]}, "without meta_info"),
        ({"output_ids": 1, "meta_info": {}}, "malformed output"),
        (
            {
                "output_ids": [1, 2],
                "meta_info": {"completion_tokens": 3, "output_token_logprobs": [[-1.0, 1, None]]},
            },
            "2 ids but 1 logprobs",
        ),
        (
            {
                "output_ids": [1, 2],
                "meta_info": {"output_token_logprobs": [[-1.0, 1, None], [-1.0, 3, None]]},
            },
            "disagree",
        ),
    ],
)
def test_a_chunk_that_does_not_add_up_is_refused_and_adds_nothing(
    chunk: dict[str, Any], message: str
) -> None:
    ids, logprobs = [7], [-0.1]
    with pytest.raises(BackendError, match=message) as caught:
        read_delta(chunk, 1, ids, logprobs)
    assert not caught.value.retryable
    assert (ids, logprobs) == ([7], [-0.1])
