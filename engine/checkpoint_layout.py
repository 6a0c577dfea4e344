"""Where each tensor of a checkpoint lives in a loaded transformers model.

Owns ``CheckpointLayout``: ``CheckpointLayout.of(model)`` maps every checkpoint name (what
``save_pretrained`` writes and SGLang's loaders read, e.g. ``mlp.experts.3.up_proj.weight``)
to the elements of the in-memory parameter that hold it (transformers 5 keeps an MoE
layer's experts fused in one ``gate_up_proj``). ``load(named)`` then copies received
tensors into place: no new model, no reallocation, as SGLang loads in place.

The map is found, not written per architecture: transformers' own reverse conversion
(``revert_weight_conversion``, what ``save_pretrained`` runs) is applied to a state dict
of element indices instead of weights, so each checkpoint tensor comes back as the indices
it was made of. That works when the conversion only moves elements (merges, splits,
concatenations, transposes); ``of`` returns None otherwise (a conversion that computes,
a checkpoint tensor drawn from two parameters, a weight no checkpoint name covers). Tied
weights share one set of indices. Element indices cost 8 bytes each, kept only for
tensors stored elsewhere than one whole parameter of the same shape.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers.core_model_loading import revert_weight_conversion

from kernel.errors import InvalidRequest


@dataclass(frozen=True, slots=True)
class _Slot:
    param: str
    shape: torch.Size  # the checkpoint's shape
    index: torch.Tensor | None  # flat element indices into the parameter; None: all of it


@dataclass(frozen=True, slots=True)
class CheckpointLayout:
    slots: dict[str, _Slot]

    @classmethod
    def of(cls, model: Any) -> CheckpointLayout | None:
        state = model.state_dict()
        names: list[str] = []  # one per storage: tied weights share theirs
        starts: list[int] = []
        probe: dict[str, torch.Tensor] = {}
        seen: dict[int, torch.Tensor] = {}
        total = 0
        for name, tensor in state.items():
            if not tensor.is_contiguous():
                return None
            tied = seen.get(tensor.data_ptr())
            if tied is not None and tied.shape == tensor.shape:
                probe[name] = tied
                continue
            names.append(name)
            starts.append(total)
            probe[name] = torch.arange(total, total + tensor.numel()).reshape(tensor.shape)
            seen[tensor.data_ptr()] = probe[name]
            total += tensor.numel()
        bounds = torch.tensor([*starts, total])
        covered = torch.zeros(total, dtype=torch.bool)
        slots: dict[str, _Slot] = {}
        for ckpt_name, indices in revert_weight_conversion(model, probe).items():
            if indices.dtype != torch.int64 or indices.numel() == 0:
                return None  # the conversion computed something
            flat = indices.reshape(-1)
            owner = int(torch.searchsorted(bounds, flat.min(), right=True)) - 1
            if not 0 <= owner < len(names) or int(flat.max()) >= int(bounds[owner + 1]):
                return None  # drawn from several parameters: not a simple move
            covered[flat] = True
            param = state[names[owner]]
            local = flat - starts[owner]
            whole = indices.shape == param.shape and torch.equal(local, torch.arange(param.numel()))
            slots[ckpt_name] = _Slot(names[owner], indices.shape, None if whole else local)
        if not bool(covered.all()):
            return None  # some weights have no checkpoint name
        return cls(slots)

    def check(self, named: Sequence[tuple[str, torch.Tensor]]) -> None:
        """Refuse, before anything changes, a name or shape the checkpoint does not have
        (in the words of SGLang's loader)."""
        for name, tensor in named:
            slot = self.slots.get(name)
            if slot is None:
                example = next(iter(self.slots))
                raise InvalidRequest(
                    f"Parameter {name} not found in params_dict (names are the checkpoint's, "
                    f"e.g. {example})"
                )
            if tensor.shape != slot.shape:
                raise InvalidRequest(
                    f"Attempted to load weight ({tensor.size()}) into parameter ({slot.shape})"
                )

    def load(self, model: Any, named: Sequence[tuple[str, torch.Tensor]]) -> None:
        self.check(named)
        state = model.state_dict()  # shares storage with the parameters
        with torch.no_grad():
            for name, tensor in named:
                slot = self.slots[name]
                target = state[slot.param].view(-1)
                values = tensor.reshape(-1).to(target.dtype)
                if slot.index is None:
                    target.copy_(values)
                else:
                    target[slot.index] = values
