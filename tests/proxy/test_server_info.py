"""The proxy reads every worker's ``/server_info`` and keeps to it (proxy.server_info and
``SGLangBackend.connect``): limits, routed-expert capture, seeds, workers that join later."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from engine.config import EngineConfig
from engine.loopback import running_engine
from engine.server import create_engine_app
from kernel.errors import BackendMisconfigured
from kernel.threaded import free_port, serve
from proxy.app import create_app
from proxy.backend import ExpertShape, SGLangBackend
from proxy.server_info import BackendLimits, assess, parse_server_info
from proxy.settings import Settings

SHAPE = ExpertShape(num_layers=4, top_k=2)


def _zero(model: Path, **fields: Any) -> EngineConfig:
    return EngineConfig(model_path=model, zero_compute=True, **fields)


def _info(**fields: object) -> dict[str, object]:
    return {
        "context_length": 4096,
        "max_req_input_len": 4090,
        "enable_return_routed_experts": True,
        "enable_deterministic_inference": True,
        **fields,
    }


def test_a_null_context_length_is_the_least_max_req_input_len_allows() -> None:
    info = parse_server_info("http://w", _info(context_length=None, max_req_input_len=1000))
    assert info.context_length == 1006
    assert BackendLimits.of_server(info).max_prompt_tokens == 999


def test_a_server_info_without_max_req_input_len_is_an_error() -> None:
    with pytest.raises(Exception, match="no max_req_input_len"):
        parse_server_info("http://w", {"context_length": 10})


def test_the_limits_are_the_tightest_and_the_output_budget_leaves_room_to_resume() -> None:
    small = parse_server_info("http://a", _info(context_length=1000, max_req_input_len=500))
    big = parse_server_info("http://b", _info())
    assessment = assess(262144, [big, small], want_experts=True)
    assert assessment.limits == BackendLimits(context_length=1000, max_prompt_tokens=499)
    # prompt + output - 1 (a resumption's prompt) stays a prompt the server accepts.
    assert assessment.limits.output_budget(100) == 400
    assert any("LEGO_CONTEXT_LENGTH=262144 is more than http://a" in w for w in assessment.warnings)
    assert not any("is more than http://b" in w for w in assessment.warnings[1:2])


def test_missing_expert_capture_is_fatal_and_seeds_are_warned_about() -> None:
    blind = parse_server_info("http://w", _info(enable_return_routed_experts=False))
    with pytest.raises(BackendMisconfigured, match="--enable-return-routed-experts"):
        assess(4096, [blind], want_experts=True)
    random = parse_server_info("http://w", _info(enable_deterministic_inference=False))
    (warning,) = assess(4000, [random], want_experts=True).warnings
    assert "--enable-deterministic-inference" in warning
    assert "ignored" in warning


async def test_connect_reads_a_real_engine(tiny_model_dir: Path) -> None:
    config = EngineConfig(
        model_path=tiny_model_dir, zero_compute=True, context_length=2048, max_total_tokens=1024
    )
    with running_engine(config) as url:
        async with httpx.AsyncClient() as client:
            backend = SGLangBackend(client, url, SHAPE, context_length=8192, require_experts=True)
            with pytest.raises(BackendMisconfigured, match=url):
                await backend.connect()
            backend = SGLangBackend(client, url, SHAPE, context_length=8192)
            warnings = await backend.connect()
    assert backend.limits == BackendLimits(context_length=2048, max_prompt_tokens=1017)
    assert len(warnings) == 2  # LEGO_CONTEXT_LENGTH too large, seeds ignored


def test_the_proxy_refuses_to_start_without_expert_capture(
    tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = EngineConfig(model_path=tiny_model_dir, zero_compute=True)
    with running_engine(config) as url:
        settings = Settings(backend_url=url, tokenizer_path=tiny_model_dir, data_dir=tmp_path)
        app = create_app(settings)

        async def start() -> None:
            async with app.router.lifespan_context(app):
                pass

        with caplog.at_level(logging.ERROR), pytest.raises(BackendMisconfigured):
            asyncio.run(start())
        (line,) = [r.getMessage() for r in caplog.records if "cannot start" in r.getMessage()]
        assert line.startswith(f"lego-proxy cannot start: {url} runs without ")
        # Told not to expect routed experts, it starts.
        quiet = settings.model_copy(update={"return_routed_experts": False})
        started = create_app(quiet)

        async def start_quiet() -> None:
            async with started.router.lifespan_context(started):
                pass

        asyncio.run(start_quiet())


KEYS = [f"session-{i}" for i in range(40)]


async def _late_worker_joins(
    model: Path, until: Callable[[SGLangBackend, str], bool], **late: Any
) -> tuple[SGLangBackend, str]:
    """A backend over [a good worker, a worker that starts after ``connect``]; the late
    worker is an engine with ``late`` flags. Returns once ``until(backend, first)``."""
    port = free_port()
    with running_engine(_zero(model, enable_return_routed_experts=True)) as first:
        async with httpx.AsyncClient() as client:
            backend = SGLangBackend(
                client,
                [first, f"http://127.0.0.1:{port}"],
                SHAPE,
                context_length=8192,
                require_experts=True,
                health_interval_s=0.05,
            )
            await backend.connect()  # the late worker is not up yet: only the first is read
            assert backend.limits.max_prompt_tokens == 8191
            backend.start()
            try:
                with serve(create_engine_app(_zero(model, port=port, **late)), port=port):
                    for _ in range(100):
                        if until(backend, first):
                            break
                        await asyncio.sleep(0.05)
            finally:
                await backend.close()
    return backend, first


async def test_a_worker_that_joins_later_is_read_and_checked(tiny_model_dir: Path) -> None:
    backend, _ = await _late_worker_joins(
        tiny_model_dir,
        lambda b, _: b.limits.max_prompt_tokens < 8191,
        enable_return_routed_experts=True,
        context_length=512,
    )
    assert backend.limits == BackendLimits(context_length=512, max_prompt_tokens=505)


async def test_an_incompatible_worker_that_joins_is_never_routed_to(tiny_model_dir: Path) -> None:
    def only_first(backend: SGLangBackend, first: str) -> bool:
        return all(backend.route(k) == [first] for k in KEYS)

    # Without --enable-return-routed-experts: it would record turns without routing.
    backend, first = await _late_worker_joins(tiny_model_dir, only_first)
    assert only_first(backend, first)
