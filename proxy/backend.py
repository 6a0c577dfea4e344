"""Client of SGLang's native ``/generate`` protocol (token ids in, token ids out).

Owns: building the ``/generate`` body, reading its SSE stream in either of SGLang's
streaming modes, decoding routed experts, aborting by ``rid``, mapping transport and
backend failures onto ``kernel.errors``, choosing a worker when there are several, and
reading every worker's ``/server_info`` into the limits the pipeline keeps to.

Connections: generations (``/generate``, the hot path) go over one
``proxy.stream_client.StreamClient``, which keeps a pool of keep-alive connections per worker
for the life of the backend; every other call (``/health``, ``/server_info``, ``/workers``,
``/abort_request``) over the caller's pooled ``httpx.AsyncClient``. Per streamed generation
httpx (h11 over anyio) cost 1.2 ms of CPU, aiohttp 0.16-0.22 ms and the stream client
0.06 ms (docs/performance.md). The stream client is the caller's when given (``create_app``
builds it next to the httpx client), else the backend's own, closed by ``close()``.

Workers: ``SGLangBackend`` takes one URL (a worker or an smg router, which does its own
routing on the ``X-SMG-Routing-Key`` header) or a list of workers. ``connect`` tells a router
from a worker by its ``GET /workers`` (smg answers ``{"workers": [...]}``; SGLang has no such
route) and, behind a router, sends the calls smg does not route (``/abort_request``,
``/server_info``) to the workers it lists. With a list, a session
goes to the worker ranked first for its routing key by rendezvous hashing among the
workers believed up, so every replica of the proxy picks the same worker for a session
without talking to the others, and a worker going down moves only its own sessions. A
worker is marked down when a connection to it fails or a stream from it breaks, and a
background probe of ``/health`` (``start``/``close``) marks it up again. A turn whose
connection failed before anything was sent moves to the next worker; a turn whose stream
broke is not re-sent (it was already sampling) and ends in a retryable ``BackendError``.
A worker a trainer took out of rotation after a failed weight sync (``exclude``, from the
database's ``worker_exclusions``) gets no turn, in list mode, until it is put back.
The same background probe re-reads a router's worker list and reads the ``/server_info``
of every worker it has not read yet (one that joined, or was down at start-up): the limits
tighten to the new worker's, and a worker that cannot serve what the proxy records
(``proxy.server_info.assess``) is logged and, in list mode, never routed to.

Failures as SGLang 0.5.23 reports them: an abort whose ``status_code`` is null (a pause,
a weight update, ``/abort_request``) ends the generation normally and the pipeline may
resume it; an abort with a status, an HTTP error and an in-band ``{"error": {"code"}}``
chunk are raised: 400 as ``ContextLengthExceeded`` when the message is about the context
or input length, else ``InvalidRequest`` (a deterministic refusal: resending cannot help),
5xx and 429 as a retryable ``BackendError``.

Contract: ``SGLangBackend.generate`` yields ``GenerationDelta``s (only the newly sampled ids
and their logprobs, whatever the server's streaming mode) and ends with exactly one
``GenerationEnd``, which carries SGLang's ``meta_info.weight_versions`` spans (positions
over this call's output) when the server sent them. Streamed chunks are cumulative by
default and deltas when the server runs with ``--incremental-streaming-output``; SGLang's
``meta_info.completion_tokens`` is always the cumulative count, so a chunk whose id list is
as long as that count is cumulative and anything shorter is a delta
(``proxy.backend_wire``). The chunks that arrive together (one read: a loaded proxy reads
less often than tokens come) are yielded as one delta, so the output parser runs once for
them; from a worker whose ``/server_info`` says it streams cumulative chunks only the last
of them is parsed (the others hold nothing it does not).
"""

from __future__ import annotations

import asyncio
import binascii
import contextlib
import hashlib
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass

import httpx
import numpy as np
import orjson
import pybase64

from kernel.errors import BackendError, BackendMisconfigured, BackendUnavailable
from proxy.backend_wire import (
    GenerationDelta,
    SseData,
    http_error,
    inband_error,
    read_delta,
    refusal,
    spans,
)
from proxy.server_info import BackendLimits, ServerInfo, assess, parse_server_info
from proxy.stream_client import BackendConnection, ConnectFailed, StreamBroken, StreamClient
from proxy.tokens import TokenIds
from recorder.records import RoutedExperts

