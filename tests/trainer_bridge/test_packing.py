"""Packed micro-batches: layout, and that packing changes no sequence's logprobs."""

from __future__ import annotations

from dataclasses import fields, replace
from pathlib import Path

import numpy as np
import pytest
import torch

from kernel.errors import InvalidRequest
from trainer_bridge.packing import MicroBatch, pack
from trainer_bridge.policy import forward_logprobs, load_policy
from trainer_bridge.samples import Sample


def _sample(n: int, seed: int, routed: bool = False) -> Sample:
    """A sample in the dtypes a claim delivers (int32, uint8, float32, uint8 experts)."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 4000, n).astype(np.int32)
    mask = (np.arange(n) >= n // 2).astype(np.uint8)
    rollout = np.where(mask, -rng.uniform(0, 3, n), 0.0).astype(np.float32)
    experts = rng.integers(0, 8, (n, 4, 2)).astype(np.uint8) if routed else None
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


def _widened(sample: Sample) -> Sample:
    """``sample`` in the dtypes the trainer used to hold (int64, bool, float64, int32)."""
    assert sample.routed_experts is not None
    return replace(
        sample,
        tokens=sample.tokens.astype(np.int64),
        loss_mask=sample.loss_mask.astype(np.bool_),
        rollout_logprobs=sample.rollout_logprobs.astype(np.float64),
        routed_experts=sample.routed_experts.astype(np.int32),
    )


def _compact(seed: int, n: int, experts: type[np.unsignedinteger]) -> Sample:
    sample = _sample(n, seed, routed=True)
    assert sample.routed_experts is not None
    return replace(sample, routed_experts=sample.routed_experts.astype(experts))


def _assert_identical(a: MicroBatch, b: MicroBatch) -> None:
    for field in fields(MicroBatch):
        x, y = getattr(a, field.name), getattr(b, field.name)
        if isinstance(x, torch.Tensor):
            assert x.dtype == y.dtype, field.name
            assert torch.equal(x, y), field.name
        else:
            assert x == y, field.name


def test_compact_expert_ids_pack_exactly_as_int32_ones() -> None:
    # uint8 and uint16 experts, mixed in one micro-batch, beside int32 tokens, a uint8 mask
    # and float32 logprobs: the same tensors as from the widened arrays.
    compact = [_compact(0, 6, np.uint8), _compact(1, 5, np.uint16), _compact(2, 1, np.uint8)]
    wide = [_widened(s) for s in compact]
    (packed,) = pack(compact, max_tokens=100)
    (expected,) = pack(wide, max_tokens=100)
    _assert_identical(packed, expected)
    assert packed.routed_experts is not None
    assert packed.routed_experts.dtype == torch.long
    assert packed.input_ids.dtype == torch.long
    assert packed.rollout_logprobs.dtype == torch.float64


def test_compact_samples_replay_to_identical_logprobs(tiny_model_dir: Path) -> None:
    model = load_policy(tiny_model_dir)
    compact = [_compact(0, 9, np.uint8), _compact(1, 7, np.uint16)]
    (packed,) = pack(compact, max_tokens=100)
    (expected,) = pack([_widened(s) for s in compact], max_tokens=100)
    with torch.no_grad():
        got, got_trace = forward_logprobs(model, packed, replay=True)
        want, want_trace = forward_logprobs(model, expected, replay=True)
    assert torch.equal(got, want)
    assert got_trace.moe_layers == want_trace.moe_layers
    for layer in got_trace.moe_layers:
        assert torch.equal(got_trace.natural[layer], want_trace.natural[layer])
