"""The engine's control routes, SGLang 0.5.23's shapes: aborts, health, info, pause, weights.

Owns ``register_control(app)``: ``/abort_request``, ``/health``, ``/health_generate``,
``/ready`` (503 while paused), ``/model_info`` and ``/server_info`` (with their deprecated
``/get_*`` aliases), ``/flush_cache``, ``/pause_generation``, ``/continue_generation``,
``/update_weights_from_disk`` and ``/update_weight_version``. Weights broadcast over a
process group have their own routes (``engine.distributed``).

Weight updates follow SGLang's serialisation (``engine.weights``): unless the server is
paused, ``/update_weights_from_disk`` takes the model-update lock's write side, so it waits
for every running request to finish and holds new ones back until the new weights are in.
A pause in ``abort`` mode aborts until no request holds the lock; ``retract``/``in_place``
keep requests alive, and a version change while they are alive is noted on them, so they
report ``weight_versions`` spans when they finish.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from engine.jobs import ErrorEvent, Event, FinishEvent, GenerationJob
from engine.protocol import AbortBody, PauseBody, UpdateWeightsFromDiskBody, UpdateWeightVersionBody
from engine.sampling import SamplingParams
from engine.state import EngineState
from kernel.errors import InvalidRequest, LegoError

HEALTH_TIMEOUT_S = 20.0
ENGINE_VERSION = "0.5.23"  # the SGLang release whose protocol this engine speaks
_PAUSE_POLL_S = 0.05


def _state(request: Request) -> EngineState:
    state: EngineState = request.app.state.engine
    return state


def server_info(state: EngineState) -> dict[str, object]:
    """The subset of SGLang's ``/server_info`` (resolved ``ServerArgs`` plus scheduler info)
    that clients read: smg to register the worker, the proxy to check its limits."""
    config = state.config
    limits = state.limits
    return {
        "model_path": str(config.model_path),
        "tokenizer_path": str(config.model_path),
        "served_model_name": config.served_model_name or str(config.model_path),
        "context_length": config.context_length,  # null unless set, as in SGLang
        "max_total_num_tokens": config.max_total_tokens or limits.context_len,
        "max_req_input_len": limits.max_req_input_len,
        "enable_return_routed_experts": config.enable_return_routed_experts,
        "incremental_streaming_output": config.incremental_streaming_output,
        "enable_deterministic_inference": config.enable_deterministic_inference,
        "allow_auto_truncate": False,
        "weight_version": config.weight_version,  # the launch value; /model_info has the live one
        "skip_tokenizer_init": False,
        "is_embedding": False,
        "tp_size": 1,
        "dp_size": 1,
        "pp_size": 1,
        "disaggregation_mode": "null",
        "status": "ready",
        "internal_states": [{"weight_version": state.weight_version}],
        "version": ENGINE_VERSION,
        "frontend": "python",
    }


def _register_requests(app: FastAPI) -> None:
    @app.post("/abort_request")
    async def abort_request(body: AbortBody, request: Request) -> Response:
        backend = _state(request).backend
        if body.abort_all:
            backend.abort_all("Aborted by /abort_request (abort_all).")
        elif body.rid:
            backend.abort(body.rid, f"Aborted by /abort_request (rid {body.rid}).")
        return Response(status_code=200)

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/ready")
    async def ready(request: Request) -> Response:
        return Response(status_code=200 if _state(request).resumed.is_set() else 503)

    @app.get("/health_generate")
    async def health_generate(request: Request) -> Response:
        state = _state(request)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Event] = asyncio.Queue()
        job = GenerationJob(
            rid=f"HEALTH_CHECK_{uuid.uuid4().hex}",
            prompt_ids=(0,),
            params=SamplingParams(max_new_tokens=1, temperature=0.0),
        )

        def emit(event: Event) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, event)

        state.backend.submit(job, emit)
        try:
            while True:
                event = await asyncio.wait_for(queue.get(), HEALTH_TIMEOUT_S)
                if isinstance(event, FinishEvent):
                    return Response(status_code=200)
                if isinstance(event, ErrorEvent):
                    return Response(status_code=503)
        except TimeoutError:
            state.backend.abort(job.rid, "health check timed out")
            return Response(status_code=503)


def _register_info(app: FastAPI) -> None:
    async def model_info(request: Request) -> dict[str, object]:
        state = _state(request)
        cfg = state.model_config
        return {
            "model_path": str(state.model_path),
            "served_model_name": state.config.served_model_name or str(state.config.model_path),
            "tokenizer_path": str(state.config.model_path),
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": state.weight_version,
            "load_format": "auto",
            "reasoning_parser": None,
            "tool_call_parser": None,
            "disaggregation_mode": "null",
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": cfg.get("model_type"),
            "architectures": cfg.get("architectures"),
        }

    async def get_server_info(request: Request) -> dict[str, object]:
        return server_info(_state(request))

    for prefix in ("", "get_"):
        app.add_api_route(f"/{prefix}model_info", model_info, methods=["GET"])
        app.add_api_route(f"/{prefix}server_info", get_server_info, methods=["GET"])

    async def flush_cache(request: Request) -> Response:
        if _state(request).backend.running_count() > 0:
            return Response("Cache not flushed: requests are running.\n", status_code=400)
        return Response("Cache flushed.\n", status_code=200)

    app.add_api_route("/flush_cache", flush_cache, methods=["GET", "POST"])


def _register_pause_and_weights(app: FastAPI) -> None:
    @app.post("/pause_generation")
    async def pause_generation(request: Request) -> dict[str, str]:
        state = _state(request)
        raw = await request.body()
        body = PauseBody.model_validate_json(raw) if raw.strip() else PauseBody()
        if body.mode not in ("abort", "retract", "in_place"):
            raise InvalidRequest(f"unknown pause mode {body.mode!r}")
        state.resumed.clear()
        if body.mode != "abort":
            state.backend.set_frozen(True)
            return {"message": "Generation paused successfully.", "status": "ok"}
        # As SGLang: abort until no request holds the update lock (one that was admitted
        # just before the pause may submit after the first abort).
        while True:
            state.backend.abort_all("Abort due to pause_generation.")
            if state.update_lock.readers == 0:
                break
            await asyncio.sleep(_PAUSE_POLL_S)
        return {"message": "Generation paused successfully.", "status": "ok"}

    @app.post("/continue_generation")
    async def continue_generation(request: Request) -> dict[str, str]:
        state = _state(request)
        state.backend.set_frozen(False)
        state.resumed.set()
        return {"message": "Generation continued successfully.", "status": "ok"}

    @app.post("/update_weights_from_disk")
    async def update_weights_from_disk(
        body: UpdateWeightsFromDiskBody, request: Request
    ) -> JSONResponse:
        state = _state(request)
        if body.abort_all_requests:
            state.backend.abort_all("Abort due to weight update.")
        async with state.model_update():
            try:
                await asyncio.to_thread(state.backend.reload, Path(body.model_path))
            except LegoError as exc:
                result = {"success": False, "message": exc.message, "num_paused_requests": 0}
                return JSONResponse(result, status_code=400)
            state.model_path = Path(body.model_path)
            await state.set_weight_version(body.weight_version)
        message = "Succeeded to update model weights."
        if body.weight_version is not None:
            message += f" Weight version updated to {body.weight_version}."
        return JSONResponse({"success": True, "message": message, "num_paused_requests": 0})

    @app.post("/update_weight_version")
    async def update_weight_version(
        body: UpdateWeightVersionBody, request: Request
    ) -> dict[str, object]:
        state = _state(request)
        if body.abort_all_requests:
            state.backend.abort_all("Abort due to weight version update.")
        await state.set_weight_version(body.new_version)
        return {
            "success": True,
            "message": f"Weight version updated to {body.new_version}",
            "new_version": body.new_version,
        }


def register_control(app: FastAPI) -> None:
    _register_requests(app)
    _register_info(app)
    _register_pause_and_weights(app)
