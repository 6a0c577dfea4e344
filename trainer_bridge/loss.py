"""The GSPO policy loss and the k3 KL loss, aggregated seq-mean-token-mean.

Owns ``token_logprobs``, ``gspo_loss`` and ``k3_kl_loss``.

All per-token inputs are flat ``[T]`` tensors over one packed micro-batch; ``seq_index[p]``
names the sequence owning position ``p`` and ``mask[p]`` whether ``p`` is a sampled token.

GSPO (sequence-level importance ratio): for sequence ``i`` with sampled tokens ``y_i``,
``s_i = exp(mean_{t in y_i}(logp_t - old_t))``. It is applied in its token form
``s_it = sg[s_i] * exp(logp_t - sg[logp_t])``, whose value is ``s_i`` and whose gradient
through the token mean equals GSPO's. Per token: ``max(-A_i * s_it, -A_i * clip(s_it,
1 - eps_low, 1 + eps_high))``; the clip decision is therefore per sequence.

Aggregation seq-mean-token-mean: mean over each sequence's sampled tokens, then mean over
the step's sequences. A micro-batch returns the *sum* of its sequences' token means divided
by ``num_sequences`` (the step's total), so the micro-batch losses of a step add up to the
step's loss and gradient accumulation needs no rescaling.

KL loss: ``k3 = exp(ref - logp) - (ref - logp) - 1`` per sampled token (an unbiased,
non-negative estimate of KL(policy || reference) from tokens the policy sampled), aggregated
the same way, times the coefficient.
"""

from __future__ import annotations

import torch

from kernel.errors import InvalidRequest


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``log_softmax(logits)[p, targets[p]]`` in float32; ``logits`` is ``[T, V]``."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def _seq_token_mean(
    values: torch.Tensor, seq_index: torch.Tensor, mask: torch.Tensor, num_seqs: int
) -> torch.Tensor:
    """``[num_seqs]``: mean of ``values`` over each sequence's masked positions."""
    weights = mask.to(values.dtype)
    sums = torch.zeros(num_seqs, dtype=values.dtype).index_add(0, seq_index, values * weights)
    counts = torch.zeros(num_seqs, dtype=values.dtype).index_add(0, seq_index, weights)
    return sums / counts.clamp(min=1.0)


def gspo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    seq_index: torch.Tensor,
    mask: torch.Tensor,
    *,
    num_sequences: int,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
) -> tuple[torch.Tensor, int]:
    """``(loss, clipped sequence count)``; ``advantages`` is ``[sequences in this batch]``."""
    if num_sequences < 1:
        raise InvalidRequest("num_sequences must be at least 1")
    seqs = int(advantages.shape[0])
    log_ratio = (logprobs - old_logprobs.to(logprobs.dtype)) * mask.to(logprobs.dtype)
    seq_log_ratio = _seq_token_mean(log_ratio, seq_index, mask, seqs)
    seq_ratio = torch.exp(seq_log_ratio.detach())[seq_index]
    token_ratio = seq_ratio * torch.exp(logprobs - logprobs.detach())
    adv = advantages.to(logprobs.dtype)[seq_index]
    unclipped = -adv * token_ratio
    clipped = -adv * token_ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(unclipped, clipped)
    per_seq = _seq_token_mean(per_token, seq_index, mask, seqs)
    ratio = torch.exp(seq_log_ratio.detach())
    adv_seq = advantages.to(ratio.dtype)
    outside = ((ratio < 1.0 - clip_low) & (adv_seq < 0)) | (
        (ratio > 1.0 + clip_high) & (adv_seq > 0)
    )
    return per_seq.sum() / num_sequences, int(outside.sum())


def k3_kl_loss(
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    seq_index: torch.Tensor,
    mask: torch.Tensor,
    *,
    num_seqs_here: int,
    num_sequences: int,
) -> torch.Tensor:
    """seq-mean-token-mean of the k3 estimator against the reference (not yet weighted)."""
    diff = ref_logprobs.to(logprobs.dtype) - logprobs
    per_token = torch.expm1(diff) - diff
    return _seq_token_mean(per_token, seq_index, mask, num_seqs_here).sum() / num_sequences
