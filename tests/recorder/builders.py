"""Builders of recorder records for tests (no IO)."""

from __future__ import annotations

import uuid

import numpy as np
import numpy.typing as npt

from recorder.export_wire import Segment
from recorder.records import RoutedExperts, TurnRecord, TurnStatus, TurnTimings


def experts(start: int, rows: list[list[list[int]]]) -> RoutedExperts:
    return RoutedExperts(start=start, rows=np.asarray(rows, dtype=np.int32))


def make_turn(
    session_id: str,
    seq: int,
    prompt: tuple[int, ...] = (1, 2, 3),
    output: tuple[int, ...] = (4, 5),
    *,
    logprobs: tuple[float, ...] | None = None,
    routed: RoutedExperts | None = None,
    status: TurnStatus = TurnStatus.COMPLETED,
    weight_version: str = "w0",
    turn_id: str | None = None,
) -> TurnRecord:
    return TurnRecord(
        id=turn_id or uuid.uuid4().hex,
        session_id=session_id,
        seq=seq,
        adapter="openai_chat",
        requested_model="some-model",
        status=status,
        prompt_ids=prompt,
        output_ids=output,
        logprobs=logprobs if logprobs is not None else tuple(-0.5 - i for i in range(len(output))),
        routed_experts=routed,
        finish_reason="stop",
        weight_version=weight_version,
    )


def rich_turn(session_id: str, seq: int, routed: RoutedExperts | None) -> TurnRecord:
    """A turn with every optional field set to a non-default value."""
    return TurnRecord(
        id=uuid.uuid4().hex,
        session_id=session_id,
        seq=seq,
        adapter="anthropic_messages",
        requested_model="claude-sonnet-4-5",
        status=TurnStatus.FAILED,
        prompt_ids=(0, 151_643, 2**31 - 1, 7),
        output_ids=(42, 151_645),
        logprobs=(-0.123456789, float("-inf")),
        routed_experts=routed,
        finish_reason="length",
        weight_version="policy-v17",
        sampling_params={"temperature": 0.7, "top_p": 0.95, "stop": ["</s>"], "seed": None},
        request_messages=b'{"messages":[{"role":"user","content":"hi \\u00e9"}]}',
        response_message=b"\x00\xffnot json at all",
        ignored_fields=("metadata", "service_tier"),
        malformed_tool_calls=2,
        resumptions=3,
        error="backend said no",
        side_requests=("an-earlier-turn",),
        timings=TurnTimings(
            received_at=1_760_000_000.123456, first_token_s=0.25, finished_s=1.5, backend_s=1.25
        ),
    )


def segment(n: int = 4, *, experts: npt.DTypeLike | None = np.uint8, base: int = 0) -> Segment:
    routed = None
    if experts is not None:
        routed = (np.arange(n * 3 * 2).reshape(n, 3, 2) + base).astype(experts)
    return Segment(
        tokens=np.arange(100, 100 + n, dtype=np.int32),
        loss_mask=np.array([i % 2 for i in range(n)], dtype=np.uint8),
        # float32 values that a float64 detour would change if anything rounded them
        logprobs=np.array([-0.1 * i - 1e-7 for i in range(n)], dtype=np.float32),
        routed_experts=routed,
        weight_versions=("v1", "v2"),
        turn_ids=("t1", "t2"),
        weight_version_spans=(("v1", 1, 2), ("v2", 3, n)),
    )
