"""The recorder's one codec between ``turns``/``sessions`` rows and its frozen records, and
the two rules every reader of those rows applies.

Owns:
- ``encode_turn(record)``: a ``TurnRecord`` as the ``StoredTurn`` that gets written (its
  ``turns`` row, prompt ids stored linearly, ``recorder.prompts``); ``InvalidRequest`` if
  it can never be stored. ``decode_stored`` is its inverse for a turn stored without a
  parent prefix. ``BLOB_COLUMNS`` are the row's binary columns; every other value is
  JSON-serializable.
- ``storable(turn)``: the row a database that refused ``turn`` takes instead, or None
  when nothing in it can be made storable: the token arrays and the request bytes stay
  exact, text and JSON values lose what no column holds (NUL becomes U+FFFD, integers
  past 64 bits become their decimal text, non-finite numbers null) and ``error`` says so.
  The writer keeps the original in its quarantine, so nothing is lost.
- ``turns_of(session_id, rows)`` / ``arrays_of(session_id, rows)``: a session's rows, in
  the order given, as ``TurnRecord``s / ``TurnArrays`` (``ARRAY_COLUMNS`` are what the
  latter reads), full prompts rebuilt and the re-label rule applied.
- ``session_values(info)`` / ``session_of(row, turn_count)``: a session both ways, and
  ``reward_values(reward)`` / ``trial_values(stages, events)``, the columns a finished
  session's reward and trial report (stage timings, defense events) are written to: NULL
  for none, so a session finished before they existed reads back the same as one that
  reported none (``stages`` None, no events); ``stages_of`` / ``events_of`` read them.
- The re-label rule (``SideRequests``): a turn stored as ``root`` that a turn of its
  session names in ``side_requests`` (a title request the main conversation's root showed
  to be a side request) reads back as ``fork``/``side_request``, whichever of the two rows
  was written first; ``named_by`` says which turn named it (the last in the order given
  when several did).
- The reward rule (``reward_of``): ``reward_vector`` wins over ``reward``; a vector reads
  back as a tuple of floats, a scalar as a float, no reward as ``None``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import numpy.typing as npt

from kernel.errors import RecorderError
from recorder import codec
from recorder.prompts import full_prompts, prompt_offset
from recorder.records import (
    DefenseEvent,
    SessionInfo,
    SessionSpec,
    SessionStatus,
    StageTimes,
    TurnArrays,
    TurnRecord,
    TurnStatus,
    TurnTimings,
)

Row = Mapping[Any, Any]  # a selected row's ``_mapping``, or a ``StoredTurn.row``
Reward = float | tuple[float, ...] | None

BLOB_COLUMNS = (
    "prompt_ids",
    "output_ids",
    "logprobs",
    "routed_experts",
    "request_messages",
    "response_message",
)
# What ``arrays_of`` reads: a segment's inputs, the re-label rule's and the prompt rebuild's.
ARRAY_COLUMNS = (
    "id",
    "seq",
    "status",
    "classification",
    "side_requests",
    "weight_version",
    "weight_version_spans",
    "parent_turn_id",
    "prompt_ids",
    "prompt_offset",
    "output_ids",
    "logprobs",
    "routed_experts",
    "routed_experts_start",
    "routed_experts_num_layers",
    "routed_experts_top_k",
    "routed_experts_dtype",
)
# A session's spec is stored one field per column, under the field's name.
_SPEC_COLUMNS = tuple(field.name for field in fields(SessionSpec))
# What a root named in a later turn's ``side_requests`` becomes (proxy.ledger.classify).
SIDE_REQUEST_CLASSIFICATION, SIDE_REQUEST_REASON = "fork", "side_request"


# -- the rules ----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class SideRequests:
    """Which turn of a session named which earlier root a side request."""

    named_by: Mapping[str, str]  # named turn id -> the turn that named it

    @classmethod
    def of(cls, turns: Iterable[tuple[str, Iterable[str] | None]]) -> SideRequests:
        """From (turn id, its ``side_requests``) of every turn of one session."""
        return cls({named: turn_id for turn_id, names in turns for named in names or ()})

    @classmethod
    def of_rows(cls, rows: Iterable[Row]) -> SideRequests:
        # A row spooled before the column existed has no ``side_requests`` at all.
        return cls.of((row["id"], row.get("side_requests")) for row in rows)

    def label(
        self, turn_id: str, classification: str, fork_reason: str | None
    ) -> tuple[str, str | None]:
        """A turn's (classification, fork reason) as it reads back."""
        if classification == "root" and turn_id in self.named_by:
            return SIDE_REQUEST_CLASSIFICATION, SIDE_REQUEST_REASON
        return classification, fork_reason


