"""GRPO advantages: each session's reward normalised within its prompt group.

Owns ``normalize_group(rewards)``, ``grpo_advantages(samples)`` and the zero-variance
count (``zero_variance_groups``: counts, so data-parallel ranks holding whole groups can
add theirs up; ``zero_variance_share``: the share).

``A_i = (r_i - mean(r)) / (std(r) + eps)`` over the sessions of one group, with the
population standard deviation (ddof 0). A group whose rewards are all equal (0/8 or 8/8
solved, or a single session) carries no group-relative signal: every advantage is exactly
0, not ``0 / eps`` noise. Each session counts once however many segments (branches) it has;
all its segments share its advantage.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from trainer_bridge.samples import Sample

EPS = 1e-6


def normalize_group(rewards: Sequence[float], eps: float = EPS) -> npt.NDArray[np.float64]:
    values = np.asarray(rewards, dtype=np.float64)
    std = float(values.std()) if values.size else 0.0
    if values.size < 2 or std == 0.0:
        return np.zeros_like(values)
    normalized: npt.NDArray[np.float64] = (values - values.mean()) / (std + eps)
    return normalized


def grpo_advantages(samples: Sequence[Sample], eps: float = EPS) -> npt.NDArray[np.float64]:
    """One advantage per sample, aligned with ``samples``."""
    sessions: dict[str, dict[str, float]] = {}  # group -> session -> reward
    for sample in samples:
        sessions.setdefault(sample.group_id, {})[sample.session_id] = sample.reward
    by_session: dict[tuple[str, str], float] = {}
    for group, rewards in sessions.items():
        normalized = normalize_group(list(rewards.values()), eps)
        for session, advantage in zip(rewards, normalized, strict=True):
            by_session[(group, session)] = float(advantage)
    return np.asarray([by_session[(s.group_id, s.session_id)] for s in samples], np.float64)


def zero_variance_groups(samples: Sequence[Sample]) -> tuple[int, int]:
    """``(groups whose rewards are all equal, groups)``: the former teach nothing this step."""
    rewards: dict[str, set[float]] = {}
    for sample in samples:
        rewards.setdefault(sample.group_id, set()).add(sample.reward)
    return sum(len(r) == 1 for r in rewards.values()), len(rewards)


def zero_variance_share(samples: Sequence[Sample]) -> float:
    """Share of groups whose rewards are all equal (0.0 without groups)."""
    flat, groups = zero_variance_groups(samples)
    return flat / groups if groups else 0.0
