"""proxy.backend_wire.SseData: SGLang's stream framed on the bytes as they arrive, whatever
the chunk boundaries (a TCP read may end anywhere, mid-line or mid-``\\r\\n``)."""

from __future__ import annotations

import orjson
from hypothesis import given
from hypothesis import strategies as st

from proxy.backend_wire import SseData

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