def reward_of(reward: float | None, vector: Sequence[float] | None) -> Reward:
    """A session's reward from its ``reward`` and ``reward_vector`` columns."""
    if vector is not None:
        return tuple(float(x) for x in vector)
    return None if reward is None else float(reward)


def reward_values(reward: Reward) -> dict[str, object]:
    """The ``sessions`` columns that hold ``reward``: a vector leaves ``reward`` NULL."""
    if isinstance(reward, tuple):
        return {"reward": None, "reward_vector": list(reward)}
    return {"reward": reward, "reward_vector": None}


def trial_values(stages: StageTimes | None, events: Sequence[DefenseEvent]) -> dict[str, object]:
    """The ``sessions`` columns that hold a finished trial's stage timings and events."""
    return {
        "stages": None if stages is None else stages.reported(),
        "defense_events": [event.flat() for event in events] or None,
    }


def stages_of(stored: Mapping[str, float] | None) -> StageTimes | None:
    """A session's stage timings from its ``stages`` column."""
    return None if stored is None else StageTimes.of(stored)


def events_of(stored: Sequence[Mapping[str, object]] | None) -> tuple[DefenseEvent, ...]:
    """A session's defense events from its ``defense_events`` column."""
    return tuple(DefenseEvent.of(event) for event in stored or ())


# -- sessions -----------------------------------------------------------------------------
def session_values(info: SessionInfo) -> dict[str, object]:
    """The ``sessions`` row of a new session (it has no termination or reward yet)."""
    spec = {name: getattr(info.spec, name) for name in _SPEC_COLUMNS}
    return {
        "id": info.id,
        "key": info.key,
        **spec,
        "status": info.status.value,
        "created_at": info.created_at,
    }


def session_of(row: Row, turn_count: int) -> SessionInfo:
    return SessionInfo(
        id=row["id"],
        key=row["key"],
        spec=SessionSpec(**{name: row[name] for name in _SPEC_COLUMNS}),
        status=SessionStatus(row["status"]),
        created_at=row["created_at"],
        termination=row["termination"],
        reward=reward_of(row["reward"], row["reward_vector"]),
        reward_details=row["reward_details"],
        turn_count=turn_count,
        stages=stages_of(row["stages"]),
        defense_events=events_of(row["defense_events"]),
    )


# -- turns --------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class StoredTurn:
    """A turn encoded as its ``turns`` row (linear storage applied): what gets written."""

    id: str
    row: Mapping[str, object]


def encode_turn(record: TurnRecord) -> StoredTurn:
    offset = prompt_offset(record)
    experts = (
        codec.encode_experts(record.routed_experts) if record.routed_experts is not None else None
    )
    row = {
        "id": record.id,
        "session_id": record.session_id,
        "seq": record.seq,
        "adapter": record.adapter,
        "requested_model": record.requested_model,
        "status": record.status.value,
        "finish_reason": record.finish_reason,
        "weight_version": record.weight_version,
        "prompt_ids": codec.encode_ids(record.prompt_ids[offset:]),
        "prompt_offset": offset,
        "output_ids": codec.encode_ids(record.output_ids),
        "logprobs": codec.encode_logprobs(record.logprobs),
        "routed_experts": experts.data if experts else None,
        "routed_experts_start": experts.start if experts else None,
        "routed_experts_num_layers": experts.num_layers if experts else None,
        "routed_experts_top_k": experts.top_k if experts else None,
        "routed_experts_dtype": experts.dtype if experts else None,
        "sampling_params": record.sampling_params,
        "request_messages": record.request_messages,
        "messages_inherited": record.messages_inherited,
        "response_message": record.response_message,
        "ignored_fields": list(record.ignored_fields),
        "malformed_tool_calls": record.malformed_tool_calls,
        "resumptions": record.resumptions,
        "error": record.error,
        "parent_turn_id": record.parent_turn_id,
        "classification": record.classification,
        "fork_reason": record.fork_reason,
        "reused_prefix_len": record.reused_prefix_len,
        "weight_version_spans": [list(span) for span in record.weight_version_spans] or None,
        "side_requests": list(record.side_requests) or None,
        "received_at": record.timings.received_at,
        "first_token_s": record.timings.first_token_s,
        "finished_s": record.timings.finished_s,
        "backend_s": record.timings.backend_s,
        "created_at": time.time(),
    }
    return StoredTurn(id=record.id, row=row)


_JSON_COLUMNS = ("sampling_params", "ignored_fields", "weight_version_spans", "side_requests")
STORABLE_NOTE = "stored with values the database refused replaced (the original is quarantined)"


