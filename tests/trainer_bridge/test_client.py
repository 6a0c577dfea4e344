"""The trainer's HTTP clients: HTTP errors map to the exception tree (claim bodies are
``recorder.export_wire``'s, tested in ``tests/recorder/test_export_wire.py``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response

from kernel.errors import Conflict, InvalidRequest, NotFound
from kernel.threaded import serve
from recorder.export_wire import ClaimedBatch, ClaimedGroup, ClaimedSample, encode_claim
from tests.recorder.builders import segment
from trainer_bridge.client import ExportClient


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    app = FastAPI()

    @app.post("/api/v1/batches/{batch_id}/ack")
    async def ack(batch_id: str) -> JSONResponse:
        status = 409 if batch_id == "expired" else 404
        body = {"error": {"message": f"batch {batch_id}", "type": "x", "code": "x"}}
        return JSONResponse(body, status_code=status)

    @app.post("/api/v1/runs/{run_id}/claims")
    async def claim(run_id: str, format: str) -> Response:
        sample = ClaimedSample("s1", 0, 1.0, "completed", (segment(),))
        sent = ClaimedBatch("b1", (ClaimedGroup("g", run_id, (sample,)),), 0, format=format)
        body = encode_claim(sent)
        return Response(body[:-8] if run_id == "cut" else body)

    with serve(app) as url:
        yield url


def test_http_errors_map_to_the_exception_tree(upstream: str) -> None:
    with ExportClient(upstream, "k", "run") as export:
        with pytest.raises(Conflict, match="batch expired"):
            export.ack("expired")
        with pytest.raises(NotFound):
            export.ack("unknown")


@pytest.mark.parametrize("wire", ["binv1", "b64v1", "json"])
def test_a_claim_asks_for_its_form_and_decodes_the_body(upstream: str, wire: str) -> None:
    with ExportClient(upstream, "k", "run-1") as export:
        got = export.claim(1, None, 60.0, wire)
    assert got.format == wire
    assert [g.task_id for g in got.groups] == ["run-1"]
    (sample,) = got.groups[0].samples
    assert sample.segments[0].tokens.tolist() == segment().tokens.tolist()
    with ExportClient(upstream, "k", "cut") as export, pytest.raises(InvalidRequest):
        export.claim(1, None, 60.0)  # binv1 by default: a body cut short is refused
