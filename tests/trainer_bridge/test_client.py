"""Claim parsing (both wire forms) and the mapping of HTTP errors to the exception tree."""

from __future__ import annotations

import base64
import struct
from collections.abc import Iterator

import numpy as np
import orjson
import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from kernel.errors import BackendError, Conflict, InvalidRequest, NotFound, Unsupported
from kernel.threaded import serve
from recorder import binwire
from trainer_bridge.client import BINV1_MAGIC, BackendClient, ExportClient, parse_claim
from trainer_bridge.samples import samples_from_batch


def _b64(array: np.ndarray) -> dict[str, object]:
    return {
        "dtype": array.dtype.str,
        "shape": list(array.shape),
        "data": base64.b64encode(array.tobytes()).decode(),
    }


SEGMENT_JSON = {
    "tokens": [5, 6, 7, 8],
    "loss_mask": [0, 0, 1, 1],
    "logprobs": [0.0, 0.0, -0.5, -1.25],
    "routed_experts": [[[0, 1]], [[2, 3]], [[4, 5]], [[0, 0]]],
    "weight_versions": ["v1"],
    "turn_ids": ["t1"],
}
SEGMENT_B64 = {
    "format": "b64v1",
    "tokens": _b64(np.array([5, 6, 7, 8], dtype="<i4")),
    "loss_mask": _b64(np.array([0, 0, 1, 1], dtype="|u1")),
    "logprobs": _b64(np.array([0.0, 0.0, -0.5, -1.25], dtype="<f4")),
    "routed_experts": _b64(np.array([[[0, 1]], [[2, 3]], [[4, 5]], [[0, 0]]], dtype="|u1")),
    "weight_versions": ["v1"],
    "turn_ids": ["t1"],
}


SEGMENT_BIN = {
    "format": "binv1",
    "tokens": np.array([5, 6, 7, 8], dtype="<i4"),
    "loss_mask": np.array([0, 0, 1, 1], dtype="|u1"),
    "logprobs": np.array([0.0, 0.0, -0.5, -1.25], dtype="<f4"),
    "routed_experts": np.array([[[0, 1]], [[2, 3]], [[4, 5]], [[0, 0]]], dtype="|u1"),
    "weight_versions": ["v1"],
    "turn_ids": ["t1"],
}


def _sample(segments: list[dict[str, object]], reward: object) -> dict[str, object]:
    return {"session_id": "s1", "sample_index": 0, "reward": reward, "segments": segments}


def _claim(segment: dict[str, object], reward: object = 1.0) -> bytes:
    group = {"group_id": "g", "task_id": "t", "samples": [_sample([segment], reward)]}
    return orjson.dumps({"batch_id": "b1", "schema_version": 1, "groups": [group]})


def _frame(header: dict[str, object]) -> bytes:
    return b"".join(binwire.encode_frame(header))


def _binv1_head(samples: int) -> bytes:
    group = {"group_id": "g", "task_id": "t", "staleness": 0, "sample_count": samples}
    return binwire.MAGIC + _frame({"batch_id": "b1", "schema_version": 1, "groups": [group]})


def _binv1_claim(*samples: dict[str, object]) -> bytes:
    """A binv1 body as the export route lays it out (``recorder.binwire``)."""
    return _binv1_head(len(samples)) + b"".join(_frame(sample) for sample in samples)


BODIES = {
    "json": _claim(SEGMENT_JSON),
    "b64v1": _claim(SEGMENT_B64),
    "binv1": _binv1_claim(_sample([SEGMENT_BIN], 1.0)),
}


@pytest.mark.parametrize("body", BODIES.values(), ids=BODIES.keys())
def test_every_wire_form_gives_the_same_sample(body: bytes) -> None:
    (sample,) = samples_from_batch(parse_claim(body))
    assert sample.tokens.tolist() == [5, 6, 7, 8]
    assert sample.loss_mask.tolist() == [False, False, True, True]
    assert sample.rollout_logprobs.tolist() == [0.0, 0.0, -0.5, -1.25]
    assert sample.routed_experts is not None
    assert sample.routed_experts.shape == (4, 1, 2)
    assert (sample.reward, sample.group_id, sample.weight_versions) == (1.0, "g", ("v1",))


