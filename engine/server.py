"""The engine's HTTP server: SGLang's native protocol over a local backend.

Owns ``create_engine_app(config)`` and the ``/generate`` route (POST, PUT); the control
routes are in ``engine.control``, the weight-broadcast routes in ``engine.distributed``. The
lifespan loads the tokenizer and the backend (the model ``Scheduler``, or
``ZeroComputeBackend`` with ``zero_compute``) into ``app.state.engine``
(``engine.state.EngineState``), then freezes what it built out of the cyclic collector's
sight while it serves (``kernel.heap``); nothing exists at import time.

A ``/generate`` runs as in SGLang 0.5.23: the schema gate (HTTP 400), then a wait while the
server is paused, then the model-update lock's read side for the request's whole life, then
the tokenizer's checks (``engine.admission``: in band when streaming) and the scheduler's
(an abort with status 400), and only then the model. ``sampling_seed`` is honoured only
with ``enable_deterministic_inference``, ``routed_experts`` is returned only with
``enable_return_routed_experts``, and ``max_new_tokens`` is quietly capped at what the
context leaves, as SGLang's scheduler does.

Where the engine still differs from SGLang is listed in the package docstring
(``engine/__init__.py``).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse

from engine.admission import BAD_REQUEST, Limits, Rejected, check_request, scheduler_abort
from engine.config import EngineConfig
from engine.control import register_control
from engine.distributed import register_distributed
from engine.jobs import (
    Backend,
    ErrorEvent,
    Event,
    FinishEvent,
    FinishReason,
    GenerationJob,
    TokenEvent,
)
from engine.protocol import GenerateBody, OutputState
from engine.sampling import SamplingContractError, SamplingParams, parse_sampling_params
from engine.script import ScriptedPolicy, split_open_assistant
from engine.state import EngineState
from kernel.errors import BackendError, InvalidRequest, LegoError, Unsupported
from kernel.heap import frozen_startup_heap

ZERO_COMPUTE_REPLY = "OK."
ZERO_COMPUTE_WORD = " ok"  # repeated, for a reply of a given length


def _make_backend(config: EngineConfig, tokenizer: Any) -> Backend:
    if config.zero_compute:
        from engine.zero import ZeroComputeBackend

        ids = tokenizer.encode(ZERO_COMPUTE_REPLY, add_special_tokens=False)
        if config.zero_compute_reply_tokens is not None:
            if config.zero_compute_reply_tokens < 1:
                raise ValueError("zero_compute_reply_tokens must be at least 1 (the eos)")
            word = tokenizer.encode(ZERO_COMPUTE_WORD, add_special_tokens=False)
            ids = (word * config.zero_compute_reply_tokens)[: config.zero_compute_reply_tokens - 1]
        return ZeroComputeBackend(
            config.model_path, (*ids, int(tokenizer.eos_token_id)), config.zero_compute_token_s
        )
    import torch

    from engine.model_runner import ModelRunner
    from engine.scheduler import Scheduler

    if config.torch_threads is not None:
        torch.set_num_threads(config.torch_threads)

    def decode(ids: Sequence[int]) -> str:
        return str(tokenizer.decode(list(ids), skip_special_tokens=False))

    return Scheduler(
        ModelRunner(config.model_path, config.dtype),
        decode,
        running_timeout_s=config.req_running_timeout_s,
    )


def _limits(config: EngineConfig, backend: Backend) -> Limits:
    context = backend.max_positions
    if config.context_length is not None:
        if config.context_length > context:
            raise ValueError(
                f"--context-length {config.context_length} is longer than the model's "
                f"max_position_embeddings ({context})"
            )
        context = config.context_length
    return Limits(context_len=context, max_total_tokens=config.max_total_tokens)


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


def _build_job(
    body: GenerateBody, state: EngineState, params: SamplingParams, prompt: tuple[int, ...]
) -> GenerationJob:
    """The job SGLang's scheduler would run; raises ``Rejected`` where its tokenizer would."""
    check_request(len(prompt), params, state.limits)
    if not state.config.enable_deterministic_inference:
        # SGLang builds per-request seeds only under deterministic inference.
        params = replace(params, sampling_seed=None)
    capped = state.limits.capped_max_new_tokens(len(prompt), params.max_new_tokens)
    params = replace(params, max_new_tokens=capped)
    logprob_start = -1 if body.logprob_start_len is None else body.logprob_start_len
    if not body.return_logprob:
        logprob_start = -1
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
        routed_experts_start_len=max(body.routed_experts_start_len or 0, 0),
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


