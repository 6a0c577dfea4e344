"""HTTP clients of the trainer: the proxy's export/control API and the backend's weight API.

Owns the wire side of training, nothing else:

- ``ExportClient`` (admin key): ``claim`` complete groups of a run (arrays as JSON lists,
  as base64 text (``b64v1``) or, by default, as raw little-endian bytes in the framed
  ``binv1`` body laid out in ``recorder.binwire``; ``parse_claim`` reads all three; a
  vector reward is ``Unsupported``: GRPO needs one scalar), ``ack`` a batch,
  ``pause``/``resume`` the run around a weight sync, ``announce_weight_version``, and
  ``post_alignment`` metrics. Claimed JSON is validated with pydantic here and handed on as
  frozen dataclasses (``ClaimedBatch`` -> ``ClaimedGroup`` -> ``ClaimedSample`` ->
  ``ClaimedSegment``), so nothing past this module sees a dict.
- The per-token arrays keep the compact dtypes the recorder stores and sends: ``Tokens``
  int32, ``LossMask`` uint8 (0 or 1), ``Logprobs`` float32, ``ExpertIds`` uint8, uint16 or
  int32 (the smallest dtype that held the session's expert ids). A ``binv1`` array in its
  dtype is a read-only ``numpy.frombuffer`` view of the response body, not a copy; the
  other forms decode into the same dtypes. Widening for torch happens once, where samples
  are packed (``trainer_bridge.packing``).
- ``BackendClient``: SGLang's ``POST /update_weights_from_disk`` (the local engine and a
  real SGLang server alike).

Errors are raised from ``kernel.errors``: an HTTP error status becomes the ``LegoError``
subclass carrying that status (401, 403, 404, 409, 413, 400; anything else ``BackendError``
with the upstream status), an unreachable server ``BackendUnavailable``. One pooled
``httpx.Client`` per client object; close it (or use it as a context manager).
"""

from __future__ import annotations

import base64
import math
import struct
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self, TypeVar

import httpx
import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kernel.errors import (
    AuthenticationFailed,
    BackendError,
    BackendUnavailable,
    Conflict,
    InvalidRequest,
    LegoError,
    NotFound,
    PayloadTooLarge,
    PermissionDenied,
    Unsupported,
)

_BY_STATUS: dict[int, type[LegoError]] = {
    400: InvalidRequest,
    401: AuthenticationFailed,
    403: PermissionDenied,
    404: NotFound,
    409: Conflict,
    413: PayloadTooLarge,
}


# --- what a claim delivers (frozen, numpy arrays for the per-token data) ---------------


Tokens = npt.NDArray[np.int32]
LossMask = npt.NDArray[np.uint8]
Logprobs = npt.NDArray[np.float32]
ExpertIds = npt.NDArray[np.uint8] | npt.NDArray[np.uint16] | npt.NDArray[np.int32]


@dataclass(frozen=True, slots=True, eq=False)
class ClaimedSegment:
    tokens: Tokens
    loss_mask: LossMask
    logprobs: Logprobs
    routed_experts: ExpertIds | None  # [len(tokens), layers, top_k]; last row pad
    weight_versions: tuple[str, ...]
    turn_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ClaimedSample:
    session_id: str
    sample_index: int
    reward: float
    termination: str | None
    segments: tuple[ClaimedSegment, ...]


@dataclass(frozen=True, slots=True)
class ClaimedGroup:
    group_id: str
    task_id: str
    samples: tuple[ClaimedSample, ...]


@dataclass(frozen=True, slots=True)
class ClaimedBatch:
    batch_id: str | None  # None when nothing was ready (then ``groups`` is empty)
    groups: tuple[ClaimedGroup, ...]
    zero_variance_groups: int


# --- the wire models (pydantic at the edge; unknown fields tolerated) ------------------


