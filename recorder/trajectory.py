"""Turns of one session -> training segments with aligned arrays (pure, no IO).

Contract of ``build_segments``:
- Only ``COMPLETED`` turns count, taken in ``seq`` order.
- A turn extends a segment when its prompt ids start with that segment's whole token
  sequence (of several such segments, the one extended most recently). The extension is
  the prompt's tail after the segment's end (loss mask 0, logprob 0.0) followed by the
  turn's output ids (loss mask 1, its recorded logprobs). Any other turn starts a new
  segment: its prompt (mask 0) then its output (mask 1). Segments are returned in the
  order they were created, so the main conversation comes first and forks after it.
- ``tokens``, ``loss_mask``, ``logprobs`` and ``routed_experts`` are aligned one-to-one:
  index ``p`` describes the token at position ``p``. ``weight_versions`` and ``turn_ids``
  have one entry per turn in the segment, in order.
- ``routed_experts[p]`` is the routing computed when token ``p`` was fed to the model: row
  ``j`` of a turn's rows lands at position ``start + j``, later turns overwrite earlier
  ones, rows past the segment's end are ignored. The LAST ROW IS PADDING (zeros): the
  final sampled token is never fed back, so no routing exists for it. Positions no turn
  covered are zeros too. ``routed_experts`` is ``None`` when no turn carried any.

A turn whose logprobs do not match its output ids, or whose routing shape differs from the
segment's, breaks the alignment this module promises, so it raises ``RecorderError``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from proxy.canonical import JsonObject, JsonValue
from proxy.errors import RecorderError
from recorder.records import RoutedExperts, TurnRecord, TurnStatus


@dataclass(frozen=True, slots=True, eq=False)
class Segment:
    tokens: tuple[int, ...]
    loss_mask: tuple[int, ...]
    logprobs: tuple[float, ...]
    routed_experts: npt.NDArray[np.int32] | None  # [len(tokens), layers, top_k]
    weight_versions: tuple[str, ...]  # one per turn in the segment
    turn_ids: tuple[str, ...]


@dataclass(slots=True)
class _Builder:
    """A segment under construction (mutable, private to one build_segments call)."""

    tokens: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    routing: list[RoutedExperts] = field(default_factory=list)  # in turn order
    weight_versions: list[str] = field(default_factory=list)
    turn_ids: list[str] = field(default_factory=list)
    last_extended: int = 0

    def is_prefix_of(self, prompt: tuple[int, ...]) -> bool:
        n = len(self.tokens)
        return len(prompt) >= n and list(prompt[:n]) == self.tokens

    def append(self, turn: TurnRecord, stamp: int) -> None:
        tail = turn.prompt_ids[len(self.tokens) :]
        self.tokens.extend(tail)
        self.loss_mask.extend([0] * len(tail))
        self.logprobs.extend([0.0] * len(tail))
        self.tokens.extend(turn.output_ids)
        self.loss_mask.extend([1] * len(turn.output_ids))
        self.logprobs.extend(turn.logprobs)
        if turn.routed_experts is not None:
            self.routing.append(turn.routed_experts)
        self.weight_versions.append(turn.weight_version)
        self.turn_ids.append(turn.id)
        self.last_extended = stamp

    def build(self) -> Segment:
        return Segment(
            tokens=tuple(self.tokens),
            loss_mask=tuple(self.loss_mask),
            logprobs=tuple(self.logprobs),
            routed_experts=_assemble_routing(self.routing, len(self.tokens), self.turn_ids),
            weight_versions=tuple(self.weight_versions),
            turn_ids=tuple(self.turn_ids),
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


def segment_to_json(seg: Segment) -> JsonObject:
    """Plain JSON lists for the export API (routed experts as nested lists or null)."""
    routed: JsonValue = None if seg.routed_experts is None else seg.routed_experts.tolist()
    tokens: list[JsonValue] = list(seg.tokens)
    loss_mask: list[JsonValue] = list(seg.loss_mask)
    logprobs: list[JsonValue] = list(seg.logprobs)
    weight_versions: list[JsonValue] = list(seg.weight_versions)
    turn_ids: list[JsonValue] = list(seg.turn_ids)
    return {
        "tokens": tokens,
        "loss_mask": loss_mask,
        "logprobs": logprobs,
        "routed_experts": routed,
        "weight_versions": weight_versions,
        "turn_ids": turn_ids,
    }
