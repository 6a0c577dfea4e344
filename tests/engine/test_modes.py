"""Engine modes: incremental streaming, the scripted policy, zero-compute, disconnects."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from transformers import AutoTokenizer

from engine.loopback import running_engine
from engine.script import prompt_tail
from engine.zero import FIXED_LOGPROB
from tests.engine.helpers import decode_routing, engine_config, generate, stream_chunks

PROMPT = [1716, 882, 198, 71, 72, 1717, 198, 1716, 329, 198]
WEATHER_REPLY = (
    "<think>\nThe user wants weather.\n</think>\n\n<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
)
SCRIPT = {
    "rules": [
        {"match": "weather", "reply": WEATHER_REPLY},
        {"match": "list files", "reply": "Sure.", "delay_s": 0.0},
        {"match": "slowly", "reply": "one two three four five six seven " * 20, "delay_s": 0.05},
    ],
    "default": "I do not know.",
}


@pytest.fixture(scope="module")
def tok(tiny_model_dir: Path) -> Any:
    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


@pytest.fixture(scope="module")
def scripted_url(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    script = tmp_path_factory.mktemp("script") / "script.json"
    script.write_text(json.dumps(SCRIPT))
    with running_engine(engine_config(tiny_model_dir, script_path=script)) as url:
        yield url


def test_incremental_stream_concatenates_to_the_full_answer(tiny_model_dir: Path) -> None:
    config = engine_config(tiny_model_dir, incremental_streaming_output=True)
    body = {
        "input_ids": PROMPT,
        "sampling_params": {"temperature": 0, "max_new_tokens": 16, "ignore_eos": True},
        "return_logprob": True,
    }
    with running_engine(config) as url:
        full = generate(url, body)
        chunks = stream_chunks(url, body)
    ids = [i for c in chunks for i in c["output_ids"]]
    logprobs = [e for c in chunks for e in c["meta_info"]["output_token_logprobs"]]
    assert ids == full["output_ids"]
    assert logprobs == full["meta_info"]["output_token_logprobs"]
    assert "".join(c["text"] for c in chunks) == full["text"]
    assert chunks[-1]["meta_info"]["completion_tokens"] == 16


def _prompt(tok: Any, messages: list[dict[str, str]]) -> list[int]:
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids: list[int] = tok.encode(text, add_special_tokens=False)
    return ids


def test_prompt_tail_is_after_last_assistant_turn() -> None:
    text = "<|im_start|>user\nweather?<|im_end|>\n<|im_start|>assistant\nok<|im_end|>\nrest"
    assert prompt_tail(text) == "\nrest"
    assert prompt_tail("no turns") == "no turns"


def test_scripted_reply_is_emitted_token_for_token(scripted_url: str, tok: Any) -> None:
    prompt = _prompt(tok, [{"role": "user", "content": "What is the weather in Paris?"}])
    out = generate(
        scripted_url,
        {
            "input_ids": prompt,
            "return_logprob": True,
            "return_routed_experts": True,
            "sampling_params": {"max_new_tokens": 200},
        },
    )
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    expected = [*tok.encode(WEATHER_REPLY, add_special_tokens=False), eos]
    assert out["output_ids"] == expected
    assert out["text"] == WEATHER_REPLY
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": eos}
    logprobs = [e[0] for e in out["meta_info"]["output_token_logprobs"]]
    assert all(lp < 0 for lp in logprobs)
    assert len(set(logprobs)) > 1
    assert decode_routing(out["meta_info"]).shape == (len(prompt) + len(expected) - 1, 4, 2)


def test_scripted_rule_matches_only_the_tail(scripted_url: str, tok: Any) -> None:
    prompt = _prompt(
        tok,
        [
            {"role": "user", "content": "weather please"},
            {"role": "assistant", "content": "It is sunny."},
            {"role": "user", "content": "now list files"},
        ],
    )
    out = generate(scripted_url, {"input_ids": prompt})
    assert out["text"] == "Sure."
    other = generate(scripted_url, {"input_ids": _prompt(tok, [{"role": "user", "content": "?"}])})
    assert other["text"] == "I do not know."


def test_scripted_reply_honours_max_new_tokens(scripted_url: str, tok: Any) -> None:
    prompt = _prompt(tok, [{"role": "user", "content": "weather"}])
    out = generate(scripted_url, {"input_ids": prompt, "sampling_params": {"max_new_tokens": 3}})
    assert out["output_ids"] == tok.encode(WEATHER_REPLY, add_special_tokens=False)[:3]
    assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 3}


def test_client_disconnect_aborts_the_request(scripted_url: str, tok: Any) -> None:
    prompt = _prompt(tok, [{"role": "user", "content": "answer slowly"}])
    with httpx.stream(
        "POST", f"{scripted_url}/generate", json={"input_ids": prompt, "stream": True}, timeout=30
    ) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                break
    assert httpx.post(f"{scripted_url}/flush_cache").status_code in (200, 400)
    deadline = time.monotonic() + 5
    while httpx.post(f"{scripted_url}/flush_cache").status_code != 200:
        assert time.monotonic() < deadline, "the disconnected request kept running"
        time.sleep(0.05)


def test_zero_compute(tiny_model_dir: Path, tok: Any) -> None:
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    reply = [*tok.encode("OK.", add_special_tokens=False), eos]
    with running_engine(engine_config(tiny_model_dir, zero_compute=True)) as url:
        out = generate(
            url, {"input_ids": PROMPT, "return_logprob": True, "return_routed_experts": True}
        )
        assert out["output_ids"] == reply
        assert out["text"] == "OK."
        assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": eos}
        assert [e[0] for e in out["meta_info"]["output_token_logprobs"]] == [FIXED_LOGPROB] * len(
            reply
        )
        rows = decode_routing(out["meta_info"])
        assert rows.shape == (len(PROMPT) + len(reply) - 1, 4, 2)
        assert (rows >= 0).all()
        assert (rows < 8).all()
        cut = generate(url, {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 1}})
        assert cut["meta_info"]["finish_reason"] == {"type": "length", "length": 1}
        chunks = stream_chunks(url, {"input_ids": PROMPT})
        assert chunks[-1]["output_ids"] == reply
        bad = httpx.post(f"{url}/generate", json={"input_ids": PROMPT, "sampling_params": {"x": 1}})
        assert bad.status_code == 400


def test_zero_compute_of_a_given_length_paced_streams_a_chunk_per_token(
    tiny_model_dir: Path, tok: Any
) -> None:
    """What a decoding engine sends (SGLang: a chunk per decode step), without a forward
    pass: so a client's cost per streamed chunk can be measured. Unpaced, the same reply
    comes as one chunk."""
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    paced = engine_config(
        tiny_model_dir, zero_compute=True, zero_compute_reply_tokens=12, zero_compute_token_s=0.01
    )
    with running_engine(paced) as url:
        began = time.monotonic()
        chunks = stream_chunks(url, {"input_ids": PROMPT, "return_logprob": True})
        assert time.monotonic() - began >= 0.1  # 12 tokens, 10 ms apart
        assert [len(c["output_ids"]) for c in chunks] == list(range(1, 13))  # cumulative
        reply = chunks[-1]["output_ids"]
        assert reply[-1] == eos
        assert (" ok" * 12).startswith(tok.decode(reply[:-1]))  # one word, repeated
        assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "stop", "matched": eos}
        cut = generate(url, {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 3}})
        assert cut["output_ids"] == reply[:3]
        assert cut["meta_info"]["finish_reason"] == {"type": "length", "length": 3}
    unpaced = engine_config(tiny_model_dir, zero_compute=True, zero_compute_reply_tokens=12)
    with running_engine(unpaced) as url:
        chunks = stream_chunks(url, {"input_ids": PROMPT})
        assert [len(c["output_ids"]) for c in chunks] == [12]


@pytest.mark.parametrize(
    ("interval", "sizes"),
    [
        (1, list(range(1, 21))),
        # The first token at once, then every 8 unsent, then the finish.
        (8, [1, 9, 17, 20]),
        (5, [1, 6, 11, 16, 20]),
        (32, [1, 20]),
    ],
)
def test_a_stream_interval_sends_the_first_token_at_once_then_every_n(
    tiny_model_dir: Path, interval: int, sizes: list[int]
) -> None:
    """``sampling_params.stream_interval`` as SGLang 0.5.23 sends it (``OutputStreamer.accept``
    in ``managers/scheduler_components/output_streamer.py``): not on multiples of N, but the
    first token at once, then whenever N tokens are unsent. The proxy's time to first token
    of a chunked turn rests on that first chunk."""
    paced = engine_config(
        tiny_model_dir, zero_compute=True, zero_compute_reply_tokens=20, zero_compute_token_s=0.01
    )
    with running_engine(paced) as url:
        body = {"input_ids": PROMPT, "sampling_params": {"stream_interval": interval}}
        chunks = stream_chunks(url, body)
    assert [len(c["output_ids"]) for c in chunks] == sizes
    assert [c["meta_info"]["finish_reason"] is None for c in chunks[:-1]] == [True] * (
        len(sizes) - 1
    )
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "stop"


def test_a_paced_zero_compute_generation_is_aborted_in_flight(
    tiny_model_dir: Path, tok: Any
) -> None:
    """In flight until its finish, it ends at SGLang's abort with what it sent so far."""
    paced = engine_config(
        tiny_model_dir, zero_compute=True, zero_compute_reply_tokens=200, zero_compute_token_s=0.01
    )
    with running_engine(paced) as url, httpx.Client(timeout=30) as client:
        body = {"input_ids": PROMPT, "rid": "paced-1", "stream": True}
        with client.stream("POST", f"{url}/generate", json=body) as response:
            lines = response.iter_lines()
            first = next(line for line in lines if line.startswith("data: {"))
            assert json.loads(first[6:])["meta_info"]["finish_reason"] is None
            assert client.post(f"{url}/abort_request", json={"rid": "paced-1"}).status_code == 200
            last = [json.loads(line[6:]) for line in lines if line.startswith("data: {")][-1]
        finish = last["meta_info"]["finish_reason"]
        assert finish["type"] == "abort"
        assert 1 <= len(last["output_ids"]) < 200
        assert client.post(f"{url}/flush_cache").status_code == 200  # nothing left running
