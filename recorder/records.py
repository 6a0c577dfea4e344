"""Frozen record types: the contract between the proxy pipeline and the recorder.

The pipeline builds one ``TurnRecord`` per backend generation it ran for a harness request
and hands it to the recorder; the recorder persists it verbatim and never recomputes
anything. ``prompt_ids`` are the ids sent to the backend, bit-exact; ``output_ids`` and
``logprobs`` are what the backend returned, in order, the stop token included.

``RoutedExperts.rows`` follows SGLang: row ``j`` is the routing computed when the token at
absolute position ``start + j`` was fed through the model, shape ``[rows, layers, top_k]``.

``StageTimes`` and ``DefenseEvent`` are what a finished trial reports beside its reward:
seconds per stage (Table 4 of LEGO-RL) and what the reward-hack defenses did.

``TurnArrays`` is the export path's view of a turn: only what a training segment needs,
with the per-token data as numpy arrays (read straight from the stored bytes by
``Store.list_turn_arrays``, routed experts kept in their stored dtype).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any

import numpy as np
import numpy.typing as npt


class TurnStatus(StrEnum):
    COMPLETED = "completed"  # the harness received the whole answer
    FAILED = "failed"  # backend error / invalid output; excluded from training
    CANCELLED = "cancelled"  # the harness disconnected; backend request aborted


class Termination(StrEnum):
    """Why a rollout ended, as the orchestrator reports it.

    Environment-side failures (``EXCLUDED``) are kept out of optimization: they say nothing
    about the policy, and turning them into a zero reward would teach it the wrong thing.
    """

    COMPLETED = "completed"  # the agent finished and was graded
    MAX_TURNS = "max_turns"  # the harness's turn budget ran out; graded as is
    CONTEXT_EXHAUSTED = "context_exhausted"  # the context budget ran out; graded as is
    AGENT_TIMEOUT = "agent_timeout"  # wall-clock limit of the agent phase
    ENV_SETUP_FAILURE = "env_setup_failure"  # sandbox/image/repo could not be prepared
    HARNESS_ERROR = "harness_error"  # the harness program crashed
    GRADER_ERROR = "grader_error"  # verification itself failed
    ABORTED = "aborted"  # cancelled by the orchestrator


EXCLUDED_TERMINATIONS = frozenset(
    {
        Termination.AGENT_TIMEOUT,
        Termination.ENV_SETUP_FAILURE,
        Termination.HARNESS_ERROR,
        Termination.GRADER_ERROR,
        Termination.ABORTED,
    }
)


class SessionStatus(StrEnum):
    ACTIVE = "active"
    FINISHED = "finished"


@dataclass(frozen=True, slots=True, eq=False)
class RoutedExperts:
    start: int
    rows: npt.NDArray[np.int32]  # [rows, layers, top_k]

    @property
    def num_rows(self) -> int:
        return int(self.rows.shape[0])


@dataclass(frozen=True, slots=True)
class TurnTimings:
    """Monotonic-clock offsets in seconds from when the request was received."""

    received_at: float  # wall clock, epoch seconds
    first_token_s: float | None = None
    finished_s: float | None = None
    backend_s: float | None = None


@dataclass(frozen=True, slots=True, eq=False)
class TurnRecord:
    id: str
    session_id: str
    seq: int  # order of arrival within the session
    adapter: str
    requested_model: str
    status: TurnStatus
    prompt_ids: Sequence[int]  # a tuple when read back; the pipeline's int32 TokenIds
    output_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    routed_experts: RoutedExperts | None
    finish_reason: str  # backend finish type: stop | length | abort | error
    weight_version: str
    sampling_params: dict[str, object] = field(default_factory=dict)
    # The canonical request as a JSON object, stored linearly (``recorder.conversations``):
    # the whole request when ``messages_inherited`` is None; else the request continues
    # ``parent_turn_id``'s conversation (its request messages, then its answer), whose first
    # ``messages_inherited`` messages are not repeated here, nor fields equal to the parent's.
    request_messages: bytes = b""
    messages_inherited: int | None = None
    response_message: bytes = b""  # the parsed answer, ``recorder.answers.Answer.encode``
    ignored_fields: tuple[str, ...] = ()
    malformed_tool_calls: int = 0
    resumptions: int = 0
    error: str | None = None
    # History alignment (the ledger): which turn this one continues, how, and why not.
    parent_turn_id: str | None = None
    classification: str = "root"  # root | extend | realign | fork
    fork_reason: str | None = None  # compaction | edited_history | system_changed | ...
    reused_prefix_len: int = 0  # leading prompt ids identical to the parent's tokens
    # Earlier turns, recorded as roots, that this root showed to be side requests: the
    # recorder re-labels them fork/side_request (proxy.ledger.classify says when).
    side_requests: tuple[str, ...] = ()
    # Which policy sampled which output ids: (version, start, end) over ``output_ids``, one
    # span per backend call when a pause-abort resumption straddled a weight update. Empty
    # means the whole output came from ``weight_version``.
    weight_version_spans: tuple[tuple[str, int, int], ...] = ()
    timings: TurnTimings = field(default_factory=lambda: TurnTimings(received_at=0.0))


@dataclass(frozen=True, slots=True, eq=False)
class TurnArrays:
    """One turn as ``recorder.trajectory`` reads it: ids, order, versions and arrays."""

    id: str
    seq: int
    status: TurnStatus
    classification: str  # as ``TurnRecord``'s, re-labels applied (a side request found later)
    weight_version: str
    weight_version_spans: tuple[tuple[str, int, int], ...]
    prompt_ids: npt.NDArray[np.int32]  # the full prompt
    output_ids: npt.NDArray[np.int32]
    logprobs: npt.NDArray[np.float32]
    routed_start: int = 0
    # [rows, layers, top_k] in any integer dtype (as stored: uint8, uint16 or int32).
    routed_rows: npt.NDArray[np.integer[Any]] | None = None

    @classmethod
    def of(cls, record: TurnRecord) -> TurnArrays:
        routed = record.routed_experts
        return cls(
            id=record.id,
            seq=record.seq,
            status=record.status,
            classification=record.classification,
            weight_version=record.weight_version,
            weight_version_spans=record.weight_version_spans,
            prompt_ids=np.asarray(record.prompt_ids, dtype=np.int32),
            output_ids=np.asarray(record.output_ids, dtype=np.int32),
            logprobs=np.asarray(record.logprobs, dtype=np.float32),
            routed_start=routed.start if routed is not None else 0,
            routed_rows=routed.rows if routed is not None else None,
        )


@dataclass(frozen=True, slots=True)
class PauseState:
    """What a replica polls: the runs paused, and the backend workers out of rotation."""

    paused_runs: frozenset[str]
    worker_exclusions: Mapping[str, str]  # url -> why


@dataclass(frozen=True, slots=True)
class RunInfo:
    id: str
    name: str
    created_at: float


@dataclass(frozen=True, slots=True)
class SessionSpec:
    """What the orchestrator asked for when it created the session."""

    run_id: str
    task_id: str
    group_id: str
    sample_index: int
    harness: str
    sampling: dict[str, object] = field(default_factory=dict)
    max_prompt_tokens: int | None = None
    max_output_tokens: int | None = None
    # PURPOSES: "train" samples are exported to trainers; the others never are.
    purpose: str = "train"


# Why a session was sampled (migration 0010); only "train" sessions are ever exported.
# "validation": a held-out evaluation every K steps; "check": the loop's validation run,
# the few trials that must all grade before any training starts.
PURPOSES = ("train", "validation", "check")


@dataclass(frozen=True, slots=True)
class StageTimes:
    """Seconds a trial spent in each stage (Table 4 of LEGO-RL); None where not reported."""

    sandbox_setup: float | None = None
    agent_setup: float | None = None
    agent_execution: float | None = None
    verification: float | None = None
    other: float | None = None

    @classmethod
    def of(cls, reported: Mapping[str, float]) -> StageTimes:
        """From ``{stage: seconds}`` (the stored and wire form); unknown stages are a bug."""
        return cls(**{name: float(seconds) for name, seconds in reported.items()})

    def reported(self) -> dict[str, float]:
        """``{stage: seconds}`` for the stages that were reported, in Table 4's order."""
        values = ((f.name, getattr(self, f.name)) for f in fields(self))
        return {name: seconds for name, seconds in values if seconds is not None}


STAGES = tuple(f.name for f in fields(StageTimes))


@dataclass(frozen=True, slots=True)
class DefenseEvent:
    """One thing a reward-hack defense did in a trial (``test_path_reverted``,
    ``test_file_removed``, ``history_hidden``, ...), with free-form JSON details. Its
    stored and wire form is one flat JSON object: ``{"kind": ..., **details}``."""

    kind: str
    details: Mapping[str, object] = field(default_factory=dict)

    @classmethod
    def of(cls, flat: Mapping[str, object]) -> DefenseEvent:
        details = {key: value for key, value in flat.items() if key != "kind"}
        return cls(kind=str(flat["kind"]), details=details)

    def flat(self) -> dict[str, object]:
        return {"kind": self.kind, **self.details}


@dataclass(frozen=True, slots=True)
class SessionInfo:
    id: str
    key: str
    spec: SessionSpec
    status: SessionStatus
    created_at: float
    termination: str | None = None
    reward: float | tuple[float, ...] | None = None  # a scalar or a vector of objectives
    reward_details: dict[str, object] | None = None
    turn_count: int = 0
    stages: StageTimes | None = None  # None: the finish reported none (or predates them)
    defense_events: tuple[DefenseEvent, ...] = ()
