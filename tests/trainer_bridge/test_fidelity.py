"""Rollouts sampled by the local engine (fp32), claimed over the export API and recomputed
by the trainer (fp32) with routing replay: the trainer reproduces the rollout."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tests.trainer_bridge.conftest import ADMIN_KEY, RolloutStack
from trainer_bridge.alignment import measure_alignment, tally_routing
from trainer_bridge.client import ExportClient
from trainer_bridge.packing import pack
from trainer_bridge.policy import forward_logprobs, load_policy
from trainer_bridge.samples import Sample, samples_from_batch

PROMPT = [{"role": "user", "content": "Tell me about the weather in three words."}]


@pytest.fixture(scope="module")
def claimed(stack: RolloutStack) -> list[Sample]:
    run_id = stack.new_run()
    groups = [
        stack.create_group(run_id, f"g{g}", [100 * g + i for i in range(3)], max_tokens=24)
        for g in range(2)
    ]
    for sessions in groups:
        for index, session in enumerate(sessions):
            stack.chat(session, PROMPT, turns=2)
            stack.finish(str(session["id"]), reward=float(index % 2), turns=2)
    with ExportClient(stack.proxy_url, ADMIN_KEY, run_id) as export:
        batch = export.claim(groups=8, max_staleness=None, lease_s=60)
        assert batch.batch_id is not None
        export.ack(batch.batch_id)
    return samples_from_batch(batch)


def _recompute(model_dir: Path, samples: list[Sample], replay: bool) -> tuple[np.ndarray, ...]:
    model = load_policy(model_dir)
    rollout, trainer, recorded, natural = [], [], [], []
    with torch.no_grad():
        for mb in pack(samples, max_tokens=4096):
            lp, trace = forward_logprobs(model, mb, replay)
            assert mb.routed_experts is not None
            layers = trace.moe_layers
            rollout.append(mb.rollout_logprobs[mb.loss_mask].numpy())
            trainer.append(lp.double()[mb.loss_mask].numpy())
            recorded.append(mb.routed_experts[:, layers][mb.loss_mask].numpy())
            chosen = torch.stack([trace.natural[layer] for layer in layers], dim=1)
            natural.append(chosen[mb.loss_mask].numpy())
    return tuple(np.concatenate(a) for a in (rollout, trainer, recorded, natural))


def test_claimed_samples_are_complete_and_aligned(claimed: list[Sample]) -> None:
    assert len({s.session_id for s in claimed}) == 6
    assert {s.group_id for s in claimed} == {"g0", "g1"}
    for sample in claimed:
        assert sample.routed_experts is not None
        assert sample.routed_experts.shape == (len(sample), 4, 2)
        assert sample.num_sampled >= 2  # two turns, each at least its stop token
        assert sample.weight_versions == ("default", "default")
        assert not sample.loss_mask[0]


def test_fp32_rollouts_recompute_with_replay(tiny_model_dir: Path, claimed: list[Sample]) -> None:
    rollout, trainer, recorded, natural = _recompute(tiny_model_dir, claimed, replay=True)
    m = measure_alignment(rollout, trainer, tally_routing(recorded, natural))
    assert m.tokens >= 40
    assert m.pearson_r >= 0.9999
    assert m.abs_dlogp_p99 <= 1e-3
    assert m.expert_overlap == 1.0
    assert m.top1_agreement == 1.0


def test_misaligned_replay_is_detected(tiny_model_dir: Path, claimed: list[Sample]) -> None:
    shifted = [
        Sample(
            s.tokens,
            s.loss_mask,
            s.rollout_logprobs,
            None if s.routed_experts is None else np.roll(s.routed_experts, 1, axis=0),
            s.reward,
            s.group_id,
            s.session_id,
            s.weight_versions,
        )
        for s in claimed
    ]
    rollout, trainer, recorded, natural = _recompute(tiny_model_dir, shifted, replay=True)
    m = measure_alignment(rollout, trainer, tally_routing(recorded, natural))
    assert m.expert_overlap is not None
    assert m.expert_overlap < 0.6
    assert m.top1_agreement is not None
    assert m.top1_agreement < 0.5
