"""The tiny Qwen3-MoE-shaped model: built locally, deterministically, without downloads.

Owns the model directory layout and its one-time construction:

- Where it lives by default is ``kernel.paths.default_model_dir(data_dir)``.
- ``ensure_tiny_model(path, tokenizer_from=None)`` builds the directory if
  ``path/config.json`` is missing and returns ``path``; with ``tokenizer_from`` the model is
  built for that tokenizer (a real one, in tests) instead of the tiny one. The build
  happens in a sibling temporary directory that is renamed into place, so concurrent
  processes never see a half-written model; the loser of a race discards its copy.
- ``build_tokenizer`` (re-exported from ``engine.tokenizer_build``) needs no torch.

The model is a ``Qwen3MoeForCausalLM`` (4 layers, layer 0 dense, 3 MoE layers of 8 experts,
top-2) initialised from a fixed seed, so two builds give identical weights. Its weights are
random: it produces plausible token streams, not sense, which is all the proxy's tests and
benchmarks need.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path
from typing import Any

from engine.tokenizer_build import EOS_TOKEN, PAD_TOKEN, build_tokenizer

__all__ = ["build_tokenizer", "ensure_tiny_model"]

WEIGHT_SEED = 20260601
# Wider than HF's 0.02 default so the random model has peaked next-token distributions:
# greedy decoding then has clear margins and tests are not at the mercy of float noise.
INIT_STD = 0.25


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _build_model(path: Path) -> None:
    import torch
    from transformers import AutoTokenizer, GenerationConfig, Qwen3MoeConfig, Qwen3MoeForCausalLM

    tokenizer: Any = AutoTokenizer.from_pretrained(str(path))
    eos_id = int(tokenizer.convert_tokens_to_ids(EOS_TOKEN))
    pad_id = int(tokenizer.convert_tokens_to_ids(PAD_TOKEN))
    config = Qwen3MoeConfig(
        vocab_size=_round_up(len(tokenizer), 64),
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=4,
        mlp_only_layers=[0],
        decoder_sparse_step=1,
        num_experts=8,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=131072,
        initializer_range=INIT_STD,
        tie_word_embeddings=False,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        bos_token_id=None,
    )
    config.architectures = ["Qwen3MoeForCausalLM"]
    torch.manual_seed(WEIGHT_SEED)
    # Untyped transformers constructors: handled as dynamic objects.
    model: Any = Qwen3MoeForCausalLM(config)
    generation_config: Any = GenerationConfig
    model.generation_config = generation_config(
        eos_token_id=eos_id, pad_token_id=pad_id, bos_token_id=None
    )
    model.save_pretrained(str(path), safe_serialization=True)


def ensure_tiny_model(path: Path, tokenizer_from: Path | None = None) -> Path:
    """Build the tiny model into ``path`` unless ``path/config.json`` exists; return ``path``.

    ``tokenizer_from``: a tokenizer directory to build the model for (its files are copied
    in; the vocabulary sets the embedding size) instead of the tiny model's own tokenizer.
    """
    if (path / "config.json").exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.parent / f".{path.name}.building-{uuid.uuid4().hex}"
    try:
        if tokenizer_from is None:
            build_tokenizer(staging)
        else:
            shutil.copytree(tokenizer_from, staging)
        _build_model(staging)
        try:
            os.rename(staging, path)
        except OSError:
            # Another process finished first (rename onto a non-empty directory fails);
            # its copy is identical, so ours is simply discarded.
            if not (path / "config.json").exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return path
