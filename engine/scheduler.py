"""The model backend: one thread that runs every active request, one step at a time.

Owns ``Scheduler`` (implements ``engine.jobs.Backend``). Each loop round prefills newly
submitted requests and then gives every due request exactly one decode step, round-robin,
so concurrent streams all progress. Aborts (``abort``, ``abort_all``, and a running request
past ``running_timeout_s``, SGLang's ``SGLANG_REQ_RUNNING_TIMEOUT``, which ends with status
503) are flags read before every step; a frozen scheduler (pause in ``retract``/``in_place``
mode) keeps its requests and their KV caches but steps none. Weight loads (from disk or
from received tensors) and weight-version notes run on the same thread between steps, so
no forward pass ever sees half-loaded weights and a version change is pinned to an exact
output position.

Finish rules follow SGLang 0.5.23 (``Req.update_finish_state``): stop strings and
``stop_regex`` first (matched on the decoded tail of the output, special tokens kept; a
regex reports its pattern), then stop tokens (the model's eos ids and ``stop_token_ids``,
both skipped with ``ignore_eos``), then length (``max_new_tokens``), so an eos sampled as
the last allowed token is a ``stop``. A scripted job emits its forced tokens
(teacher-forced through the model, so logprobs and routing are the model's) and finishes
with ``stop`` when they run out.
"""

from __future__ import annotations

import re
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from engine.jobs import Emit, ErrorEvent, FinishEvent, FinishReason, GenerationJob, TokenEvent
from engine.model_runner import ModelRunner
from engine.sampling import choose_token
from kernel.errors import InvalidRequest

Decode = Callable[[Sequence[int]], str]
_IDLE_WAIT_S = 1.0
_SERVICE_UNAVAILABLE = 503


@dataclass(eq=False)
class _Request:
    """Mutable per-request state, owned by the scheduler thread (``abort_message`` aside)."""

    job: GenerationJob
    emit: Emit
    generator: torch.Generator
    cache: Any = None
    prefilled: bool = False
    output: list[int] = field(default_factory=list)
    rows: list[npt.NDArray[np.int32]] = field(default_factory=list)
    input_logprobs: tuple[tuple[float | None, int], ...] = ()
    due: float = 0.0
    started: float = 0.0  # monotonic time of the prefill (the running timeout's origin)
    abort_message: str | None = None
    abort_status: int | None = None
    version_events: list[tuple[str, int]] = field(default_factory=list)


def _input_logprobs(
    logits: torch.Tensor, prompt: Sequence[int], start: int
) -> tuple[tuple[float | None, int], ...]:
    logp = torch.log_softmax(logits, dim=-1)
    out: list[tuple[float | None, int]] = []
    for pos in range(start, len(prompt)):
        lp = None if pos == 0 else float(logp[pos - 1, prompt[pos]].item())
        out.append((lp, prompt[pos]))
    return tuple(out)


