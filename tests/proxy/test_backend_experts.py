"""proxy.backend.decode_experts: SGLang's base64 routed experts as rows, exactly, and a
payload that is not what SGLang sends is a deterministic backend error, never rows."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from kernel.errors import BackendError
from proxy.backend import ExpertShape, decode_experts

SHAPE = ExpertShape(num_layers=48, top_k=8)  # Qwen3-30B-A3B's


def encoded(rows: np.ndarray) -> str:
    # What SGLang sends: base64 of the C-contiguous little-endian int32 array.
    return base64.b64encode(np.ascontiguousarray(rows, dtype="<i4").tobytes()).decode("ascii")


@pytest.mark.parametrize("tokens", [1, 3, 257, 4000])
def test_rows_round_trip_exactly(tokens: int) -> None:
    rows = np.random.default_rng(tokens).integers(0, 128, size=(tokens, 48, 8), dtype=np.int32)
    decoded = decode_experts(encoded(rows), SHAPE, start=17)
    assert decoded is not None
    assert decoded.start == 17
    assert decoded.rows.dtype == np.int32
    assert np.array_equal(decoded.rows, rows)


def test_nothing_to_decode_is_none() -> None:
    rows = np.zeros((2, 48, 8), dtype=np.int32)
    assert decode_experts(None, SHAPE, start=0) is None  # the server sent none
    assert decode_experts(encoded(rows), None, start=0) is None  # a dense model


TWO_ROWS = encoded(np.zeros((2, 48, 8), dtype=np.int32))


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        ("not base64 at all!", "not base64"),
        (TWO_ROWS + "\n", "not base64"),
        (TWO_ROWS[:-1], "not base64"),  # its padding cut
        (TWO_ROWS[:-4], "not a multiple"),  # 3 bytes short: not whole int32s
        (encoded(np.zeros((2 * 48 * 8 + 1,), dtype=np.int32)), "not a multiple"),  # one id more
    ],
    ids=["text", "newline", "padding", "partial-id", "partial-row"],
)
def test_a_payload_sglang_would_not_send_is_refused(payload: str, reason: str) -> None:
    with pytest.raises(BackendError, match=reason) as refused:
        decode_experts(payload, SHAPE, start=0)
    assert not refused.value.retryable  # resending gets the same bytes
