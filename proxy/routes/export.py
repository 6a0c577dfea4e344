"""Export and run-control API for trainers (admin key): what issue 6's trainer consumes.

Owns the export API's request models and routes; storage lives in ``recorder.export``.
Errors use the control API's envelope (``{"error": {"message", "type", "param", "code"}}``).

    POST /api/v1/runs/{run_id}/weight_versions  {"version"}  -> {run_id, version, index, ...}
    GET  /api/v1/runs/{run_id}/weight_versions                     -> {"versions": [...]}
    POST /api/v1/runs/{run_id}/pause | /resume                     -> {run_id, paused}
    GET  /api/v1/runs/{run_id}/trajectories?cursor=&limit=&finished=&excluded=
                                                                   -> {"items", "next_cursor"}
    POST /api/v1/runs/{run_id}/claims?format=json|b64v1|binv1
         {"groups", "max_staleness", "lease_s"}                    -> batch
    POST /api/v1/batches/{batch_id}/ack                            -> {batch_id, acked}
    POST /api/v1/runs/{run_id}/alignment  {"step", "weight_version", "metrics", "flagged",
                                           "reasons"}
    GET  /api/v1/runs/{run_id}/alignment                           -> {"reports": [...]}
    POST /api/v1/workers/exclusions  {"exclude": {url: why}, "include": [url]}
    GET  /api/v1/workers/exclusions                                -> {"excluded": {url: why}}

Worker exclusions are how a trainer takes a worker of a plain ``LEGO_BACKEND_URL`` list out
of rotation after its weight sync failed (with an smg router it removes it there): every
replica reads them with the paused runs and routes no turn to those workers.

Claims flush this proxy's turn writer first, so a finished session's turns are in the
database before its group is delivered. The claim's shape, its schema version and its
three forms (``json`` numbers, ``b64v1`` base64 text, ``binv1`` raw bytes in a framed body
that streams sample by sample) are ``recorder.export_wire``'s. A binv1 claim that fails
after its first byte ends the connection early, which its client detects (the batch's
lease then expires as usual).
A claim delivers only complete groups (``recorder.groups``: the declared ``group_size``
reached, or the group closed, and every session finished). Its lease starts once its
samples are read (``lease_expires_at``; in ``binv1`` the head's value is a lower bound, the
lease running from the end of the body). A group one of whose sessions cannot be read into
a sample is set broken and left out for good (``lego_export_broken_groups``), so one broken
session never blocks a run's export.
A claim response also carries ``stale_groups``: complete groups held back by
``max_staleness`` (they stay in the pool). The latest alignment step of each run is
exported as ``lego_alignment_<metric>{run}`` gauges.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from kernel.errors import LegoError, RecorderError, RecorderUnavailable
from proxy.adapters.wire import Name
from proxy.gate import RunGate
from proxy.metrics import Metrics
from proxy.openapi import json_body
from proxy.routes.admin_api import (
    ErrorRenderer,
    admin_endpoint,
    cursor_of,
    parse_body,
    parse_cursor,
    query_bool,
    query_int,
    session_json,
)
from proxy.settings import Settings
from recorder.export import AlignmentReport, Claim, ExportStore
from recorder.export import ClaimedGroup as ExportedGroup
from recorder.export_wire import (
    MEDIA_TYPE,
    BatchHead,
    ClaimedSample,
    GroupHead,
    binv1_head,
    binv1_sample,
    check_format,
    claim_body,
    sample_json,
)
from recorder.records import EXCLUDED_TERMINATIONS, SessionInfo
from recorder.store import Store
from recorder.trajectory import build_segments
from recorder.writer import TurnWriter

CLAIM_FLUSH_TIMEOUT_S = 10.0
# How long a claim's groups stay held while its samples are read, before the lease proper
# starts (a server that dies mid-claim hands them back after lease_s plus this).
CLAIM_READ_GRACE_S = 300.0


@dataclass(frozen=True, slots=True)
class ExportState:
    """What the export routes need; ``create_app`` puts it on ``app.state.lego_export``."""

    store: Store
    exports: ExportStore
    writer: TurnWriter
    gate: RunGate
    metrics: Metrics


class _Strict(BaseModel):
    # Finite numbers only: NaN and Infinity are not JSON, and no column keeps them.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class AnnounceVersion(_Strict):
    version: Name = Field(min_length=1, max_length=256)


class ClaimBody(_Strict):
    groups: int = Field(ge=1, le=10_000)
    max_staleness: int | None = Field(default=None, ge=0)
    lease_s: float = Field(default=600.0, gt=0, le=7 * 24 * 3600)


# What a metric of an alignment report may be: stored in a JSON column and read back as a
# float by every later read (Postgres would turn 2e19 into an integer past 64 bits).
_Metric = Annotated[float, Field(gt=-(2.0**63), lt=2.0**63)]


class AlignmentBody(_Strict):
    step: int = Field(ge=0, le=2**31 - 1)
    weight_version: Name = Field(min_length=1, max_length=256)
    metrics: dict[Annotated[Name, Field(max_length=128)], _Metric | None] = Field(max_length=256)
    flagged: bool = False
    # Why it was flagged, in words (shown in the Live UI); empty when it was not.
    reasons: list[Annotated[str, Field(max_length=1024)]] = Field(
        default_factory=list, max_length=32
    )


_WorkerUrl = Annotated[str, Field(min_length=1, max_length=2048, pattern=r"^https?://")]


class WorkerExclusionsBody(_Strict):
    """Workers to take out of rotation (url -> why) and to put back."""

    exclude: dict[_WorkerUrl, Annotated[Name, Field(max_length=2048)]] = Field(
        default_factory=dict, max_length=1024
    )
    include: list[_WorkerUrl] = Field(default_factory=list, max_length=1024)


def _state(request: Request) -> ExportState:
    state: ExportState = request.app.state.lego_export
    return state


def build_router(settings: Settings, render_error: ErrorRenderer) -> APIRouter:
    router = APIRouter(prefix="/api/v1")
    admin_key = settings.effective_admin_key.encode()
    public_url = settings.effective_public_url

    def admin(
        handler: Callable[[ExportState, Request], Awaitable[object]],
    ) -> Callable[[Request], Awaitable[Response]]:
        return admin_endpoint("export API", admin_key, render_error, _state, handler)

    def run_id(request: Request) -> str:
        return str(request.path_params["run_id"])

    async def announce(state: ExportState, request: Request) -> object:
        body = parse_body(AnnounceVersion, await request.body())
        entry = await state.exports.announce_version(run_id(request), body.version)
        return {
            "run_id": entry.run_id,
            "version": entry.version,
            "index": entry.index,
            "created_at": entry.created_at,
        }

    async def versions(state: ExportState, request: Request) -> object:
        entries = await state.exports.list_versions(run_id(request))
        return {
            "versions": [
                {"version": e.version, "index": e.index, "created_at": e.created_at}
                for e in entries
            ]
        }

    async def pause(state: ExportState, request: Request) -> object:
        run = await state.store.get_run(run_id(request))
        await state.exports.set_paused(run.id, True)  # the other replicas poll this
        state.gate.pause(run.id)
        return {"run_id": run.id, "paused": True}

    async def resume(state: ExportState, request: Request) -> object:
        run = await state.store.get_run(run_id(request))
        await state.exports.set_paused(run.id, False)
        state.gate.resume(run.id)
        return {"run_id": run.id, "paused": False}

    async def trajectories(state: ExportState, request: Request) -> object:
        query = request.query_params
        run = await state.store.get_run(run_id(request))
        limit = query_int(query.get("limit"), "limit", default=100, low=1, high=1000)
        finished = query_bool(query.get("finished"), "finished")
        excluded = query_bool(query.get("excluded"), "excluded")
        scanned = await state.store.list_sessions(
            run.id, after=parse_cursor(query.get("cursor")), limit=limit, finished=finished
        )
        items = [
            session_json(s, public_url)
            for s in scanned
            if excluded is None or (s.termination in EXCLUDED_TERMINATIONS) == excluded
        ]
        last = scanned[-1] if len(scanned) == limit else None
        return {
            "items": items,
            "next_cursor": None if last is None else cursor_of(last.created_at, last.id),
        }

    async def claim(state: ExportState, request: Request) -> object:
        body = parse_body(ClaimBody, await request.body())
        wire = check_format(request.query_params.get("format", "json"))
        run = await state.store.get_run(run_id(request))
        try:
            async with asyncio.timeout(CLAIM_FLUSH_TIMEOUT_S):
                await state.writer.flush()  # this proxy's turns reach the database first
        except TimeoutError:
            raise RecorderUnavailable(
                "the recorder is still writing turns; retry the claim"
            ) from None
        result = await state.exports.claim(
            run.id, body.groups, body.max_staleness, body.lease_s, read_grace_s=CLAIM_READ_GRACE_S
        )
        state.metrics.export_claims.labels(outcome="hit" if result.groups else "empty").inc()
        state.metrics.export_claimed_groups.inc(len(result.groups))
        state.metrics.export_stale_groups.inc(result.stale_groups)
        state.metrics.export_lease_expiries.inc(result.reclaimed_groups)
        for group in result.groups:
            state.metrics.export_staleness.observe(group.staleness)
        owner = {sid: group.group_id for group in result.groups for sid in group.session_ids}
        if wire == "binv1" or result.batch_id is None:
            head = _head(result, wire, result.groups, result.lease_expires_at)
            if result.batch_id is None:
                return claim_body(head, [])
            frames = _binv1_claim(state, result.batch_id, body.lease_s, head, owner)
            return StreamingResponse(frames, media_type=MEDIA_TYPE)
        # Each sample is encoded as it arrives, while the next one is read.
        samples: dict[str, list[dict[str, object]]] = {g.group_id: [] for g in result.groups}
        broken: set[str] = set()
        async for session_id, sample in _samples(state, list(owner)):
            group_id = owner[session_id]
            if group_id in broken:
                continue
            if isinstance(sample, LegoError):
                broken.add(group_id)
                await _set_broken(state, result.batch_id, group_id, sample)
                continue
            samples[group_id].append(sample_json(sample, wire))
        kept = [g for g in result.groups if g.group_id not in broken]
        # The lease runs from now, once the samples are read, however long that took.
        expires = await state.exports.start_lease(result.batch_id, body.lease_s)
        head = _head(result, wire, kept, expires)
        return claim_body(head, [sample for g in kept for sample in samples[g.group_id]])

    async def ack(state: ExportState, request: Request) -> object:
        batch_id = str(request.path_params["batch_id"])
        await state.exports.ack(batch_id)
        return {"batch_id": batch_id, "acked": True}

    async def post_alignment(state: ExportState, request: Request) -> object:
        body = parse_body(AlignmentBody, await request.body())
        report = AlignmentReport(
            run_id=run_id(request),
            step=body.step,
            weight_version=body.weight_version,
            metrics=body.metrics,
            flagged=body.flagged,
            created_at=time.time(),
            reasons=tuple(body.reasons),
        )
        await state.exports.record_alignment(report)
        latest = (await state.exports.list_alignment(report.run_id))[-1]
        state.metrics.alignment_step.labels(run=report.run_id).set(latest.step)
        if report.flagged:
            state.metrics.alignment_flagged.labels(run=report.run_id).inc()
        for name, value in latest.metrics.items():
            gauge = state.metrics.alignment_gauge(name)
            if value is not None and gauge is not None:
                gauge.labels(run=report.run_id).set(value)
        return _alignment_json(report)

    async def get_alignment(state: ExportState, request: Request) -> object:
        reports = await state.exports.list_alignment(run_id(request))
        return {"reports": [_alignment_json(r) for r in reports]}

    async def set_exclusions(state: ExportState, request: Request) -> object:
        body = parse_body(WorkerExclusionsBody, await request.body())
        excluded = await state.exports.set_worker_exclusions(body.exclude, body.include)
        return {"excluded": excluded}

    async def get_exclusions(state: ExportState, request: Request) -> object:
        return {"excluded": await state.exports.worker_exclusions()}

    runs = "/runs/{run_id}"
    router.add_api_route(
        "/workers/exclusions",
        admin(set_exclusions),
        methods=["POST"],
        openapi_extra=json_body(WorkerExclusionsBody),
    )
    router.add_api_route("/workers/exclusions", admin(get_exclusions), methods=["GET"])
    router.add_api_route(
        f"{runs}/weight_versions",
        admin(announce),
        methods=["POST"],
        openapi_extra=json_body(AnnounceVersion),
    )
    router.add_api_route(f"{runs}/weight_versions", admin(versions), methods=["GET"])
    router.add_api_route(f"{runs}/pause", admin(pause), methods=["POST"])
    router.add_api_route(f"{runs}/resume", admin(resume), methods=["POST"])
    router.add_api_route(f"{runs}/trajectories", admin(trajectories), methods=["GET"])
    router.add_api_route(
        f"{runs}/claims", admin(claim), methods=["POST"], openapi_extra=json_body(ClaimBody)
    )
    router.add_api_route("/batches/{batch_id}/ack", admin(ack), methods=["POST"])
    router.add_api_route(
        f"{runs}/alignment",
        admin(post_alignment),
        methods=["POST"],
        openapi_extra=json_body(AlignmentBody),
    )
    router.add_api_route(f"{runs}/alignment", admin(get_alignment), methods=["GET"])
    return router


def _head(
    result: Claim, wire: str, groups: Sequence[ExportedGroup], expires: float | None
) -> BatchHead:
    return BatchHead(
        batch_id=result.batch_id,
        lease_expires_at=expires,
        format=wire,
        zero_variance_groups=result.zero_variance_groups,
        stale_groups=result.stale_groups,
        groups=tuple(
            GroupHead(g.group_id, g.task_id, g.staleness, len(g.session_ids)) for g in groups
        ),
    )


async def _set_broken(state: ExportState, batch_id: str, group_id: str, error: LegoError) -> None:
    state.metrics.export_broken_groups.inc()
    await state.exports.set_broken(batch_id, group_id, error.message)


async def _binv1_claim(
    state: ExportState,
    batch_id: str,
    lease_s: float,
    head: BatchHead,
    owner: Mapping[str, str],
) -> AsyncIterator[bytes | memoryview]:
    """The claim as binv1 frames: the batch, then each sample as soon as it is read.

    The head is sent before any sample is read, so a broken session can only end the body
    early (the client refuses it): its group is set broken and the batch handed back at
    once, so the trainer's next claim gets every other group. The lease runs from the end
    of the body (the head's expiry is a lower bound of it)."""
    for part in binv1_head(head):
        yield part
    async for session_id, sample in _samples(state, list(owner)):
        if isinstance(sample, LegoError):
            await _set_broken(state, batch_id, owner[session_id], sample)
            await state.exports.abandon(batch_id)
            raise sample
        for part in binv1_sample(sample):
            yield part
    await state.exports.start_lease(batch_id, lease_s)


async def _samples(
    state: ExportState, session_ids: Sequence[str]
) -> AsyncIterator[tuple[str, ClaimedSample | LegoError]]:
    """The samples in order, each read from the database while the previous one is
    handled (the database and the socket work at the same time); a session that cannot
    be read comes as its error."""
    if not session_ids:
        return
    ahead = asyncio.create_task(_sample(state, session_ids[0]))
    try:
        for current, following in zip(session_ids, [*session_ids[1:], None], strict=True):
            sample = await ahead
            if following is not None:
                ahead = asyncio.create_task(_sample(state, following))
            yield current, sample
    finally:
        ahead.cancel()  # the client went away mid-claim: nothing will read it


async def _sample(state: ExportState, session_id: str) -> ClaimedSample | LegoError:
    try:
        session: SessionInfo = await state.store.get_session(session_id)
        turns = await state.store.list_turn_arrays(session_id)
        segments = tuple(build_segments(turns))
    except RecorderError as exc:
        # Its recorded turns do not chain (a turn missing, arrays that do not align): the
        # caller sets its group broken; every other group is still delivered.
        if isinstance(exc, RecorderUnavailable):
            raise
        return exc
    return ClaimedSample(
        session_id=session.id,
        sample_index=session.spec.sample_index,
        reward=session.reward,
        termination=session.termination,
        segments=segments,
        reward_details=session.reward_details,
        stages=session.stages,
        defense_events=session.defense_events,
    )


def _alignment_json(report: AlignmentReport) -> dict[str, object]:
    return {
        "run_id": report.run_id,
        "step": report.step,
        "weight_version": report.weight_version,
        "metrics": dict(report.metrics),
        "flagged": report.flagged,
        "reasons": list(report.reasons),
        "created_at": report.created_at,
    }
