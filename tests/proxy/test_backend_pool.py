"""The backend pool: sessions pinned to workers by rendezvous hashing, failover before a
turn is sent, retryable errors for turns a dying worker broke, health probes.

Workers are recording taps in front of one real zero-compute engine, each on its own
loopback port, so a test can see which worker served a turn and can stop one.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from engine.config import EngineConfig
from engine.loopback import running_engine
from kernel.errors import BackendError, BackendUnavailable
from kernel.threaded import free_port, serve
from proxy import backend as backend_module
from proxy.backend import GenerateCall, GenerationEnd, SGLangBackend, rendezvous_order
from tests.support.tap import BackendTap


@pytest.fixture(scope="module")
def zero_engine(tiny_model_dir: Path) -> Iterator[str]:
    with running_engine(EngineConfig(model_path=tiny_model_dir, zero_compute=True)) as url:
        yield url


@pytest.fixture
def taps(zero_engine: str) -> Iterator[list[BackendTap]]:
    with ExitStack() as stack:
        workers = []
        for _ in range(3):
            tap = BackendTap(upstream=zero_engine)
            tap.url = stack.enter_context(serve(tap.app()))
            workers.append(tap)
        yield workers


def call(key: str, rid: str) -> GenerateCall:
    return GenerateCall(
        input_ids=(1, 2, 3),
        sampling_params={"max_new_tokens": 4},
        rid=rid,
        routing_key=key,
    )


async def run(backend: SGLangBackend, generate: GenerateCall) -> GenerationEnd:
    end = None
    async for item in backend.generate(generate):
        if isinstance(item, GenerationEnd):
            end = item
    assert end is not None
    return end


def served_by(taps: list[BackendTap], rid: str) -> list[str]:
    return [t.url for t in taps for ex in t.generates if ex.body["rid"] == rid]


def test_rendezvous_moves_only_the_keys_of_a_removed_worker() -> None:
    urls = [f"http://w{i}:30000" for i in range(4)]
    keys = [f"session-{i}" for i in range(400)]
    before = {k: rendezvous_order(k, urls)[0] for k in keys}
    after = {k: rendezvous_order(k, urls[1:])[0] for k in keys}
    moved = [k for k in keys if before[k] != after[k]]
    assert moved == [k for k in keys if before[k] == urls[0]]
    assert 60 < len(moved) < 140  # about a quarter of the keys
    assert rendezvous_order("session-7", urls) == rendezvous_order("session-7", urls[::-1])


async def test_a_session_sticks_to_one_worker_and_sessions_spread(
    taps: list[BackendTap],
) -> None:
    async with (
        httpx.AsyncClient() as client,
        SGLangBackend(client, [t.url for t in taps], None) as backend,
    ):
        for i in range(24):
            for turn in range(2):
                await run(backend, call(f"s{i}", f"s{i}-t{turn}"))
        for i in range(24):
            first, second = served_by(taps, f"s{i}-t0"), served_by(taps, f"s{i}-t1")
            assert first == second == [backend.route(f"s{i}")[0]]
        assert all(t.generates for t in taps)


async def test_a_refused_connection_moves_the_turn_to_the_next_worker(
    taps: list[BackendTap],
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    async with (
        httpx.AsyncClient() as client,
        SGLangBackend(client, [dead, taps[0].url], None) as backend,
    ):
        key = next(k for k in (f"k{i}" for i in range(100)) if backend.route(k)[0] == dead)
        end = await run(backend, call(key, "moved"))
        assert end.finish.type in ("stop", "length")
        assert served_by(taps, "moved") == [taps[0].url]
        assert not backend.is_up(dead)
        assert backend.route(key) == [taps[0].url, dead]  # new sessions avoid it

        async with SGLangBackend(client, [dead], None) as lonely:
            with pytest.raises(BackendUnavailable):
                await run(lonely, call(key, "nowhere"))


async def test_a_worker_whose_connects_hang_passes_the_turn_on(
    taps: list[BackendTap], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A connect that times out sent nothing, like a refused one: the next worker takes
    the turn (a full accept queue drops the SYNs, so the connect hangs)."""
    monkeypatch.setattr(backend_module, "CONNECT_TIMEOUT_S", 0.3)
    with socket.socket() as hanging:
        hanging.bind(("127.0.0.1", 0))
        hanging.listen(0)
        host, port = hanging.getsockname()
        fillers = [socket.socket() for _ in range(3)]
        for filler in fillers:
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                filler.connect((host, port))
        try:
            dead = f"http://{host}:{port}"
            async with (
                httpx.AsyncClient() as client,
                SGLangBackend(client, [dead, taps[0].url], None) as backend,
            ):
                key = next(k for k in (f"k{i}" for i in range(100)) if backend.route(k)[0] == dead)
                await run(backend, call(key, "past-a-hang"))
            assert served_by(taps, "past-a-hang") == [taps[0].url]
            assert not backend.is_up(dead)
        finally:
            for filler in fillers:
                filler.close()


