"""The behaviour analytics API (admin key): LEGO-RL Table 9 for one run, as JSON.

    GET /api/v1/runs/{run_id}/behaviour?k=   -> indicators and pass@k, first vs last third

Owns the route and its JSON (``behaviour_json``); the numbers are
``recorder.read_models.behaviour``'s, defined in ``docs/analytics.md``. ``k`` (1 to
``MAX_K``) asks pass@k for that many samples; without it, k is the run's most common
group size. The answer names each third ``first_third`` / ``last_third`` beside ``all``;
each indicator carries, per slice, its ``value`` (null when nothing was measured) and the
sessions it counted, had nothing to measure in, or left out because it does not
understand their harness's tools. Errors use the control API's envelope (an unknown run
is 404). The read flushes this proxy's turn writer first, as the control API's do.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from fastapi import APIRouter, Request

from kernel.errors import RecorderUnavailable
from proxy.routes.admin_api import ErrorRenderer, admin_endpoint, query_int
from proxy.settings import Settings
from proxy.state import AppState
from recorder.read_models.behaviour import Behaviour, IndicatorValue, Slice, load_behaviour

MAX_K = 10_000  # a group's declared size is at most this (control.CreateSession)
FLUSH_TIMEOUT_S = 10.0


def _slices(behaviour: Behaviour) -> Mapping[str, Slice]:
    return {"first_third": behaviour.first, "last_third": behaviour.last, "all": behaviour.all}


def _value(value: IndicatorValue) -> dict[str, object]:
    return {
        "value": value.value,
        "sessions": value.sessions,
        "not_applicable": value.not_applicable,
        "not_understood": value.not_understood,
    }


def _slice(part: Slice) -> dict[str, object]:
    return {
        "sessions": part.sessions,
        "since": part.since,
        "until": part.until,
        "harnesses": dict(part.harnesses),
        "k": part.passes.k,
        "groups": part.passes.groups,
        "groups_left_out": part.passes.left_out,
        "pass_at_k": part.passes.pass_at_k,
        "pass_hat_k": part.passes.pass_hat_k,
    }


def behaviour_json(behaviour: Behaviour) -> dict[str, object]:
    slices = _slices(behaviour)
    return {
        "run_id": behaviour.run_id,
        "run_name": behaviour.run_name,
        "graded_sessions": behaviour.graded,
        "read_sessions": behaviour.read,
        "session_limit": behaviour.limit,
        "k": behaviour.all.passes.k,
        "slices": {name: _slice(part) for name, part in slices.items()},
        "indicators": [
            {
                "key": indicator.key,
                "label": indicator.label,
                "unit": indicator.unit.value,
                "harnesses": None if indicator.harnesses is None else sorted(indicator.harnesses),
                "definition": indicator.definition,
                **{name: _value(part.indicators[indicator.key]) for name, part in slices.items()},
            }
            for indicator in behaviour.indicators
        ],
    }


def _state(request: Request) -> AppState:
    state: AppState = request.app.state.lego
    return state


def build_router(settings: Settings, render_error: ErrorRenderer) -> APIRouter:
    router = APIRouter(prefix="/api/v1")
    admin_key = settings.effective_admin_key.encode()

    async def behaviour(state: AppState, request: Request) -> object:
        k = request.query_params.get("k") or None  # none: the run's most common group size
        asked = None if k is None else query_int(k, "k", default=1, low=1, high=MAX_K)
        try:
            async with asyncio.timeout(FLUSH_TIMEOUT_S):
                await state.writer.flush()  # this proxy's turns reach the database first
        except TimeoutError:
            raise RecorderUnavailable(
                "the recorder is still writing this proxy's turns (is the database down?); "
                "retry in a while"
            ) from None
        found = await load_behaviour(state.store, request.path_params["run_id"], asked)
        return behaviour_json(found)

    router.add_api_route(
        "/runs/{run_id}/behaviour",
        admin_endpoint("behaviour API", admin_key, render_error, _state, behaviour),
        methods=["GET"],
    )
    return router
