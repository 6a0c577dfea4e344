"""Client of SGLang's native ``/generate`` protocol (token ids in, token ids out).

Owns: building the ``/generate`` body, reading its SSE stream in either of SGLang's
streaming modes, decoding routed experts, aborting by ``rid``, and mapping transport and
backend failures onto ``proxy.errors``.

Contract: ``SGLangBackend.generate`` yields ``GenerationDelta``s (only the newly sampled ids
and their logprobs, whatever the server's streaming mode) and ends with exactly one
``GenerationEnd``. Streamed chunks are cumulative by default and deltas when the server
runs with ``--incremental-streaming-output``; SGLang's ``meta_info.completion_tokens`` is
always the cumulative count, so a chunk whose id list is as long as that count is
cumulative and anything shorter is a delta. The ids and logprobs are taken from
``meta_info.output_token_logprobs`` (``[logprob, id, null]`` triples) and cross-checked
against ``output_ids``.
"""

from __future__ import annotations

import base64
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import numpy as np
import orjson

from proxy.errors import BackendError, BackendUnavailable, ContextLengthExceeded
from recorder.records import RoutedExperts

ROUTING_KEY_HEADER = "X-SMG-Routing-Key"


@dataclass(frozen=True, slots=True)
class ExpertShape:
    """Layers and top-k of the served MoE model; needed to decode routed experts."""

    num_layers: int
    top_k: int


@dataclass(frozen=True, slots=True)
class GenerateCall:
    input_ids: tuple[int, ...]
    sampling_params: dict[str, object]
    rid: str
    routing_key: str
    routed_experts_start_len: int | None = None  # None: do not ask for routed experts


@dataclass(frozen=True, slots=True)
class GenerationDelta:
    ids: tuple[int, ...]
    logprobs: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class Finish:
    """SGLang's ``finish_reason`` object."""

    type: str  # stop | length | abort
    matched: int | str | None = None
    message: str | None = None


@dataclass(frozen=True, slots=True, eq=False)
class GenerationEnd:
    finish: Finish
    weight_version: str
    prompt_tokens: int
    routed_experts: RoutedExperts | None


class SGLangBackend:
    """One SGLang endpoint (a worker or an sglang-router) over a pooled HTTP client."""

    def __init__(
        self, client: httpx.AsyncClient, base_url: str, expert_shape: ExpertShape | None
    ) -> None:
        self._client = client
        self._base = base_url.rstrip("/")
        self._experts = expert_shape

    @property
    def base_url(self) -> str:
        return self._base

    @property
    def captures_experts(self) -> bool:
        return self._experts is not None

    async def generate(self, call: GenerateCall) -> AsyncIterator[GenerationDelta | GenerationEnd]:
        body: dict[str, object] = {
            "input_ids": list(call.input_ids),
            "sampling_params": call.sampling_params,
            "rid": call.rid,
            "stream": True,
            "return_logprob": True,
        }
        if call.routed_experts_start_len is not None and self._experts is not None:
            body["return_routed_experts"] = True
            body["routed_experts_start_len"] = call.routed_experts_start_len
        headers = {ROUTING_KEY_HEADER: call.routing_key, "content-type": "application/json"}
        request = self._client.build_request(
            "POST", f"{self._base}/generate", content=orjson.dumps(body), headers=headers
        )
        try:
            response = await self._client.send(request, stream=True)
        except httpx.TransportError as exc:
            raise BackendUnavailable(f"backend unreachable at {self._base}: {exc!r}") from exc
        try:
            if response.status_code != 200:
                await response.aread()
                raise _http_error(response)
            seen = 0
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    break
                chunk = orjson.loads(payload)
                if "error" in chunk:
                    raise _inband_error(chunk["error"])
                delta, seen = _delta(chunk, seen)
                if delta.ids:
                    yield delta
                meta = chunk.get("meta_info", {})
                finish = meta.get("finish_reason")
                if finish is not None:
                    yield GenerationEnd(
                        finish=Finish(
                            type=str(finish.get("type")),
                            matched=finish.get("matched"),
                            message=finish.get("message"),
                        ),
                        weight_version=str(meta.get("weight_version", "default")),
                        prompt_tokens=int(meta.get("prompt_tokens", len(call.input_ids))),
                        routed_experts=self._decode_experts(
                            meta.get("routed_experts"), call.routed_experts_start_len or 0
                        ),
                    )
                    return
            raise BackendError("backend stream ended without a finish reason")
        except httpx.TransportError as exc:
            raise BackendError(f"backend stream broke: {exc!r}") from exc
        finally:
            await response.aclose()

    async def abort(self, rid: str) -> None:
        """Best effort: the request may already be finished, which is fine."""
        # A dead backend has nothing left to abort; the caller records the turn anyway.
        with contextlib.suppress(httpx.HTTPError):
            await self._client.post(f"{self._base}/abort_request", json={"rid": rid}, timeout=5.0)

    async def healthy(self) -> bool:
        try:
            response = await self._client.get(f"{self._base}/health", timeout=2.0)
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    def _decode_experts(self, encoded: object, start: int) -> RoutedExperts | None:
        if self._experts is None or not isinstance(encoded, str):
            return None
        flat = np.frombuffer(base64.b64decode(encoded), dtype="<i4")
        per_row = self._experts.num_layers * self._experts.top_k
        if flat.size % per_row:
            raise BackendError(
                f"routed experts payload of {flat.size} ids is not a multiple of "
                f"{self._experts.num_layers} layers x top-{self._experts.top_k}",
                retryable=False,
            )
        rows = flat.reshape(-1, self._experts.num_layers, self._experts.top_k).astype(np.int32)
        return RoutedExperts(start=start, rows=rows)


