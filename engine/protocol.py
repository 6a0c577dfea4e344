"""SGLang's native wire shapes: request bodies in, response bodies and SSE chunks out.

Owns the pydantic request models of the engine's HTTP edge (unknown top-level keys are
ignored, as SGLang's contract does) and ``OutputState``, which accumulates a request's
events and renders SGLang's response body: the whole body for a non-streaming call, and
per-chunk bodies when streaming, cumulative by default (full ``text``/``output_ids``/
``output_token_logprobs`` so far) or deltas in incremental mode. ``e2e_latency`` and
``routed_experts`` (base64 of little-endian C-contiguous int32 ``[rows, layers, top_k]``)
appear only on the final chunk, and so does ``weight_versions``: the spans of output tokens
each weight version sampled (``engine.weights``), after which ``weight_version`` names the
last of them. ``input_token_logprobs`` is ``[]`` until the final chunk
(SGLang sends it with the first chunk; the local engine computes it at the end).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np
import pybase64
from pydantic import BaseModel, ConfigDict

from engine.jobs import FinishEvent, GenerationJob, TokenEvent
from engine.weights import weight_version_spans

Decoder = Callable[[Sequence[int], bool], str]


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")


class GenerateBody(_Body):
    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: dict[str, Any] | None = None
    rid: str | None = None
    stream: bool = False
    return_logprob: bool | None = None
    logprob_start_len: int | None = None
    top_logprobs_num: int | None = None
    token_ids_logprob: list[int] | None = None
    return_text_in_logprobs: bool = False
    return_routed_experts: bool = False
    routed_experts_start_len: int | None = None
    return_prompt_token_ids: bool = False


class AbortBody(_Body):
    rid: str | None = ""
    abort_all: bool = False


class PauseBody(_Body):
    mode: str = "abort"


class UpdateWeightsFromDiskBody(_Body):
    model_path: str
    weight_version: str | None = None
    abort_all_requests: bool = False
    flush_cache: bool = True


class InitWeightsUpdateGroupBody(_Body):
    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    group_name: str = "weight_update_group"
    backend: str = "nccl"  # SGLang's default; the CPU engine takes "gloo" only


class DestroyWeightsUpdateGroupBody(_Body):
    group_name: str = "weight_update_group"


class BeginWeightUpdateBody(_Body):
    selector: Literal["target", "draft", "all"] = "all"


class EndWeightUpdateBody(_Body):
    pass


class UpdateWeightsFromDistributedBody(_Body):
    names: list[str]
    dtypes: list[str]
    shapes: list[list[int]]
    group_name: str = "weight_update_group"
    flush_cache: bool = True
    abort_all_requests: bool = False
    weight_version: str | None = None
    load_format: str | None = None  # "flattened_bucket": one broadcast of all the bytes
    selector: Literal["target", "draft", "all"] = "all"
    torch_empty_cache: bool = False


class UpdateWeightVersionBody(_Body):
    new_version: str
    abort_all_requests: bool = True


def encode_routed_experts(rows: np.ndarray[Any, np.dtype[np.int32]]) -> str:
    little = np.ascontiguousarray(rows, dtype="<i4")
    return pybase64.b64encode(little.tobytes()).decode("ascii")  # as SGLang encodes them


class OutputState:
    """One request's output so far, rendered as SGLang response bodies."""

    def __init__(
        self,
        job: GenerationJob,
        decode: Decoder,
        *,
        return_logprob: bool,
        text_in_logprobs: bool,
        return_routed_experts: bool,
        return_prompt_token_ids: bool,
        incremental: bool,
    ) -> None:
        self.job = job
        self._decode = decode
        self._return_logprob = return_logprob
        self._text_in_logprobs = text_in_logprobs
        self._return_routed = return_routed_experts
        self._return_prompt = return_prompt_token_ids
        self._incremental = incremental
        self.ids: list[int] = []
        self.logprobs: list[float] = []
        self._sent_ids = 0
        self._sent_chars = 0

    def add(self, event: TokenEvent) -> None:
        self.ids.append(event.token_id)
        self.logprobs.append(event.logprob)

    def _text(self, finish: FinishEvent | None) -> str:
        params = self.job.params
        ids = self.ids
        reason = finish.reason if finish is not None else None
        trim = reason is not None and reason.type == "stop" and not params.no_stop_trim
        if trim and reason is not None and isinstance(reason.matched, int) and ids:
            ids = ids[:-1]
        text = self._decode(ids, params.skip_special_tokens)
        if trim and reason is not None and isinstance(reason.matched, str):
            cut = text.find(reason.matched)
            text = text if cut < 0 else text[:cut]
        return text

    def _logprob_entries(self, start: int) -> list[list[object]]:
        return [
            [lp, tok, self._decode([tok], False) if self._text_in_logprobs else None]
            for lp, tok in zip(self.logprobs[start:], self.ids[start:], strict=True)
        ]

    def body(
        self,
        finish: FinishEvent | None,
        *,
        weight_version: str,
        e2e_latency: float,
    ) -> dict[str, object]:
        """The next response body: final when ``finish`` is given."""
        start = self._sent_ids if self._incremental else 0
        text = self._text(finish)
        if self._incremental:
            # Hold back a trailing partial UTF-8 character until its bytes are complete.
            stable = len(text) if finish is not None else len(text.rstrip("\ufffd"))
            out_text = text[self._sent_chars : stable]
            self._sent_chars = max(self._sent_chars, stable)
        else:
            out_text = text
        meta: dict[str, object] = {
            "id": self.job.rid,
            "finish_reason": finish.reason.to_json() if finish is not None else None,
            "prompt_tokens": len(self.job.prompt_ids),
            "weight_version": weight_version,
            "num_retractions": 0,
            "completion_tokens": len(self.ids),
            "cached_tokens": 0,
            "reasoning_tokens": 0,
        }
        if self._return_logprob:
            meta["output_token_logprobs"] = self._logprob_entries(start)
            meta["output_token_logprobs_length"] = len(self.ids) - start
            inputs = finish.input_logprobs if finish is not None else ()
            meta["input_token_logprobs"] = [[lp, tok, None] for lp, tok in inputs]
        if finish is not None:
            meta["e2e_latency"] = e2e_latency
            spans = weight_version_spans(finish.version_events, weight_version, len(self.ids))
            meta["weight_versions"] = spans
            meta["weight_version"] = spans[-1]["version"]
            if self._return_routed and finish.routed_experts is not None:
                meta["routed_experts"] = encode_routed_experts(finish.routed_experts)
        body: dict[str, object] = {
            "text": out_text,
            "output_ids": self.ids[start:],
            "meta_info": meta,
        }
        if self._return_prompt:
            body["prompt_token_ids"] = list(self.job.prompt_ids)
        self._sent_ids = len(self.ids)
        return body
