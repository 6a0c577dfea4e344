"""The engine's routes for weights broadcast over a process group, SGLang 0.5.23's shapes.

Owns ``register_distributed(app)``: ``/init_weights_update_group``,
``/destroy_weights_update_group``, ``/begin_weight_update``, ``/end_weight_update`` and
``/update_weights_from_distributed`` (``http_server.py:1404-1525``). Each answers
``{"success", "message"}``, 200 or 400, with SGLang's messages (``engine.update_groups``).

A sync as a trainer runs it, on every worker: ``/pause_generation`` -> ``/flush_cache`` ->
(first time) ``/init_weights_update_group`` while the trainer joins as rank 0 ->
``/begin_weight_update`` -> one ``/update_weights_from_distributed`` per batch while the
trainer broadcasts it (the call answers once the batch is received and loaded) ->
``/end_weight_update`` -> ``/continue_generation``.

As in SGLang, the session and update routes take the model-update lock's write side
unless the server is paused (``EngineState.model_update``). Received tensors are loaded
into the running model between scheduler steps, like a load from disk; then, when asked
(``flush_cache``, the default), the update fails if requests still run (SGLang cannot
flush then), and on success ``weight_version`` becomes the served version. The group
routes take no lock: joining blocks until the trainer and every other worker have joined,
and runs off the event loop meanwhile.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from engine.protocol import (
    BeginWeightUpdateBody,
    DestroyWeightsUpdateGroupBody,
    EndWeightUpdateBody,
    InitWeightsUpdateGroupBody,
    UpdateWeightsFromDistributedBody,
)
from engine.state import EngineState
from kernel.errors import InvalidRequest, LegoError
from kernel.weight_group import GroupAddress, TensorSpec

NOT_FLUSHED = (
    "Weights were updated, but the cache was not flushed because requests are still "
    "running or queued. Retract or finish them, then call /flush_cache."
)


def _state(request: Request) -> EngineState:
    state: EngineState = request.app.state.engine
    return state


async def _answer(step: Awaitable[str]) -> JSONResponse:
    """SGLang's ``{success, message}``: 200 with the step's message, or 400 with its error."""
    try:
        message = await step
    except LegoError as exc:
        return JSONResponse({"success": False, "message": exc.message}, status_code=400)
    return JSONResponse({"success": True, "message": message})


async def _deferred(call: Callable[[], str]) -> str:
    return call()


def _specs(body: UpdateWeightsFromDistributedBody) -> list[TensorSpec]:
    if not len(body.names) == len(body.dtypes) == len(body.shapes):
        raise InvalidRequest(
            "Failed to receive weights: names, dtypes and shapes differ in length "
            f"({len(body.names)}, {len(body.dtypes)}, {len(body.shapes)})"
        )
    return [
        TensorSpec(name, dtype, tuple(shape))
        for name, dtype, shape in zip(body.names, body.dtypes, body.shapes, strict=True)
    ]


async def _update(state: EngineState, body: UpdateWeightsFromDistributedBody) -> str:
    specs = _specs(body)
    weights = await state.update_groups.receive(body.group_name, specs, body.load_format)
    try:
        await asyncio.to_thread(state.backend.load_weights, weights)
    except LegoError as exc:
        raise InvalidRequest(
            f"Failed to update parameter online: {exc.message}. The full weights of the "
            "ModelRunner are partially updated. Please discard the whole weights."
        ) from exc
    if body.flush_cache and state.backend.running_count() > 0:
        raise InvalidRequest(NOT_FLUSHED)
    message = "Succeeded to update parameter online."
    if body.weight_version is not None:
        await state.set_weight_version(body.weight_version)
        message += f" Weight version updated to {body.weight_version}."
    return message


def register_distributed(app: FastAPI) -> None:
    @app.post("/init_weights_update_group")
    async def init_weights_update_group(
        body: InitWeightsUpdateGroupBody, request: Request
    ) -> JSONResponse:
        state = _state(request)
        address = GroupAddress(
            body.master_address, body.master_port, body.world_size, body.group_name, body.backend
        )
        timeout_s = state.config.weight_group_timeout_s
        return await _answer(state.update_groups.init(address, body.rank_offset, timeout_s))

    @app.post("/destroy_weights_update_group")
    async def destroy_weights_update_group(
        body: DestroyWeightsUpdateGroupBody, request: Request
    ) -> JSONResponse:
        groups = _state(request).update_groups
        return await _answer(_deferred(lambda: groups.destroy(body.group_name)))

    @app.post("/begin_weight_update")
    async def begin_weight_update(body: BeginWeightUpdateBody, request: Request) -> JSONResponse:
        state = _state(request)
        async with state.model_update():
            return await _answer(_deferred(state.update_groups.begin))

    @app.post("/end_weight_update")
    async def end_weight_update(body: EndWeightUpdateBody, request: Request) -> JSONResponse:
        state = _state(request)
        async with state.model_update():
            return await _answer(_deferred(state.update_groups.end))

    @app.post("/update_weights_from_distributed")
    async def update_weights_from_distributed(
        body: UpdateWeightsFromDistributedBody, request: Request
    ) -> JSONResponse:
        state = _state(request)
        if body.abort_all_requests:
            state.backend.abort_all("Abort due to weight update.")
        async with state.model_update():
            return await _answer(_update(state, body))
