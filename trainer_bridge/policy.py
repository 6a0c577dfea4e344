"""The policy model's lifecycle: load, forward with replay, reference KL, checkpoint.

Owns ``load_policy``, ``forward_logprobs``, the reference-model integration (``Reference``
protocol; ``FrozenReference`` or the null object ``NoReference``) and ``save_checkpoint``.

- ``load_policy(path, dtype, device)``: any transformers causal-LM directory, in training
  mode. The model is typed ``torch.nn.Module``; transformers' own types stay at this edge.
- ``forward_logprobs(model, mb, replay)``: one forward of a packed micro-batch, returning
  the logprob of each position's target ``[T]`` (float32, differentiable) and the
  ``RouterTrace`` (the trainer's own top-k per MoE layer). With ``replay`` the recorded
  routing is forced (R3); without it the model routes as it likes. Models with
  linear-attention layers (Qwen3.5) need one sequence per micro-batch (``Unsupported``
  otherwise): their recurrent layers would carry state across packed sequences.
- ``Reference.kl(...)``: the KL-loss term against the initial policy. ``FrozenReference``
  runs a frozen copy under the same routing; ``NoReference`` contributes exactly 0, so the
  loop has no branch for "KL off".
- ``save_checkpoint(model, source, target)``: ``save_pretrained`` into a new directory plus
  the source's tokenizer files, so every published version is a complete checkpoint the
  backend can load.
- ``checkpoint_tensors(model)``: the same weights in memory, named and shaped as the
  checkpoint has them (what a distributed weight sync sends: SGLang loads checkpoint
  names, while transformers keeps some tensors fused, e.g. an MoE layer's experts).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Protocol

import torch
from transformers import AutoModelForCausalLM
from transformers.core_model_loading import revert_weight_conversion

from kernel.errors import InvalidRequest, Unsupported
from trainer_bridge.loss import k3_kl_loss, token_logprobs
from trainer_bridge.packing import MicroBatch
from trainer_bridge.replay import RouterTrace, routing_replay

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
_TOKENIZER_FILES = ("tokenizer", "special_tokens", "chat_template", "vocab", "merges", "added")


def load_policy(path: str | Path, dtype: str = "float32", device: str = "cpu") -> torch.nn.Module:
    if dtype not in _DTYPES:
        raise InvalidRequest(f"unknown dtype {dtype!r}; expected one of {sorted(_DTYPES)}")
    # transformers' loader is untyped; the model is handled as a plain nn.Module from here.
    model: Any = AutoModelForCausalLM.from_pretrained(str(path), dtype=_DTYPES[dtype])
    module: torch.nn.Module = model.to(device)
    return module.train()


def _has_linear_attention(model: torch.nn.Module) -> bool:
    config = getattr(model, "config", None)
    return "linear_attention" in (getattr(config, "layer_types", None) or ())


def forward_logprobs(
    model: torch.nn.Module, mb: MicroBatch, replay: bool
) -> tuple[torch.Tensor, RouterTrace]:
    if len(mb.sample_ids) > 1 and _has_linear_attention(model):
        # Linear-attention layers (Qwen3.5's gated delta rule) carry state along the row and
        # ignore position ids, so packed sequences would leak into each other.
        raise Unsupported("pack one sequence per micro-batch for linear-attention models")
    device = next(model.parameters()).device
    forced = mb.routed_experts.to(device) if replay and mb.routed_experts is not None else None
    with routing_replay(model, forced) as trace:
        # No attention mask and no cache: only then do restarting position ids make
        # transformers build the block-diagonal causal mask that keeps sequences apart.
        out = model(
            input_ids=mb.input_ids.to(device),
            position_ids=mb.position_ids.to(device),
            use_cache=False,
        )
    logits: torch.Tensor = out.logits[0]
    return token_logprobs(logits, mb.targets.to(device)), trace


class Reference(Protocol):
    def kl(self, mb: MicroBatch, logprobs: torch.Tensor, num_sequences: int) -> torch.Tensor:
        """The (unweighted) KL loss of this micro-batch's share of the step."""
        ...


class NoReference:
    def kl(self, mb: MicroBatch, logprobs: torch.Tensor, num_sequences: int) -> torch.Tensor:
        return torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)


class FrozenReference:
    def __init__(self, model: torch.nn.Module, replay: bool) -> None:
        self._model = model.eval().requires_grad_(False)
        self._replay = replay

    def kl(self, mb: MicroBatch, logprobs: torch.Tensor, num_sequences: int) -> torch.Tensor:
        with torch.no_grad():
            ref, _ = forward_logprobs(self._model, mb, self._replay)
        device = logprobs.device
        return k3_kl_loss(
            logprobs,
            ref,
            mb.seq_index.to(device),
            mb.loss_mask.to(device),
            num_seqs_here=len(mb.sample_ids),
            num_sequences=num_sequences,
        )


def save_checkpoint(model: torch.nn.Module, source: Path, target: Path) -> Path:
    """Write ``model`` to the new directory ``target``; return it."""
    if target.exists():
        raise InvalidRequest(f"checkpoint directory {target} already exists")
    staging = target.with_name(f".{target.name}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    saver: Any = model  # save_pretrained is transformers', untyped
    saver.save_pretrained(str(staging), safe_serialization=True)
    for item in source.iterdir():
        if item.is_file() and item.name.startswith(_TOKENIZER_FILES):
            shutil.copy2(item, staging / item.name)
    # Rename last so a backend never sees a half-written checkpoint.
    staging.rename(target)
    return target


def checkpoint_tensors(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """``model``'s weights as ``save_checkpoint`` writes them, without writing them."""
    converted: Any = model  # transformers' own type stays at this edge
    # save_pretrained's own conversion back from the in-memory layout.
    named = revert_weight_conversion(converted, model.state_dict())
    return [(str(name), tensor.detach()) for name, tensor in named.items()]