def _delta(chunk: dict[str, object], seen: int) -> tuple[GenerationDelta, int]:
    meta = chunk.get("meta_info")
    if not isinstance(meta, dict):
        raise BackendError("backend chunk without meta_info", retryable=False)
    triples = meta.get("output_token_logprobs") or []
    output_ids = chunk.get("output_ids") or []
    if not isinstance(triples, list) or not isinstance(output_ids, list):
        raise BackendError("backend chunk with malformed output", retryable=False)
    total = int(meta.get("completion_tokens", len(output_ids)))
    cumulative = len(output_ids) == total
    new_ids = output_ids[seen:] if cumulative else output_ids
    new_triples = triples[seen:] if len(triples) == total else triples
    if len(new_triples) != len(new_ids):
        raise BackendError(
            f"backend returned {len(new_ids)} ids but {len(new_triples)} logprobs",
            retryable=False,
        )
    ids = tuple(int(i) for i in new_ids)
    if any(int(t[1]) != i for t, i in zip(new_triples, ids, strict=True)):
        raise BackendError("backend logprob ids disagree with output_ids", retryable=False)
    logprobs = tuple(float(t[0]) for t in new_triples)
    return GenerationDelta(ids, logprobs), seen + len(ids)


def _error_message(payload: object) -> str:
    if isinstance(payload, dict):
        inner = payload.get("error", payload)
        if isinstance(inner, dict):
            return str(inner.get("message", inner))
        return str(inner)
    return str(payload)


def _http_error(response: httpx.Response) -> BackendError | ContextLengthExceeded:
    try:
        message = _error_message(orjson.loads(response.content))
    except orjson.JSONDecodeError:
        message = response.text[:500]
    if response.status_code == 400 and "length" in message.lower():
        return ContextLengthExceeded(f"the backend rejected the prompt: {message}")
    retryable = response.status_code >= 500 or response.status_code == 429
    return BackendError(
        f"backend answered HTTP {response.status_code}: {message}",
        retryable=retryable,
        backend_status=response.status_code,
    )


def _inband_error(error: object) -> BackendError:
    retryable = True
    if isinstance(error, dict) and error.get("retryable") is False:
        retryable = False
    return BackendError(f"backend failed mid-stream: {_error_message(error)}", retryable=retryable)
