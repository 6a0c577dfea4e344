"""Samples -> micro-batches of packed sequences (no padding).

Owns ``MicroBatch`` and ``pack(samples, max_tokens)``.

Layout: the sequences of a micro-batch are concatenated into one row ``[1, T]``;
``position_ids`` restart at 0 for each sequence. transformers turns restarting position ids
(with no attention mask) into a block-diagonal causal mask, so sequences never attend to
each other, and MoE routing is per token, so packing changes no sequence's numbers. Every
array is indexed by the packed position ``p`` *as an input*: the logits at ``p`` predict
``targets[p]`` (the sequence's next token); ``loss_mask[p]`` says whether that next token
was sampled and ``rollout_logprobs[p]`` is its rollout logprob. The last position of each
sequence predicts nothing (mask False). ``routed_experts[p]`` is the recorded routing of the
input token at ``p``, so it lines up with the router's rows without any shift.

Packing is greedy in order: a micro-batch takes sequences while its total stays within
``max_tokens``; a longer sequence gets a micro-batch of its own. Padded batches are not
offered: packing wastes no compute, and the trainer never needs a rectangular batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from proxy.errors import InvalidRequest
from trainer_bridge.samples import Sample


@dataclass(frozen=True, slots=True, eq=False)
class MicroBatch:
    sample_ids: tuple[int, ...]  # indices into the step's sample list, in packed order
    input_ids: torch.Tensor  # [1, T] long
    position_ids: torch.Tensor  # [1, T] long
    targets: torch.Tensor  # [T] long: the token each position predicts (0 where none)
    loss_mask: torch.Tensor  # [T] bool
    rollout_logprobs: torch.Tensor  # [T] float64
    seq_index: torch.Tensor  # [T] long: 0..len(sample_ids)-1, which sequence owns p
    routed_experts: torch.Tensor | None  # [T, layers, top_k] long

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[1])


def _build(samples: Sequence[Sample], ids: Sequence[int]) -> MicroBatch:
    chosen = [samples[i] for i in ids]
    routed = [s.routed_experts for s in chosen]
    if any(r is None for r in routed) and not all(r is None for r in routed):
        raise InvalidRequest("a micro-batch mixes samples with and without routed experts")
    tokens = np.concatenate([s.tokens for s in chosen])
    positions = np.concatenate([np.arange(len(s)) for s in chosen])
    # Shift each sequence left by one: position p predicts the sequence's token p + 1.
    targets = np.concatenate([np.append(s.tokens[1:], 0) for s in chosen])
    mask = np.concatenate([np.append(s.loss_mask[1:], False) for s in chosen])
    rollout = np.concatenate([np.append(s.rollout_logprobs[1:], 0.0) for s in chosen])
    owner = np.concatenate([np.full(len(s), k) for k, s in enumerate(chosen)])
    experts = None
    if routed and routed[0] is not None:
        experts = torch.from_numpy(np.concatenate([r for r in routed if r is not None])).long()
    return MicroBatch(
        sample_ids=tuple(ids),
        input_ids=torch.from_numpy(tokens).long().unsqueeze(0),
        position_ids=torch.from_numpy(positions).long().unsqueeze(0),
        targets=torch.from_numpy(targets).long(),
        loss_mask=torch.from_numpy(mask).bool(),
        rollout_logprobs=torch.from_numpy(rollout).double(),
        seq_index=torch.from_numpy(owner).long(),
        routed_experts=experts,
    )


def pack(samples: Sequence[Sample], max_tokens: int) -> list[MicroBatch]:
    """Greedy in-order packing into micro-batches of at most ``max_tokens`` tokens."""
    if max_tokens < 1:
        raise InvalidRequest("max_tokens must be at least 1")
    batches: list[MicroBatch] = []
    current: list[int] = []
    used = 0
    for i, sample in enumerate(samples):
        if current and used + len(sample) > max_tokens:
            batches.append(_build(samples, current))
            current, used = [], 0
        current.append(i)
        used += len(sample)
    if current:
        batches.append(_build(samples, current))
    return batches