def test_unusable_claims_raise() -> None:
    with pytest.raises(InvalidRequest):
        parse_claim(_claim({**SEGMENT_JSON, "logprobs": [0.0]}))
    with pytest.raises(Unsupported):
        parse_claim(_claim(SEGMENT_JSON, reward=[1.0, 0.0]))
    empty = parse_claim(orjson.dumps({"batch_id": None, "schema_version": 1, "groups": []}))
    assert empty.batch_id is None
    assert empty.groups == ()


def test_binv1_reads_every_sample_and_segment_in_order() -> None:
    empty = {
        **SEGMENT_BIN,
        "tokens": np.zeros(0, dtype="<i4"),
        "loss_mask": np.zeros(0, dtype="|u1"),
        "logprobs": np.zeros(0, dtype="<f4"),
        "routed_experts": np.zeros((0, 1, 2), dtype="<u2"),
    }
    wide = {**SEGMENT_BIN, "routed_experts": np.array([[[300, 1]]] * 4, dtype="<u2")}
    body = _binv1_claim(_sample([SEGMENT_BIN, wide], 1.0), _sample([], 0.0), _sample([empty], 0.5))
    assert body.startswith(BINV1_MAGIC)

    batch = parse_claim(body)

    (group,) = batch.groups
    assert [s.reward for s in group.samples] == [1.0, 0.0, 0.5]
    first, wide_seg = group.samples[0].segments
    assert first.tokens.tolist() == [5, 6, 7, 8]
    assert first.loss_mask.tolist() == [False, False, True, True]
    assert first.logprobs.tolist() == [0.0, 0.0, -0.5, -1.25]
    assert wide_seg.routed_experts is not None
    assert wide_seg.routed_experts.tolist() == [[[300, 1]]] * 4
    assert group.samples[1].segments == ()
    (nothing,) = group.samples[2].segments
    assert nothing.tokens.shape == (0,)
    assert nothing.routed_experts is not None
    assert nothing.routed_experts.shape == (0, 1, 2)


@pytest.mark.parametrize("body", BODIES.values(), ids=BODIES.keys())
def test_every_wire_form_decodes_into_the_compact_dtypes(body: bytes) -> None:
    (segment,) = parse_claim(body).groups[0].samples[0].segments
    assert segment.tokens.dtype == np.int32
    assert segment.loss_mask.dtype == np.uint8
    assert segment.logprobs.dtype == np.float32
    assert segment.routed_experts is not None
    # Expert ids keep the dtype they were sent in (uint8 here); JSON numbers become int32.
    expected = np.int32 if body == BODIES["json"] else np.uint8
    assert segment.routed_experts.dtype == expected


def test_binv1_arrays_are_views_of_the_body_not_copies() -> None:
    wide = {**SEGMENT_BIN, "routed_experts": np.array([[[300, 1]]] * 4, dtype="<u2")}
    body = _binv1_claim(_sample([SEGMENT_BIN, wide], 1.0))
    whole = np.frombuffer(body, dtype=np.uint8)

    batch = parse_claim(body)

    narrow, wider = batch.groups[0].samples[0].segments
    for segment, expert_dtype in ((narrow, np.uint8), (wider, np.uint16)):
        assert segment.routed_experts is not None
        assert segment.routed_experts.dtype == expert_dtype
        for array in (segment.tokens, segment.loss_mask, segment.logprobs):
            assert np.shares_memory(array, whole)
        assert np.shares_memory(segment.routed_experts, whole)
    # The trainer's samples hold those same arrays.
    first, second = samples_from_batch(batch)
    assert first.routed_experts is narrow.routed_experts
    assert second.routed_experts is wider.routed_experts
    assert first.tokens is narrow.tokens


