"""One loaded causal LM on the CPU: forward passes with per-request KV caches and routing.

Owns ``ModelRunner``: loads any HF causal-LM directory with transformers (float32 unless
``dtype`` says otherwise: "float32" or "bfloat16"),
runs ``prefill`` (a whole prompt) and ``decode`` (one token) against a caller-held KV cache
(so each step costs only its new tokens), and reloads weights in place: from a checkpoint
directory (``reload``) or from tensors named as a checkpoint names them (``load_named``,
what a trainer broadcasts, copied in place through ``engine.checkpoint_layout``).

Routed experts: a forward hook on every MoE router (a module named ``...layers.N...``
whose output tuple ends in an integer tensor of top-k expert ids, e.g. transformers'
``Qwen3MoeTopKRouter``) records the ids the router chose for every token fed, as logical
expert ids. Each forward returns them as an int32 array ``[tokens, num_hidden_layers,
num_experts_per_tok]``; rows of dense layers stay 0. A model without routers returns None
(``supports_routing`` is False) and the server then omits ``routed_experts``, as SGLang does
without a capturer.

Logprobs are ``log_softmax`` of the raw (temperature 1, unpenalised) logits; not
thread-safe: one scheduler thread owns a runner.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from transformers import AutoModelForCausalLM, GenerationConfig

from engine.checkpoint_layout import CheckpointLayout
from kernel.errors import InvalidRequest, Unsupported

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class ForwardResult:
    logits: torch.Tensor  # [positions, vocab] float32: last position only unless asked
    routing: npt.NDArray[np.int32] | None  # [tokens, layers, top_k]


def _eos_ids(model: Any) -> frozenset[int]:
    ids: set[int] = set()
    for source in (model.config, getattr(model, "generation_config", None)):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list):
            ids.update(int(v) for v in value)
    return frozenset(ids)


class ModelRunner:
    def __init__(self, model_path: Path, dtype: str = "float32") -> None:
        if dtype not in _DTYPES:
            raise InvalidRequest(f"unknown dtype {dtype!r}; expected one of {sorted(_DTYPES)}")
        self.model_path = model_path
        self.dtype = _DTYPES[dtype]
        # transformers' loader is typed loosely; the runner treats the model as dynamic.
        loaded: Any = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=self.dtype)
        self.model: Any = loaded.eval()
        config = self.model.config
        self.num_layers = int(config.num_hidden_layers)
        self.top_k = int(getattr(config, "num_experts_per_tok", 0) or 0)
        self.max_positions = int(getattr(config, "max_position_embeddings", 2**31 - 1))
        self.vocab_size = int(config.vocab_size)
        self.eos_ids = _eos_ids(self.model)
        self._captured: dict[int, torch.Tensor] = {}
        self._layout: CheckpointLayout | None = None  # found on the first load_named
        self.supports_routing = self._install_router_hooks() > 0 and self.top_k > 0

    def _install_router_hooks(self) -> int:
        count = 0
        for name, module in self.model.named_modules():
            match = _LAYER.search(name)
            if match is None or not type(module).__name__.endswith("Router"):
                continue
            module.register_forward_hook(self._hook_for(int(match.group(1))))
            count += 1
        return count

    def _hook_for(self, layer: int) -> Any:
        def hook(_module: object, _inputs: object, output: object) -> None:
            if isinstance(output, tuple):
                ints = [
                    t for t in output if isinstance(t, torch.Tensor) and not t.is_floating_point()
                ]
                if ints:
                    self._captured[layer] = ints[-1].detach()

        return hook

    def _routing(self, tokens: int) -> npt.NDArray[np.int32] | None:
        if not self.supports_routing:
            return None
        rows = np.zeros((tokens, self.num_layers, self.top_k), dtype=np.int32)
        for layer, ids in self._captured.items():
            rows[:, layer, :] = ids.reshape(tokens, self.top_k).numpy()
        self._captured.clear()
        return rows

    def _forward(self, ids: list[int], cache: Any, all_logits: bool) -> tuple[ForwardResult, Any]:
        self._captured.clear()
        with torch.inference_mode():
            out = self.model(
                input_ids=torch.tensor([ids], dtype=torch.long),
                cache=cache,
                use_cache=True,
                logits_to_keep=0 if all_logits else 1,
            )
        logits = out.logits[0].to(torch.float32)
        return ForwardResult(logits=logits, routing=self._routing(len(ids))), out.cache

    def prefill(self, prompt: list[int], *, all_logits: bool = False) -> tuple[ForwardResult, Any]:
        """Run the prompt; return its logits/routing and the new KV cache."""
        return self._forward(prompt, None, all_logits)

    def decode(self, token: int, cache: Any) -> ForwardResult:
        """Feed one token through ``cache`` (extended in place)."""
        result, _ = self._forward([token], cache, False)
        return result

    def reload(self, model_path: Path) -> None:
        """Load ``model_path``'s weights into the running model (same architecture only)."""
        try:
            fresh = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=self.dtype)
        except (OSError, ValueError) as exc:
            raise InvalidRequest(f"Failed to load weights from {model_path}: {exc}") from exc
        try:
            self.model.load_state_dict(fresh.state_dict(), strict=True)
        except RuntimeError as exc:
            raise InvalidRequest(f"Weights at {model_path} do not fit the model: {exc}") from exc
        fresh_gen = getattr(fresh, "generation_config", None)
        if isinstance(fresh_gen, GenerationConfig):
            self.model.generation_config = fresh_gen
        self.model_path = model_path

    def load_named(self, named: Sequence[tuple[str, torch.Tensor]]) -> None:
        """Copy checkpoint-named tensors into the running model, in place; the rest stay
        as they are. Every name and shape is checked before anything changes."""
        if self._layout is None:
            self._layout = CheckpointLayout.of(self.model)
            if self._layout is None:
                raise Unsupported(
                    "this model's checkpoint tensors are not a rearrangement of its "
                    "parameters; update it from disk"
                )
        self._layout.load(self.model, named)