@dataclass(eq=False)
class _Run:
    """One admitted request: its events arrive on ``queue``; ``refused`` is a 400 abort."""

    job: GenerationJob
    queue: asyncio.Queue[Event]
    output: OutputState
    refused: FinishEvent | None = None
    finished: bool = False


@asynccontextmanager
async def _admitted(
    state: EngineState, body: GenerateBody, params: SamplingParams, prompt: tuple[int, ...]
) -> AsyncIterator[_Run]:
    """Wait out a pause, hold the update lock's read side, check and submit the request.

    Raises ``Rejected`` (the tokenizer's checks); a request the scheduler refuses is not
    submitted and comes back with ``refused`` set. Leaving early aborts the request.
    """
    await state.resumed.wait()
    async with state.update_lock.reading():
        job = _build_job(body, state, params, prompt)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Event] = asyncio.Queue()
        output = OutputState(
            job,
            state.decode,
            return_logprob=bool(body.return_logprob),
            text_in_logprobs=body.return_text_in_logprobs,
            return_routed_experts=body.return_routed_experts
            and state.config.enable_return_routed_experts,
            return_prompt_token_ids=body.return_prompt_token_ids,
            incremental=state.config.incremental_streaming_output,
        )
        run = _Run(job, queue, output)
        refusal = scheduler_abort(
            len(prompt),
            logprob_start_len=job.logprob_start_len,
            routed_experts_start_len=body.routed_experts_start_len
            if body.return_routed_experts
            else None,
            limits=state.limits,
        )
        if refusal is not None:
            reason = FinishReason(
                "abort", message=refusal, status_code=BAD_REQUEST, err_type="BadRequestError"
            )
            run.refused = FinishEvent(reason, None)
            yield run
            return

        def emit(event: Event) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, event)

        try:
            state.backend.submit(job, emit)
        except InvalidRequest as exc:  # a duplicate rid: SGLang's tokenizer refuses it
            raise Rejected(exc.message) from exc
        try:
            yield run
        finally:
            if not run.finished:
                state.backend.abort(job.rid, "client disconnected")


def _abort_status(event: FinishEvent) -> int | None:
    """The HTTP status of an abort SGLang turns into an error, if it is one."""
    reason = event.reason
    if reason.type != "abort" or reason.status_code is None:
        return None
    return reason.status_code if 400 <= reason.status_code < 600 else None


def _register_generate(app: FastAPI) -> None:
    async def generate(body: GenerateBody, request: Request) -> Response:
        state = _state(request)
        params = parse_sampling_params(body.sampling_params)
        prompt = _prompt_ids(body, state)
        if body.top_logprobs_num or body.token_ids_logprob:
            raise Unsupported("top_logprobs_num and token_ids_logprob are not supported")
        if body.stream:
            return StreamingResponse(
                _stream(state, body, params, prompt), media_type="text/event-stream"
            )
        return await _complete(state, body, params, prompt)

    app.add_api_route("/generate", generate, methods=["POST", "PUT"])


