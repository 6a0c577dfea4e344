"""Alignment metrics on constructed data."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kernel.errors import InvalidRequest
from trainer_bridge.alignment import (
    AlignmentThresholds,
    is_flagged,
    measure_alignment,
    routing_agreement,
    tally_routing,
)


def _routing(tokens: int, layers: int = 3, experts: int = 8, top_k: int = 2) -> np.ndarray:
    rng = np.random.default_rng(0)
    rows = [rng.permutation(experts)[:top_k] for _ in range(tokens * layers)]
    return np.asarray(rows, dtype=np.int64).reshape(tokens, layers, top_k)


def test_identical_logprobs_are_perfectly_aligned() -> None:
    lp = np.log(np.linspace(0.05, 0.95, 50))
    m = measure_alignment(lp, lp.copy())
    assert m.pearson_r == pytest.approx(1.0)
    assert m.k3_kl == 0.0
    assert m.abs_dlogp_p99 == 0.0
    assert m.abs_dp_mean == 0.0
    assert m.expert_overlap is None
    assert m.top1_agreement is None
    assert not is_flagged(m, AlignmentThresholds())


def test_hand_computed_statistics() -> None:
    rollout = np.log(np.array([0.5, 0.25]))
    recomputed = rollout + np.array([0.1, -0.2])
    m = measure_alignment(rollout, recomputed)
    k3 = [math.exp(0.1) - 1 - 0.1, math.exp(-0.2) - 1 + 0.2]
    assert m.k3_kl == pytest.approx(sum(k3) / 2)
    assert m.abs_dlogp_mean == pytest.approx(0.15)
    assert m.abs_dlogp_p50 == pytest.approx(0.15)
    expected_dp = (abs(0.5 - 0.5 * math.exp(0.1)) + abs(0.25 - 0.25 * math.exp(-0.2))) / 2
    assert m.abs_dp_mean == pytest.approx(expected_dp)
    assert m.pearson_r == pytest.approx(1.0)  # two points always lie on a line


def test_noise_lowers_pearson_and_is_flagged() -> None:
    rng = np.random.default_rng(1)
    rollout = np.log(rng.uniform(0.01, 1.0, 2000))
    m = measure_alignment(rollout, rollout + rng.normal(0, 1.0, 2000))
    assert m.pearson_r < 0.95
    assert is_flagged(m, AlignmentThresholds())


def test_one_row_shift_collapses_overlap_and_top1() -> None:
    recorded = _routing(400)
    assert routing_agreement(recorded, recorded) == (1.0, 1.0)
    overlap, top1 = routing_agreement(recorded, np.roll(recorded, 1, axis=0))
    # Chance level for 2 of 8 experts: overlap 0.25, top-1 0.125.
    assert overlap < 0.35
    assert top1 < 0.2
    lp = np.log(np.linspace(0.1, 0.9, 400))
    m = measure_alignment(lp, lp, tally_routing(recorded, np.roll(recorded, 1, axis=0)))
    assert m.expert_overlap == overlap
    assert is_flagged(m, AlignmentThresholds(min_expert_overlap=0.9))


def test_overlap_ignores_order_but_top1_does_not() -> None:
    recorded = np.array([[[1, 2]], [[3, 4]]])
    swapped = np.array([[[2, 1]], [[3, 5]]])
    assert routing_agreement(recorded, swapped) == (0.75, 0.5)


def test_tallies_of_disjoint_rows_add_up_to_the_whole() -> None:
    recorded = _routing(300)
    natural = np.roll(recorded, 1, axis=0)
    natural[:150] = recorded[:150]  # half agrees, half is shifted
    whole = tally_routing(recorded, natural)
    parts = tally_routing(recorded[:100], natural[:100]) + tally_routing(
        recorded[100:], natural[100:]
    )
    assert parts == whole
    assert (whole.rows, whole.slots) == (300 * 3, 300 * 3 * 2)
    assert 0.5 < whole.expert_overlap < 0.7
    assert routing_agreement(recorded, natural) == (whole.expert_overlap, whole.top1_agreement)


def test_an_empty_tally_agrees_fully() -> None:
    empty = tally_routing(np.zeros((0, 3, 2), np.int64), np.zeros((0, 3, 2), np.int64))
    assert (empty.expert_overlap, empty.top1_agreement) == (1.0, 1.0)


def test_mismatched_inputs_raise() -> None:
    with pytest.raises(InvalidRequest):
        measure_alignment(np.zeros(3), np.zeros(4))
    with pytest.raises(InvalidRequest):
        measure_alignment(np.zeros(0), np.zeros(0))
    with pytest.raises(InvalidRequest):
        routing_agreement(np.zeros((2, 1, 2), np.int64), np.zeros((3, 1, 2), np.int64))
