"""Every ``/generate`` body the proxy sends passes SGLang 0.5.23's own checks.

The checks are the real package's (``tests.support.sglang_types``): the schema gate
``generate_contract_error`` and ``SamplingParams(...).verify``, plus the scheduler's bounds
on ``routed_experts_start_len``. The bodies are what the tap saw for turns that exercise
every field the proxy fills: the three wire protocols, harness sampling, session pins,
stop strings, a tool-call conversation that extends its parent (``routed_experts_start_len``
> 0), and a resumption after a pause-abort.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.proxy.conftest import SHELL_TOOL, Proxy
from tests.support.sglang_types import sglang_checks
from tests.support.tap import BackendTap


def _drive_every_kind_of_turn(proxy: Proxy, scripted_engine_url: str) -> None:
    pinned = proxy.new_session(
        sampling={"temperature": 0.7, "top_p": 0.9, "top_k": 20, "min_p": 0.05, "seed": 7},
        max_output_tokens=64,
    )
    chat = openai.OpenAI(base_url=pinned["openai_base_url"], api_key="x", max_retries=0)
    chat.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hello"}], stop=["\n\n"], seed=3
    )
    session = proxy.new_session()
    chat = openai.OpenAI(base_url=session["openai_base_url"], api_key="x", max_retries=0)
    messages: list[Any] = [{"role": "user", "content": "CALL_TOOL please"}]
    first = chat.chat.completions.create(model="m", messages=messages, tools=[SHELL_TOOL])
    call = first.choices[0].message.tool_calls
    assert call
    messages += [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call[0].id, "content": "done"},
    ]
    chat.chat.completions.create(
        model="m", messages=messages, tools=[SHELL_TOOL], temperature=0, max_tokens=32
    )
    claude = anthropic.Anthropic(base_url=session["anthropic_base_url"], api_key="x")
    claude.messages.create(
        model="claude",
        max_tokens=16,
        messages=[{"role": "user", "content": "hi"}],
        extra_body={"top_k": 5},
    )
    chat.responses.create(model="m", input="hello", top_p=0.5, max_output_tokens=16)
    # A pause-abort mid-answer: the proxy resumes with prompt + partial output.
    body = {"model": "m", "messages": [{"role": "user", "content": "RESUMABLE"}], "stream": True}
    with (
        httpx.Client(timeout=60) as client,
        client.stream("POST", f"{session['openai_base_url']}/chat/completions", json=body) as r,
    ):
        lines = r.iter_lines()
        for line in lines:
            if '"content":"r' in line.replace(" ", ""):
                break
        httpx.post(f"{scripted_engine_url}/pause_generation", json={"mode": "abort"})
        httpx.post(f"{scripted_engine_url}/continue_generation", json={})
        list(lines)


def test_every_generate_body_passes_sglangs_own_checks(
    proxy: Proxy, tap: BackendTap, scripted_engine_url: str, model_dir: Path
) -> None:
    contract_error, sampling_params = sglang_checks()
    tap.reset()
    _drive_every_kind_of_turn(proxy, scripted_engine_url)
    bodies = [exchange.body for exchange in tap.generates]
    starts = [b.get("routed_experts_start_len", 0) for b in bodies]
    assert any(start > 0 for start in starts), "no continuation was exercised"
    assert any("-r1" in b["rid"] for b in bodies), "no resumption was exercised"
    assert any("sampling_seed" in b["sampling_params"] for b in bodies)
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    for body in bodies:
        assert contract_error(body) is None, body["sampling_params"]
        sampling_params(**body["sampling_params"]).verify(vocab)
        if body.get("return_routed_experts"):
            assert 0 <= body["routed_experts_start_len"] <= len(body["input_ids"])


def test_the_checks_are_sglangs_and_would_catch_a_bad_body() -> None:
    contract_error, sampling_params = sglang_checks()
    bad = {"input_ids": [1], "sampling_params": {"max_tokens": 5}}
    assert str(contract_error(bad)).startswith("unknown field `max_tokens`")
    with pytest.raises(ValueError, match="top_k must be -1"):
        sampling_params(top_k=0).verify(4096)