def test_arrays_in_other_dtypes_are_converted_exactly() -> None:
    segment = {
        **SEGMENT_B64,
        "tokens": _b64(np.array([5, 6, 7, 8], dtype="<i8")),
        "loss_mask": _b64(np.array([False, False, True, True])),
        "logprobs": _b64(np.array([0.0, 0.0, -0.5, -1.25], dtype="<f8")),
        "routed_experts": _b64(np.array([[[0, 1]], [[2, 3]], [[4, 5]], [[0, 300]]], dtype=">u2")),
    }
    (sample,) = samples_from_batch(parse_claim(_claim(segment)))
    assert sample.tokens.dtype == np.int32
    assert sample.tokens.tolist() == [5, 6, 7, 8]
    assert sample.loss_mask.dtype == np.uint8
    assert sample.loss_mask.tolist() == [0, 0, 1, 1]
    assert sample.rollout_logprobs.dtype == np.float32
    assert sample.rollout_logprobs.tolist() == [0.0, 0.0, -0.5, -1.25]
    assert sample.routed_experts is not None
    assert sample.routed_experts.dtype == np.uint16  # in native byte order
    assert sample.routed_experts[:, 0].tolist() == [[0, 1], [2, 3], [4, 5], [0, 300]]
    too_wide = {**SEGMENT_B64, "tokens": _b64(np.array([5, 6, 7, 2**40], dtype="<i8"))}
    with pytest.raises(InvalidRequest):
        parse_claim(_claim(too_wide))


def _broken_array(**changes: object) -> bytes:
    """A binv1 body whose one segment's tokens array is described by ``changes``."""
    frame = _frame(_sample([SEGMENT_BIN], 1.0))
    (size,) = struct.unpack_from("<I", frame)
    header = orjson.loads(frame[4 : 4 + size])
    header["segments"][0]["tokens"].update(changes)
    text = orjson.dumps(header)
    return _binv1_head(1) + struct.pack("<I", len(text)) + text + frame[4 + size :]


@pytest.mark.parametrize(
    "body",
    [
        BODIES["binv1"][:-8],  # the server failed mid-stream
        BODIES["binv1"][: len(binwire.MAGIC) + 2],
        BODIES["binv1"] + BODIES["binv1"][len(binwire.MAGIC) :],  # frames after the last
        _broken_array(offset=10_000),  # outside its payload
        _broken_array(dtype="|O"),
        _broken_array(shape=[-1]),
        _broken_array(dtype="<i8"),  # its i4 bytes read in pairs: values past int32
        _claim({**SEGMENT_JSON, "tokens": {"dtype": "<i4", "shape": [4], "offset": 0}}),
    ],
    ids=[
        "truncated",
        "cut-in-header",
        "trailing",
        "offset",
        "object",
        "negative",
        "past-int32",
        "no-frame",
    ],
)
def test_unusable_binv1_claims_raise(body: bytes) -> None:
    with pytest.raises(InvalidRequest):
        parse_claim(body)


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    app = FastAPI()

    @app.post("/api/v1/batches/{batch_id}/ack")
    async def ack(batch_id: str) -> JSONResponse:
        status = 409 if batch_id == "expired" else 404
        body = {"error": {"message": f"batch {batch_id}", "type": "x", "code": "x"}}
        return JSONResponse(body, status_code=status)

    @app.post("/update_weights_from_disk")
    async def update() -> JSONResponse:
        return JSONResponse({"success": False, "message": "no such dir"}, status_code=400)

    with serve(app) as url:
        yield url


def test_http_errors_map_to_the_exception_tree(upstream: str) -> None:
    with ExportClient(upstream, "k", "run") as export:
        with pytest.raises(Conflict, match="batch expired"):
            export.ack("expired")
        with pytest.raises(NotFound):
            export.ack("unknown")
    with BackendClient(upstream) as backend, pytest.raises(InvalidRequest, match="no such dir"):
        backend.update_weights_from_disk("/nowhere", "v1")
    with BackendClient("http://127.0.0.1:9") as dead, pytest.raises(BackendError):
        dead.update_weights_from_disk("/nowhere", "v1")