class Scheduler:
    def __init__(
        self, runner: ModelRunner, decode: Decode, *, running_timeout_s: float | None = None
    ) -> None:
        self._runner = runner
        self._decode = decode
        self._running_timeout_s = running_timeout_s
        self.supports_routing = runner.supports_routing
        self.max_positions = runner.max_positions
        self.vocab_size = runner.vocab_size
        self._cond = threading.Condition()
        self._live: dict[str, _Request] = {}
        self._incoming: list[_Request] = []
        self._calls: list[tuple[Callable[[], None], Future[None]]] = []
        self._frozen = False
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="engine-scheduler", daemon=True)
        self._thread.start()

    # -- Backend API (any thread) ------------------------------------------------------

    def submit(self, job: GenerationJob, emit: Emit) -> None:
        seed = job.params.sampling_seed
        generator = torch.Generator().manual_seed(
            seed if seed is not None else secrets.randbits(63)
        )
        request = _Request(job=job, emit=emit, generator=generator)
        with self._cond:
            if job.rid in self._live:
                raise InvalidRequest(f"Duplicate request ID {job.rid}")
            self._live[job.rid] = request
            self._incoming.append(request)
            self._cond.notify()

    def abort(self, rid: str, message: str, status_code: int | None = None) -> None:
        with self._cond:
            # SGLang's tokenizer ignores a rid it does not hold; its scheduler then ends
            # every request whose rid starts with it.
            if not rid or rid not in self._live:
                return
            for live_rid, request in self._live.items():
                if live_rid.startswith(rid) and request.abort_message is None:
                    request.abort_message = message
                    request.abort_status = status_code
            self._cond.notify()

    def abort_all(self, message: str) -> None:
        with self._cond:
            for request in self._live.values():
                request.abort_message = request.abort_message or message
            self._cond.notify()

    def set_frozen(self, frozen: bool) -> None:
        with self._cond:
            self._frozen = frozen
            self._cond.notify()

    def note_weight_version(self, old_version: str) -> None:
        def note() -> None:
            with self._cond:
                live = list(self._live.values())
            for request in live:
                if request.output:
                    request.version_events.append((old_version, len(request.output)))

        self._call(note)

    def running_count(self) -> int:
        with self._cond:
            return len(self._live)

    def reload(self, model_path: Path) -> None:
        self._call(lambda: self._runner.reload(model_path))

    def load_weights(self, named: Sequence[tuple[str, torch.Tensor]]) -> None:
        self._call(lambda: self._runner.load_named(named))

    def _call(self, call: Callable[[], None]) -> None:
        """Run ``call`` on the scheduler thread between steps; wait for it."""
        done: Future[None] = Future()
        with self._cond:
            self._calls.append((call, done))
            self._cond.notify()
        done.result()

    def close(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join(timeout=10)

    # -- scheduler thread ----------------------------------------------------------------

    def _runnable(self, running: list[_Request], now: float) -> bool:
        if self._incoming or self._calls:
            return True
        if any(r.abort_message is not None for r in running):
            return True
        if any(self._timed_out(r, now) for r in running):
            return True
        return not self._frozen and any(r.due <= now for r in running)

    def _wait_s(self, running: list[_Request], now: float) -> float:
        if self._frozen or not running:
            return _IDLE_WAIT_S
        return max(0.0, min(min(r.due for r in running) - now, _IDLE_WAIT_S))

    def _timed_out(self, request: _Request, now: float) -> bool:
        limit = self._running_timeout_s
        return limit is not None and request.prefilled and now - request.started > limit

    def _loop(self) -> None:
        running: list[_Request] = []
        while True:
            with self._cond:
                while not self._stopping and not self._runnable(running, time.monotonic()):
                    self._cond.wait(self._wait_s(running, time.monotonic()))
                if self._stopping:
                    break
                running.extend(self._incoming)
                self._incoming.clear()
                calls, self._calls = self._calls, []
                frozen = self._frozen
            for call, done in calls:
                try:
                    call()
                    done.set_result(None)
                except Exception as exc:  # handed to the waiting caller, who re-raises it
                    done.set_exception(exc)
            for request in list(running):
                if request.abort_message is None and self._timed_out(request, time.monotonic()):
                    request.abort_message = "Request running timeout reached."
                    request.abort_status = _SERVICE_UNAVAILABLE
                if request.abort_message is not None:
                    self._finish(
                        request,
                        FinishReason(
                            "abort",
                            message=request.abort_message,
                            status_code=request.abort_status,
                        ),
                    )
                elif not frozen and request.due <= time.monotonic():
                    self._guarded_step(request)
                if request.job.rid not in self._live:
                    running.remove(request)
        for request in running:
            self._finish(request, FinishReason("abort", message="engine shutting down"))

    def _guarded_step(self, request: _Request) -> None:
        try:
            self._step(request)
        except Exception as exc:
            # A failing forward must fail its request, not the engine; the client gets the
            # error in band (SGLang's mid-stream error chunk).
            with self._cond:
                self._live.pop(request.job.rid, None)
            request.emit(ErrorEvent(f"{type(exc).__name__}: {exc}"))

    def _step(self, request: _Request) -> None:
        job = request.job
        if not request.prefilled:
            result, request.cache = self._runner.prefill(
                list(job.prompt_ids), all_logits=job.logprob_start_len >= 0
            )
            request.prefilled = True
            request.started = time.monotonic()
            if job.logprob_start_len >= 0:
                request.input_logprobs = _input_logprobs(
                    result.logits, job.prompt_ids, job.logprob_start_len
                )
            if job.params.max_new_tokens == 0:
                request.rows.append(self._rows_or_empty(result.routing))
                self._finish(request, FinishReason("length", length=0))
                return
        else:
            result = self._runner.decode(request.output[-1], request.cache)
        request.rows.append(self._rows_or_empty(result.routing))
        logits = result.logits[-1]
        token = self._next_token(request, logits)
        logprob = float(torch.log_softmax(logits, dim=-1)[token].item())
        request.output.append(token)
        request.emit(TokenEvent(token_id=token, logprob=logprob))
        request.due = time.monotonic() + job.forced_delay_s
        reason = self._finish_reason(request)
        if reason is not None:
            self._finish(request, reason)

    def _rows_or_empty(self, rows: npt.NDArray[np.int32] | None) -> npt.NDArray[np.int32]:
        if rows is not None:
            return rows
        return np.zeros((0, self._runner.num_layers, max(self._runner.top_k, 1)), np.int32)

    def _stop_ids(self, request: _Request) -> set[int]:
        if request.job.params.ignore_eos:
            return set()
        return set(self._runner.eos_ids) | set(request.job.params.stop_token_ids)

    def _next_token(self, request: _Request, logits: torch.Tensor) -> int:
        job = request.job
        if job.forced_ids is not None:
            return job.forced_ids[len(request.output)]
        params = job.params
        banned = self._stop_ids(request) if len(request.output) < params.min_new_tokens else set()
        return choose_token(
            logits,
            params,
            request.generator,
            seen=[*job.prompt_ids, *request.output],
            generated=request.output,
            banned=sorted(banned),
        )

    def _finish_reason(self, request: _Request) -> FinishReason | None:
        params = request.job.params
        output = request.output
        if params.stop or params.stop_regex:
            longest = max((len(s) for s in params.stop), default=16)
            tail = self._decode(output[-(4 * longest + 8) :])
            for stop in params.stop:
                if stop and stop in tail:
                    return FinishReason("stop", matched=stop)
            for pattern in params.stop_regex:
                if re.search(pattern, tail) is not None:
                    return FinishReason("stop", matched=pattern)
        if output[-1] in self._stop_ids(request):
            return FinishReason("stop", matched=output[-1])
        if len(output) >= params.max_new_tokens:
            return FinishReason("length", length=params.max_new_tokens)
        forced = request.job.forced_ids
        if forced is not None and len(output) >= len(forced):
            return FinishReason("stop", matched=output[-1])
        return None

    def _finish(self, request: _Request, reason: FinishReason) -> None:
        with self._cond:
            self._live.pop(request.job.rid, None)
        job = request.job
        routed = None
        if self.supports_routing and request.rows:
            rows = np.concatenate(request.rows, axis=0)
            end = max(len(job.prompt_ids) + len(request.output) - 1, 0)
            routed = np.ascontiguousarray(rows[job.routed_experts_start_len : end])
        elif self.supports_routing:
            routed = self._rows_or_empty(None)
        request.emit(
            FinishEvent(reason, routed, request.input_logprobs, tuple(request.version_events))
        )
