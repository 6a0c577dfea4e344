"""What SGLang checks before a ``/generate`` runs, in its words, and how each failure surfaces.

Owns ``Limits`` (the server's length limits, as ``/server_info`` reports them),
``Rejected``, ``check_request`` and ``scheduler_abort``. The stages follow SGLang 0.5.23:

1. The schema gate (``GenerateBody``, ``engine.sampling.parse_sampling_params``): an unknown
   or mistyped field is HTTP 400 before any stream starts.
2. The tokenizer's checks, ``check_request``: the prompt within the context length, prompt
   plus ``max_new_tokens`` within it (``TokenizerManager._validate_one_request``), and the
   sampling ranges (``SamplingParams.verify``). They raise ``Rejected``: HTTP 400
   ``{"error": {"message"}}`` without streaming, and with streaming HTTP 200 carrying one
   in-band chunk ``{"error": {"message", "type": "invalid_request_error", "code": 400,
   "retryable": false}}`` before ``[DONE]``.
3. The scheduler's checks, ``scheduler_abort``: the prompt shorter than
   ``max_req_input_len``, ``logprob_start_len`` and ``routed_experts_start_len`` within the
   prompt. A failure ends the request at once as ``finish_reason`` abort with
   ``status_code`` 400 and no output: the final chunk of a stream, HTTP 400 otherwise.

Limits: ``context_len`` is ``--context-length`` or the model's ``max_position_embeddings``;
``max_req_len = min(context_len - 1, max_total_tokens - 1)`` and ``max_req_input_len =
max_req_len - 5`` (``TpModelWorker``). The scheduler then quietly caps ``max_new_tokens`` at
``max_req_len - prompt - 1`` (``Scheduler.init_req_max_new_tokens``).
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.sampling import SamplingParams, verify_sampling_params
from kernel.errors import InvalidRequest

BAD_REQUEST = 400


@dataclass(frozen=True)
class Limits:
    context_len: int
    max_total_tokens: int | None  # the KV pool's size; None: unbounded (no pool here)

    @property
    def max_req_len(self) -> int:
        pool = self.max_total_tokens if self.max_total_tokens is not None else self.context_len
        return min(self.context_len - 1, pool - 1)

    @property
    def max_req_input_len(self) -> int:
        return self.max_req_len - 5

    def capped_max_new_tokens(self, prompt_len: int, requested: int) -> int:
        return max(0, min(requested, self.max_req_len - prompt_len - 1))


class Rejected(InvalidRequest):
    """A ValueError of SGLang's tokenizer stage: in band when streaming, else HTTP 400."""


def check_request(prompt_len: int, params: SamplingParams, limits: Limits) -> None:
    context = limits.context_len
    if prompt_len >= context:
        raise Rejected(
            f"The input ({prompt_len} tokens) is longer than the model's context length "
            f"({context} tokens)."
        )
    if prompt_len + params.max_new_tokens > context:
        raise Rejected(
            "Requested token count exceeds the model's maximum context length of "
            f"{context} tokens. You requested a total of {prompt_len + params.max_new_tokens} "
            f"tokens: {prompt_len} tokens from the input messages and {params.max_new_tokens} "
            "tokens for the completion. Please reduce the number of tokens in the input "
            "messages or the completion to fit within the limit."
        )
    try:
        verify_sampling_params(params)
    except InvalidRequest as exc:
        raise Rejected(exc.message) from exc


def scheduler_abort(
    prompt_len: int,
    *,
    logprob_start_len: int,
    routed_experts_start_len: int | None,
    limits: Limits,
) -> str | None:
    """The message of the 400 abort the scheduler would end this request with, if any."""
    if prompt_len >= limits.max_req_input_len:
        return (
            f"Input length ({prompt_len} tokens) exceeds the maximum allowed length "
            f"({limits.max_req_input_len} tokens). Use a shorter input or enable "
            "--allow-auto-truncate."
        )
    if logprob_start_len > prompt_len:
        return (
            f"req.logprob_start_len={logprob_start_len} is higher than the number of input "
            f"tokens len(req.origin_input_ids)={prompt_len}. Please use a smaller "
            "logprob_start_len."
        )
    start = routed_experts_start_len
    if start is not None and start < 0:
        return (
            f"recv_req.routed_experts_start_len={start} is lower than 0. Please use a "
            "non-negative routed_experts_start_len."
        )
    if start is not None and start > prompt_len:
        return (
            f"recv_req.routed_experts_start_len={start} is higher than the number of input "
            f"tokens len(req.origin_input_ids)={prompt_len}. Please use a smaller "
            "routed_experts_start_len."
        )
    return None
