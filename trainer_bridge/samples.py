"""``Sample``: the trainer's one data contract, and claimed groups -> samples.

A ``Sample`` is one training sequence: one exported segment of one session (a session
whose history forked has several segments, each a root-to-leaf branch). Its arrays are
aligned one-to-one by position ``p``:

- ``tokens[p]`` (int32): the token at position ``p``;
- ``loss_mask[p]`` (uint8): 1 exactly where the policy sampled ``tokens[p]``, else 0;
- ``rollout_logprobs[p]`` (float32): the backend's logprob of ``tokens[p]`` (0.0 where not
  sampled);
- ``routed_experts[p]`` (uint8, uint16 or int32): the expert ids the backend chose when it
  fed ``tokens[p]``, ``[len, layers, top_k]``. The LAST ROW IS PADDING: the final sampled
  token is never fed back, so it has no routing (and no logits of the trainer depend on
  it). ``None`` when the backend returned no routing.

These are the dtypes the recorder stores and the claim delivers (``recorder.export_wire``);
a sample holds the claimed arrays themselves (read-only views of a ``binv1`` body), and
``trainer_bridge.packing`` widens them to torch's dtypes once, as it packs.

``reward`` is the session's, shared by all its segments: a scalar (GRPO needs one, so a
vector reward is ``Unsupported``; a delivered session without a reward is graded 0.0).
``group_id`` names the prompt group whose sessions are normalised together;
``session_id`` lets advantages count each session once however many segments it has;
``weight_versions`` is one entry per turn.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kernel.errors import Unsupported
from recorder.export_wire import ClaimedBatch, ClaimedSample, ExpertIds, Logprobs, LossMask, Tokens


@dataclass(frozen=True, slots=True, eq=False)
class Sample:
    tokens: Tokens
    loss_mask: LossMask
    rollout_logprobs: Logprobs
    routed_experts: ExpertIds | None
    reward: float
    group_id: str
    session_id: str
    weight_versions: tuple[str, ...]

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def num_sampled(self) -> int:
        return int(np.count_nonzero(self.loss_mask))


def _scalar_reward(sample: ClaimedSample) -> float:
    if isinstance(sample.reward, tuple):
        raise Unsupported(
            f"session {sample.session_id} has a vector reward; the trainer needs one scalar"
        )
    # A delivered (finished, not excluded) session without a reward is graded 0.
    return float(sample.reward or 0.0)


def samples_from_batch(batch: ClaimedBatch) -> list[Sample]:
    """Every segment with at least one sampled token, in delivery order."""
    out: list[Sample] = []
    for group in batch.groups:
        for claimed in group.samples:
            for segment in claimed.segments:
                if not segment.loss_mask.any():
                    continue  # nothing the policy sampled: nothing to learn from
                out.append(
                    Sample(
                        tokens=segment.tokens,
                        loss_mask=segment.loss_mask,
                        rollout_logprobs=segment.logprobs,
                        routed_experts=segment.routed_experts,
                        reward=_scalar_reward(claimed),
                        group_id=group.group_id,
                        session_id=claimed.session_id,
                        weight_versions=segment.weight_versions,
                    )
                )
    return out
