"""Rollout routing replay (R3) for transformers MoE models, as a context manager.

Owns ``routing_replay(model, routed_experts)`` and ``RouterTrace``.

Inside ``with routing_replay(model, experts) as trace:`` every forward of ``model`` routes
each token of each MoE layer to the recorded expert ids ``experts[p, layer]`` instead of
the router's own top-k. The gate weights are still the trainer's: its router softmax
gathered at the recorded ids (renormalised over them when the model normalises its top-k),
so the loss's gradient reaches the router weights. ``experts`` is ``[T, layers, top_k]``
with ``T`` the number of tokens one forward feeds (batch x sequence, flattened as the
router flattens them); rows of dense layers (``mlp_only_layers``) are never read, as those
layers have no router. ``experts=None`` replays nothing (routing as the model decides).

Either way ``trace.natural[layer]`` holds the ids the trainer's router would have chosen
on its own in the last forward, ``[T, top_k]`` ordered by probability, for the alignment
metrics (expert overlap, top-1 agreement).

Mechanism: forward hooks on the router modules that replace the router's output tuple
``(logits, weights, ids)``; they are removed when the block exits, even on error, so no
patch outlives the context. Supported routers (transformers 5.x):
``Qwen3MoeTopKRouter`` (Qwen3-MoE; renormalises iff ``norm_topk_prob``) and
``Qwen3_5MoeTopKRouter`` (Qwen3.5-MoE; always renormalises; its shared expert is dense and
untouched). A model with other routers raises ``Unsupported`` rather than replaying wrongly.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from kernel.errors import InvalidRequest, Unsupported

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
# Router class name -> whether its top-k weights are renormalised (None: read the module's
# ``norm_topk_prob``).
_ROUTERS: dict[str, bool | None] = {"Qwen3MoeTopKRouter": None, "Qwen3_5MoeTopKRouter": True}

Hook = Callable[[torch.nn.Module, object, object], object]


@dataclass
class RouterTrace:
    """What the routers saw in the last forward (mutable; owned by one replay block)."""

    natural: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> [T, top_k]

    @property
    def moe_layers(self) -> list[int]:
        return sorted(self.natural)


def find_routers(model: torch.nn.Module) -> list[tuple[int, torch.nn.Module]]:
    """``(layer index, router module)`` for every MoE layer, in layer order."""
    routers: list[tuple[int, torch.nn.Module]] = []
    for name, module in model.named_modules():
        kind = type(module).__name__
        match = _LAYER.search(name)
        if match is None or not kind.endswith("Router"):
            continue
        if kind not in _ROUTERS:
            raise Unsupported(f"routing replay does not know the router {kind} ({name})")
        routers.append((int(match.group(1)), module))
    return sorted(routers, key=lambda pair: pair[0])


def _normalises(module: torch.nn.Module) -> bool:
    fixed = _ROUTERS[type(module).__name__]
    return bool(getattr(module, "norm_topk_prob", True)) if fixed is None else fixed


def _hook(layer: int, forced: torch.Tensor | None, trace: RouterTrace, normalise: bool) -> Hook:
    def hook(module: torch.nn.Module, _inputs: object, output: object) -> object:
        if not isinstance(output, tuple) or len(output) != 3:
            raise Unsupported(f"router of layer {layer} returned {type(output).__name__}")
        logits, _weights, natural = output
        trace.natural[layer] = natural.detach()
        if forced is None:
            return None
        if forced.shape[0] != logits.shape[0]:
            raise InvalidRequest(
                f"routing replay: {forced.shape[0]} recorded rows for {logits.shape[0]} tokens"
            )
        ids = forced[:, layer, :].to(device=logits.device, dtype=torch.long)
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
        weights = probs.gather(1, ids)
        if normalise:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return logits, weights.to(logits.dtype), ids

    return hook


@contextmanager
def routing_replay(
    model: torch.nn.Module, routed_experts: torch.Tensor | None
) -> Iterator[RouterTrace]:
    """Force the recorded routing for every forward inside the block (see module doc)."""
    routers = find_routers(model)
    if routed_experts is not None:
        if not routers:
            raise Unsupported("routing replay needs an MoE model; this one has no routers")
        if routed_experts.ndim != 3 or routed_experts.shape[1] <= routers[-1][0]:
            shape = tuple(routed_experts.shape)
            raise InvalidRequest(f"routed experts of shape {shape} miss the model's MoE layers")
        experts_per_router = max(int(getattr(m, "num_experts", 0)) for _, m in routers)
        if routed_experts.numel() and (
            int(routed_experts.min()) < 0 or int(routed_experts.max()) >= experts_per_router
        ):
            raise InvalidRequest("recorded expert ids fall outside the model's experts")
    trace = RouterTrace()
    handles = [
        module.register_forward_hook(_hook(layer, routed_experts, trace, _normalises(module)))
        for layer, module in routers
    ]
    try:
        yield trace
    finally:
        for handle in handles:
            handle.remove()