class _Wire(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class _EncodedWire(_Wire):
    """One array in the ``b64v1`` form: base64 of its little-endian bytes."""

    dtype: str
    shape: list[int]
    data: str


class _ArrayRefWire(_Wire):
    """One array in a ``binv1`` frame: where its little-endian bytes lie in the payload."""

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
    turn_ids: list[str] = []


class _SampleWire(_Wire):
    session_id: str
    sample_index: int = 0
    reward: float | list[float] | None = None
    termination: str | None = None
    segments: list[_SegmentWire]


class _GroupWire(_Wire):
    group_id: str
    task_id: str = ""
    samples: list[_SampleWire]


class _ClaimWire(_Wire):
    batch_id: str | None = None
    schema_version: int = 1
    zero_variance_groups: int = 0
    groups: list[_GroupWire]


class _FrameWire(_Wire):
    nbytes: int = Field(ge=0)  # of the payload after this header


class _GroupHeadWire(_Wire):
    group_id: str
    task_id: str = ""
    sample_count: int = Field(ge=0)


class _BatchFrameWire(_FrameWire):
    batch_id: str | None = None
    schema_version: int = 1
    zero_variance_groups: int = 0
    groups: list[_GroupHeadWire]


class _SampleFrameWire(_FrameWire, _SampleWire):
    pass


_W = TypeVar("_W", bound=_FrameWire)
BINV1_MAGIC = b"LEGOBIN1"  # recorder.binwire.MAGIC: a binv1 body starts with it
_ARRAY_KINDS = frozenset("biuf")


# The dtypes a segment's arrays are handed on in (see the module doc); expert ids keep
# whichever of theirs is listed, and become int32 when they came in another.
_TOKENS = np.dtype(np.int32)
_LOSS_MASK = np.dtype(np.uint8)
_LOGPROBS = np.dtype(np.float32)
_EXPERT_IDS = frozenset({np.dtype(np.uint8), np.dtype(np.uint16), np.dtype(np.int32)})


def _decode(value: list[Any] | _Array, payload: memoryview | None) -> npt.NDArray[Any]:
    """One array in the dtype it came in: a ``binv1`` one is a view of the body's bytes."""
    try:
        if isinstance(value, list):
            return np.asarray(value)
        wire_dtype = np.dtype(value.dtype)
        if wire_dtype.kind not in _ARRAY_KINDS or any(n < 0 for n in value.shape):
            raise ValueError("not a numeric dtype, or a negative dimension")
        if isinstance(value, _EncodedWire):
            raw = np.frombuffer(base64.b64decode(value.data), dtype=wire_dtype)
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


def _segment(wire: _SegmentWire, payload: memoryview | None) -> ClaimedSegment:
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
        if routed.ndim != 3 or routed.shape[0] != n:
            raise InvalidRequest(f"routed_experts of shape {routed.shape} for {n} tokens")
    return ClaimedSegment(
        tokens=tokens,
        loss_mask=loss_mask,
        logprobs=logprobs,
        routed_experts=routed,
        weight_versions=tuple(wire.weight_versions),
        turn_ids=tuple(wire.turn_ids),
    )


def _reward(wire: _SampleWire) -> float:
    if isinstance(wire.reward, list):
        raise Unsupported(
            f"session {wire.session_id} has a vector reward; the trainer needs one scalar"
        )
    # A delivered (finished, not excluded) session without a reward is graded 0.
    return float(wire.reward or 0.0)


def _sample(wire: _SampleWire, payload: memoryview | None = None) -> ClaimedSample:
    return ClaimedSample(
        session_id=wire.session_id,
        sample_index=wire.sample_index,
        reward=_reward(wire),
        termination=wire.termination,
        segments=tuple(_segment(seg, payload) for seg in wire.segments),
    )


def _check_batch(wire: _ClaimWire | _BatchFrameWire) -> None:
    if wire.schema_version != 1:
        raise InvalidRequest(f"claim schema_version {wire.schema_version} is not supported")
    if wire.groups and wire.batch_id is None:
        raise InvalidRequest("a claim that delivers groups must name its batch")


def parse_claim(body: bytes) -> ClaimedBatch:
    """Validate a claim response body (any wire form); ``InvalidRequest`` if unusable."""
    if body.startswith(BINV1_MAGIC):
        return _parse_binv1(body)
    try:
        wire = _ClaimWire.model_validate_json(body)
    except ValidationError as exc:
        raise InvalidRequest(f"unusable claim response: {exc.errors()[0]['msg']}") from exc
    _check_batch(wire)
    groups = tuple(
        ClaimedGroup(
            group_id=g.group_id,
            task_id=g.task_id,
            samples=tuple(_sample(s) for s in g.samples),
        )
        for g in wire.groups
    )
    return ClaimedBatch(
        batch_id=wire.batch_id, groups=groups, zero_variance_groups=wire.zero_variance_groups
    )


def _parse_binv1(body: bytes) -> ClaimedBatch:
    frames = _Frames(memoryview(body))
    batch, _ = frames.next(_BatchFrameWire)
    _check_batch(batch)
    groups = []
    for head in batch.groups:
        samples = []
        for _ in range(head.sample_count):
            sample, payload = frames.next(_SampleFrameWire)
            samples.append(_sample(sample, payload))
        groups.append(ClaimedGroup(head.group_id, head.task_id, tuple(samples)))
    if not frames.done:
        raise InvalidRequest("unusable binv1 claim: bytes after its last frame")
    return ClaimedBatch(
        batch_id=batch.batch_id,
        groups=tuple(groups),
        zero_variance_groups=batch.zero_variance_groups,
    )


class _Frames:
    """Reads the frames of a binv1 body in order (layout: ``recorder.binwire``)."""

    def __init__(self, body: memoryview) -> None:
        self._body = body
        self._at = len(BINV1_MAGIC)

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


# --- the transport ---------------------------------------------------------------------


def _raise_for(response: httpx.Response) -> None:
    if response.is_success:
        return
    # OpenAI-style {"error": {"message"}}, SGLang's {"error": "..."} or {"message": "..."}.
    try:
        body = response.json()
    except ValueError:
        body = None
    message = response.text[:500]
    if isinstance(body, dict):
        error = body.get("error")
        found = error.get("message") if isinstance(error, dict) else error or body.get("message")
        message = str(found) if found else message
    where = f"{response.request.method} {response.request.url.path}"
    text = f"{where} -> {response.status_code}: {message}"
    kind = _BY_STATUS.get(response.status_code)
    if kind is not None:
        raise kind(text)
    raise BackendError(text, backend_status=response.status_code)


class _Http:
    def __init__(self, base_url: str, headers: dict[str, str], timeout_s: float) -> None:
        self._http = httpx.Client(base_url=base_url, headers=headers, timeout=timeout_s)

    def post(self, path: str, body: object) -> httpx.Response:
        try:
            response = self._http.post(path, json=body)
        except httpx.TransportError as exc:
            raise BackendUnavailable(f"POST {path}: {exc}") from exc
        _raise_for(response)
        return response

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        _type: type[BaseException] | None,
        _value: BaseException | None,
        _tb: TracebackType | None,
    ) -> None:
        self.close()