async def _complete(
    state: EngineState, body: GenerateBody, params: SamplingParams, prompt: tuple[int, ...]
) -> Response:
    started = time.perf_counter()
    try:
        async with _admitted(state, body, params, prompt) as run:
            if run.refused is not None:
                return _error(BAD_REQUEST, str(run.refused.reason.message))
            last = await _drain(run.queue, run.output)
            run.finished = True
    except Rejected as exc:
        return _error(BAD_REQUEST, exc.message)
    if isinstance(last, ErrorEvent):
        raise BackendError(last.message, retryable=False)
    status = _abort_status(last)
    if status == BAD_REQUEST:
        return _error(status, str(last.reason.message))
    if status is not None:
        return JSONResponse({"detail": last.reason.message}, status_code=status)
    payload = run.output.body(
        last, weight_version=state.weight_version, e2e_latency=time.perf_counter() - started
    )
    return Response(orjson.dumps(payload), media_type="application/json")


async def _drain(queue: asyncio.Queue[Event], output: OutputState) -> FinishEvent | ErrorEvent:
    """Consume token events until the request ends; return its last event."""
    while True:
        event = await queue.get()
        if isinstance(event, TokenEvent):
            output.add(event)
        else:
            return event


async def _stream(
    state: EngineState, body: GenerateBody, params: SamplingParams, prompt: tuple[int, ...]
) -> AsyncIterator[bytes]:
    started = time.perf_counter()
    try:
        async with _admitted(state, body, params, prompt) as run:
            if run.refused is not None:
                latency = time.perf_counter() - started
                refused = run.output.body(
                    run.refused, weight_version=state.weight_version, e2e_latency=latency
                )
                yield _sse(refused)
            else:
                async for frame in _frames(state, run, started):
                    yield frame
            run.finished = True
    except Rejected as exc:
        error = {"message": exc.message, "type": "invalid_request_error", "code": BAD_REQUEST}
        yield _sse({"error": {**error, "retryable": False}})
    yield b"data: [DONE]\n\n"


async def _frames(state: EngineState, run: _Run, started: float) -> AsyncIterator[bytes]:
    interval = run.job.params.stream_interval
    output = run.output
    sent = 0  # tokens in the last chunk sent
    while True:
        event = await run.queue.get()
        # Collapse whatever else is already queued into one chunk: chunks are cumulative
        # (or concatenated deltas), so nothing is lost.
        events = [event]
        while not run.queue.empty() and isinstance(events[-1], TokenEvent):
            events.append(run.queue.get_nowait())
        end: FinishEvent | ErrorEvent | None = None
        for item in events:
            if isinstance(item, TokenEvent):
                output.add(item)
            else:
                end = item
        if isinstance(end, ErrorEvent):
            error = {"message": end.message, "type": "InternalServerError"}
            yield _sse({"error": {**error, "code": 500, "retryable": False}})
            return
        if end is not None or _chunk_due(len(output.ids), sent, interval):
            sent = len(output.ids)
            yield _sse(
                output.body(
                    end,
                    weight_version=state.weight_version,
                    e2e_latency=time.perf_counter() - started,
                )
            )
        if end is not None:
            return


def _chunk_due(tokens: int, sent: int, interval: int) -> bool:
    """Whether an unfinished request's chunk goes out now, by SGLang 0.5.23's rule
    (``OutputStreamer.accept``, ``managers/scheduler_components/output_streamer.py``): every
    step at an interval of 1; otherwise the first token at once, then whenever at least
    ``interval`` tokens are unsent. (The finish always goes out.)"""
    unsent = tokens - sent
    return interval == 1 or unsent >= interval or (sent == 0 and unsent > 0)


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
        try:
            limits = _limits(config, backend)
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
                limits=limits,
                resumed=resumed,
            )
            with frozen_startup_heap():
                yield
        finally:
            if hasattr(app.state, "engine"):
                app.state.engine.update_groups.close_all()
            backend.close()

    app = FastAPI(title="lego-proxy local engine", lifespan=lifespan)
    _register_generate(app)
    register_control(app)
    register_distributed(app)
    _register_errors(app)
    return app
