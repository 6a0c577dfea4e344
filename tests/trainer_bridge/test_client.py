"""Claim parsing (both wire forms) and the mapping of HTTP errors to the exception tree."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import numpy as np
import orjson
import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from proxy.errors import BackendError, Conflict, InvalidRequest, NotFound, Unsupported
from proxy.threaded import serve
from trainer_bridge.client import BackendClient, ExportClient, parse_claim
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


def _claim(segment: dict[str, object], reward: object = 1.0) -> bytes:
    sample = {"session_id": "s1", "sample_index": 0, "reward": reward, "segments": [segment]}
    group = {"group_id": "g", "task_id": "t", "samples": [sample], "staleness": 0}
    return orjson.dumps({"batch_id": "b1", "schema_version": 1, "groups": [group]})


@pytest.mark.parametrize("segment", [SEGMENT_JSON, SEGMENT_B64], ids=["json", "b64v1"])
def test_both_wire_forms_give_the_same_sample(segment: dict[str, object]) -> None:
    (sample,) = samples_from_batch(parse_claim(_claim(segment)))
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
