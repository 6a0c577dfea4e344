"""The zero-compute backend: fixed answers, no model forward, no torch.

Owns ``ZeroComputeBackend`` (implements ``engine.jobs.Backend``) for overhead benchmarks:
every request is answered with ``reply_ids`` (a reply ending in the eos, cut to
``max_new_tokens``), each token with logprob ``FIXED_LOGPROB``, and routed-expert rows of
the model's real shape whose ids are a fixed function of (row, layer, slot). The shape
comes from ``config.json`` (``num_hidden_layers``, ``num_experts_per_tok``), so a client
cannot tell the payload from a real one by its size.

With ``token_s`` 0 the whole answer is emitted at once (the server sends it as one chunk).
With ``token_s`` > 0 one token is emitted every ``token_s`` seconds on the event loop, as a
decoding engine streams them (SGLang sends a chunk per decode step by default), so what a
client pays per streamed chunk can be measured. Such a generation is in flight until its
finish: ``abort`` ends it at once with an abort finish (resumable unless ``status_code``
says otherwise, as SGLang's); pausing (``set_frozen``) and weight versions do not apply to
it, it is a benchmark's stand-in for decoding time only.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from engine.jobs import Emit, FinishEvent, FinishReason, GenerationJob, TokenEvent
from kernel.errors import InvalidRequest

if TYPE_CHECKING:
    import torch

FIXED_LOGPROB = -0.125


class ZeroComputeBackend:
    def __init__(self, model_path: Path, reply_ids: tuple[int, ...], token_s: float = 0.0) -> None:
        config = json.loads((model_path / "config.json").read_text(encoding="utf-8"))
        self._layers = int(config["num_hidden_layers"])
        self._top_k = int(config.get("num_experts_per_tok") or 0)
        self._experts = int(
            config.get("num_experts")
            or config.get("num_local_experts")
            or config.get("n_routed_experts")
            or 1
        )
        self.supports_routing = self._top_k > 0
        self.max_positions = int(config.get("max_position_embeddings", 2**31 - 1))
        self.vocab_size = int(config["vocab_size"])
        self._reply = reply_ids
        self._token_s = token_s
        self._paced: dict[str, _Paced] = {}  # in flight, by rid (token_s > 0 only)

    def _routing(self, rows: int, start: int) -> npt.NDArray[np.int32]:
        r = np.arange(start, start + rows, dtype=np.int64)[:, None, None]
        layer = np.arange(self._layers, dtype=np.int64)[None, :, None]
        slot = np.arange(self._top_k, dtype=np.int64)[None, None, :]
        return np.ascontiguousarray(((r * 7 + layer * 3 + slot) % self._experts).astype(np.int32))

    def submit(self, job: GenerationJob, emit: Emit) -> None:
        tokens = self._reply[: job.params.max_new_tokens]
        if self._token_s <= 0 or not tokens:
            for token in tokens:
                emit(TokenEvent(token, FIXED_LOGPROB))
            emit(self._finish(job, tokens))
            return
        if job.rid in self._paced:
            raise InvalidRequest(f"Duplicate request ID: {job.rid}")
        paced = _Paced(job, tokens, emit, asyncio.get_running_loop())
        self._paced[job.rid] = paced
        paced.handle = paced.loop.call_later(self._token_s, self._step, paced)

    def _step(self, paced: _Paced) -> None:
        paced.emit(TokenEvent(paced.tokens[paced.sent], FIXED_LOGPROB))
        paced.sent += 1
        if paced.sent < len(paced.tokens):
            paced.handle = paced.loop.call_later(self._token_s, self._step, paced)
            return
        del self._paced[paced.job.rid]
        paced.emit(self._finish(paced.job, paced.tokens))

    def _finish(
        self, job: GenerationJob, tokens: Sequence[int], abort: FinishReason | None = None
    ) -> FinishEvent:
        limit = job.params.max_new_tokens
        if abort is not None:
            reason = abort
        elif len(tokens) >= limit:
            reason = FinishReason("length", length=len(tokens))
        else:
            reason = FinishReason("stop", matched=tokens[-1])
        routed = None
        if self.supports_routing:
            rows = max(len(job.prompt_ids) + len(tokens) - 1 - job.routed_experts_start_len, 0)
            routed = self._routing(rows, job.routed_experts_start_len)
        inputs: tuple[tuple[float | None, int], ...] = ()
        if job.logprob_start_len >= 0:
            inputs = tuple(
                (None if pos == 0 else FIXED_LOGPROB, job.prompt_ids[pos])
                for pos in range(job.logprob_start_len, len(job.prompt_ids))
            )
        return FinishEvent(reason, routed, inputs)

    def abort(self, rid: str, message: str, status_code: int | None = None) -> None:
        """Ends the paced generations whose rid starts with ``rid`` (as SGLang's scheduler
        does); an unpaced one is never in flight."""
        if not rid:
            return
        for live in [live for live in self._paced if live.startswith(rid)]:
            self._abort(self._paced.pop(live), message, status_code)

    def abort_all(self, message: str) -> None:
        for live in list(self._paced):
            self._abort(self._paced.pop(live), message, None)

    def _abort(self, paced: _Paced, message: str, status_code: int | None) -> None:
        if paced.handle is not None:
            paced.handle.cancel()
        reason = FinishReason("abort", message=message, status_code=status_code)
        paced.emit(self._finish(paced.job, paced.tokens[: paced.sent], reason))

    def note_weight_version(self, old_version: str) -> None:
        """Nothing is ever in flight, so no request straddles a version change."""

    def set_frozen(self, frozen: bool) -> None:
        """Nothing runs between calls, so there is nothing to freeze."""

    def running_count(self) -> int:
        return len(self._paced)

    def reload(self, model_path: Path) -> None:
        if not (model_path / "config.json").exists():
            raise InvalidRequest(f"Failed to load weights: {model_path} has no config.json")

    def load_weights(self, named: Sequence[tuple[str, torch.Tensor]]) -> None:
        """There is no model to load them into: received tensors are dropped."""

    def close(self) -> None:
        """No resources."""


class _Paced:
    """One paced generation in flight."""

    def __init__(
        self,
        job: GenerationJob,
        tokens: Sequence[int],
        emit: Emit,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.job = job
        self.tokens = tokens
        self.emit = emit
        self.loop = loop
        self.sent = 0
        self.handle: asyncio.TimerHandle | None = None