ROUTING_KEY_HEADER = "X-SMG-Routing-Key"
CONNECT_TIMEOUT_S = 5.0
KEEPALIVE_S = 4.0  # an idle pooled generation connection is closed after this
# How long the end of a finished stream may take to arrive before its connection is dropped.
SETTLE_TIMEOUT_S = 1.0

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
class Finish:
    """SGLang's ``finish_reason`` object."""

    type: str  # stop | length | abort
    matched: int | str | None = None
    message: str | None = None
    status_code: int | None = None  # an abort's: null means resumable (pause, user abort)


@dataclass(frozen=True, slots=True, eq=False)
class GenerationEnd:
    finish: Finish
    weight_version: str
    prompt_tokens: int
    routed_experts: RoutedExperts | None
    # SGLang's (version, start, end) over this call's output; () when it sent none.
    weight_version_spans: tuple[tuple[str, int, int], ...] = ()


class _Worker:
    """One SGLang endpoint and what this process currently believes about it."""

    __slots__ = ("incompatible", "up", "url")

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self.up = True
        self.incompatible: str | None = None  # why it must not serve turns, if it must not


def rendezvous_order(routing_key: str, urls: Sequence[str]) -> list[str]:
    """``urls`` ranked for ``routing_key`` by highest random weight (rendezvous) hashing.

    Deterministic across processes (no per-process hash seed), so replicas agree; removing
    a URL changes the first choice only of the keys that ranked it first.
    """

    def weight(url: str) -> bytes:
        return hashlib.blake2b(f"{routing_key}\0{url}".encode(), digest_size=8).digest()

    return sorted(urls, key=weight, reverse=True)


