"""GRPO advantages against hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest

from trainer_bridge.advantages import (
    grpo_advantages,
    normalize_group,
    zero_variance_groups,
    zero_variance_share,
)
from trainer_bridge.samples import Sample


def _sample(group: str, session: str, reward: float) -> Sample:
    tokens = np.array([1, 2, 3], dtype=np.int32)
    mask = np.array([0, 1, 1], dtype=np.uint8)
    logprobs = np.zeros(3, dtype=np.float32)
    return Sample(tokens, mask, logprobs, None, reward, group, session, ("v0",))


def test_binary_rewards_normalise_to_plus_minus_one() -> None:
    # mean 0.5, population std 0.5
    out = normalize_group([1.0, 0.0, 0.0, 1.0])
    np.testing.assert_allclose(out, [1, -1, -1, 1], atol=1e-5)


def test_three_rewards_use_population_std() -> None:
    std = math.sqrt(2 / 3)
    expected = [1 / std, -1 / std, 0.0]
    np.testing.assert_allclose(normalize_group([2.0, 0.0, 1.0]), expected, atol=1e-5)


@pytest.mark.parametrize("rewards", [[1.0, 1.0, 1.0], [0.0, 0.0], [0.7]])
def test_zero_variance_groups_give_exactly_zero(rewards: list[float]) -> None:
    assert normalize_group(rewards).tolist() == [0.0] * len(rewards)


def test_groups_are_normalised_separately_and_sessions_count_once() -> None:
    samples = [
        _sample("g1", "a", 1.0),
        _sample("g1", "a", 1.0),  # a second segment (fork) of session a
        _sample("g1", "b", 0.0),
        _sample("g2", "c", 1.0),
        _sample("g2", "d", 1.0),
    ]
    out = grpo_advantages(samples)
    # Counting a twice would give mean 2/3 and advantages (0.707, 0.707, -1.414).
    np.testing.assert_allclose(out, [1.0, 1.0, -1.0, 0.0, 0.0], atol=1e-5)
    assert zero_variance_share(samples) == 0.5
    assert zero_variance_groups(samples) == (1, 2)
    assert zero_variance_share([]) == 0.0
