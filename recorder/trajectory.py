"""Turns of one session -> training segments with aligned arrays (pure, no IO).

Contract of ``build_segments`` (turns as ``TurnArrays``, read straight from the stored
bytes by ``Store.list_turn_arrays``, or as ``TurnRecord``):
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
- The arrays are numpy: tokens int32, loss mask uint8, logprobs float32 (as recorded), and
  routed experts in the dtype they were stored in (uint8, uint16 or int32; the widest
  of the segment's turns when they differ). Each is filled once, turn range by turn range,
  from the turns' arrays: nothing passes through Python lists.
- ``routed_experts[p]`` is the routing computed when token ``p`` was fed to the model: row
  ``j`` of a turn's rows lands at position ``start + j``, later turns overwrite earlier
  ones, rows past the segment's end are ignored. The LAST ROW IS PADDING (zeros): the
  final sampled token is never fed back, so no routing exists for it. Positions no turn
  covered are zeros too. ``routed_experts`` is ``None`` when no turn carried any.

The wire forms of a segment are ``recorder.export_wire``'s (``segment_json``).

A turn whose logprobs do not match its output ids, or whose routing shape differs from the
segment's, breaks the alignment this module promises, so it raises ``RecorderError``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from kernel.errors import RecorderError
from recorder.export_wire import Segment
from recorder.records import TurnArrays, TurnRecord, TurnStatus


@dataclass(slots=True)
class _Builder:
    """A segment under construction (mutable, private to one build_segments call).

    Its tokens are always its last turn's prompt followed by that turn's output (each
    extension's prompt starts with the tokens so far), so nothing is copied until
    ``build``, and the arrays are then filled turn by turn, each range written once.
    """

    turns: list[TurnArrays] = field(default_factory=list)
    spans: list[tuple[str, int, int]] = field(default_factory=list)
    last_extended: int = 0

    def is_prefix_of(self, prompt: npt.NDArray[np.int32]) -> bool:
        last = self.turns[-1]
        p, o = len(last.prompt_ids), len(last.output_ids)
        return (
            len(prompt) >= p + o
            and np.array_equal(prompt[:p], last.prompt_ids)
            and np.array_equal(prompt[p : p + o], last.output_ids)
        )

    def append(self, turn: TurnArrays, stamp: int) -> None:
        self._add_spans(turn, len(turn.prompt_ids))
        self.turns.append(turn)
        self.last_extended = stamp

    def _add_spans(self, turn: TurnArrays, at: int) -> None:
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
        last = self.turns[-1]
        tokens = np.concatenate([last.prompt_ids, last.output_ids]).astype(np.int32, copy=False)
        loss_mask = np.zeros(len(tokens), dtype=np.uint8)
        logprobs = np.zeros(len(tokens), dtype=np.float32)
        for turn in self.turns:
            at = len(turn.prompt_ids)
            loss_mask[at : at + len(turn.output_ids)] = 1
            logprobs[at : at + len(turn.output_ids)] = turn.logprobs
        turn_ids = tuple(turn.id for turn in self.turns)
        return Segment(
            tokens=tokens,
            loss_mask=loss_mask,
            logprobs=logprobs,
            routed_experts=_assemble_routing(self.turns, len(tokens), turn_ids),
            weight_versions=tuple(turn.weight_version for turn in self.turns),
            turn_ids=turn_ids,
            weight_version_spans=tuple(self.spans),
        )


def build_segments(turns: Sequence[TurnArrays | TurnRecord]) -> list[Segment]:
    arrays = (turn if isinstance(turn, TurnArrays) else TurnArrays.of(turn) for turn in turns)
    completed = sorted(
        (turn for turn in arrays if turn.status is TurnStatus.COMPLETED), key=lambda t: t.seq
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
    builders.sort(key=lambda builder: builder.turns[0].id not in roots)  # stable
    return [builder.build() for builder in builders]


def _assemble_routing(
    turns: Sequence[TurnArrays], length: int, turn_ids: Sequence[str]
) -> npt.NDArray[np.integer[Any]] | None:
    routed = [(t.routed_start, t.routed_rows) for t in turns if t.routed_rows is not None]
    if not routed:
        return None
    shape = routed[0][1].shape[1:]
    for _, rows in routed:
        if rows.shape[1:] != shape:
            raise RecorderError(
                f"segment of turns {list(turn_ids)}: routed experts of shape "
                f"{rows.shape[1:]} and {shape} cannot be aligned"
            )
    # The widest stored dtype holds every row; narrower rows widen on assignment.
    out = np.zeros((length, *shape), dtype=np.result_type(*(rows.dtype for _, rows in routed)))
    for start, rows in routed:
        end = min(start + len(rows), length)
        if end > start:
            out[start:end] = rows[: end - start]
    return out
