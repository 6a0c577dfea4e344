"""Client of SGLang's native ``/generate`` protocol (token ids in, token ids out).

Owns: building the ``/generate`` body, reading its SSE stream in either of SGLang's
streaming modes, decoding routed experts, aborting by ``rid``, mapping transport and
backend failures onto ``kernel.errors``, and choosing a worker when there are several.

Workers: ``SGLangBackend`` takes one URL (a worker or an sglang-router, which does its own
routing on the ``X-SMG-Routing-Key`` header) or a list of workers. With a list, a session
goes to the worker ranked first for its routing key by rendezvous hashing among the
workers believed up, so every replica of the proxy picks the same worker for a session
without talking to the others, and a worker going down moves only its own sessions. A
worker is marked down when a connection to it fails or a stream from it breaks, and a
background probe of ``/health`` (``start``/``close``) marks it up again. A turn whose
connection failed before anything was sent moves to the next worker; a turn whose stream
broke is not re-sent (it was already sampling) and ends in a retryable ``BackendError``.

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

import asyncio
import base64
import contextlib
import hashlib
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import httpx
import numpy as np
import orjson

from kernel.errors import BackendError, BackendUnavailable, ContextLengthExceeded
from proxy.tokens import TokenIds
from recorder.records import RoutedExperts

ROUTING_KEY_HEADER = "X-SMG-Routing-Key"

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ExpertShape:
    """Layers and top-k of the served MoE model; needed to decode routed experts."""

    num_layers: int
    top_k: int


@dataclass(frozen=True, slots=True)
class GenerateCall:
    input_ids: Sequence[int]  # TokenIds on the hot path: serialised from its int32 array
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


class _Worker:
    """One SGLang endpoint and what this process currently believes about it."""

    __slots__ = ("up", "url")

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self.up = True


def rendezvous_order(routing_key: str, urls: Sequence[str]) -> list[str]:
    """``urls`` ranked for ``routing_key`` by highest random weight (rendezvous) hashing.

    Deterministic across processes (no per-process hash seed), so replicas agree; removing
    a URL changes the first choice only of the keys that ranked it first.
    """

    def weight(url: str) -> bytes:
        return hashlib.blake2b(f"{routing_key}\0{url}".encode(), digest_size=8).digest()

    return sorted(urls, key=weight, reverse=True)


class SGLangBackend:
    """SGLang endpoints (one worker, one sglang-router, or several workers) over a pooled
    HTTP client owned by the caller."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        base_urls: str | Sequence[str],
        expert_shape: ExpertShape | None,
        *,
        health_interval_s: float = 5.0,
        probe_timeout_s: float = 1.0,
    ) -> None:
        urls = [base_urls] if isinstance(base_urls, str) else list(base_urls)
        if not urls:
            raise ValueError("SGLangBackend needs at least one URL")
        self._client = client
        self._workers = {w.url: w for w in (_Worker(url) for url in urls)}
        self._experts = expert_shape
        self._health_interval_s = health_interval_s
        self._probe_timeout_s = probe_timeout_s
        self._inflight: dict[str, _Worker] = {}  # rid -> worker, so an abort finds it
        self._prober: asyncio.Task[None] | None = None

    def is_up(self, url: str) -> bool:
        return self._workers[url.rstrip("/")].up

    def route(self, routing_key: str) -> list[str]:
        """Workers to try for ``routing_key``, best first: those believed up in rendezvous
        order, then the ones believed down (a stale belief must not refuse every turn)."""
        ranked = rendezvous_order(routing_key, list(self._workers))
        return [u for u in ranked if self._workers[u].up] + [
            u for u in ranked if not self._workers[u].up
        ]

    # -- lifecycle ---------------------------------------------------------------
    def start(self) -> None:
        """Probe workers in the background; pointless (and skipped) with a single URL."""
        if len(self._workers) > 1 and self._prober is None:
            self._prober = asyncio.create_task(self._probe_forever(), name="backend-prober")

    async def close(self) -> None:
        if self._prober is not None:
            self._prober.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._prober
            self._prober = None

    async def _probe_forever(self) -> None:
        while True:
            await asyncio.sleep(self._health_interval_s)
            await self.probe()

    async def probe(self) -> dict[str, bool]:
        """Ask every worker's ``/health`` at once (each within the probe timeout), record
        the answers and return them by URL."""
        urls = list(self._workers)
        answers = await asyncio.gather(*(self._answers(url) for url in urls))
        for url, up in zip(urls, answers, strict=True):
            self._mark(self._workers[url], up)
        return dict(zip(urls, answers, strict=True))

    async def _answers(self, url: str) -> bool:
        try:
            response = await self._client.get(f"{url}/health", timeout=self._probe_timeout_s)
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    def _mark(self, worker: _Worker, up: bool) -> None:
        if worker.up != up:
            _log.warning("backend worker %s is %s", worker.url, "up" if up else "down")
        worker.up = up

    # -- generation --------------------------------------------------------------
    async def generate(self, call: GenerateCall) -> AsyncIterator[GenerationDelta | GenerationEnd]:
        failures: list[str] = []
        for url in self.route(call.routing_key):
            worker = self._workers[url]
            try:
                response = await self._send(worker, call)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                # Nothing reached this worker, so the next one may take the turn without
                # making it two generations.
                self._mark(worker, False)
                failures.append(f"{url}: {exc!r}")
                continue
            except httpx.TransportError as exc:
                self._mark(worker, False)
                raise BackendUnavailable(f"backend unreachable at {url}: {exc!r}") from exc
            self._inflight[call.rid] = worker
            try:
                async for item in self._read(worker, response, call):
                    yield item
            finally:
                self._inflight.pop(call.rid, None)
            return
        raise BackendUnavailable(f"no backend worker reachable: {'; '.join(failures)}")

    async def _send(self, worker: _Worker, call: GenerateCall) -> httpx.Response:
        body: dict[str, object] = {
            "input_ids": call.input_ids.array
            if isinstance(call.input_ids, TokenIds)
            else list(call.input_ids),
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
            "POST",
            f"{worker.url}/generate",
            content=orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY),
            headers=headers,
        )
        return await self._client.send(request, stream=True)

    async def _read(
        self, worker: _Worker, response: httpx.Response, call: GenerateCall
    ) -> AsyncIterator[GenerationDelta | GenerationEnd]:
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
            # The worker died under us: the harness retries, and the retry must not land
            # on the same worker before a probe has seen it answer again.
            if len(self._workers) > 1:
                self._mark(worker, False)
            raise BackendError(f"backend stream from {worker.url} broke: {exc!r}") from exc
        finally:
            await response.aclose()

    async def abort(self, rid: str) -> None:
        """Best effort: the request may already be finished, which is fine. A ``rid`` no
        longer in flight here is aborted on every worker (an unknown rid is a no-op)."""
        worker = self._inflight.get(rid)
        targets = [worker] if worker is not None else list(self._workers.values())
        await asyncio.gather(*(self._abort_on(w, rid) for w in targets))

    async def _abort_on(self, worker: _Worker, rid: str) -> None:
        # A dead backend has nothing left to abort; the caller records the turn anyway.
        with contextlib.suppress(httpx.HTTPError):
            await self._client.post(f"{worker.url}/abort_request", json={"rid": rid}, timeout=5.0)

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
