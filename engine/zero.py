"""The zero-compute backend: instant fixed answers, no model forward, no torch.

Owns ``ZeroComputeBackend`` (implements ``engine.jobs.Backend``) for overhead benchmarks:
every request is answered at once with ``reply_ids`` (a short reply ending in the eos,
cut to ``max_new_tokens``), each token with logprob ``FIXED_LOGPROB``, and routed-expert
rows of the model's real shape whose ids are a fixed function of (row, layer, slot). The
shape comes from ``config.json`` (``num_hidden_layers``, ``num_experts_per_tok``), so a
client cannot tell the payload from a real one by its size.
"""

from __future__ import annotations

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
    def __init__(self, model_path: Path, reply_ids: tuple[int, ...]) -> None:
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

    def _routing(self, rows: int, start: int) -> npt.NDArray[np.int32]:
        r = np.arange(start, start + rows, dtype=np.int64)[:, None, None]
        layer = np.arange(self._layers, dtype=np.int64)[None, :, None]
        slot = np.arange(self._top_k, dtype=np.int64)[None, None, :]
        return np.ascontiguousarray(((r * 7 + layer * 3 + slot) % self._experts).astype(np.int32))

    def submit(self, job: GenerationJob, emit: Emit) -> None:
        limit = job.params.max_new_tokens
        tokens = self._reply[:limit]
        for token in tokens:
            emit(TokenEvent(token, FIXED_LOGPROB))
        if len(tokens) >= limit:
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
        emit(FinishEvent(reason, routed, inputs))

    def abort(self, rid: str, message: str, status_code: int | None = None) -> None:
        """Nothing is ever in flight."""

    def abort_all(self, message: str) -> None:
        """Nothing is ever in flight."""

    def note_weight_version(self, old_version: str) -> None:
        """Nothing is ever in flight, so no request straddles a version change."""

    def set_frozen(self, frozen: bool) -> None:
        """Nothing runs between calls, so there is nothing to freeze."""

    def running_count(self) -> int:
        return 0

    def reload(self, model_path: Path) -> None:
        if not (model_path / "config.json").exists():
            raise InvalidRequest(f"Failed to load weights: {model_path} has no config.json")

    def load_weights(self, named: Sequence[tuple[str, torch.Tensor]]) -> None:
        """There is no model to load them into: received tensors are dropped."""

    def close(self) -> None:
        """No resources."""
