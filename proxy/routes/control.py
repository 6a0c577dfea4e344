"""Control API for orchestrators and trainers (admin key): runs, sessions, trajectories.

Owns the control API's wire models and routes. Errors use the same envelope as the
OpenAI adapter (``{"error": {"message", "type", "param", "code"}}``). A session's
``group_size`` declares how many samples its prompt group has; closing a group says it
has them all (``recorder.groups`` owns the rules; a session that may not join is 409).
Reads flush this proxy's turn writer first, for at most ``FLUSH_TIMEOUT_S`` (then 503).

A finish may carry the trial's report beside its reward: ``stages``, seconds per stage of
Table 4 (``recorder.records.STAGES``; each finite, >= 0, at most ``MAX_STAGE_S``; any
other key is a 400), and ``events``, what the reward-hack defenses did: at most
``MAX_EVENTS`` flat JSON objects ``{"kind": "test_path_reverted", ...details}``, each at
most ``MAX_EVENT_BYTES`` of JSON, storable as ``reward_details`` is. Every session read
(this API's session JSON, the trajectory, the export's samples) gives them back as
``stages`` (null when none were reported) and ``defense_events`` (the trajectory's
``events`` are the history ledger's departures, an older contract).

    POST /api/v1/runs                          {"name"}                       -> run
    GET  /api/v1/runs?cursor=&limit=                              -> {"items", "next_cursor"}
    POST /api/v1/runs/{run_id}/sessions        {"task_id", "group_id", ...}   -> session + key
    POST /api/v1/runs/{run_id}/groups/{group_id}/close                        -> group
    POST /api/v1/sessions/{id}/finish          {"termination", "reward", ...} -> session
    GET  /api/v1/sessions/{id}                                                -> session
    GET  /api/v1/sessions/{id}/trajectory?format=json|b64v1                   -> segments

The trajectory is the session's JSON with ``turns``, ``segments`` (each in the ``format``
asked for: ``json`` numbers by default, or ``b64v1``'s base64 arrays, far smaller for
routed experts), ``events``, and the export wire's ``schema_version``;
``recorder.export_wire.decode_trajectory`` reads it.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from typing import Annotated, Literal

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    PlainValidator,
    field_validator,
    model_validator,
)

from kernel.errors import InvalidRequest, RecorderUnavailable
from proxy.adapters.wire import Name, refuse_unstorable
from proxy.openapi import json_body
from proxy.routes.admin_api import (
    ErrorRenderer,
    admin_endpoint,
    cursor_of,
    parse_body,
    parse_cursor,
    query_int,
    session_json,
)
from proxy.sampling_rules import SamplingSeed, TopK
from proxy.settings import Settings
from proxy.state import AppState
from recorder.export_wire import SCHEMA_VERSION, TRAJECTORY_FORMATS, check_format, segment_json
from recorder.records import STAGES, DefenseEvent, SessionSpec, StageTimes, Termination
from recorder.rows import SideRequests
from recorder.trajectory import build_segments


class _Strict(BaseModel):
    # Finite numbers only: NaN and Infinity are not JSON, and no column keeps them.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


INT32_MAX = 2**31 - 1  # what an Integer column holds
FLUSH_TIMEOUT_S = 10.0
MAX_STAGE_S = 7 * 24 * 3600.0  # a week: no trial runs longer, and a typo stands out
MAX_EVENTS = 256
MAX_EVENT_BYTES = 64 * 1024  # room for a real repository's refs (history_hidden's items)


class CreateRun(_Strict):
    name: Name = Field(min_length=1, max_length=256)


class SessionSampling(_Strict):
    """Sampling the orchestrator pins for every turn of a session; wins over the harness."""

    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: TopK | None = Field(default=None, le=INT32_MAX)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    seed: SamplingSeed | None = None
    max_tokens: int | None = Field(default=None, ge=1, le=INT32_MAX)


class CreateSession(_Strict):
    task_id: Name = Field(min_length=1, max_length=512)
    group_id: Name = Field(min_length=1, max_length=512)
    sample_index: int = Field(default=0, ge=0, le=INT32_MAX)
    # How many sessions the group has: it is exported once that many are finished.
    group_size: int | None = Field(default=None, ge=1, le=10_000)
    harness: Name = Field(default="unknown", max_length=128)
    sampling: SessionSampling = SessionSampling()
    max_prompt_tokens: int | None = Field(default=None, ge=1, le=INT32_MAX)
    max_output_tokens: int | None = Field(default=None, ge=1, le=INT32_MAX)
    # recorder.records.PURPOSES: anything but "train" is recorded and charted but never
    # exported to a trainer (lego-proxy loop's held-out evaluations and validation run).
    purpose: Literal["train", "validation", "check"] = "train"


def _reward(value: object) -> float | list[float] | None:
    # One validator instead of a union, so an error names the field, not a union member.
    if value is None:
        return None
    if _is_number(value):
        return float(value)  # type: ignore[arg-type]
    if isinstance(value, list) and value and all(_is_number(x) for x in value):
        return [float(x) for x in value]
    raise ValueError("reward must be a finite number or a non-empty list of finite numbers")


def _is_number(value: object) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:  # an integer past the float range
        return False


Reward = Annotated[float | list[float] | None, PlainValidator(_reward)]


def _refuse_unstorable(value: object) -> None:
    # Stored in a JSON column and read back by every claim: refuse what would not be.
    try:
        refuse_unstorable(value, json_column=True)
    except InvalidRequest as exc:
        raise ValueError(exc.message) from None


_Seconds = Annotated[float | None, Field(default=None, ge=0.0, le=MAX_STAGE_S, strict=True)]


class TrialStages(_Strict):
    """Seconds the trial spent in each stage of Table 4 (``recorder.records.StageTimes``)."""

    sandbox_setup: _Seconds = None
    agent_setup: _Seconds = None
    agent_execution: _Seconds = None
    verification: _Seconds = None
    other: _Seconds = None

    @model_validator(mode="before")
    @classmethod
    def _known_stages(cls, value: object) -> object:
        # Named here, not as pydantic's "extra inputs", so the caller learns the stages.
        unknown = sorted(set(value) - set(STAGES)) if isinstance(value, dict) else []
        if unknown:
            raise ValueError(f"unknown stage {unknown[0]!r}; the stages are {', '.join(STAGES)}")
        return value


class TrialEvent(BaseModel):
    """What one defense did: a ``kind`` and free-form JSON details beside it."""

    model_config = ConfigDict(extra="allow", frozen=True, allow_inf_nan=False)
    __pydantic_extra__: dict[str, JsonValue] = Field(init=False)

    kind: Name = Field(min_length=1, max_length=64, pattern=r"^[a-z][a-z0-9_]*$")

    @model_validator(mode="after")
    def _small_and_storable(self) -> TrialEvent:
        _refuse_unstorable(self.model_extra)
        if len(orjson.dumps(self.model_dump())) > MAX_EVENT_BYTES:
            raise ValueError(f"an event must be at most {MAX_EVENT_BYTES} bytes of JSON")
        return self


class FinishSession(_Strict):
    termination: Termination
    reward: Reward = None  # a scalar, or a vector of objectives
    reward_details: dict[str, JsonValue] | None = None
    stages: TrialStages | None = None
    events: list[TrialEvent] = Field(default_factory=list, max_length=MAX_EVENTS)

    @field_validator("reward_details")
    @classmethod
    def _storable(cls, value: dict[str, JsonValue] | None) -> dict[str, JsonValue] | None:
        _refuse_unstorable(value)
        return value

    def stage_times(self) -> StageTimes | None:
        if self.stages is None:
            return None
        return StageTimes(**self.stages.model_dump())

    def defense_events(self) -> tuple[DefenseEvent, ...]:
        return tuple(DefenseEvent.of(event.model_dump()) for event in self.events)


def _state(request: Request) -> AppState:
    state: AppState = request.app.state.lego
    return state


def build_router(settings: Settings, render_error: ErrorRenderer) -> APIRouter:
    router = APIRouter(prefix="/api/v1")
    admin_key = settings.effective_admin_key.encode()
    public_url = settings.effective_public_url

    def admin(
        handler: Callable[[AppState, Request], Awaitable[object]],
    ) -> Callable[[Request], Awaitable[Response]]:
        return admin_endpoint("control API", admin_key, render_error, _state, handler)

    async def create_run(state: AppState, request: Request) -> object:
        body = parse_body(CreateRun, await request.body())
        run = await state.store.create_run(body.name)
        return {"id": run.id, "name": run.name, "created_at": run.created_at}

    async def list_runs(state: AppState, request: Request) -> object:
        query = request.query_params
        limit = query_int(query.get("limit"), "limit", default=100, low=1, high=1000)
        found = await state.store.list_runs(after=parse_cursor(query.get("cursor")), limit=limit)
        last = found[-1] if len(found) == limit else None
        return {
            "items": [{"id": r.id, "name": r.name, "created_at": r.created_at} for r in found],
            "next_cursor": None if last is None else cursor_of(last.created_at, last.id),
        }

    async def create_session(state: AppState, request: Request) -> object:
        body = parse_body(CreateSession, await request.body())
        spec = SessionSpec(
            run_id=request.path_params["run_id"],
            task_id=body.task_id,
            group_id=body.group_id,
            sample_index=body.sample_index,
            harness=body.harness,
            sampling=body.sampling.model_dump(exclude_none=True),
            max_prompt_tokens=body.max_prompt_tokens,
            max_output_tokens=body.max_output_tokens,
            purpose=body.purpose,
        )
        session = await state.store.create_session(spec, group_size=body.group_size)
        state.sessions.put(session)
        return {**session_json(session, public_url), "key": session.key}

    async def close_group(state: AppState, request: Request) -> object:
        group = await state.store.close_group(
            request.path_params["run_id"], request.path_params["group_id"]
        )
        return {
            "run_id": group.run_id,
            "group_id": group.group_id,
            "size": group.size,
            "sessions": group.sessions,
            "closed": group.closed,
            "exported": group.exported,
        }

    async def finish_session(state: AppState, request: Request) -> object:
        body = parse_body(FinishSession, await request.body())
        details: dict[str, object] | None = (
            dict(body.reward_details) if body.reward_details is not None else None
        )
        reward = tuple(body.reward) if isinstance(body.reward, list) else body.reward
        session = await state.store.finish_session(
            request.path_params["session_id"],
            body.termination.value,
            reward,
            details,
            stages=body.stage_times(),
            defense_events=body.defense_events(),
        )
        state.sessions.finished(session)
        state.pipeline.forget(session.id)
        state.metrics.sessions_finished.labels(termination=body.termination.value).inc()
        return session_json(session, public_url)

    async def flushed(state: AppState) -> None:
        """This proxy's turns are in the database (bounded: an outage answers 503)."""
        try:
            async with asyncio.timeout(FLUSH_TIMEOUT_S):
                await state.writer.flush()
        except TimeoutError:
            raise RecorderUnavailable(
                "the recorder is still writing this proxy's turns (is the database down?); "
                "retry in a while"
            ) from None

    async def get_session(state: AppState, request: Request) -> object:
        await flushed(state)
        session = await state.store.get_session(request.path_params["session_id"])
        return session_json(session, public_url)

    async def trajectory(state: AppState, request: Request) -> object:
        wire = check_format(request.query_params.get("format", "json"), TRAJECTORY_FORMATS)
        await flushed(state)
        session = await state.store.get_session(request.path_params["session_id"])
        turns = await state.store.list_turns(session.id)
        relabelled_by = SideRequests.of((t.id, t.side_requests) for t in turns).named_by
        return {
            **session_json(session, public_url),
            "schema_version": SCHEMA_VERSION,
            "format": wire,
            "turns": [
                {
                    "id": t.id,
                    "seq": t.seq,
                    "status": t.status.value,
                    "finish_reason": t.finish_reason,
                    "weight_version": t.weight_version,
                    "prompt_tokens": len(t.prompt_ids),
                    "completion_tokens": len(t.output_ids),
                    "adapter": t.adapter,
                    "requested_model": t.requested_model,
                    "error": t.error,
                    "resumptions": t.resumptions,
                    "classification": t.classification,
                    "fork_reason": t.fork_reason,
                    "parent_turn_id": t.parent_turn_id,
                    "reused_prefix_len": t.reused_prefix_len,
                    "malformed_tool_calls": t.malformed_tool_calls,
                    "ignored_fields": list(t.ignored_fields),
                }
                for t in turns
            ],
            "segments": [segment_json(s, wire) for s in build_segments(turns)],
            # Departures from token-exact continuation, so none of them goes unseen.
            "events": [
                {
                    "turn_id": t.id,
                    "seq": t.seq,
                    "classification": t.classification,
                    "fork_reason": t.fork_reason,
                    "parent_turn_id": t.parent_turn_id,
                    "reused_prefix_len": t.reused_prefix_len,
                    # The turn that showed this root to be a side request, if one did.
                    "relabelled_by": relabelled_by.get(t.id),
                }
                for t in turns
                if t.classification in ("fork", "realign")
            ],
        }

    router.add_api_route(
        "/runs", admin(create_run), methods=["POST"], openapi_extra=json_body(CreateRun)
    )
    router.add_api_route("/runs", admin(list_runs), methods=["GET"])
    router.add_api_route(
        "/runs/{run_id}/sessions",
        admin(create_session),
        methods=["POST"],
        openapi_extra=json_body(CreateSession),
    )
    router.add_api_route(
        "/runs/{run_id}/groups/{group_id}/close", admin(close_group), methods=["POST"]
    )
    router.add_api_route(
        "/sessions/{session_id}/finish",
        admin(finish_session),
        methods=["POST"],
        openapi_extra=json_body(FinishSession),
    )
    router.add_api_route("/sessions/{session_id}", admin(get_session), methods=["GET"])
    router.add_api_route("/sessions/{session_id}/trajectory", admin(trajectory), methods=["GET"])
    return router
