"""The proxy against SGLang 0.5.23's own failure modes, served by the local engine.

The engine has small limits (context 400; ``--max-total-tokens 200`` so prompts must be
under ``max_req_input_len`` = 194 tokens) and a 6 s running timeout. Two proxies sit in
front of it through recording taps: one reads the engine's ``/server_info`` and keeps to its
limits; the other cannot (its tap hides ``/server_info``), so what only the server refuses
reaches the server, and the test sees how the refusal comes back:

- a 400 abort (prompt over ``max_req_input_len``) and an in-band 400 error (prompt plus
  output over the context) become the harness's context-length error after exactly one
  backend call, never a resumption;
- a 503 abort (the running timeout) is a retryable error, not resumed;
- a version change inside one backend call is recorded as SGLang's spans and exported per
  token; an abort of a resumed call names the rid actually in flight.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from engine.config import EngineConfig
from engine.loopback import running_engine
from kernel.threaded import serve
from tests.proxy.conftest import SCRIPT, Proxy, running_proxy
from tests.support.tap import BackendTap

CONTEXT = 400
MAX_REQ_INPUT_LEN = 194  # min(400 - 1, 200 - 1) - 5
LONG_PROMPT = "word " * 120
BRIEF_REPLY = "resumed " * 6  # about 250 tokens: under the context, over max_req_input_len


@pytest.fixture(scope="module")
def small_engine(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    script = tmp_path_factory.mktemp("script") / "policy.json"
    rules = [
        {"match": "GLACIAL", "reply": "tick " * 20, "delay_s": 0.5},  # far past the timeout
        {"match": "BRIEF", "reply": BRIEF_REPLY, "delay_s": 0.02},  # well within it
        *SCRIPT["rules"],
    ]
    script.write_text(json.dumps({**SCRIPT, "rules": rules}))
    config = EngineConfig(
        model_path=model_dir,
        script_path=script,
        enable_return_routed_experts=True,
        context_length=CONTEXT,
        max_total_tokens=200,
        req_running_timeout_s=6.0,
    )
    with running_engine(config) as url:
        yield url


def _tap(upstream: str, *, server_info: bool) -> Iterator[BackendTap]:
    tap = BackendTap(upstream=upstream, server_info=server_info)
    with serve(tap.app()) as url:
        tap.url = url
        yield tap


@pytest.fixture(scope="module")
def seeing_tap(small_engine: str) -> Iterator[BackendTap]:
    yield from _tap(small_engine, server_info=True)


@pytest.fixture(scope="module")
def blind_tap(small_engine: str) -> Iterator[BackendTap]:
    yield from _tap(small_engine, server_info=False)


@pytest.fixture(scope="module")
def seeing(
    seeing_tap: BackendTap, model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Proxy]:
    with running_proxy(seeing_tap.url, model_dir, tmp_path_factory.mktemp("seeing"), None) as p:
        yield p


@pytest.fixture(scope="module")
def blind(
    blind_tap: BackendTap, model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Proxy]:
    with running_proxy(blind_tap.url, model_dir, tmp_path_factory.mktemp("blind"), None) as p:
        yield p


def _openai(session: dict[str, Any]) -> openai.OpenAI:
    return openai.OpenAI(base_url=session["openai_base_url"], api_key="placeholder", max_retries=0)


def _anthropic(session: dict[str, Any]) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=session["anthropic_base_url"], api_key="placeholder", max_retries=0
    )


def _only_turn(proxy: Proxy, session: dict[str, Any]) -> dict[str, Any]:
    (turn,) = proxy.trajectory(session["id"])["turns"]
    return dict(turn)


def test_a_400_abort_is_context_length_exceeded_after_one_call(
    blind: Proxy, blind_tap: BackendTap
) -> None:
    session = blind.new_session()
    blind_tap.reset()
    with pytest.raises(openai.BadRequestError) as info:
        _openai(session).chat.completions.create(
            model="m", messages=[{"role": "user", "content": LONG_PROMPT}], max_tokens=2
        )
    assert info.value.code == "context_length_exceeded"
    assert "maximum allowed length (194 tokens)" in info.value.message
    (call,) = blind_tap.generates  # never resumed: the same prompt would be refused again
    finish = call.final["meta_info"]["finish_reason"]
    assert finish["type"] == "abort"
    assert finish["status_code"] == 400
    turn = _only_turn(blind, session)
    assert turn["status"] == "failed"
    assert "maximum allowed length" in turn["error"]
    assert turn["resumptions"] == 0


def test_an_in_band_400_is_context_length_exceeded(blind: Proxy, blind_tap: BackendTap) -> None:
    session = blind.new_session()
    blind_tap.reset()
    # No max_tokens: the proxy (which cannot read the server's limits) asks for more
    # output than the server's context leaves, and the server refuses in band.
    # The error comes before any output, so the proxy answers it as a plain 400.
    with pytest.raises(openai.BadRequestError) as info:
        _openai(session).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hello"}], stream=True
        )
    assert "maximum context length of 400 tokens" in info.value.message
    assert info.value.code == "context_length_exceeded"
    (call,) = blind_tap.generates
    assert call.chunks[0]["error"]["code"] == 400
    assert _only_turn(blind, session)["status"] == "failed"


def test_anthropic_harnesses_hear_prompt_is_too_long(blind: Proxy, blind_tap: BackendTap) -> None:
    session = blind.new_session()
    blind_tap.reset()
    with pytest.raises(anthropic.BadRequestError) as info:
        _anthropic(session).messages.create(
            model="claude-sonnet-4-5",
            max_tokens=2,
            messages=[{"role": "user", "content": LONG_PROMPT}],
        )
    assert info.value.status_code == 400
    body = info.value.body
    assert isinstance(body, dict)
    assert body["error"]["type"] == "invalid_request_error"
    assert body["error"]["message"].startswith("prompt is too long: ")
    assert len(blind_tap.generates) == 1


def test_a_503_timeout_abort_is_retryable_and_not_resumed(
    blind: Proxy, blind_tap: BackendTap
) -> None:
    session = blind.new_session()
    blind_tap.reset()
    with pytest.raises(openai.InternalServerError) as info:
        _openai(session).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "GLACIAL"}], max_tokens=150
        )
    assert info.value.status_code == 502
    body = info.value.body
    assert isinstance(body, dict)
    assert body["type"] == "server_error"  # retryable: the harness may try again
    (call,) = blind_tap.generates
    assert call.final["meta_info"]["finish_reason"]["status_code"] == 503
    assert "Request running timeout reached." in _only_turn(blind, session)["error"]


def test_the_proxy_keeps_to_the_servers_limits(seeing: Proxy, seeing_tap: BackendTap) -> None:
    session = seeing.new_session()
    seeing_tap.reset()
    # LEGO_CONTEXT_LENGTH is 8192; the server takes prompts under 194 tokens.
    with pytest.raises(openai.BadRequestError) as info:
        _openai(session).chat.completions.create(
            model="m", messages=[{"role": "user", "content": LONG_PROMPT}], max_tokens=2
        )
    assert info.value.code == "context_length_exceeded"
    assert seeing_tap.generates == []  # refused before anything was sent
    with pytest.raises(anthropic.BadRequestError) as too_long:
        _anthropic(session).messages.create(
            model="m", max_tokens=2, messages=[{"role": "user", "content": LONG_PROMPT}]
        )
    body = too_long.value.body
    assert isinstance(body, dict)
    assert body["error"]["message"].endswith(f"tokens > {MAX_REQ_INPUT_LEN - 1} maximum")
    # Without max_tokens the output budget is what the server leaves, so it is accepted.
    answer = _openai(session).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hello"}]
    )
    assert answer.choices[0].finish_reason == "stop"
    (call,) = seeing_tap.generates
    prompt = len(call.body["input_ids"])
    assert call.body["sampling_params"]["max_new_tokens"] == MAX_REQ_INPUT_LEN - prompt


@contextmanager
def _streaming(session: dict[str, Any], content: str) -> Iterator[Iterator[str]]:
    """A streamed chat turn, held open once its answer has begun; yields the rest."""
    body = {"model": "m", "messages": [{"role": "user", "content": content}], "stream": True}
    url = f"{session['openai_base_url']}/chat/completions"
    with httpx.Client(timeout=60) as client, client.stream("POST", url, json=body) as response:
        lines = response.iter_lines()
        for line in lines:
            if line.startswith("data:") and '"content":"r' in line.replace(" ", ""):
                break
        yield lines


def test_a_version_change_inside_one_call_is_recorded_per_token(
    seeing: Proxy, seeing_tap: BackendTap, small_engine: str
) -> None:
    session = seeing.new_session()
    seeing_tap.reset()
    with _streaming(session, "BRIEF") as lines:
        # A retract/in-place weight sync: the request stays alive across the change.
        httpx.post(f"{small_engine}/pause_generation", json={"mode": "in_place"})
        change = {"new_version": "v2", "abort_all_requests": False}
        httpx.post(f"{small_engine}/update_weight_version", json=change).raise_for_status()
        httpx.post(f"{small_engine}/continue_generation", json={})
        rest = [line for line in lines if line]
    assert rest[-1] == "data: [DONE]"
    (call,) = seeing_tap.generates  # not an abort: one backend call
    sent = call.final["meta_info"]["weight_versions"]
    assert [s["version"] for s in sent] == ["default", "v2"]
    boundary = sent[0]["end"]
    trajectory = seeing.trajectory(session["id"])
    (turn,) = trajectory["turns"]
    assert turn["weight_version"] == "v2"
    (segment,) = trajectory["segments"]
    prompt = len(call.body["input_ids"])
    end = prompt + len(call.final["output_ids"])
    assert segment["weight_version_spans"] == [
        ["default", prompt, prompt + boundary],
        ["v2", prompt + boundary, end],
    ]
    assert len(segment["tokens"]) == end


def test_a_disconnect_during_a_resumption_aborts_the_rid_in_flight(
    seeing: Proxy, seeing_tap: BackendTap, small_engine: str
) -> None:
    session = seeing.new_session()
    seeing_tap.reset()
    with _streaming(session, "BRIEF") as lines:
        httpx.post(f"{small_engine}/pause_generation", json={"mode": "abort"})
        time.sleep(0.3)
        httpx.post(f"{small_engine}/continue_generation", json={})
        next(lines)  # the resumed call is sampling; then the harness goes away
    deadline = time.monotonic() + 10
    while not seeing_tap.aborts and time.monotonic() < deadline:
        time.sleep(0.05)
    first, resumed = seeing_tap.generates
    assert resumed.body["rid"] == f"{first.body['rid']}-r1"
    assert [a["rid"] for a in seeing_tap.aborts] == [resumed.body["rid"]]
