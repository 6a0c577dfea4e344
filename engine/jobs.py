"""The contract between the HTTP layer and a generation backend.

Owns ``GenerationJob`` (one validated /generate request), the events a backend emits for
it (``TokenEvent`` per sampled token, then exactly one ``FinishEvent`` or ``ErrorEvent``),
``FinishReason`` (SGLang's ``finish_reason`` shapes, an abort's ``status_code`` included)
and the ``Backend`` protocol that both the model scheduler and the zero-compute responder
implement. ``emit`` callbacks may be invoked from any thread; the HTTP layer marshals them
onto its event loop.

Aborts follow SGLang: ``abort(rid)`` is a no-op unless a request with exactly that rid is
live (SGLang's tokenizer drops unknown rids), and then ends every live request whose rid
starts with it (the scheduler matches by prefix). A weight-version change is noted on the
live requests (``note_weight_version``) between decode steps, so a request that straddles
it can report which of its tokens each version sampled.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np
import numpy.typing as npt

from engine.sampling import SamplingParams

if TYPE_CHECKING:
    import torch


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
    # Aborts only: None for a user or pause abort (resumable), 400 for a request the
    # scheduler refused, 503 for a timeout.
    status_code: int | None = None
    err_type: str | None = None

    def to_json(self) -> dict[str, object]:
        if self.type == "stop":
            return {"type": "stop", "matched": self.matched}
        if self.type == "length":
            return {"type": "length", "length": self.length}
        return {
            "type": "abort",
            "message": self.message,
            "status_code": self.status_code,
            "err_type": self.err_type,
        }


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
    # (old version, output tokens sampled under it) per version change while it ran.
    version_events: tuple[tuple[str, int], ...] = ()


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

    def abort(self, rid: str, message: str, status_code: int | None = None) -> None: ...

    def abort_all(self, message: str) -> None: ...

    def note_weight_version(self, old_version: str) -> None:
        """Record on every live request that its tokens so far came from ``old_version``."""

    def set_frozen(self, frozen: bool) -> None: ...

    def running_count(self) -> int: ...

    def reload(self, model_path: Path) -> None:
        """Blocking; callers run it off the event loop."""

    def load_weights(self, named: Sequence[tuple[str, torch.Tensor]]) -> None:
        """Load tensors named as a checkpoint names them into the served model; blocking."""

    def close(self) -> None: ...
