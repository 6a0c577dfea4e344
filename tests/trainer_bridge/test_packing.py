"""Packed micro-batches: layout, and that packing changes no sequence's logprobs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from proxy.errors import InvalidRequest
from trainer_bridge.packing import pack
from trainer_bridge.policy import forward_logprobs, load_policy
from trainer_bridge.samples import Sample


def _sample(n: int, seed: int, routed: bool = False) -> Sample:
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 4000, n).astype(np.int64)
    mask = np.arange(n) >= n // 2
    rollout = np.where(mask, -rng.uniform(0, 3, n), 0.0)
    experts = rng.integers(0, 8, (n, 4, 2)).astype(np.int32) if routed else None
    return Sample(tokens, mask, rollout, experts, 1.0, "g", f"s{seed}", ("v",))


def test_layout_shifts_targets_and_restarts_positions() -> None:
    a, b = _sample(4, 0, routed=True), _sample(3, 1, routed=True)
    (mb,) = pack([a, b], max_tokens=100)
    assert mb.input_ids[0].tolist() == [*a.tokens.tolist(), *b.tokens.tolist()]
    assert mb.position_ids[0].tolist() == [0, 1, 2, 3, 0, 1, 2]
    assert mb.targets.tolist() == [*a.tokens[1:].tolist(), 0, *b.tokens[1:].tolist(), 0]
    assert mb.loss_mask.tolist() == [False, True, True, False, True, True, False]
    assert mb.rollout_logprobs[1].item() == a.rollout_logprobs[2]
    assert mb.seq_index.tolist() == [0, 0, 0, 0, 1, 1, 1]
    assert mb.routed_experts is not None
    assert b.routed_experts is not None
    assert mb.routed_experts[4].tolist() == b.routed_experts[0].tolist()


def test_greedy_budget_and_oversized_sequences() -> None:
    samples = [_sample(n, i) for i, n in enumerate([5, 5, 12, 3])]
    assert [mb.sample_ids for mb in pack(samples, max_tokens=10)] == [(0, 1), (2,), (3,)]
    with pytest.raises(InvalidRequest):
        pack(samples, max_tokens=0)
    with pytest.raises(InvalidRequest):
        pack([_sample(4, 0, routed=True), _sample(4, 1)], max_tokens=100)


def test_packing_gives_the_same_logprobs_as_separate_sequences(tiny_model_dir: Path) -> None:
    model = load_policy(tiny_model_dir)
    samples = [_sample(n, i) for i, n in enumerate([20, 33, 7])]
    (packed,) = pack(samples, max_tokens=1000)
    together, _ = forward_logprobs(model, packed, replay=False)
    alone = torch.cat([forward_logprobs(model, mb, replay=False)[0] for mb in pack(samples, 1)])
    torch.testing.assert_close(together, alone, rtol=0, atol=1e-4)
