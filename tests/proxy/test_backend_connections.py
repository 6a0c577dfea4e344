"""The proxy keeps its backend connections alive: turns reuse one pooled TCP connection
instead of paying a connect (and a close) each. A counting relay sits between the proxy
(or the bare backend client) and one real zero-compute engine."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import openai
import pytest

from engine.config import EngineConfig
from engine.loopback import running_engine
from proxy.backend import GenerateCall, GenerationEnd, SGLangBackend
from tests.proxy.conftest import running_proxy
from tests.support.tcp_relay import TcpRelay

TURNS = 12


def call(rid: str) -> GenerateCall:
    return GenerateCall(
        input_ids=(1, 2, 3), sampling_params={"max_new_tokens": 4}, rid=rid, routing_key="s"
    )


@pytest.fixture(scope="module")
def engine_port(tiny_model_dir: Path) -> Iterator[int]:
    with running_engine(EngineConfig(model_path=tiny_model_dir, zero_compute=True)) as url:
        port = urlsplit(url).port
        assert port is not None
        yield port


async def test_sequential_generates_share_one_connection(engine_port: int) -> None:
    with TcpRelay(engine_port) as relay:
        async with (
            httpx.AsyncClient() as client,
            SGLangBackend(client, [relay.url], None) as backend,
        ):
            for turn in range(TURNS):
                items = [item async for item in backend.generate(call(f"r{turn}"))]
                assert isinstance(items[-1], GenerationEnd)
        assert relay.accepted == 1


async def test_a_consumer_that_stops_at_the_end_still_returns_the_connection(
    engine_port: int,
) -> None:
    """The pipeline stops reading once it has the ``GenerationEnd``: the stream's tail
    ([DONE], the chunked body's end) must already be read by then."""
    with TcpRelay(engine_port) as relay:
        async with (
            httpx.AsyncClient() as client,
            SGLangBackend(client, [relay.url], None) as backend,
        ):
            for turn in range(TURNS):
                stream = backend.generate(call(f"stop{turn}"))
                async for item in stream:
                    if isinstance(item, GenerationEnd):
                        break
                await stream.aclose()  # type: ignore[attr-defined]
        assert relay.accepted == 1


def test_turns_through_the_proxy_open_no_connection_each(
    engine_port: int, tiny_model_dir: Path, tmp_path: Path
) -> None:
    with TcpRelay(engine_port) as relay:
        settings = {"return_routed_experts": False, "backend_health_interval_s": 3600.0}
        with running_proxy(relay.url, tiny_model_dir, tmp_path, None, **settings) as proxy:
            before = relay.accepted  # start-up: server_info and the first probe
            session = proxy.new_session()
            client = openai.OpenAI(base_url=session["openai_base_url"], api_key="k", max_retries=0)
            for _ in range(TURNS):
                client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=2
                )
            streamed = client.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=2,
                stream=True,
            )
            assert [chunk for chunk in streamed]
            opened = relay.accepted - before
        assert opened <= 1, f"{opened} backend connections for {TURNS + 1} turns"
