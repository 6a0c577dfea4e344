"""The export API's wire contract: what a claim carries, in its three forms, both ways.

The export route (``proxy.routes.export``) encodes with this module and the trainer's
client (``trainer_bridge.client``) decodes with it, so the claim's shape is written once.

Types (frozen; the per-token arrays are numpy):
- ``Segment``: one training sequence, ``tokens`` int32, ``loss_mask`` uint8, ``logprobs``
  float32 and ``routed_experts`` ``[len, layers, top_k]`` (uint8, uint16 or int32; the LAST
  ROW IS PADDING), aligned one-to-one by position; ``weight_versions`` and ``turn_ids`` one
  per turn; ``weight_version_spans`` ``(version, start, end)`` over loss-masked positions.
  ``recorder.trajectory`` builds it from recorded turns.
- ``ClaimedSample`` (one session: reward a float, a tuple of floats or None; the trial's
  ``stages`` and ``defense_events`` as its finish reported them, ``recorder.records``),
  ``ClaimedGroup`` (one prompt group), ``ClaimedBatch`` (one claim); ``BatchHead`` and
  ``GroupHead`` are a batch without its samples, what a streamed ``binv1`` body sends first.
  ``format`` names the form the batch travels in.

Forms (``FORMATS``), each carrying the same values, under ``SCHEMA_VERSION``:
- ``json``: arrays as JSON numbers (logprobs as the float32 values exactly).
- ``b64v1``: each array as ``{"dtype", "shape", "data"}``, ``data`` the base64 of its
  little-endian bytes; routed experts in the smallest of ``|u1``/``<u2``/``<i4``.
- ``binv1``: raw little-endian bytes behind JSON headers, streamed sample by sample::

      body    := MAGIC frame+                          MAGIC := b"LEGOBIN1" (8 bytes)
      frame   := u32 header_len | header | payload
      header  := a UTF-8 JSON object padded with spaces so that the payload starts at a
                 multiple of 8 from the start of the body; ``nbytes`` is the payload's length
      payload := the bytes of the arrays its header describes, each 8-aligned

  An array in a header is ``{"dtype", "shape", "offset"}`` (offset into its frame's
  payload). The first frame is the batch (each group with ``sample_count`` instead of
  ``samples``), then one frame per sample, group by group. A body that ends early (the
  server failed mid-stream) or runs on is unusable. Decoded ``binv1`` arrays in their
  dtype are read-only views of the body, not copies.

One session alone: ``GET /api/v1/sessions/{id}/trajectory`` (``proxy.routes.control``)
carries the session's fields, its turns and its segments, each segment in ``json`` or
``b64v1`` form (``TRAJECTORY_FORMATS``; ``?format=``), under the same ``SCHEMA_VERSION``
(added in version 1; a body without it is version 1). ``decode_trajectory(body)`` reads
it into a ``Trajectory``: what a trainer that takes sessions one at a time, as they
finish, needs (verl's agent loop, ``verl_bridge``), instead of claiming complete groups.

Encoders: ``segment_json`` (one segment, also the trajectory route's), ``claim_json`` (a
whole ``json``/``b64v1`` claim as a JSON-ready dict, arrays left as numpy for orjson's
``OPT_SERIALIZE_NUMPY``; ``claim_body`` the same from a head and samples already encoded
with ``sample_json``), ``binv1_head`` and ``binv1_sample`` (the frames, as pieces that
view the arrays; ``encode_frame`` lays out any header), and ``encode_claim`` (a whole
body, any form). ``decode_claim(body)`` reads all three back into a ``ClaimedBatch``,
converting arrays to the dtypes above (integers that do not fit are refused, never
wrapped), and raises ``InvalidRequest`` for anything unusable: misaligned arrays, an
unknown schema version, a batch with groups but no id, a truncated or overlong ``binv1``
body. Unknown fields are ignored.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
import orjson
import pybase64
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kernel.errors import InvalidRequest, RecorderError
from recorder.codec import expert_dtype_for
from recorder.records import STAGES, DefenseEvent, StageTimes

# Of the claim; bump on any breaking change. A field added that old decoders may ignore
# (as they ignore unknown fields) is not one: samples gained ``stages`` and
# ``defense_events`` under version 1.
SCHEMA_VERSION = 1
COMPACT_FORMATS = ("b64v1", "binv1")
FORMATS = ("json", *COMPACT_FORMATS)
TRAJECTORY_FORMATS = ("json", "b64v1")  # a trajectory is one JSON document: no binv1
MAGIC = b"LEGOBIN1"
MEDIA_TYPE = "application/x-lego-binv1"
ALIGN = 8

Tokens = npt.NDArray[np.int32]
LossMask = npt.NDArray[np.uint8]
Logprobs = npt.NDArray[np.float32]
ExpertIds = npt.NDArray[np.integer[Any]]  # uint8, uint16 or int32 (decode_claim ensures it)
Reward = float | tuple[float, ...] | None


# --- what a claim carries ------------------------------------------------------------


@dataclass(frozen=True, slots=True, eq=False)
class Segment:
    tokens: Tokens
    loss_mask: LossMask
    logprobs: Logprobs
    routed_experts: ExpertIds | None
    weight_versions: tuple[str, ...]
    turn_ids: tuple[str, ...]
    weight_version_spans: tuple[tuple[str, int, int], ...] = ()


@dataclass(frozen=True, slots=True)
class ClaimedSample:
    session_id: str
    sample_index: int
    reward: Reward
    termination: str | None
    segments: tuple[Segment, ...]
    reward_details: Mapping[str, object] | None = None
    stages: StageTimes | None = None
    defense_events: tuple[DefenseEvent, ...] = ()


@dataclass(frozen=True, slots=True)
class Trajectory:
    """One session as the trajectory route gives it: its outcome and its segments.

    ``excluded`` is the server's word on whether its termination keeps it out of
    optimization (``recorder.records.EXCLUDED_TERMINATIONS``); ``reward`` is None for
    those, and for a session not finished yet (``status`` says which)."""

    session_id: str
    run_id: str
    task_id: str
    group_id: str
    sample_index: int
    purpose: str
    status: str
    termination: str | None
    reward: Reward
    excluded: bool
    segments: tuple[Segment, ...]
    reward_details: Mapping[str, object] | None = None
    stages: StageTimes | None = None


@dataclass(frozen=True, slots=True)
class GroupHead:
    group_id: str
    task_id: str
    staleness: int
    sample_count: int


@dataclass(frozen=True, slots=True)
class ClaimedGroup:
    group_id: str
    task_id: str
    samples: tuple[ClaimedSample, ...]
    staleness: int = 0


@dataclass(frozen=True, slots=True)
class BatchHead:
    batch_id: str | None  # None when nothing was ready (then there are no groups)
    lease_expires_at: float | None
    format: str
    zero_variance_groups: int
    stale_groups: int
    groups: tuple[GroupHead, ...]


@dataclass(frozen=True, slots=True)
class ClaimedBatch:
    batch_id: str | None
    groups: tuple[ClaimedGroup, ...]
    zero_variance_groups: int
    stale_groups: int = 0
    lease_expires_at: float | None = None
    format: str = "json"

    @property
    def head(self) -> BatchHead:
        heads = tuple(
            GroupHead(g.group_id, g.task_id, g.staleness, len(g.samples)) for g in self.groups
        )
        return BatchHead(
            self.batch_id,
            self.lease_expires_at,
            self.format,
            self.zero_variance_groups,
            self.stale_groups,
            heads,
        )


# --- encoders (the server) -----------------------------------------------------------

_ARRAY_KEYS = ("tokens", "loss_mask", "logprobs", "routed_experts")
_WIRE_EXPERT_DTYPES = {"uint8": "|u1", "uint16": "<u2", "int32": "<i4"}


def check_format(wire: str, allowed: Sequence[str] = FORMATS) -> str:
    if wire not in allowed:
        raise InvalidRequest(f"format must be one of {list(allowed)}", param="format")
    return wire


def segment_json(
    seg: Segment, wire: str = "json", *, numpy_arrays: bool = False
) -> dict[str, object]:
    """The segment in ``wire`` form. ``numpy_arrays`` leaves the ``json`` form's arrays as
    numpy (for orjson's numpy path, an order of magnitude faster than lists); ``binv1``
    gives the arrays themselves, for the frame encoder to lay out."""
    check_format(wire)
    common = {
        "weight_versions": list(seg.weight_versions),
        "weight_version_spans": [list(span) for span in seg.weight_version_spans],
        "turn_ids": list(seg.turn_ids),
    }
    routed = seg.routed_experts
    if wire == "json":
        # float64 so that the JSON numbers are the float32 values exactly, as recorded.
        plain = (seg.tokens, seg.loss_mask, seg.logprobs.astype(np.float64), routed)
        return {
            key: value.tolist() if value is not None and not numpy_arrays else value
            for key, value in zip(_ARRAY_KEYS, plain, strict=True)
        } | common
    arrays: tuple[object, ...]
    if wire == "binv1":
        experts = None if routed is None else _stored_experts(routed)
        arrays = (seg.tokens, seg.loss_mask, seg.logprobs, experts)
    else:
        encoded = None if routed is None else _b64(_smallest(routed))
        arrays = (_b64(seg.tokens), _b64(seg.loss_mask), _b64(seg.logprobs), encoded)
    return {"format": wire, **dict(zip(_ARRAY_KEYS, arrays, strict=True)), **common}


def sample_json(sample: ClaimedSample, wire: str) -> dict[str, object]:
    reward = list(sample.reward) if isinstance(sample.reward, tuple) else sample.reward
    return {
        "session_id": sample.session_id,
        "sample_index": sample.sample_index,
        "reward": reward,
        "reward_details": None if sample.reward_details is None else dict(sample.reward_details),
        "termination": sample.termination,
        "stages": None if sample.stages is None else sample.stages.reported(),
        "defense_events": [event.flat() for event in sample.defense_events],
        "segments": [segment_json(s, wire, numpy_arrays=True) for s in sample.segments],
    }


def _head_json(head: BatchHead) -> dict[str, object]:
    return {
        "batch_id": head.batch_id,
        "lease_expires_at": head.lease_expires_at,
        "schema_version": SCHEMA_VERSION,
        "format": head.format,
        "zero_variance_groups": head.zero_variance_groups,
        "stale_groups": head.stale_groups,
    }


def _group_json(group: GroupHead | ClaimedGroup) -> dict[str, object]:
    return {"group_id": group.group_id, "task_id": group.task_id, "staleness": group.staleness}


def claim_json(batch: ClaimedBatch) -> dict[str, object]:
    """A ``json`` or ``b64v1`` claim, ready for ``orjson.dumps(OPT_SERIALIZE_NUMPY)``."""
    samples = [sample_json(s, batch.format) for g in batch.groups for s in g.samples]
    return claim_body(batch.head, samples)


def claim_body(head: BatchHead, samples: Sequence[Mapping[str, object]]) -> dict[str, object]:
    """``claim_json`` of a batch whose samples are already in their JSON form
    (``sample_json``), group by group in order: a server encodes each sample as it reads
    it, while the next one is read."""
    if len(samples) != sum(g.sample_count for g in head.groups):
        raise RecorderError(f"{len(samples)} samples for a batch head that counts otherwise")
    rest = iter(samples)
    groups = [
        {**_group_json(g), "samples": [next(rest) for _ in range(g.sample_count)]}
        for g in head.groups
    ]
    return {**_head_json(head), "groups": groups}


def binv1_head(head: BatchHead) -> list[bytes | memoryview]:
    """The body's start: the magic and the batch frame."""
    groups = [{**_group_json(g), "sample_count": g.sample_count} for g in head.groups]
    first, *rest = encode_frame({**_head_json(head), "groups": groups})
    return [MAGIC + first, *rest]


def binv1_sample(sample: ClaimedSample) -> list[bytes | memoryview]:
    return encode_frame(sample_json(sample, "binv1"))


def encode_claim(batch: ClaimedBatch) -> bytes:
    """A whole claim body in ``batch.format``."""
    if check_format(batch.format) != "binv1":
        return orjson.dumps(claim_json(batch), option=orjson.OPT_SERIALIZE_NUMPY)
    parts = binv1_head(batch.head)
    for group in batch.groups:
        for sample in group.samples:
            parts += binv1_sample(sample)
    return b"".join(parts)


def encode_frame(header: Mapping[str, object]) -> list[bytes | memoryview]:
    """One frame: ``header`` with each numpy array in it laid out in the payload; the
    pieces in order (arrays as views), their total length a multiple of ``ALIGN``."""
    parts: list[bytes | memoryview] = []
    size = 0

    def pad() -> None:
        nonlocal size
        if gap := -size % ALIGN:
            parts.append(bytes(gap))
            size += gap

    def describe(value: object) -> object:
        nonlocal size
        if isinstance(value, np.ndarray):
            if value.dtype.kind not in _ARRAY_KINDS:
                raise RecorderError(f"binv1 carries numeric arrays only, not {value.dtype}")
            array = np.ascontiguousarray(value, dtype=value.dtype.newbyteorder("<"))
            pad()
            offset = size
            if array.nbytes:
                parts.append(array.data.cast("B"))
                size += array.nbytes
            return {"dtype": array.dtype.str, "shape": list(array.shape), "offset": offset}
        if isinstance(value, Mapping):
            return {key: describe(item) for key, item in value.items()}
        if isinstance(value, list | tuple):
            return [describe(item) for item in value]
        return value

    described = describe(header)
    assert isinstance(described, dict)
    pad()
    text = orjson.dumps({**described, "nbytes": size})
    text += b" " * (-(4 + len(text)) % ALIGN)
    return [struct.pack("<I", len(text)) + text, *parts]


def _b64(array: npt.NDArray[Any]) -> dict[str, object]:
    return {
        "dtype": array.dtype.str,
        "shape": list(array.shape),
        "data": pybase64.b64encode(np.ascontiguousarray(array).data).decode("ascii"),
    }


def _smallest(rows: npt.NDArray[np.integer[Any]]) -> npt.NDArray[np.integer[Any]]:
    """Expert ids in the smallest of the stored dtypes that holds them all."""
    if rows.dtype == np.uint8:
        return rows  # nothing is smaller: skip the scan
    return rows.astype(_WIRE_EXPERT_DTYPES[expert_dtype_for(rows)], copy=False)


def _stored_experts(rows: npt.NDArray[np.integer[Any]]) -> npt.NDArray[np.integer[Any]]:
    """Stored dtypes travel as they are, unscanned; anything else (records built in
    memory, int64) is narrowed to the smallest stored dtype."""
    return rows if rows.dtype.str in ("|u1", "<u2", "<i4") else _smallest(rows)


# --- the wire schema and decoders (the client) ---------------------------------------


class _Wire(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class _EncodedWire(_Wire):
    dtype: str
    shape: list[int]
    data: str


class _ArrayRefWire(_Wire):
    dtype: str
    shape: list[int]
    offset: int = Field(ge=0)


_Array = _EncodedWire | _ArrayRefWire


class _SegmentWire(_Wire):
    tokens: list[int] | _Array
    loss_mask: list[int] | _Array
    logprobs: list[float] | _Array
    routed_experts: list[list[list[int]]] | _Array | None = None
    weight_versions: list[str] = []
    weight_version_spans: list[tuple[str, int, int]] = []
    turn_ids: list[str] = []


class _EventWire(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)
    kind: str


class _SampleWire(_Wire):
    session_id: str
    sample_index: int = 0
    reward: float | list[float] | None = None
    reward_details: dict[str, Any] | None = None
    termination: str | None = None
    stages: dict[str, float] | None = None
    defense_events: list[_EventWire] = []
    segments: list[_SegmentWire]


class _TrajectoryWire(_Wire):
    schema_version: int = SCHEMA_VERSION
    id: str
    run_id: str
    task_id: str
    group_id: str
    sample_index: int = 0
    purpose: str = "train"
    status: str
    termination: str | None = None
    reward: float | list[float] | None = None
    reward_details: dict[str, Any] | None = None
    excluded: bool = False
    stages: dict[str, float] | None = None
    segments: list[_SegmentWire]


class _GroupWire(_Wire):
    group_id: str
    task_id: str = ""
    staleness: int = 0
    samples: list[_SampleWire]


class _BatchWire(_Wire):
    batch_id: str | None = None
    lease_expires_at: float | None = None
    schema_version: int = SCHEMA_VERSION
    format: str = "json"
    zero_variance_groups: int = 0
    stale_groups: int = 0


class _ClaimWire(_BatchWire):
    groups: list[_GroupWire]


class _FrameWire(_Wire):
    nbytes: int = Field(ge=0)  # of the payload after this header


class _GroupHeadWire(_Wire):
    group_id: str
    task_id: str = ""
    staleness: int = 0
    sample_count: int = Field(ge=0)


class _BatchFrameWire(_FrameWire, _BatchWire):
    groups: list[_GroupHeadWire]


class _SampleFrameWire(_FrameWire, _SampleWire):
    pass


_W = TypeVar("_W", bound=_FrameWire)
_ARRAY_KINDS = frozenset("biuf")
_TOKENS = np.dtype(np.int32)
_LOSS_MASK = np.dtype(np.uint8)
_LOGPROBS = np.dtype(np.float32)
# Expert ids keep whichever of these they came in; any other dtype becomes int32.
_EXPERT_IDS = frozenset({np.dtype(np.uint8), np.dtype(np.uint16), np.dtype(np.int32)})


def decode_claim(body: bytes) -> ClaimedBatch:
    if body.startswith(MAGIC):
        return _decode_binv1(body)
    try:
        wire = _ClaimWire.model_validate_json(body)
    except ValidationError as exc:
        raise InvalidRequest(f"unusable claim response: {exc.errors()[0]['msg']}") from exc
    _check_batch(wire, bool(wire.groups))
    groups = tuple(
        ClaimedGroup(g.group_id, g.task_id, tuple(_sample(s, None) for s in g.samples), g.staleness)
        for g in wire.groups
    )
    return _batch(wire, groups)


def decode_trajectory(body: bytes) -> Trajectory:
    """The trajectory route's body (either form); ``InvalidRequest`` if it is unusable."""
    try:
        wire = _TrajectoryWire.model_validate_json(body)
    except ValidationError as exc:
        raise InvalidRequest(f"unusable trajectory: {exc.errors()[0]['msg']}") from exc
    if wire.schema_version != SCHEMA_VERSION:
        raise InvalidRequest(f"trajectory schema_version {wire.schema_version} is not supported")
    return Trajectory(
        session_id=wire.id,
        run_id=wire.run_id,
        task_id=wire.task_id,
        group_id=wire.group_id,
        sample_index=wire.sample_index,
        purpose=wire.purpose,
        status=wire.status,
        termination=wire.termination,
        reward=tuple(wire.reward) if isinstance(wire.reward, list) else wire.reward,
        excluded=wire.excluded,
        segments=tuple(_segment(seg, None) for seg in wire.segments),
        reward_details=wire.reward_details,
        stages=_stages(wire.stages),
    )


def _decode_binv1(body: bytes) -> ClaimedBatch:
    frames = _Frames(memoryview(body))
    head, _ = frames.next(_BatchFrameWire)
    _check_batch(head, bool(head.groups))
    groups = []
    for group in head.groups:
        samples = tuple(_sample(*frames.next(_SampleFrameWire)) for _ in range(group.sample_count))
        groups.append(ClaimedGroup(group.group_id, group.task_id, samples, group.staleness))
    if not frames.done:
        raise InvalidRequest("unusable binv1 claim: bytes after its last frame")
    return _batch(head, tuple(groups))


def _check_batch(wire: _BatchWire, has_groups: bool) -> None:
    if wire.schema_version != SCHEMA_VERSION:
        raise InvalidRequest(f"claim schema_version {wire.schema_version} is not supported")
    if has_groups and wire.batch_id is None:
        raise InvalidRequest("a claim that delivers groups must name its batch")


def _batch(wire: _BatchWire, groups: tuple[ClaimedGroup, ...]) -> ClaimedBatch:
    return ClaimedBatch(
        batch_id=wire.batch_id,
        groups=groups,
        zero_variance_groups=wire.zero_variance_groups,
        stale_groups=wire.stale_groups,
        lease_expires_at=wire.lease_expires_at,
        format=wire.format,
    )


def _sample(wire: _SampleWire, payload: memoryview | None) -> ClaimedSample:
    reward = tuple(wire.reward) if isinstance(wire.reward, list) else wire.reward
    return ClaimedSample(
        session_id=wire.session_id,
        sample_index=wire.sample_index,
        reward=reward,
        termination=wire.termination,
        segments=tuple(_segment(seg, payload) for seg in wire.segments),
        reward_details=wire.reward_details,
        stages=_stages(wire.stages),
        defense_events=tuple(DefenseEvent.of(e.model_dump()) for e in wire.defense_events),
    )


def _stages(wire: dict[str, float] | None) -> StageTimes | None:
    # A stage a newer server knows and this decoder does not is ignored, like a field.
    return None if wire is None else StageTimes.of({k: v for k, v in wire.items() if k in STAGES})


def _segment(wire: _SegmentWire, payload: memoryview | None) -> Segment:
    tokens: Tokens = _as(_decode(wire.tokens, payload), _TOKENS)
    loss_mask: LossMask = _as(_decode(wire.loss_mask, payload), _LOSS_MASK)
    logprobs: Logprobs = _as(_decode(wire.logprobs, payload), _LOGPROBS)
    n = tokens.shape[0]
    if tokens.ndim != 1 or loss_mask.shape != (n,) or logprobs.shape != (n,):
        raise InvalidRequest(
            f"segment arrays are not aligned: tokens {tokens.shape}, mask {loss_mask.shape}, "
            f"logprobs {logprobs.shape}"
        )
    routed: ExpertIds | None = None
    if wire.routed_experts is not None:
        routed = _expert_ids(_decode(wire.routed_experts, payload))
        if n == 0 and routed.shape == (0,):
            routed = routed.reshape(0, 0, 0)  # json numbers cannot say an empty array's shape
        if routed.ndim != 3 or routed.shape[0] != n:
            raise InvalidRequest(f"routed_experts of shape {routed.shape} for {n} tokens")
    return Segment(
        tokens=tokens,
        loss_mask=loss_mask,
        logprobs=logprobs,
        routed_experts=routed,
        weight_versions=tuple(wire.weight_versions),
        turn_ids=tuple(wire.turn_ids),
        weight_version_spans=tuple(wire.weight_version_spans),
    )


def _decode(value: list[Any] | _Array, payload: memoryview | None) -> npt.NDArray[Any]:
    """One array in the dtype it came in: a ``binv1`` one is a view of the body's bytes."""
    try:
        if isinstance(value, list):
            return np.asarray(value)
        wire_dtype = np.dtype(value.dtype)
        if wire_dtype.kind not in _ARRAY_KINDS or any(n < 0 for n in value.shape):
            raise ValueError("not a numeric dtype, or a negative dimension")
        if isinstance(value, _EncodedWire):
            raw = np.frombuffer(pybase64.b64decode(value.data), dtype=wire_dtype)
        elif payload is None:
            raise ValueError("an array reference outside a binv1 frame")
        else:
            count = math.prod(value.shape)
            raw = np.frombuffer(payload, dtype=wire_dtype, count=count, offset=value.offset)
        return raw.reshape(value.shape)
    except (ValueError, TypeError) as exc:
        what = "a ragged list" if isinstance(value, list) else f"{value.dtype}, {value.shape}"
        raise InvalidRequest(f"undecodable array ({what}): {exc}") from exc


def _as(array: npt.NDArray[Any], dtype: np.dtype[Any]) -> npt.NDArray[Any]:
    """``array`` itself when it is ``dtype`` already, else a converted copy; integers that
    would not fit are refused rather than wrapped."""
    if array.dtype == dtype:
        return array
    if dtype.kind in "iu" and array.size and not np.can_cast(array.dtype, dtype):
        info = np.iinfo(dtype)
        if array.dtype.kind not in "iu" or array.min() < info.min or array.max() > info.max:
            raise InvalidRequest(f"{array.dtype} values that are not all {dtype}")
    return array.astype(dtype)


def _expert_ids(array: npt.NDArray[Any]) -> ExpertIds:
    native = array.dtype.newbyteorder("=")
    return _as(array, native if native in _EXPERT_IDS else np.dtype(np.int32))


class _Frames:
    """Reads the frames of a binv1 body in order."""

    def __init__(self, body: memoryview) -> None:
        self._body = body
        self._at = len(MAGIC)

    @property
    def done(self) -> bool:
        return self._at == len(self._body)

    def next(self, model: type[_W]) -> tuple[_W, memoryview]:
        body, at = self._body, self._at
        if at + 4 > len(body):
            raise InvalidRequest("unusable binv1 claim: the body ends before its last frame")
        (size,) = struct.unpack_from("<I", body, at)
        header = body[at + 4 : at + 4 + size]
        try:
            wire = model.model_validate_json(header.tobytes())
        except ValidationError as exc:
            raise InvalidRequest(f"unusable binv1 frame: {exc.errors()[0]['msg']}") from exc
        start = at + 4 + size
        if start + wire.nbytes > len(body):
            raise InvalidRequest("unusable binv1 claim: the body ends inside a frame")
        self._at = start + wire.nbytes
        return wire, body[start : self._at]