class ExportClient(_Http):
    """The proxy's export/control API for one run, under the admin key."""

    def __init__(
        self, proxy_url: str, admin_key: str, run_id: str, *, timeout_s: float = 120.0
    ) -> None:
        super().__init__(proxy_url, {"authorization": f"Bearer {admin_key}"}, timeout_s)
        self.run_id = run_id

    def claim(
        self, groups: int, max_staleness: int | None, lease_s: float, wire_format: str = "binv1"
    ) -> ClaimedBatch:
        body = {"groups": groups, "max_staleness": max_staleness, "lease_s": lease_s}
        path = f"/api/v1/runs/{self.run_id}/claims?format={wire_format}"
        return parse_claim(self.post(path, body).content)

    def ack(self, batch_id: str) -> None:
        self.post(f"/api/v1/batches/{batch_id}/ack", {})

    def pause(self) -> None:
        self.post(f"/api/v1/runs/{self.run_id}/pause", {})

    def resume(self) -> None:
        self.post(f"/api/v1/runs/{self.run_id}/resume", {})

    def announce_weight_version(self, version: str) -> int:
        """Tell the proxy ``version`` is now served; return its announcement index."""
        response = self.post(f"/api/v1/runs/{self.run_id}/weight_versions", {"version": version})
        return int(response.json()["index"])

    def post_alignment(
        self, step: int, weight_version: str, metrics: dict[str, float | None], flagged: bool
    ) -> None:
        body = {"step": step, "weight_version": weight_version, "metrics": metrics}
        self.post(f"/api/v1/runs/{self.run_id}/alignment", {**body, "flagged": flagged})


class BackendClient(_Http):
    """The SGLang backend's weight-update endpoint (no auth)."""

    def __init__(self, backend_url: str, *, timeout_s: float = 600.0) -> None:
        super().__init__(backend_url, {}, timeout_s)

    def update_weights_from_disk(self, model_path: str, weight_version: str) -> None:
        body = {"model_path": model_path, "weight_version": weight_version}
        result = self.post("/update_weights_from_disk", body).json()
        if not result.get("success", False):
            raise BackendError(f"weight update refused: {result.get('message')}", retryable=False)
