"""Routing replay on small MoE models whose routing the test controls."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from transformers import (
    Qwen3_5MoeForCausalLM,
    Qwen3_5MoeTextConfig,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

from kernel.errors import InvalidRequest
from trainer_bridge.alignment import routing_agreement
from trainer_bridge.replay import find_routers, routing_replay

LAYERS, EXPERTS, TOP_K, TOKENS = 3, 8, 2, 24


def _qwen3_moe(norm_topk_prob: bool = True) -> Any:
    config = Qwen3MoeConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        moe_intermediate_size=16,
        num_hidden_layers=LAYERS,
        mlp_only_layers=[0],
        num_experts=EXPERTS,
        num_experts_per_tok=TOP_K,
        norm_topk_prob=norm_topk_prob,
        num_attention_heads=2,
        num_key_value_heads=1,
        initializer_range=0.3,
    )
    torch.manual_seed(0)
    return Qwen3MoeForCausalLM(config)


def _natural(model: Any, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits, routing [T, LAYERS, TOP_K]) of a free-running forward."""
    with routing_replay(model, None) as trace:
        logits = model(input_ids=ids).logits
    rows = torch.zeros(ids.numel(), LAYERS, TOP_K, dtype=torch.long)
    for layer in trace.moe_layers:
        rows[:, layer] = trace.natural[layer]
    return logits, rows


def _ids() -> torch.Tensor:
    return torch.randint(0, 64, (1, TOKENS), generator=torch.Generator().manual_seed(1))


def test_finds_only_moe_layers() -> None:
    assert [layer for layer, _ in find_routers(_qwen3_moe())] == [1, 2]


def test_replaying_the_natural_routing_changes_nothing() -> None:
    model, ids = _qwen3_moe(), _ids()
    logits, rows = _natural(model, ids)
    rows[:, 0] = 7  # dense layer 0: garbage rows must be ignored
    with routing_replay(model, rows):
        again = model(input_ids=ids).logits
    torch.testing.assert_close(again, logits, rtol=0, atol=0)


@pytest.mark.parametrize("norm", [True, False])
def test_forced_experts_are_used_with_the_routers_own_weights(norm: bool) -> None:
    model, ids = _qwen3_moe(norm), _ids()
    baseline, natural = _natural(model, ids)
    forced = torch.zeros_like(natural)
    forced[..., 0], forced[..., 1] = 5, 2
    seen: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    logits_in: dict[int, torch.Tensor] = {}

    def spy(layer: int) -> Any:
        def hook(_m: object, args: tuple[torch.Tensor, ...]) -> None:
            seen[layer] = (args[1].clone(), args[2].detach().clone())

        return hook

    def gate_spy(layer: int) -> Any:
        def hook(_m: object, _a: object, out: tuple[torch.Tensor, ...]) -> None:
            logits_in[layer] = out[0].detach().clone()

        return hook

    handles = []
    for layer in (1, 2):
        mlp = model.model.layers[layer].mlp
        handles.append(mlp.experts.register_forward_pre_hook(spy(layer)))
        handles.append(mlp.gate.register_forward_hook(gate_spy(layer)))
    with routing_replay(model, forced):
        out = model(input_ids=ids).logits
    for h in handles:
        h.remove()
    assert not torch.allclose(out, baseline)
    for layer in (1, 2):
        chosen, weights = seen[layer]
        assert chosen.tolist() == [[5, 2]] * TOKENS
        probs = torch.softmax(logits_in[layer], dim=-1)[:, [5, 2]]
        if norm:
            probs = probs / probs.sum(-1, keepdim=True)
        torch.testing.assert_close(weights, probs)

    # Only experts 5 and 2 matter now: zeroing every other expert changes nothing.
    with torch.no_grad():
        for layer in (1, 2):
            experts = model.model.layers[layer].mlp.experts
            keep = torch.zeros(EXPERTS, dtype=torch.bool)
            keep[[5, 2]] = True
            experts.down_proj[~keep] = 0.0
    with routing_replay(model, forced):
        pruned = model(input_ids=ids).logits
    torch.testing.assert_close(pruned, out)


def test_gradients_reach_the_router_under_replay() -> None:
    model, ids = _qwen3_moe(), _ids()
    _, natural = _natural(model, ids)
    with routing_replay(model, natural):
        loss = model(input_ids=ids).logits.logsumexp(-1).mean()
    torch.autograd.backward(loss)
    for layer in (1, 2):
        grad = model.model.layers[layer].mlp.gate.weight.grad
        assert grad is not None
        assert float(grad.abs().sum()) > 0


def test_one_row_shift_collapses_overlap_and_top1() -> None:
    model, ids = _qwen3_moe(), _ids()
    _, natural = _natural(model, ids)
    moe = [1, 2]
    shifted = torch.roll(natural, shifts=1, dims=0)
    with routing_replay(model, shifted) as trace:
        model(input_ids=ids)
    chosen = torch.stack([trace.natural[layer] for layer in moe], dim=1)
    overlap, top1 = routing_agreement(shifted[:, moe].numpy(), chosen.numpy())
    assert overlap < 0.6
    assert top1 < 0.5
    with routing_replay(model, natural) as trace:
        model(input_ids=ids)
    chosen = torch.stack([trace.natural[layer] for layer in moe], dim=1)
    assert routing_agreement(natural[:, moe].numpy(), chosen.numpy()) == (1.0, 1.0)


def test_hooks_are_removed_even_after_an_error() -> None:
    model, ids = _qwen3_moe(), _ids()
    _, natural = _natural(model, ids)
    with pytest.raises(InvalidRequest), routing_replay(model, natural[:5]):
        model(input_ids=ids)
    assert all(not m._forward_hooks for _, m in find_routers(model))
    with pytest.raises(InvalidRequest), routing_replay(model, natural + EXPERTS):
        pass


def test_qwen3_5_moe_replay() -> None:
    config = Qwen3_5MoeTextConfig(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        moe_intermediate_size=16,
        shared_expert_intermediate_size=16,
        num_experts=4,
        num_experts_per_tok=2,
        linear_num_value_heads=2,
        linear_num_key_heads=1,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        layer_types=["linear_attention", "full_attention"],
    )
    torch.manual_seed(0)
    model: Any = Qwen3_5MoeForCausalLM(config)
    ids = torch.randint(0, 64, (1, 12), generator=torch.Generator().manual_seed(2))
    with routing_replay(model, None) as trace:
        baseline = model(input_ids=ids).logits
    natural = torch.stack([trace.natural[0], trace.natural[1]], dim=1)
    with routing_replay(model, natural):
        torch.testing.assert_close(model(input_ids=ids).logits, baseline, rtol=0, atol=0)
    forced = torch.zeros_like(natural)
    forced[..., 0], forced[..., 1] = 3, 1
    with routing_replay(model, forced):
        loss = model(input_ids=ids).logits.logsumexp(-1).mean()
    torch.autograd.backward(loss)
    grad = model.model.layers[1].mlp.gate.weight.grad
    assert grad is not None
    assert float(grad.abs().sum()) > 0
