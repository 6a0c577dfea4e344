"""Turns of one session -> training segments with aligned arrays (pure, no IO).

Contract of ``build_segments``:
- Only ``COMPLETED`` turns count, taken in ``seq`` order.
- A turn extends a segment when its prompt ids start with that segment's whole token
  sequence (of several such segments, the one extended most recently). The extension is
  the prompt's tail after the segment's end (loss mask 0, logprob 0.0) followed by the
  turn's output ids (loss mask 1, its recorded logprobs). Any other turn starts a new
  segment: its prompt (mask 0) then its output (mask 1). Segments are returned in the
  order they were created, those begun by a ``root`` turn first, so the main conversation
  comes first and forks after it, even when a side request that arrived before it (a
  title request, re-labelled once the main conversation began) began an earlier segment.
- ``tokens``, ``loss_mask``, ``logprobs`` and ``routed_experts`` are aligned one-to-one:
  index ``p`` describes the token at position ``p``. ``weight_versions`` and ``turn_ids``
  have one entry per turn in the segment, in order. ``weight_version_spans`` says which
  policy sampled which tokens: ``(version, start, end)`` over segment positions, covering
  exactly the loss-masked positions, split where a turn straddled a weight update.
- ``routed_experts[p]`` is the routing computed when token ``p`` was fed to the model: row
  ``j`` of a turn's rows lands at position ``start + j``, later turns overwrite earlier
  ones, rows past the segment's end are ignored. The LAST ROW IS PADDING (zeros): the
  final sampled token is never fed back, so no routing exists for it. Positions no turn
  covered are zeros too. ``routed_experts`` is ``None`` when no turn carried any.

Wire forms (``segment_to_json``): ``format="json"`` gives plain lists; ``format="b64v1"``
gives each array as ``{"dtype", "shape", "data"}`` with ``data`` the base64 of the
little-endian bytes (tokens ``<i4``, loss mask ``|u1``, logprobs ``<f4``, routed experts
the smallest of ``|u1``/``<u2``/``<i4`` holding every id), about 5x smaller and decoded
with one ``numpy.frombuffer`` each. ``COMPACT_FORMATS`` lists the versions served.

A turn whose logprobs do not match its output ids, or whose routing shape differs from the
segment's, breaks the alignment this module promises, so it raises ``RecorderError``.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from proxy.errors import InvalidRequest, RecorderError
from recorder.codec import expert_dtype_for
from recorder.records import RoutedExperts, TurnRecord, TurnStatus


@dataclass(frozen=True, slots=True, eq=False)
class Segment:
    tokens: tuple[int, ...]
    loss_mask: tuple[int, ...]
    logprobs: tuple[float, ...]
    routed_experts: npt.NDArray[np.int32] | None  # [len(tokens), layers, top_k]
    weight_versions: tuple[str, ...]  # one per turn in the segment
    turn_ids: tuple[str, ...]
    weight_version_spans: tuple[tuple[str, int, int], ...] = ()  # over segment positions


@dataclass(slots=True)
class _Builder:
    """A segment under construction (mutable, private to one build_segments call)."""

    tokens: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    routing: list[RoutedExperts] = field(default_factory=list)  # in turn order
    weight_versions: list[str] = field(default_factory=list)
    turn_ids: list[str] = field(default_factory=list)
    spans: list[tuple[str, int, int]] = field(default_factory=list)
    last_extended: int = 0

    def is_prefix_of(self, prompt: Sequence[int]) -> bool:
        n = len(self.tokens)
        return len(prompt) >= n and list(prompt[:n]) == self.tokens

    def append(self, turn: TurnRecord, stamp: int) -> None:
        tail = turn.prompt_ids[len(self.tokens) :]
        self.tokens.extend(tail)
        self.loss_mask.extend([0] * len(tail))
        self.logprobs.extend([0.0] * len(tail))
        self._add_spans(turn, len(self.tokens))
        self.tokens.extend(turn.output_ids)
        self.loss_mask.extend([1] * len(turn.output_ids))
        self.logprobs.extend(turn.logprobs)
        if turn.routed_experts is not None:
            self.routing.append(turn.routed_experts)
        self.weight_versions.append(turn.weight_version)
        self.turn_ids.append(turn.id)
        self.last_extended = stamp

    def _add_spans(self, turn: TurnRecord, at: int) -> None:
        spans = turn.weight_version_spans or ((turn.weight_version, 0, len(turn.output_ids)),)
        for version, start, end in spans:
            if end <= start:
                continue
            last = self.spans[-1] if self.spans else None
            if last is not None and last[0] == version and last[2] == at + start:
                self.spans[-1] = (version, last[1], at + end)
            else:
                self.spans.append((version, at + start, at + end))

    def build(self) -> Segment:
        return Segment(
            tokens=tuple(self.tokens),
            loss_mask=tuple(self.loss_mask),
            logprobs=tuple(self.logprobs),
            routed_experts=_assemble_routing(self.routing, len(self.tokens), self.turn_ids),
            weight_versions=tuple(self.weight_versions),
            turn_ids=tuple(self.turn_ids),
            weight_version_spans=tuple(self.spans),
        )


def build_segments(turns: Sequence[TurnRecord]) -> list[Segment]:
    completed = sorted(
        (turn for turn in turns if turn.status is TurnStatus.COMPLETED), key=lambda t: t.seq
    )
    builders: list[_Builder] = []
    for stamp, turn in enumerate(completed, start=1):
        if len(turn.logprobs) != len(turn.output_ids):
            raise RecorderError(
                f"turn {turn.id}: {len(turn.logprobs)} logprobs for "
                f"{len(turn.output_ids)} output ids"
            )
        matching = [b for b in builders if b.is_prefix_of(turn.prompt_ids)]
        if matching:
            target = max(matching, key=lambda b: b.last_extended)
        else:
            target = _Builder()
            builders.append(target)
        target.append(turn, stamp)
    roots = {turn.id for turn in completed if turn.classification == "root"}
    builders.sort(key=lambda builder: builder.turn_ids[0] not in roots)  # stable
    return [builder.build() for builder in builders]


def _assemble_routing(
    routing: Sequence[RoutedExperts], length: int, turn_ids: Sequence[str]
) -> npt.NDArray[np.int32] | None:
    if not routing:
        return None
    shape = routing[0].rows.shape[1:]
    out = np.zeros((length, *shape), dtype=np.int32)
    for experts in routing:
        if experts.rows.shape[1:] != shape:
            raise RecorderError(
                f"segment of turns {list(turn_ids)}: routed experts of shape "
                f"{experts.rows.shape[1:]} and {shape} cannot be aligned"
            )
        end = min(experts.start + experts.num_rows, length)
        if end > experts.start:
            out[experts.start : end] = experts.rows[: end - experts.start]
    return out


COMPACT_FORMATS = ("b64v1",)
FORMATS = ("json", *COMPACT_FORMATS)


def segment_to_json(
    seg: Segment, format: str = "json", *, numpy_arrays: bool = False
) -> Mapping[str, object]:
    """The segment as JSON values; ``InvalidRequest`` for an unknown ``format``.

    ``numpy_arrays`` leaves ``routed_experts`` as an array in the json format, for callers
    that serialize with ``orjson.OPT_SERIALIZE_NUMPY`` (an order of magnitude faster than
    building nested lists).
    """
    if format not in FORMATS:
        raise InvalidRequest(f"unknown format {format!r}: use one of {list(FORMATS)}")
    common = {
        "weight_versions": list(seg.weight_versions),
        "weight_version_spans": [list(span) for span in seg.weight_version_spans],
        "turn_ids": list(seg.turn_ids),
    }
    if format == "json":
        return {
            "tokens": list(seg.tokens),
            "loss_mask": list(seg.loss_mask),
            "logprobs": list(seg.logprobs),
            "routed_experts": seg.routed_experts
            if numpy_arrays or seg.routed_experts is None
            else seg.routed_experts.tolist(),
            **common,
        }
    routed = seg.routed_experts
    return {
        "format": format,
        "tokens": _b64(np.asarray(seg.tokens, dtype="<i4")),
        "loss_mask": _b64(np.asarray(seg.loss_mask, dtype="|u1")),
        "logprobs": _b64(np.asarray(seg.logprobs, dtype="<f4")),
        "routed_experts": None if routed is None else _b64(_smallest(routed)),
        **common,
    }


def decode_array(encoded: Mapping[str, object]) -> npt.NDArray[np.generic]:
    """Inverse of the ``b64v1`` array encoding (for trainers and tests)."""
    data = base64.b64decode(str(encoded["data"]))
    shape = encoded["shape"]
    assert isinstance(shape, list)
    return np.frombuffer(data, dtype=np.dtype(str(encoded["dtype"]))).reshape(shape)


def _smallest(rows: npt.NDArray[np.int32]) -> npt.NDArray[np.generic]:
    dtype = {"uint8": "|u1", "uint16": "<u2", "int32": "<i4"}[expert_dtype_for(rows)]
    return rows.astype(dtype)


def _b64(array: npt.NDArray[np.generic]) -> dict[str, object]:
    return {
        "dtype": array.dtype.str,
        "shape": list(array.shape),
        "data": base64.b64encode(array.tobytes()).decode("ascii"),
    }
