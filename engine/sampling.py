"""SGLang ``sampling_params``: parsing with SGLang's contract, and token selection.

Owns ``SamplingParams`` (frozen), ``parse_sampling_params(raw)``,
``verify_sampling_params(params)`` and ``choose_token``.

Parsing follows SGLang 0.5.23's schema gate: only SGLang's own keys are accepted (an
unknown key raises ``SamplingContractError``, rendered as HTTP 400 ``{"error": "unknown
field `x`, expected one of ..."}``), values must have the right types, and ``null`` means
the default. Ranges are checked separately by ``verify_sampling_params``, with SGLang's
rules and wording (``SamplingParams.verify``), because SGLang checks them later, inside the
request (a streamed request then fails in band). Keys that ask for constrained decoding,
beams, watermarks or more than one sample (``json_schema``, ``regex``, ``ebnf``,
``structural_tag``, ``choice``, ``beam_width``, ``watermark``, ``custom_params``, ``n`` > 1)
are refused with ``Unsupported`` rather than silently ignored.
``spaces_between_special_tokens`` is accepted and has no effect (fast tokenizers ignore it).

Selection: temperature below 1e-6 is greedy; otherwise penalties, ``logit_bias``,
temperature, ``top_k``, ``top_p`` and ``min_p`` shape the distribution and a per-request
``torch.Generator`` draws from it. Stop tokens are masked until ``min_new_tokens``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kernel.errors import InvalidRequest, Unsupported

if TYPE_CHECKING:
    import torch

SAMPLING_KEYS = (
    "max_new_tokens",
    "stop",
    "stop_token_ids",
    "stop_regex",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "min_new_tokens",
    "n",
    "json_schema",
    "regex",
    "ebnf",
    "structural_tag",
    "ignore_eos",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "no_stop_trim",
    "custom_params",
    "stream_interval",
    "logit_bias",
    "sampling_seed",
    "beam_width",
    "watermark",
    "choice",
)
_REFUSED: tuple[str, ...] = (
    "json_schema",
    "regex",
    "ebnf",
    "structural_tag",
    "choice",
    "beam_width",
    "watermark",
    "custom_params",
)
GREEDY_EPS = 1e-6


class SamplingContractError(InvalidRequest):
    """A ``sampling_params`` body SGLang's schema gate would reject (plain-string error)."""

    code = "contract_error"


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 128
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    stop_regex: tuple[str, ...] = ()
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1: the whole vocabulary
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_new_tokens: int = 0
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    stream_interval: int = 1
    logit_bias: tuple[tuple[int, float], ...] = ()
    sampling_seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_EPS


def _strs(value: object, key: str) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise InvalidRequest(f"sampling_params.{key} must be a string or a list of strings")


