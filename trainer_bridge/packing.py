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

Dtypes: samples arrive in the claim's compact dtypes (int32 tokens, uint8 loss mask,
float32 logprobs, uint8/uint16/int32 expert ids; ``trainer_bridge.samples``); a
``MicroBatch`` holds what torch and the loss need (long ids and expert ids, bool mask,
float64 logprobs). The widening happens here, once, as the sequences are copied into the
packed row; every conversion is exact, so the trainer's numbers do not depend on the wire
dtypes.

Packing is greedy in order: a micro-batch takes sequences while its total stays within
``max_tokens``; a longer sequence gets a micro-batch of its own. Padded batches are not
offered: packing wastes no compute, and the trainer never needs a rectangular batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from kernel.errors import InvalidRequest
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
    total = sum(len(s) for s in chosen)
    # The samples' compact arrays (int32, uint8, float32; see ``samples``) are widened here,
    # once, each copied straight into its torch dtype; the tensors below share that memory.
    tokens = np.empty(total, np.int64)
    positions = np.empty(total, np.int64)
    owner = np.empty(total, np.int64)
    # Each sequence is shifted left by one: position p predicts the sequence's token p + 1;
    # its last position predicts nothing (target 0, mask False, logprob 0.0).
    targets = np.zeros(total, np.int64)
    mask = np.zeros(total, np.bool_)
    rollout = np.zeros(total, np.float64)
    at = 0
    for k, s in enumerate(chosen):
        n = len(s)
        tokens[at : at + n] = s.tokens
        positions[at : at + n] = np.arange(n)
        owner[at : at + n] = k
        if n:
            targets[at : at + n - 1] = s.tokens[1:]
            mask[at : at + n - 1] = s.loss_mask[1:]  # nonzero -> True
            rollout[at : at + n - 1] = s.rollout_logprobs[1:]
        at += n
    experts = None
    if routed and routed[0] is not None:
        rows = [r for r in routed if r is not None]
        experts = torch.from_numpy(np.concatenate(rows, dtype=np.int64))
    return MicroBatch(
        sample_ids=tuple(ids),
        input_ids=torch.from_numpy(tokens).unsqueeze(0),
        position_ids=torch.from_numpy(positions).unsqueeze(0),
        targets=torch.from_numpy(targets),
        loss_mask=torch.from_numpy(mask),
        rollout_logprobs=torch.from_numpy(rollout),
        seq_index=torch.from_numpy(owner),
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
