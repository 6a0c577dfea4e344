"""The engine's HTTP server: SGLang's native protocol over a local backend.

Owns ``create_engine_app(config)``. The lifespan loads the tokenizer and the backend (the
model ``Scheduler``, or ``ZeroComputeBackend`` with ``zero_compute``) into
``app.state.engine``; nothing exists at import time. Endpoints: ``/generate`` (POST, PUT),
``/abort_request``, ``/health``, ``/health_generate``, ``/model_info`` (and the deprecated
``/get_model_info``), ``/flush_cache``, ``/pause_generation``, ``/continue_generation``,
``/update_weights_from_disk``, ``/update_weight_version``.

Known differences from SGLang 0.5.23, all deliberate or harmless for the proxy:

- Single requests only: batch ``text``/``input_ids`` lists, ``top_logprobs_num`` > 0 and
  ``token_ids_logprob`` are refused with 400 instead of served.
- There is no prefix cache: ``cached_tokens`` is always 0 and ``/flush_cache`` only checks
  that nothing is running.
- ``routed_experts`` is returned whenever requested and the model has routers (SGLang also
  needs ``--enable-return-routed-experts``).
- Pause modes ``retract`` and ``in_place`` both freeze running requests with their KV cache
  and resume them on ``/continue_generation``.
- A client that disconnects mid-stream is aborted at once (SGLang waits about 2 s).
- Abort messages are the engine's own wording; shapes match SGLang's.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse

from engine.config import EngineConfig
from engine.jobs import Backend, ErrorEvent, Event, FinishEvent, GenerationJob, TokenEvent
from engine.protocol import (
    AbortBody,
    GenerateBody,
    OutputState,
    PauseBody,
    UpdateWeightsFromDiskBody,
    UpdateWeightVersionBody,
)
from engine.sampling import SamplingContractError, SamplingParams, parse_sampling_params
from engine.script import ScriptedPolicy, split_open_assistant
from kernel.errors import BackendError, InvalidRequest, LegoError, Unsupported

ZERO_COMPUTE_REPLY = "OK."
HEALTH_TIMEOUT_S = 20.0


@dataclass(eq=False)
class EngineState:
    """Per-app mutable state; lives in ``app.state.engine``."""

    config: EngineConfig
    tokenizer: Any
    backend: Backend
    model_config: dict[str, Any]
    script: ScriptedPolicy | None
    weight_version: str
    model_path: Path
    resumed: asyncio.Event

    def decode(self, ids: Sequence[int], skip_special_tokens: bool) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens))


def _make_backend(config: EngineConfig, tokenizer: Any) -> Backend:
    if config.zero_compute:
        from engine.zero import ZeroComputeBackend

        ids = tokenizer.encode(ZERO_COMPUTE_REPLY, add_special_tokens=False)
        return ZeroComputeBackend(config.model_path, (*ids, int(tokenizer.eos_token_id)))
    import torch

    from engine.model_runner import ModelRunner
    from engine.scheduler import Scheduler

    if config.torch_threads is not None:
        torch.set_num_threads(config.torch_threads)

    def decode(ids: Sequence[int]) -> str:
        return str(tokenizer.decode(list(ids), skip_special_tokens=False))

    return Scheduler(ModelRunner(config.model_path, config.dtype), decode)


def _state(request: Request) -> EngineState:
    state: EngineState = request.app.state.engine
    return state


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message}}, status_code=status)


def _prompt_ids(body: GenerateBody, state: EngineState) -> tuple[int, ...]:
    if (body.text is None) == (body.input_ids is None):
        raise InvalidRequest("Exactly one of text or input_ids must be provided")
    if isinstance(body.text, list) or (body.input_ids and isinstance(body.input_ids[0], list)):
        raise Unsupported("batch requests are not supported by the local engine")
    if body.text is not None:
        ids = tuple(int(i) for i in state.tokenizer.encode(body.text, add_special_tokens=False))
    else:
        ids = tuple(i for i in (body.input_ids or []) if isinstance(i, int))
    if not ids:
        raise InvalidRequest("input_ids cannot be empty")
    vocab = state.backend.vocab_size
    if any(i < 0 or i >= vocab for i in ids):
        raise InvalidRequest(f"input_ids must be in [0, {vocab})")
    return ids


def _build_job(body: GenerateBody, state: EngineState) -> GenerationJob:
    params: SamplingParams = parse_sampling_params(body.sampling_params)
    prompt = _prompt_ids(body, state)
    if body.top_logprobs_num or body.token_ids_logprob:
        raise Unsupported("top_logprobs_num and token_ids_logprob are not supported")
    limit = state.backend.max_positions
    if len(prompt) >= limit:
        raise InvalidRequest(
            f"The input ({len(prompt)} tokens) is longer than the model's context length "
            f"({limit} tokens)."
        )
    if len(prompt) + params.max_new_tokens > limit:
        params = replace(params, max_new_tokens=limit - len(prompt))
    logprob_start = -1 if body.logprob_start_len is None else body.logprob_start_len
    if not body.return_logprob:
        logprob_start = -1
    if logprob_start > len(prompt):
        raise InvalidRequest(
            f"logprob_start_len ({logprob_start}) must not exceed the prompt length ({len(prompt)})"
        )
    routed_start = body.routed_experts_start_len or 0
    if not 0 <= routed_start <= len(prompt):
        raise InvalidRequest(
            f"routed_experts_start_len ({routed_start}) must be in [0, {len(prompt)}]"
        )
    forced: tuple[int, ...] | None = None
    delay = 0.0
    if state.script is not None:
        text = state.decode(prompt, False)
        reply = state.script.reply_for(text)
        ids = state.tokenizer.encode(reply.text, add_special_tokens=False)
        forced = (*(int(i) for i in ids), int(state.tokenizer.eos_token_id))
        forced = forced[_already_sampled(state, forced, split_open_assistant(text)[1]) :]
        delay = reply.delay_s
    return GenerationJob(
        rid=body.rid or uuid.uuid4().hex,
        prompt_ids=prompt,
        params=params,
        logprob_start_len=logprob_start,
        routed_experts_start_len=routed_start,
        forced_ids=forced,
        forced_delay_s=delay,
    )


def _already_sampled(state: EngineState, reply: tuple[int, ...], partial: str | None) -> int:
    """How many reply ids a resumed prompt already ends with (0 for a fresh answer)."""
    if not partial:
        return 0
    for count in range(len(reply), 0, -1):
        if state.decode(reply[:count], False) == partial:
            return count
    return 0


def _sse(payload: object) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


async def _drain(queue: asyncio.Queue[Event], output: OutputState) -> FinishEvent | ErrorEvent:
    """Consume token events until the request ends; return its last event."""
    while True:
        event = await queue.get()
        if isinstance(event, TokenEvent):
            output.add(event)
        else:
            return event


def _register_generate(app: FastAPI) -> None:
    async def generate(body: GenerateBody, request: Request) -> Response:
        state = _state(request)
        job = _build_job(body, state)
        await state.resumed.wait()
        started = time.perf_counter()
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Event] = asyncio.Queue()

        def emit(event: Event) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, event)

        output = OutputState(
            job,
            state.decode,
            return_logprob=bool(body.return_logprob),
            text_in_logprobs=body.return_text_in_logprobs,
            return_routed_experts=body.return_routed_experts,
            return_prompt_token_ids=body.return_prompt_token_ids,
            incremental=state.config.incremental_streaming_output,
        )
        state.backend.submit(job, emit)
        if body.stream:
            return StreamingResponse(
                _stream(state, job, queue, output, started), media_type="text/event-stream"
            )
        finished = False
        try:
            last = await _drain(queue, output)
            finished = True
        finally:
            if not finished:
                state.backend.abort(job.rid, "client disconnected")
        if isinstance(last, ErrorEvent):
            raise BackendError(last.message, retryable=False)
        payload = output.body(
            last,
            weight_version=state.weight_version,
            e2e_latency=time.perf_counter() - started,
        )
        return Response(orjson.dumps(payload), media_type="application/json")

    app.add_api_route("/generate", generate, methods=["POST", "PUT"])


async def _stream(
    state: EngineState,
    job: GenerationJob,
    queue: asyncio.Queue[Event],
    output: OutputState,
    started: float,
) -> AsyncIterator[bytes]:
    finished = False
    interval = job.params.stream_interval
    try:
        while True:
            event = await queue.get()
            # Collapse whatever else is already queued into one chunk: chunks are
            # cumulative (or concatenated deltas), so nothing is lost.
            events = [event]
            while not queue.empty() and isinstance(events[-1], TokenEvent):
                events.append(queue.get_nowait())
            end: FinishEvent | ErrorEvent | None = None
            for item in events:
                if isinstance(item, TokenEvent):
                    output.add(item)
                else:
                    end = item
            if isinstance(end, ErrorEvent):
                error = {"message": end.message, "type": "InternalServerError"}
                yield _sse({"error": {**error, "code": 500, "retryable": False}})
                break
            if end is not None or len(output.ids) % interval == 0:
                yield _sse(
                    output.body(
                        end,
                        weight_version=state.weight_version,
                        e2e_latency=time.perf_counter() - started,
                    )
                )
            if end is not None:
                break
        yield b"data: [DONE]\n\n"
        finished = True
    finally:
        if not finished:
            state.backend.abort(job.rid, "client disconnected")


def _register_control(app: FastAPI) -> None:
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

    app.add_api_route("/model_info", model_info, methods=["GET"])
    app.add_api_route("/get_model_info", model_info, methods=["GET"])

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
        if body.mode == "abort":
            state.backend.abort_all("Abort due to pause_generation.")
        else:
            state.backend.set_frozen(True)
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
        try:
            await asyncio.to_thread(state.backend.reload, Path(body.model_path))
        except LegoError as exc:
            result = {"success": False, "message": exc.message, "num_paused_requests": 0}
            return JSONResponse(result, status_code=400)
        state.model_path = Path(body.model_path)
        if body.weight_version is not None:
            state.weight_version = body.weight_version
        message = "Succeeded to update model weights."
        return JSONResponse({"success": True, "message": message, "num_paused_requests": 0})

    @app.post("/update_weight_version")
    async def update_weight_version(
        body: UpdateWeightVersionBody, request: Request
    ) -> dict[str, object]:
        state = _state(request)
        if body.abort_all_requests:
            state.backend.abort_all("Abort due to weight version update.")
        state.weight_version = body.new_version
        return {
            "success": True,
            "message": f"Weight version updated to {body.new_version}.",
            "new_version": body.new_version,
        }


def _register_errors(app: FastAPI) -> None:
    @app.exception_handler(LegoError)
    async def lego_error(_request: Request, exc: LegoError) -> JSONResponse:
        if isinstance(exc, SamplingContractError):
            return JSONResponse({"error": exc.message}, status_code=400)
        return _error(exc.status, exc.message)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"error": str(exc.errors())}, status_code=400)


def create_engine_app(config: EngineConfig) -> FastAPI:
    """Build the engine app; the model loads when the app starts (lifespan)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(config.model_path))
        model_config = json.loads((config.model_path / "config.json").read_text("utf-8"))
        script = ScriptedPolicy.load(config.script_path) if config.script_path else None
        backend = await asyncio.to_thread(_make_backend, config, tokenizer)
        resumed = asyncio.Event()
        resumed.set()
        app.state.engine = EngineState(
            config=config,
            tokenizer=tokenizer,
            backend=backend,
            model_config=model_config,
            script=script,
            weight_version=config.weight_version,
            model_path=config.model_path,
            resumed=resumed,
        )
        try:
            yield
        finally:
            backend.close()

    app = FastAPI(title="lego-proxy local engine", lifespan=lifespan)
    _register_generate(app)
    _register_control(app)
    _register_pause_and_weights(app)
    _register_errors(app)
    return app
