"""The trainer's log: one progress line per step, and a flagged step says why."""

from __future__ import annotations

from trainer_bridge.alignment import (
    AlignmentMetrics,
    AlignmentThresholds,
    flag_reasons,
    is_flagged,
)
from trainer_bridge.train import StepOutcome, progress_line


def test_a_flagged_step_says_which_thresholds_it_broke() -> None:
    metrics = AlignmentMetrics(
        tokens=10,
        pearson_r=0.9,
        k3_kl=0.0,
        abs_dp_mean=0.0,
        abs_dlogp_mean=0.0,
        abs_dlogp_p50=0.0,
        abs_dlogp_p90=0.0,
        abs_dlogp_p99=0.2,
        expert_overlap=0.95,
    )
    reasons = flag_reasons(metrics, AlignmentThresholds())
    assert reasons == ["pearson_r 0.9000 < 0.99", "|dlogp| p99 0.2000 > 0.05"]
    assert is_flagged(metrics, AlignmentThresholds())
    outcome = StepOutcome(
        samples=8,
        mean_reward=0.5,
        zero_variance_share=0.25,
        policy_loss=-0.01,
        kl_loss=0.001,
        grad_norm=0.7,
        clipped_sequences=1,
        alignment=metrics,
    )
    line = progress_line(3, 10, outcome, "step-3", reasons)
    assert line.startswith("step 3/10: 8 samples, reward 0.500 (zero-variance groups 25%)")
    assert "published step-3" in line
    assert line.endswith("FLAGGED: pearson_r 0.9000 < 0.99; |dlogp| p99 0.2000 > 0.05")
    assert "FLAGGED" not in progress_line(3, 10, outcome, "step-3", [])
