"""batch_series: turns, response length and the entropy estimate of one step's batch."""

from __future__ import annotations

import numpy as np
import pytest

from trainer_bridge.samples import Sample
from trainer_bridge.series import batch_series


def sample(session: str, logprobs: list[float], mask: list[int], turns: int) -> Sample:
    return Sample(
        tokens=np.arange(len(mask), dtype=np.int32),
        loss_mask=np.array(mask, dtype=np.uint8),
        rollout_logprobs=np.array(logprobs, dtype=np.float32),
        routed_experts=None,
        reward=0.0,
        group_id="g",
        session_id=session,
        weight_versions=("v0",) * turns,
    )


def test_a_forked_session_counts_its_longest_segment_and_all_its_sampled_tokens() -> None:
    series = batch_series(
        [
            sample("a", [0.0, -1.0, -2.0], [0, 1, 1], turns=2),
            sample("a", [0.0, -3.0], [0, 1], turns=3),  # a fork of session a
            sample("b", [0.0, -0.5, 0.0], [0, 1, 0], turns=1),
        ]
    )
    assert series["turns_per_trajectory"] == pytest.approx((3 + 1) / 2)
    assert series["response_tokens"] == pytest.approx((3 + 1) / 2)
    # Mean surprisal over the four sampled tokens; prompt tokens' zeros never count.
    assert series["entropy"] == pytest.approx((1.0 + 2.0 + 3.0 + 0.5) / 4)


def test_the_estimate_matches_the_entropy_of_the_distribution_it_samples() -> None:
    rng = np.random.default_rng(0)
    p = np.array([0.5, 0.25, 0.125, 0.125])
    drawn = rng.choice(len(p), size=20_000, p=p)
    logprobs = np.log(p[drawn]).tolist()
    series = batch_series([sample("s", logprobs, [1] * len(logprobs), turns=1)])
    exact = float(-(p * np.log(p)).sum())
    assert series["entropy"] == pytest.approx(exact, abs=0.02)


def test_an_empty_batch_has_no_series() -> None:
    assert batch_series([]) == {}