class SGLangBackend:
    """SGLang endpoints (one worker, one smg router, or several workers) over a pooled
    HTTP client owned by the caller."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        base_urls: str | Sequence[str],
        expert_shape: ExpertShape | None,
        *,
        health_interval_s: float = 5.0,
        probe_timeout_s: float = 1.0,
        context_length: int = 2**31 - 1,
        require_experts: bool = False,
        streams: StreamClient | None = None,
        read_timeout_s: float = 1800.0,
    ) -> None:
        urls = [base_urls] if isinstance(base_urls, str) else list(base_urls)
        if not urls:
            raise ValueError("SGLangBackend needs at least one URL")
        self._client = client
        self._own_streams = streams is None  # then this backend's own, closed here
        self._streams = streams if streams is not None else stream_client()
        self._read_timeout_s = read_timeout_s
        self._workers = {w.url: w for w in (_Worker(url) for url in urls)}
        self._experts = expert_shape
        self._health_interval_s = health_interval_s
        self._probe_timeout_s = probe_timeout_s
        self._inflight: dict[str, _Worker] = {}  # rid -> worker, so an abort finds it
        self._prober: asyncio.Task[None] | None = None
        self._context_length = context_length
        self._require_experts = require_experts and expert_shape is not None
        self._router: str | None = None  # the smg router, when the one URL is one
        self._behind_router: tuple[str, ...] = ()  # its workers, for the calls it drops
        self._infos: dict[str, ServerInfo] = {}
        self._unchecked: set[str] = set()  # answered, but without a /server_info
        self._excluded: dict[str, str] = {}  # url -> why a trainer took it out of rotation
        self.limits = BackendLimits.of(context_length)

    def is_up(self, url: str) -> bool:
        return self._workers[url.rstrip("/")].up

    @property
    def router(self) -> str | None:
        return self._router

    @property
    def control_urls(self) -> tuple[str, ...]:
        """The SGLang workers themselves: behind a router, those it lists."""
        if self._router is not None:
            return self._behind_router
        return tuple(self._workers)

    def exclude(self, excluded: Mapping[str, str]) -> None:
        """The workers a trainer took out of rotation (url -> why; the database's
        ``worker_exclusions``, which every replica polls): no turn goes to them."""
        known = {url.rstrip("/"): why for url, why in excluded.items()}
        for url in self._workers:
            if url in known and url not in self._excluded:
                _log.warning("backend worker %s is out of rotation: %s", url, known[url])
            elif url in self._excluded and url not in known:
                _log.warning("backend worker %s is back in rotation", url)
        self._excluded = {url: why for url, why in known.items() if url in self._workers}

    def route(self, routing_key: str) -> list[str]:
        """Workers to try for ``routing_key``, best first: those believed up in rendezvous
        order, then the ones believed down (a stale belief must not refuse every turn).
        A worker found incompatible, or taken out of rotation, is never tried (unless that
        leaves none: then every worker is, so a stale exclusion cannot stop all turns)."""
        if len(self._workers) == 1:
            return list(self._workers)  # what the ranking gives one worker, without hashing
        usable = [
            u
            for u, w in self._workers.items()
            if w.incompatible is None and u not in self._excluded
        ]
        ranked = rendezvous_order(routing_key, usable or list(self._workers))
        return [u for u in ranked if self._workers[u].up] + [
            u for u in ranked if not self._workers[u].up
        ]

    # -- lifecycle ---------------------------------------------------------------
    async def connect(self) -> tuple[str, ...]:
        """Find out what sits behind the URL(s) and read every worker's ``/server_info``.

        Returns the warnings (also logged); raises ``BackendMisconfigured`` when a worker
        answered and cannot serve what the proxy records. A worker that does not answer
        yet is read by the background probe when it does."""
        await self._discover()
        infos = await self._read_missing_infos()
        assessment = assess(self._context_length, infos, want_experts=self._require_experts)
        self.limits = assessment.limits
        for warning in assessment.warnings:
            _log.warning("%s", warning)
        return assessment.warnings

    def start(self) -> None:
        """Probe in the background: worker health, a router's worker list, and the
        ``/server_info`` of workers not read yet."""
        if self._prober is None:
            self._prober = asyncio.create_task(self._probe_forever(), name="backend-prober")

    async def close(self) -> None:
        if self._prober is not None:
            self._prober.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._prober
            self._prober = None
        if self._own_streams:
            await self._streams.close()

    async def __aenter__(self) -> SGLangBackend:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    async def _probe_forever(self) -> None:
        while True:
            await asyncio.sleep(self._health_interval_s)
            await self.probe()
            await self._discover()
            await self._admit_new_workers()

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

    # -- topology and server info -----------------------------------------------
    async def _discover(self) -> None:
        """With one URL, learn whether it is an smg router and, if so, its workers."""
        if len(self._workers) != 1:
            return
        (url,) = self._workers
        try:
            response = await self._client.get(f"{url}/workers", timeout=self._probe_timeout_s)
            listed = response.json().get("workers") if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError, AttributeError):
            return  # unreachable, or not a router: re-checked by the next probe
        if not isinstance(listed, list):
            return
        urls = tuple(
            str(w["url"]).rstrip("/") for w in listed if isinstance(w, dict) and w.get("url")
        )
        if self._router is None:
            _log.info("backend %s is an smg router in front of %s", url, ", ".join(urls))
        self._router = url
        self._behind_router = urls

    async def _read_missing_infos(self) -> list[ServerInfo]:
        missing = [
            u for u in self.control_urls if u not in self._infos and u not in self._unchecked
        ]
        read = await asyncio.gather(*(self._server_info(u) for u in missing))
        for info in read:
            if info is not None:
                self._infos[info.url] = info
                _log.info("backend worker %s", info.describe())
        return [info for info in read if info is not None]

    async def _server_info(self, url: str) -> ServerInfo | None:
        """SGLang's ``/server_info`` (``/get_server_info`` before 0.5); None if unreadable."""
        for path in ("/server_info", "/get_server_info"):
            try:
                response = await self._client.get(f"{url}{path}", timeout=self._probe_timeout_s)
            except httpx.HTTPError:
                return None
            if response.status_code == 404:
                continue
            if response.status_code != 200:
                return None
            try:
                return parse_server_info(url, response.json())
            except (ValueError, BackendError) as exc:
                _log.warning("cannot read %s%s: %s", url, path, exc)
                return None
        _log.warning("%s has no /server_info: its limits and features are unchecked", url)
        self._unchecked.add(url)
        return None

    async def _admit_new_workers(self) -> None:
        """Check workers read for the first time; tighten the limits to theirs."""
        for info in await self._read_missing_infos():
            try:
                assessment = assess(
                    self._context_length, [info], want_experts=self._require_experts
                )
            except BackendMisconfigured as exc:
                _log.error("%s", exc.message)
                worker = self._workers.get(info.url)
                if worker is not None:
                    worker.incompatible = exc.message
                continue
            for warning in assessment.warnings:
                _log.warning("%s", warning)
            self.limits = self.limits.tighter(assessment.limits)

    # -- generation --------------------------------------------------------------
    async def generate(self, call: GenerateCall) -> AsyncIterator[GenerationDelta | GenerationEnd]:
        failures: list[str] = []
        for url in self.route(call.routing_key):
            worker = self._workers[url]
            try:
                # Until the response starts: one timer per call (the stream has its own).
                async with asyncio.timeout(self._read_timeout_s):
                    response = await self._send(worker, call)
            except ConnectFailed as exc:
                # Refused, unresolvable or timed out while connecting: nothing reached this
                # worker, so the next one may take the turn without making it two
                # generations.
                self._mark(worker, False)
                failures.append(f"{url}: {exc.message}")
                continue
            except TimeoutError as exc:
                self._mark(worker, False)
                raise BackendUnavailable(
                    f"the backend at {url} did not start its answer within "
                    f"{self._read_timeout_s:g} s"
                ) from exc
            except StreamBroken as exc:
                self._mark(worker, False)
                raise BackendUnavailable(f"backend unreachable at {url}: {exc.message}") from exc
            self._inflight[call.rid] = worker
            try:
                async for item in self._read(worker, response, call):
                    yield item
            finally:
                self._inflight.pop(call.rid, None)
            return
        raise BackendUnavailable(f"no backend worker reachable: {'; '.join(failures)}")

    async def _send(self, worker: _Worker, call: GenerateCall) -> BackendConnection:
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
        headers = {ROUTING_KEY_HEADER: call.routing_key, "Content-Type": "application/json"}
        return await self._streams.post(
            f"{worker.url}/generate", orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY), headers
        )

    async def _read(
        self, worker: _Worker, response: BackendConnection, call: GenerateCall
    ) -> AsyncIterator[GenerationDelta | GenerationEnd]:
        finished = False
        silence = _Silence(response, self._read_timeout_s)
        try:
            if response.status != 200:
                silence.waiting = True
                raise http_error(response.status, await response.read())
            seen = 0
            framing = SseData()
            info = self._infos.get(worker.url)
            cumulative = info is not None and not info.incremental_streaming
            now = asyncio.get_running_loop().time
            while True:
                silence.waiting = True
                received = await response.readany()
                silence.waiting = False
                if not received:
                    break
                silence.last = now()
                payloads = framing.feed(received)
                skipped = cumulative and len(payloads) > 1
                if skipped:
                    payloads = _latest(payloads)
                ids: list[int] = []
                logprobs: list[float] = []
                for payload in payloads:
                    chunk = None if payload == b"[DONE]" else orjson.loads(payload)
                    if chunk is None or "error" in chunk:
                        if ids:  # what came before the failure is recorded with the turn
                            yield GenerationDelta(tuple(ids), tuple(logprobs))
                        if chunk is None:
                            raise BackendError("backend stream ended without a finish reason")
                        raise inband_error(chunk["error"])
                    seen = read_delta(chunk, seen, ids, logprobs)
                    meta = chunk.get("meta_info", {})
                    if skipped and seen != meta.get("completion_tokens", seen):
                        raise BackendError(
                            f"{worker.url} streams deltas though its /server_info says "
                            "cumulative chunks: tokens were skipped",
                            retryable=False,
                        )
                    finish = meta.get("finish_reason")
                    if finish is not None:
                        if ids:
                            yield GenerationDelta(tuple(ids), tuple(logprobs))
                        end = Finish(
                            type=str(finish.get("type")),
                            matched=finish.get("matched"),
                            message=finish.get("message"),
                            status_code=finish.get("status_code"),
                        )
                        if end.type == "abort" and end.status_code is not None:
                            # SGLang's refusals and timeouts: an error, not a pause to resume.
                            raise refusal(str(end.message), int(end.status_code))
                        # Nothing more is read: the connection is released now, before the
                        # end is yielded (a consumer that stops at the end never resumes
                        # this). The stream's tail (``data: [DONE]``, the chunked body's
                        # end) is the stream client's to take as it comes: the turn goes on
                        # without waiting for it, and the connection is pooled once it came.
                        finished = True
                        silence.stop()
                        response.release()
                        yield GenerationEnd(
                            finish=end,
                            weight_version=str(meta.get("weight_version", "default")),
                            prompt_tokens=int(meta.get("prompt_tokens", len(call.input_ids))),
                            routed_experts=decode_experts(
                                meta.get("routed_experts"),
                                self._experts,
                                call.routed_experts_start_len or 0,
                            ),
                            weight_version_spans=spans(meta.get("weight_versions"), seen),
                        )
                        return
                if ids:  # the segment's chunks as one delta: one parse downstream
                    yield GenerationDelta(tuple(ids), tuple(logprobs))
            if silence.fired:
                raise BackendError(silence.message(worker.url))
            raise BackendError("backend stream ended without a finish reason")
        except (StreamBroken, TimeoutError) as exc:
            # The worker died under us: the harness retries, and the retry must not land
            # on the same worker before a probe has seen it answer again.
            if len(self._workers) > 1:
                self._mark(worker, False)
            if silence.fired:
                raise BackendError(silence.message(worker.url)) from exc
            reason = exc.message if isinstance(exc, StreamBroken) else repr(exc)
            raise BackendError(f"backend stream from {worker.url} broke: {reason}") from exc
        finally:
            silence.stop()
            if not finished:
                response.close()  # cut short (an error, a disconnect): drop the connection

    async def abort(self, rid: str) -> None:
        """Best effort: the request may already be finished, which is fine. ``rid`` must be
        the exact rid in flight (SGLang ignores a rid it does not hold, even a prefix of a
        live one). It goes to the worker serving it; behind a router (which has no abort
        route) or when it is no longer in flight here, to every worker."""
        worker = self._inflight.get(rid)
        if worker is not None and self._router is None:
            targets = [worker.url]
        else:
            targets = list(self.control_urls)
        await asyncio.gather(*(self._abort_on(url, rid) for url in targets))

    async def _abort_on(self, url: str, rid: str) -> None:
        # A dead backend has nothing left to abort; the caller records the turn anyway.
        with contextlib.suppress(httpx.HTTPError):
            await self._client.post(f"{url}/abort_request", json={"rid": rid}, timeout=5.0)