async def test_a_broken_stream_is_a_retryable_error_and_the_retry_goes_elsewhere(
    taps: list[BackendTap],
) -> None:
    async with (
        httpx.AsyncClient() as client,
        SGLangBackend(client, [t.url for t in taps], None) as backend,
    ):
        victim = backend.route("victim")[0]
        tap = next(t for t in taps if t.url == victim)
        tap.drop_after_chunks_once = 0
        with pytest.raises(BackendError) as caught:
            await run(backend, call("victim", "broken"))
        assert caught.value.retryable
        assert not isinstance(caught.value, BackendUnavailable)
        assert not backend.is_up(victim)

        await run(backend, call("victim", "retry"))
        (retried_on,) = served_by(taps, "retry")
        assert retried_on != victim

        # The worker still answers its health check, so a probe brings it back.
        assert (await backend.probe())[victim]
        await run(backend, call("victim", "back"))
        assert served_by(taps, "back") == [victim]


async def test_the_background_probe_marks_a_restarted_worker_up(zero_engine: str) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    async with (
        httpx.AsyncClient() as client,
        SGLangBackend(client, [url, zero_engine], None, health_interval_s=0.05) as backend,
    ):
        assert not (await backend.probe())[url]
        backend.start()
        try:
            tap = BackendTap(upstream=zero_engine)
            with serve(tap.app(), port=port):
                for _ in range(100):
                    if backend.is_up(url):
                        break
                    await asyncio.sleep(0.05)
                assert backend.is_up(url)
        finally:
            await backend.close()


async def test_an_abort_of_a_finished_rid_reaches_every_worker(taps: list[BackendTap]) -> None:
    async with (
        httpx.AsyncClient() as client,
        SGLangBackend(client, [t.url for t in taps], None) as backend,
    ):
        await backend.abort("gone")
        assert all(t.aborts == [{"rid": "gone"}] for t in taps)


def test_a_worker_taken_out_of_rotation_gets_no_turn_until_it_is_put_back() -> None:
    urls = [f"http://w{i}:30000" for i in range(3)]
    backend = SGLangBackend(httpx.AsyncClient(), urls, None)
    keys = [f"session-{i}" for i in range(60)]
    first = {k: backend.route(k)[0] for k in keys}
    assert urls[0] in first.values()

    backend.exclude({urls[0]: "weight sync to step-3 failed", "http://elsewhere:1": "x"})

    for key in keys:
        route = backend.route(key)
        assert urls[0] not in route
        if first[key] != urls[0]:
            assert route[0] == first[key]  # only the excluded worker's sessions move
    backend.exclude({})
    assert {k: backend.route(k)[0] for k in keys} == first
    backend.exclude({url: "every sync failed" for url in urls})
    assert sorted(backend.route("k")) == sorted(urls)  # never no worker at all
