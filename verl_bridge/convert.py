"""A lego-proxy trajectory as verl's agent-loop outputs (pure: no verl, no IO).

``to_verl(trajectory)`` returns a ``Conversion``: the ``VerlOutput`` of each segment, or
none and the reason, for a session verl must not train on. Its contract:

- A session whose termination is excluded (``Trajectory.excluded``: a failed environment,
  harness or grader, a timeout) gives no output: verl 0.9.1's V1 trainer leaves a sample
  whose agent loop returned no output out of its group (``AgentLoopWorkerTQ`` stores
  nothing for it; ``compute_advantage_for_multi_trajectories`` groups what is stored), so
  it is neither a zero reward nor a member of the group's baseline. So does a session
  without a reward, and one whose segments hold no sampled token (nothing to train).
- A reward that is a vector is refused (``ConfigurationError``): verl's ``reward_score``
  is one number.
- Otherwise one output per segment with at least one sampled token, the forks first in
  the trajectory's order and the main conversation (the trajectory's first segment)
  LAST: verl's V1 trainer computes a session's GRPO advantage from its final output and
  gives it to the session's other outputs.
- Per segment, split at its first loss-masked position: ``prompt_ids`` are the tokens
  before it; ``response_ids`` the rest, in order, the tool results and user messages
  between generations included; ``response_mask`` the loss mask of the rest (1 exactly on
  sampled tokens); ``response_logprobs`` the rollout logprobs of the rest as recorded
  (float32, 0.0 where nothing was sampled); ``routed_experts`` every row of the segment,
  ``[len(prompt) + len(response), layers, top_k]`` in the recorded dtype, row ``p`` the
  routing when token ``p`` was fed (the last row is padding, zeros, as verl pads rows
  past the last generation), or None when the backend returned none.
- ``reward_score`` is the session's reward, on every output (verl puts it on the last
  response token); ``num_turns`` counts as verl's own loops count messages: the opening
  prompt, each generation, each input between two generations (``2 * generations``).
- ``extra_fields`` say where each output came from (``lego_*``: session, segment index in
  the trajectory, whether it is the main conversation, its turns and their weight
  versions, the termination) and carry the keys verl's V1 worker reads
  (``reward_extra_info``, ``turn_scores``, ``tool_rewards``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from pydantic import JsonValue

from kernel.errors import ConfigurationError
from recorder.export_wire import ExpertIds, Logprobs, LossMask, Segment, Tokens, Trajectory


@dataclass(frozen=True, slots=True, eq=False)
class VerlOutput:
    """The fields of one verl ``AgentLoopOutput``, as numpy (``verl_api`` makes lists)."""

    prompt_ids: Tokens
    response_ids: Tokens
    response_mask: LossMask
    response_logprobs: Logprobs
    routed_experts: ExpertIds | None
    reward_score: float
    num_turns: int
    extra_fields: dict[str, JsonValue]


@dataclass(frozen=True, slots=True)
class Conversion:
    outputs: tuple[VerlOutput, ...]
    dropped: str | None = None  # why there are no outputs


@dataclass(frozen=True, slots=True, eq=False)
class Split:
    """A segment cut where sampling starts: ``prompt`` positions, then ``response``."""

    prompt: slice
    response: slice

    @classmethod
    def of(cls, segment: Segment) -> Split | None:
        sampled = np.flatnonzero(segment.loss_mask)
        if not len(sampled):
            return None
        first = int(sampled[0])
        return cls(slice(0, first), slice(first, len(segment.tokens)))


def to_verl(trajectory: Trajectory) -> Conversion:
    who = f"session {trajectory.session_id}"
    if trajectory.excluded:
        return Conversion((), f"{who}: excluded ({trajectory.termination})")
    reward = trajectory.reward
    if isinstance(reward, tuple):
        raise ConfigurationError(
            f"{who} has a vector reward {list(reward)}; verl's reward_score is one number"
        )
    if reward is None:
        return Conversion((), f"{who}: no reward ({trajectory.status}, {trajectory.termination})")
    converted = [
        (index, _output(trajectory, index, segment, split, reward))
        for index, segment in enumerate(trajectory.segments)
        if (split := Split.of(segment)) is not None
    ]
    if not converted:
        return Conversion((), f"{who}: no sampled token in its {len(trajectory.segments)} segments")
    forks = tuple(output for index, output in converted if index != 0)
    main = tuple(output for index, output in converted if index == 0)
    return Conversion((*forks, *main))


def _output(
    trajectory: Trajectory, index: int, segment: Segment, split: Split, reward: float
) -> VerlOutput:
    extra: dict[str, JsonValue] = {
        "lego_session_id": trajectory.session_id,
        "lego_group_id": trajectory.group_id,
        "lego_segment": index,
        "lego_main": index == 0,
        "lego_termination": trajectory.termination,
        "lego_turn_ids": list(segment.turn_ids),
        "lego_weight_versions": list(segment.weight_versions),
        # Read by verl's V1 worker on a sample's final output, and copied to the others.
        "reward_extra_info": {},
        "turn_scores": [],
        "tool_rewards": [],
    }
    return VerlOutput(
        prompt_ids=segment.tokens[split.prompt],
        response_ids=segment.tokens[split.response],
        response_mask=segment.loss_mask[split.response],
        response_logprobs=segment.logprobs[split.response],
        routed_experts=segment.routed_experts,
        reward_score=reward,
        num_turns=2 * len(segment.turn_ids),
        extra_fields=extra,
    )