def _latest(payloads: list[bytes]) -> list[bytes]:
    """Of the cumulative chunks that came together, the last one with output (each holds
    everything before it, as SGLang itself collapses them for a slow reader) and what
    follows it: ``[DONE]``, an error chunk. A payload that merely mentions ``"error"`` is
    kept too, which only costs a parse."""
    first = len(payloads) - 1
    while first > 0 and (payloads[first] == b"[DONE]" or b'"error"' in payloads[first]):
        first -= 1
    return payloads[first:]


def decode_experts(encoded: object, shape: ExpertShape | None, start: int) -> RoutedExperts | None:
    """SGLang's ``meta_info.routed_experts`` (base64 of little-endian int32, rows of layers x
    top-k) as rows from ``start``; None when the model has no experts or none were sent."""
    if shape is None or not isinstance(encoded, str):
        return None
    try:
        raw = pybase64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise BackendError(f"routed experts payload is not base64: {exc}", retryable=False) from exc
    per_row = shape.num_layers * shape.top_k
    if len(raw) % (4 * per_row):
        raise BackendError(
            f"routed experts payload of {len(raw)} bytes is not a multiple of "
            f"{shape.num_layers} layers x top-{shape.top_k} int32 ids",
            retryable=False,
        )
    flat = np.frombuffer(raw, dtype="<i4")
    rows = flat.reshape(-1, shape.num_layers, shape.top_k).astype(np.int32)
    return RoutedExperts(start=start, rows=rows)


