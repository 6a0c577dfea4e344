"""The engine refuses what SGLang 0.5.23 refuses, where and how SGLang reports it.

One engine with small limits (``--context-length 64 --max-total-tokens 40``, so
``max_req_input_len`` is ``min(63, 39) - 5 = 34``) serves every case: over-long prompts
are refused (never clamped), in band when streaming; prompts over ``max_req_input_len``
end as 400 aborts; the scheduler's quiet cap of ``max_new_tokens`` applies; the finish
order is stop string, then stop token, then length.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from engine.loopback import running_engine
from tests.engine.helpers import engine_config, generate, stream_chunks

CONTEXT = 64
MAX_REQ_INPUT_LEN = 34
SCRIPT = {
    "rules": [
        {"match": "count", "reply": "one two DONE 42 three four five"},
        {"match": "long", "reply": "word " * 60},
    ],
    "default": "OK.",
}


@pytest.fixture(scope="module")
def small_engine(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    script = tmp_path_factory.mktemp("script") / "script.json"
    script.write_text(json.dumps(SCRIPT))
    config = engine_config(
        tiny_model_dir, script_path=script, context_length=CONTEXT, max_total_tokens=40
    )
    with running_engine(config) as url:
        yield url


def _prompt(tok: Any, text: str) -> list[int]:
    chat = f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"
    ids: list[int] = tok.encode(chat, add_special_tokens=False)
    return ids


def _stream_raw(url: str, body: dict[str, Any]) -> tuple[int, list[str]]:
    with httpx.stream("POST", f"{url}/generate", json={**body, "stream": True}, timeout=60) as r:
        return r.status_code, [line for line in r.iter_lines() if line]


def test_server_info_reports_the_limits(small_engine: str) -> None:
    info = httpx.get(f"{small_engine}/server_info").json()
    assert info["context_length"] == CONTEXT
    assert info["max_req_input_len"] == MAX_REQ_INPUT_LEN
    assert info["enable_return_routed_experts"] is True
    assert info["incremental_streaming_output"] is False
    assert info["enable_deterministic_inference"] is True
    assert info["dp_size"] == 1
    assert httpx.get(f"{small_engine}/get_server_info").json()["max_req_input_len"] == 34


def test_a_prompt_over_the_context_is_refused_in_band_when_streaming(small_engine: str) -> None:
    body = {"input_ids": [5] * CONTEXT, "sampling_params": {"max_new_tokens": 1}}
    status, lines = _stream_raw(small_engine, body)
    assert status == 200
    assert lines[-1] == "data: [DONE]"
    error = json.loads(lines[0].removeprefix("data: "))["error"]
    assert error["code"] == 400
    assert error["type"] == "invalid_request_error"
    assert error["retryable"] is False
    assert "longer than the model's context length (64 tokens)" in error["message"]
    plain = httpx.post(f"{small_engine}/generate", json=body)
    assert plain.status_code == 400
    assert "context length" in plain.json()["error"]["message"]


def test_prompt_plus_max_new_tokens_over_the_context_is_refused_not_clamped(
    small_engine: str,
) -> None:
    body = {"input_ids": [5] * 20, "sampling_params": {"max_new_tokens": CONTEXT}}
    status, lines = _stream_raw(small_engine, body)
    assert status == 200
    error = json.loads(lines[0].removeprefix("data: "))["error"]
    assert error["code"] == 400
    assert error["message"].startswith(
        "Requested token count exceeds the model's maximum context length of 64 tokens."
    )


def test_a_prompt_over_max_req_input_len_ends_as_a_400_abort(small_engine: str) -> None:
    body = {"input_ids": [5] * (MAX_REQ_INPUT_LEN + 2), "sampling_params": {"max_new_tokens": 4}}
    chunks = stream_chunks(small_engine, body)
    assert len(chunks) == 1
    finish = chunks[0]["meta_info"]["finish_reason"]
    assert finish["type"] == "abort"
    assert finish["status_code"] == 400
    assert finish["err_type"] == "BadRequestError"
    assert "exceeds the maximum allowed length (34 tokens)" in finish["message"]
    assert chunks[0]["output_ids"] == []
    plain = httpx.post(f"{small_engine}/generate", json=body)
    assert plain.status_code == 400
    assert "maximum allowed length" in plain.json()["error"]["message"]


def test_sampling_ranges_fail_in_band_when_streaming(small_engine: str) -> None:
    body = {"input_ids": [5] * 4, "sampling_params": {"top_k": 0, "max_new_tokens": 2}}
    status, lines = _stream_raw(small_engine, body)
    assert status == 200
    error = json.loads(lines[0].removeprefix("data: "))["error"]
    assert error["message"] == "top_k must be -1 (disable) or at least 1, got 0."


def test_max_new_tokens_is_capped_at_what_the_context_leaves(small_engine: str, tok: Any) -> None:
    prompt = _prompt(tok, "long")
    # prompt + 30 <= 64 passes the tokenizer; the scheduler caps at max_req_len (39) - prompt - 1.
    cap = 39 - len(prompt) - 1
    assert 0 < cap < 30
    params = {"max_new_tokens": 30}
    out = generate(small_engine, {"input_ids": prompt, "sampling_params": params})
    assert out["meta_info"]["finish_reason"] == {"type": "length", "length": cap}
    assert len(out["output_ids"]) == cap


def test_an_eos_on_the_last_allowed_token_is_a_stop(small_engine: str, tok: Any) -> None:
    prompt = _prompt(tok, "hello")
    reply = [*tok.encode("OK.", add_special_tokens=False), tok.eos_token_id]
    params = {"max_new_tokens": len(reply)}
    out = generate(small_engine, {"input_ids": prompt, "sampling_params": params})
    assert out["output_ids"] == reply
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": tok.eos_token_id}


def test_a_stop_regex_reports_its_pattern(small_engine: str, tok: Any) -> None:
    params = {"stop_regex": r"DONE \d+", "max_new_tokens": 20}
    out = generate(small_engine, {"input_ids": _prompt(tok, "count"), "sampling_params": params})
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": r"DONE \d+"}


def test_a_stop_string_beats_the_length_cap(small_engine: str, tok: Any) -> None:
    prompt = _prompt(tok, "count")
    upto = tok.encode("one two DONE", add_special_tokens=False)
    params = {"stop": ["DONE"], "max_new_tokens": len(upto)}
    out = generate(small_engine, {"input_ids": prompt, "sampling_params": params})
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": "DONE"}
