"""The contract between the HTTP layer and a generation backend.

Owns ``GenerationJob`` (one validated /generate request), the events a backend emits for
it (``TokenEvent`` per sampled token, then exactly one ``FinishEvent`` or ``ErrorEvent``),
``FinishReason`` (SGLang's ``finish_reason`` shapes) and the ``Backend`` protocol that
both the model scheduler and the zero-compute responder implement. ``emit`` callbacks may
be invoked from any thread; the HTTP layer marshals them onto its event loop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import numpy.typing as npt

from engine.sampling import SamplingParams


@dataclass(frozen=True)
class GenerationJob:
    rid: str
    prompt_ids: tuple[int, ...]
    params: SamplingParams
    logprob_start_len: int = -1  # >= 0: also compute input logprobs from that position
    routed_experts_start_len: int = 0
    forced_ids: tuple[int, ...] | None = None  # scripted policy: the tokens to emit
    forced_delay_s: float = 0.0


@dataclass(frozen=True)
class FinishReason:
    type: str  # "stop" | "length" | "abort"
    matched: int | str | None = None
    length: int | None = None
    message: str | None = None

    def to_json(self) -> dict[str, object]:
        if self.type == "stop":
            return {"type": "stop", "matched": self.matched}
        if self.type == "length":
            return {"type": "length", "length": self.length}
        return {"type": "abort", "message": self.message, "status_code": None, "err_type": None}


@dataclass(frozen=True)
class TokenEvent:
    token_id: int
    logprob: float


@dataclass(frozen=True)
class FinishEvent:
    reason: FinishReason
    # [rows, layers, top_k] from routed_experts_start_len; None when the model has no routers.
    routed_experts: npt.NDArray[np.int32] | None
    input_logprobs: tuple[tuple[float | None, int], ...] = ()


@dataclass(frozen=True)
class ErrorEvent:
    message: str


Event = TokenEvent | FinishEvent | ErrorEvent
Emit = Callable[[Event], None]


class Backend(Protocol):
    supports_routing: bool
    max_positions: int
    vocab_size: int

    def submit(self, job: GenerationJob, emit: Emit) -> None: ...

    def abort(self, rid: str, message: str) -> None: ...

    def abort_all(self, message: str) -> None: ...

    def set_frozen(self, frozen: bool) -> None: ...

    def running_count(self) -> int: ...

    def reload(self, model_path: Path) -> None:
        """Blocking; callers run it off the event loop."""

    def close(self) -> None: ...