class _Silence:
    """Fails a generation whose stream sends nothing for ``limit_s`` while the proxy waits
    on it, with one timer per ``limit_s`` rather than one per read (a read timeout cancels
    and re-arms a timer at every read). A proxy that is not reading (its harness
    stopped reading) is not waiting: that is no silence of the backend's."""

    __slots__ = ("_handle", "_limit_s", "_loop", "_response", "fired", "last", "waiting")

    def __init__(self, response: BackendConnection, limit_s: float) -> None:
        self._loop = asyncio.get_running_loop()
        self._response = response
        self._limit_s = limit_s
        self.last = self._loop.time()  # of the last read
        self.waiting = False
        self.fired = False
        self._handle = self._loop.call_at(self.last + limit_s, self._check)

    def _check(self) -> None:
        due = self.last + self._limit_s
        now = self._loop.time()
        if self.waiting and now >= due:
            self.fired = True
            self._response.close()  # the read waiting on it fails
            return
        self._handle = self._loop.call_at(due if self.waiting else now + self._limit_s, self._check)

    def message(self, url: str) -> str:
        return f"the backend stream from {url} sent nothing for {self._limit_s:g} s"

    def stop(self) -> None:
        self._handle.cancel()


def stream_client() -> StreamClient:
    """The client generations stream over: connections kept alive between turns, as many
    as there are concurrent generations (SGLang serves each on its own); a connect that takes
    over ``CONNECT_TIMEOUT_S`` fails (the turn moves to the next worker). An idle connection
    is let go before SGLang's uvicorn closes it (its keep-alive timeout is 5 s), so a turn
    never starts on one the server is closing. A finished stream's tail that takes over
    ``SETTLE_TIMEOUT_S`` costs its connection. A silent stream is ``SGLangBackend``'s to
    time out (``_Silence``)."""
    return StreamClient(
        connect_timeout_s=CONNECT_TIMEOUT_S, keepalive_s=KEEPALIVE_S, settle_s=SETTLE_TIMEOUT_S
    )
