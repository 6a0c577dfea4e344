"""The per-step series the trainer logs beside alignment, for LEGO-RL's collapse check.

Table 8 of the paper reads a run's health off a handful of series over its steps: reward,
turns per trajectory, response length, policy entropy, KL, rollout-training agreement and
gradient norm. The optimisation step measures the last four (``trainer_bridge.train``);
``batch_series(samples)`` measures the rest from the step's batch:

- ``turns_per_trajectory``: mean over sessions of the turns recorded for it (a sample's
  ``weight_versions`` has one entry per turn; a forked session's segments share turns, so
  a session counts its longest segment);
- ``response_tokens``: mean over sessions of the tokens the policy sampled (all segments);
- ``entropy``: mean over sampled tokens of ``-log p`` under the rollout policy. For tokens
  drawn from the policy this is an unbiased Monte-Carlo estimate of its per-token entropy
  (``E[-log p(x)] = H(p)`` for ``x ~ p``), at the sampling temperature the backend used;
  it needs no full-vocabulary logits.

Pure functions over ``Sample``s; names match the keys posted with each step's alignment.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from trainer_bridge.samples import Sample


def batch_series(samples: Sequence[Sample]) -> dict[str, float]:
    """``turns_per_trajectory``, ``response_tokens`` and ``entropy`` of one step's batch."""
    if not samples:
        return {}
    turns: dict[str, int] = {}
    sampled: dict[str, int] = {}
    surprisal = 0.0
    tokens = 0
    for sample in samples:
        turns[sample.session_id] = max(turns.get(sample.session_id, 0), len(sample.weight_versions))
        sampled[sample.session_id] = sampled.get(sample.session_id, 0) + sample.num_sampled
        mask = sample.loss_mask.astype(bool)
        surprisal -= float(np.sum(sample.rollout_logprobs[mask], dtype=np.float64))
        tokens += int(mask.sum())
    return {
        "turns_per_trajectory": float(np.mean(list(turns.values()))),
        "response_tokens": float(np.mean(list(sampled.values()))),
        "entropy": surprisal / tokens if tokens else 0.0,
    }