def _num(value: object, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidRequest(f"sampling_params.{key} must be a number")
    return float(value)


def _int(value: object, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequest(f"sampling_params.{key} must be an integer")
    return value


def _bool(value: object, key: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidRequest(f"sampling_params.{key} must be a boolean")
    return value


def parse_sampling_params(raw: Mapping[str, object] | None) -> SamplingParams:
    """Validate an SGLang ``sampling_params`` object; raise on anything SGLang would refuse."""
    given = {k: v for k, v in (raw or {}).items() if v is not None}
    for key in given:
        if key not in SAMPLING_KEYS:
            expected = ", ".join(f"`{k}`" for k in SAMPLING_KEYS)
            raise SamplingContractError(f"unknown field `{key}`, expected one of {expected}")
    for key in _REFUSED:
        if key in given:
            raise Unsupported(f"sampling_params.{key} is not supported by the local engine")
    if _int(given.get("n", 1), "n") != 1:
        raise Unsupported("sampling_params.n > 1 is not supported by the local engine")
    ids = given.get("stop_token_ids", [])
    if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
        raise InvalidRequest("sampling_params.stop_token_ids must be a list of integers")
    bias = given.get("logit_bias", {})
    if not isinstance(bias, dict):
        raise InvalidRequest("sampling_params.logit_bias must be an object")
    try:
        bias_items = tuple(sorted((int(k), _num(v, "logit_bias")) for k, v in bias.items()))
    except ValueError as exc:
        raise InvalidRequest("sampling_params.logit_bias keys must be token ids") from exc
    seed = given.get("sampling_seed")
    return SamplingParams(
        max_new_tokens=_int(given.get("max_new_tokens", 128), "max_new_tokens"),
        stop=_strs(given.get("stop", []), "stop"),
        stop_token_ids=tuple(ids),
        stop_regex=_strs(given.get("stop_regex", []), "stop_regex"),
        temperature=_num(given.get("temperature", 1.0), "temperature"),
        top_p=_num(given.get("top_p", 1.0), "top_p"),
        top_k=_int(given.get("top_k", -1), "top_k"),
        min_p=_num(given.get("min_p", 0.0), "min_p"),
        frequency_penalty=_num(given.get("frequency_penalty", 0.0), "frequency_penalty"),
        presence_penalty=_num(given.get("presence_penalty", 0.0), "presence_penalty"),
        repetition_penalty=_num(given.get("repetition_penalty", 1.0), "repetition_penalty"),
        min_new_tokens=_int(given.get("min_new_tokens", 0), "min_new_tokens"),
        ignore_eos=_bool(given.get("ignore_eos", False), "ignore_eos"),
        skip_special_tokens=_bool(given.get("skip_special_tokens", True), "skip_special_tokens"),
        spaces_between_special_tokens=_bool(
            given.get("spaces_between_special_tokens", True), "spaces_between_special_tokens"
        ),
        no_stop_trim=_bool(given.get("no_stop_trim", False), "no_stop_trim"),
        stream_interval=_int(given.get("stream_interval", 1), "stream_interval"),
        logit_bias=bias_items,
        sampling_seed=None if seed is None else _int(seed, "sampling_seed"),
    )


def verify_sampling_params(p: SamplingParams) -> None:
    """SGLang's ``SamplingParams.verify``; raise ``InvalidRequest`` with its message."""
    if not math.isfinite(p.temperature) or p.temperature < 0:
        raise InvalidRequest(
            f"temperature must be a non-negative finite number, got {p.temperature}."
        )
    if not 0 < p.top_p <= 1:
        raise InvalidRequest(f"top_p must be in (0, 1], got {p.top_p}.")
    if not 0 <= p.min_p <= 1:
        raise InvalidRequest(f"min_p must be in [0, 1], got {p.min_p}.")
    # SGLang turns a greedy temperature into top_k = 1 before it checks top_k.
    if not p.greedy and (p.top_k == 0 or p.top_k < -1):
        raise InvalidRequest(f"top_k must be -1 (disable) or at least 1, got {p.top_k}.")
    if not -2 <= p.frequency_penalty <= 2:
        raise InvalidRequest(f"frequency_penalty must be in [-2, 2], got {p.frequency_penalty}.")
    if not -2 <= p.presence_penalty <= 2:
        raise InvalidRequest(f"presence_penalty must be in [-2, 2], got {p.presence_penalty}.")
    if not 0 < p.repetition_penalty <= 2:
        raise InvalidRequest(
            f"repetition_penalty must be in (0, 2] (1.0 = no penalty), got {p.repetition_penalty}."
        )
    if p.max_new_tokens < 0:
        raise InvalidRequest(f"max_new_tokens must be at least 0, got {p.max_new_tokens}.")
    if not 0 <= p.min_new_tokens <= p.max_new_tokens:
        raise InvalidRequest(
            f"min_new_tokens must be in [0, max_new_tokens({p.max_new_tokens})], got "
            f"{p.min_new_tokens}."
        )
    if p.sampling_seed is not None and not -(2**63) <= p.sampling_seed <= 2**63 - 1:
        raise InvalidRequest(
            f"sampling_seed must be in [-2**63, 2**63 - 1], got {p.sampling_seed}."
        )
    if p.stream_interval < 1:
        raise InvalidRequest("stream_interval must be at least 1")
    for pattern in p.stop_regex:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise InvalidRequest(f"sampling_params.stop_regex is not a valid regex: {exc}") from exc


def _penalised(
    logits: torch.Tensor, params: SamplingParams, seen: Sequence[int], generated: Sequence[int]
) -> torch.Tensor:
    import torch

    out = logits.clone()
    if params.repetition_penalty != 1.0 and seen:
        idx = torch.tensor(sorted(set(seen)), dtype=torch.long)
        vals = out[idx]
        rp = params.repetition_penalty
        out[idx] = torch.where(vals > 0, vals / rp, vals * rp)
    if (params.frequency_penalty or params.presence_penalty) and generated:
        counts = torch.bincount(torch.tensor(generated), minlength=out.numel()).to(out.dtype)
        out -= params.frequency_penalty * counts + params.presence_penalty * (counts > 0)
    for token, bias in params.logit_bias:
        if 0 <= token < out.numel():
            out[token] += bias
    return out


def choose_token(
    logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator,
    *,
    seen: Sequence[int],
    generated: Sequence[int],
    banned: Sequence[int],
) -> int:
    """Pick the next token from 1-D float32 ``logits`` (``banned`` ids get probability 0)."""
    import torch

    shaped = _penalised(logits, params, seen, generated)
    if banned:
        shaped[torch.tensor(list(banned), dtype=torch.long)] = float("-inf")
    if params.greedy:
        return int(torch.argmax(shaped).item())
    probs = torch.softmax(shaped / params.temperature, dim=-1)
    if params.top_k > 0 and params.top_k < probs.numel():
        kth = torch.topk(probs, params.top_k).values[-1]
        probs = torch.where(probs >= kth, probs, torch.zeros_like(probs))
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        before = torch.cumsum(sorted_probs, dim=0) - sorted_probs
        sorted_probs[before > params.top_p * sorted_probs.sum()] = 0.0
        probs = torch.zeros_like(probs).scatter(0, order, sorted_probs)
    if params.min_p > 0.0:
        probs = torch.where(probs >= params.min_p * probs.max(), probs, torch.zeros_like(probs))
    return int(torch.multinomial(probs, 1, generator=generator).item())