def storable(turn: StoredTurn) -> StoredTurn | None:
    row: dict[str, object] = {}
    for name, value in turn.row.items():
        if name in BLOB_COLUMNS:
            row[name] = value
        elif name in _JSON_COLUMNS or isinstance(value, str):
            row[name] = _storable_value(value)
        else:
            row[name] = value
    if row == dict(turn.row):
        return None
    error = turn.row.get("error")
    row["error"] = f"{_storable_value(error)}; {STORABLE_NOTE}" if error else STORABLE_NOTE
    return StoredTurn(id=turn.id, row=row)


def _storable_value(value: object) -> object:
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return value if -(2**63) <= value < 2**63 else str(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(_storable_value(str(k))): _storable_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_storable_value(item) for item in value]
    return value


def decode_stored(turn: StoredTurn) -> TurnRecord:
    if turn.row["prompt_offset"]:
        raise RecorderError(f"turn {turn.id} needs its parent to rebuild its prompt")
    return turns_of("", [turn.row])[0]


def turns_of(session_id: str, rows: Sequence[Row]) -> list[TurnRecord]:
    prompts = full_prompts(session_id, rows)
    labels = SideRequests.of_rows(rows)
    return [
        _turn_of(row, tuple(prompt.tolist()), labels)
        for row, prompt in zip(rows, prompts, strict=True)
    ]


def arrays_of(session_id: str, rows: Sequence[Row]) -> list[TurnArrays]:
    prompts = full_prompts(session_id, rows)
    labels = SideRequests.of_rows(rows)
    return [_arrays_of(row, prompt, labels) for row, prompt in zip(rows, prompts, strict=True)]


def _turn_of(row: Row, prompt_ids: tuple[int, ...], labels: SideRequests) -> TurnRecord:
    experts = None
    if row["routed_experts"] is not None:
        experts = codec.decode_experts(_encoded_experts(row))
    classification, fork_reason = labels.label(row["id"], row["classification"], row["fork_reason"])
    return TurnRecord(
        id=row["id"],
        session_id=row["session_id"],
        seq=row["seq"],
        adapter=row["adapter"],
        requested_model=row["requested_model"],
        status=TurnStatus(row["status"]),
        prompt_ids=prompt_ids,
        output_ids=codec.decode_ids(bytes(row["output_ids"])),
        logprobs=codec.decode_logprobs(bytes(row["logprobs"])),
        routed_experts=experts,
        finish_reason=row["finish_reason"],
        weight_version=row["weight_version"],
        sampling_params=row["sampling_params"],
        request_messages=bytes(row["request_messages"]),
        messages_inherited=row["messages_inherited"],
        response_message=bytes(row["response_message"]),
        ignored_fields=tuple(row["ignored_fields"]),
        malformed_tool_calls=row["malformed_tool_calls"],
        resumptions=row["resumptions"],
        error=row["error"],
        parent_turn_id=row["parent_turn_id"],
        classification=classification,
        fork_reason=fork_reason,
        reused_prefix_len=row["reused_prefix_len"],
        side_requests=tuple(row.get("side_requests") or ()),
        weight_version_spans=_spans(row),
        timings=TurnTimings(
            received_at=row["received_at"],
            first_token_s=row["first_token_s"],
            finished_s=row["finished_s"],
            backend_s=row["backend_s"],
        ),
    )


def _arrays_of(row: Row, prompt_ids: npt.NDArray[np.int32], labels: SideRequests) -> TurnArrays:
    routed = None
    if row["routed_experts"] is not None:
        routed = codec.stored_rows(_encoded_experts(row))
    classification, _ = labels.label(row["id"], row["classification"], None)
    return TurnArrays(
        id=row["id"],
        seq=row["seq"],
        status=TurnStatus(row["status"]),
        classification=classification,
        weight_version=row["weight_version"],
        weight_version_spans=_spans(row),
        prompt_ids=prompt_ids,
        output_ids=np.frombuffer(row["output_ids"], dtype="<i4"),
        logprobs=np.frombuffer(row["logprobs"], dtype="<f4"),
        routed_start=row["routed_experts_start"] if routed is not None else 0,
        routed_rows=routed,
    )


def _encoded_experts(row: Row) -> codec.EncodedExperts:
    return codec.EncodedExperts(
        data=bytes(row["routed_experts"]),
        start=row["routed_experts_start"],
        num_layers=row["routed_experts_num_layers"],
        top_k=row["routed_experts_top_k"],
        dtype=row["routed_experts_dtype"],
    )


def _spans(row: Row) -> tuple[tuple[str, int, int], ...]:
    return tuple((str(v), int(a), int(b)) for v, a, b in row["weight_version_spans"] or ())
