"""GSPO and k3 KL losses against hand-computed values and GSPO's sequence-level gradient."""

from __future__ import annotations

import math

import pytest
import torch

from trainer_bridge.loss import gspo_loss, k3_kl_loss, token_logprobs


def _batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # Two packed sequences: positions 0..2 (seq 0, two sampled) and 3..4 (seq 1, one sampled).
    seq_index = torch.tensor([0, 0, 0, 1, 1])
    mask = torch.tensor([True, True, False, True, False])
    logprobs = torch.tensor([-1.0, -2.0, -9.0, -0.5, -9.0], dtype=torch.float64)
    return seq_index, mask, logprobs


def test_on_policy_value_and_upper_clip() -> None:
    seq_index, mask, logprobs = _batch()
    logprobs.requires_grad_(True)
    # Seq 0 is on-policy (ratio 1); seq 1's ratio exp(1e-3) exceeds 1 + 4e-4 with A > 0.
    old = torch.tensor([-1.0, -2.0, 0.0, -0.501, 0.0], dtype=torch.float64)
    adv = torch.tensor([1.0, 2.0], dtype=torch.float64)
    loss, clipped = gspo_loss(logprobs, old, adv, seq_index, mask, num_sequences=4)
    # seq 0: -1 * 1; seq 1: max(-2 * 1.0010005, -2 * 1.0004) = -2.0008; over 4 sequences
    assert float(loss.detach()) == pytest.approx((-1.0 - 2.0008) / 4, abs=1e-9)
    assert clipped == 1
    torch.autograd.backward(loss)
    assert logprobs.grad is not None
    # Seq 0: -A * s / n_tokens / num_sequences per token; seq 1 is clipped: no gradient.
    expected = torch.tensor([-0.125, -0.125, 0.0, 0.0, 0.0], dtype=torch.float64)
    torch.testing.assert_close(logprobs.grad, expected)


def test_lower_clip_for_negative_advantage() -> None:
    seq_index, mask, logprobs = _batch()
    old = logprobs.clone()
    old[3] = -0.5 + 1e-3  # seq 1 ratio exp(-1e-3) < 1 - 3e-4
    adv = torch.tensor([0.0, -1.0], dtype=torch.float64)
    loss, clipped = gspo_loss(logprobs, old, adv, seq_index, mask, num_sequences=2)
    assert float(loss.detach()) == pytest.approx(0.9997 / 2, abs=1e-9)
    assert clipped == 1


def test_gradient_equals_sequence_level_gspo_inside_the_clip_range() -> None:
    seq_index, mask, logprobs = _batch()
    logprobs.requires_grad_(True)
    old = logprobs.detach() - torch.tensor([1e-4, -2e-4, 0.0, 1e-4, 0.0], dtype=torch.float64)
    adv = torch.tensor([0.5, -1.5], dtype=torch.float64)
    loss, clipped = gspo_loss(logprobs, old, adv, seq_index, mask, num_sequences=2)
    torch.autograd.backward(loss)
    assert clipped == 0
    # d/dlogp_t of -A_i * exp(mean_t(logp - old)) / num_sequences = -A_i * s_i / n_i / 2
    s0 = math.exp((1e-4 - 2e-4) / 2)
    s1 = math.exp(1e-4)
    expected = [-0.5 * s0 / 2 / 2, -0.5 * s0 / 2 / 2, 0.0, 1.5 * s1 / 1 / 2, 0.0]
    assert logprobs.grad is not None
    torch.testing.assert_close(logprobs.grad, torch.tensor(expected, dtype=torch.float64))
    assert float(loss.detach()) == pytest.approx((-0.5 * s0 + 1.5 * s1) / 2, abs=1e-12)


def test_k3_kl_hand_computed() -> None:
    seq_index, mask, logprobs = _batch()
    ref = logprobs.clone()
    ref[0] = -1.5  # d = -0.5: exp(-0.5) - 1 + 0.5
    ref[3] = -0.5  # d = 0: no divergence
    kl = k3_kl_loss(logprobs, ref, seq_index, mask, num_seqs_here=2, num_sequences=2)
    k = math.exp(-0.5) - 0.5
    assert float(kl) == pytest.approx((k / 2 + 0.0) / 2, abs=1e-12)


def test_token_logprobs_gathers_log_softmax() -> None:
    logits = torch.tensor([[0.0, math.log(3.0)], [2.0, 2.0]])
    out = token_logprobs(logits, torch.tensor([1, 0]))
    torch.testing.assert_close(out, torch.tensor([math.log(0.75), math.log(0.5)]))
