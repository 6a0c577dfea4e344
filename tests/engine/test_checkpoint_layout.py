"""Where each checkpoint tensor lives in the loaded tiny model (engine.checkpoint_layout)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM
from transformers.core_model_loading import revert_weight_conversion

from engine.checkpoint_layout import CheckpointLayout
from kernel.errors import InvalidRequest


def _load(path: Path) -> Any:
    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)


def test_every_checkpoint_tensor_is_found_where_save_pretrained_takes_it(
    tiny_model_dir: Path,
) -> None:
    model = _load(tiny_model_dir)
    layout = CheckpointLayout.of(model)
    assert layout is not None
    state = model.state_dict()
    saved = revert_weight_conversion(model, state)
    assert set(layout.slots) == set(saved)
    # The experts are fused in memory: their slots are element indices, the rest whole.
    expert = layout.slots["model.layers.1.mlp.experts.3.up_proj.weight"]
    assert expert.param == "model.layers.1.mlp.experts.gate_up_proj"
    assert expert.index is not None
    assert layout.slots["lm_head.weight"].index is None
    for name, tensor in saved.items():
        slot = layout.slots[name]
        flat = state[slot.param].reshape(-1)
        found = flat if slot.index is None else flat[slot.index]
        assert torch.equal(found.reshape(slot.shape), tensor), name


def test_loading_a_checkpoints_tensors_gives_that_checkpoints_model(tiny_model_dir: Path) -> None:
    model = _load(tiny_model_dir)
    other = _load(tiny_model_dir)
    with torch.no_grad():
        for param in other.parameters():
            param.mul_(-0.5)
    layout = CheckpointLayout.of(model)
    assert layout is not None
    storage = {name: t.data_ptr() for name, t in model.state_dict().items()}
    layout.load(model, list(revert_weight_conversion(other, other.state_dict()).items()))
    for name, tensor in other.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor), name
    assert {n: t.data_ptr() for n, t in model.state_dict().items()} == storage  # in place


def test_a_misfit_changes_nothing(tiny_model_dir: Path) -> None:
    model = _load(tiny_model_dir)
    layout = CheckpointLayout.of(model)
    assert layout is not None
    before = {name: t.clone() for name, t in model.state_dict().items()}
    good = ("lm_head.weight", torch.zeros(4096, 64))
    with pytest.raises(InvalidRequest, match=r"Attempted to load weight \(torch.Size\(\[2\]\)\)"):
        layout.load(model, [good, ("model.norm.weight", torch.zeros(2))])
    with pytest.raises(InvalidRequest, match="not found"):
        layout.load(model, [good, ("model.layers.1.mlp.experts.gate_up_proj", torch.zeros(1))])
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, before[name]), name
