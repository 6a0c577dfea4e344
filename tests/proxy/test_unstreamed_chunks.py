"""``LEGO_UNSTREAMED_CHUNK_TOKENS`` (64 by default): a turn the harness does not stream asks
the backend for a chunk every N tokens (SGLang's ``sampling_params.stream_interval``; SGLang
0.5.23 sends the first token at once, then a chunk whenever N tokens are unsent), so the
proxy reads N times fewer chunks, times the first token as before, and records exactly what
it records from a chunk a token. Through a recording tap in front of a paced zero-compute
engine (a chunk per decode step, as SGLang streams) and SGLang's own request types."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import openai
import pytest

from engine.loopback import running_engine
from kernel.threaded import serve
from proxy.routes import inference
from tests.engine.helpers import engine_config
from tests.proxy.conftest import Proxy, running_proxy
from tests.support.sglang_types import sglang_checks
from tests.support.tap import BackendTap

REPLY_TOKENS = 48
CHUNK_TOKENS = 16
TTFT = "lego_time_to_first_token_seconds_count"


@contextmanager
def tapped_engine(
    model: Path, token_s: float, reply_tokens: int = REPLY_TOKENS
) -> Iterator[BackendTap]:
    paced = engine_config(
        model,
        zero_compute=True,
        zero_compute_reply_tokens=reply_tokens,
        zero_compute_token_s=token_s,
    )
    with running_engine(paced) as engine:
        tap = BackendTap(upstream=engine)
        with serve(tap.app()) as url:
            tap.url = url
            yield tap


@pytest.fixture(scope="module")
def paced_tap(tiny_model_dir: Path) -> Iterator[BackendTap]:
    with tapped_engine(tiny_model_dir, 0.002) as tap:
        yield tap


def answer(proxy: Proxy, stream: bool) -> tuple[str, dict[str, Any]]:
    """One turn in a new session: the harness's text and the session's trajectory."""
    session = proxy.new_session()
    client = openai.OpenAI(base_url=session["openai_base_url"], api_key="k", max_retries=0)
    messages: Any = [{"role": "user", "content": "hi"}]
    if stream:
        chunks = client.chat.completions.create(model="m", messages=messages, stream=True)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    else:
        reply = client.chat.completions.create(model="m", messages=messages)
        text = reply.choices[0].message.content or ""
    return text, proxy.trajectory(session["id"])


def test_an_unstreamed_turn_reads_a_chunk_every_n_tokens_and_records_the_same(
    paced_tap: BackendTap, tiny_model_dir: Path, tmp_path: Path
) -> None:
    with running_proxy(
        paced_tap.url, tiny_model_dir, tmp_path, None, unstreamed_chunk_tokens=CHUNK_TOKENS
    ) as proxy:
        paced_tap.reset()
        before = proxy.metric_total(TTFT)
        streamed_text, streamed = answer(proxy, stream=True)
        (per_token,) = paced_tap.generates
        assert proxy.metric_total(TTFT) == before + 1
        paced_tap.reset()
        text, unstreamed = answer(proxy, stream=False)
        (chunked,) = paced_tap.generates
        # Its first chunk is its first token: the time to first token is kept.
        assert proxy.metric_total(TTFT) == before + 2

    assert "stream_interval" not in per_token.body["sampling_params"]
    assert chunked.body["sampling_params"]["stream_interval"] == CHUNK_TOKENS
    contract_error, sampling_params = sglang_checks()  # SGLang's own: it takes the key
    assert contract_error(chunked.body) is None
    assert sampling_params(**chunked.body["sampling_params"]).stream_interval == CHUNK_TOKENS
    # The paced engine sends a chunk per decode step unless told otherwise.
    assert len(per_token.chunks) > REPLY_TOKENS // 2
    # The first token, then 16 more twice, then the last 15 with the finish.
    assert [len(chunk["output_ids"]) for chunk in chunked.chunks] == [1, 17, 33, 48]
    assert text == streamed_text
    assert text.startswith(" ok ok")
    (segment,) = unstreamed["segments"]
    (reference,) = streamed["segments"]
    for array in ("tokens", "loss_mask", "logprobs", "routed_experts"):
        assert segment[array] == reference[array], array
    assert sum(segment["loss_mask"]) == REPLY_TOKENS


def test_unstreamed_turns_are_chunked_by_default_and_one_restores_a_chunk_a_token(
    paced_tap: BackendTap, tiny_model_dir: Path, tmp_path: Path
) -> None:
    with running_proxy(paced_tap.url, tiny_model_dir, tmp_path, None) as proxy:
        paced_tap.reset()
        answer(proxy, stream=False)
        (default,) = paced_tap.generates
    with running_proxy(
        paced_tap.url, tiny_model_dir, tmp_path / "one", None, unstreamed_chunk_tokens=1
    ) as proxy:
        paced_tap.reset()
        before = proxy.metric_total(TTFT)
        answer(proxy, stream=False)
        (per_token,) = paced_tap.generates
        assert proxy.metric_total(TTFT) == before + 1
    assert default.body["sampling_params"]["stream_interval"] == 64
    assert len(default.chunks) == 2  # the first token at once, then the 48-token finish
    assert "stream_interval" not in per_token.body["sampling_params"]
    assert len(per_token.chunks) > REPLY_TOKENS // 2


def test_a_pause_mid_chunk_resumes_with_every_token_sampled(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """A pause-abort ends the call with a last chunk holding every token sampled since the
    chunk before: the resumption continues from all of them, and the record is whole."""
    with (
        tapped_engine(tiny_model_dir, 0.01) as slow,
        running_proxy(
            slow.url, tiny_model_dir, tmp_path, None, unstreamed_chunk_tokens=CHUNK_TOKENS
        ) as proxy,
    ):
        result: dict[str, Any] = {}

        def unstreamed() -> None:
            result["text"], result["trajectory"] = answer(proxy, stream=False)

        turn = threading.Thread(target=unstreamed)
        turn.start()
        deadline = time.monotonic() + 30
        # The first token, then the first full chunk (17 tokens in all).
        while not (slow.generates and len(slow.generates[0].chunks) >= 2):
            assert time.monotonic() < deadline, "no chunk came"
            time.sleep(0.005)
        httpx.post(f"{slow.upstream}/pause_generation", json={"mode": "abort"}).raise_for_status()
        httpx.post(f"{slow.upstream}/continue_generation", json={}).raise_for_status()
        turn.join(timeout=60)
    first, resumed = slow.generates
    paused_at = len(first.final["output_ids"])
    assert first.final["meta_info"]["finish_reason"]["type"] == "abort"
    assert CHUNK_TOKENS < paused_at < REPLY_TOKENS  # past the first full chunk, not the end
    assert resumed.body["rid"].endswith("-r1")
    assert resumed.body["input_ids"][-paused_at:] == first.final["output_ids"]
    (segment,) = result["trajectory"]["segments"]
    # The zero-compute engine starts its fixed reply again on the resumed call: the record
    # is what both calls sampled, in order, the tokens past the last full chunk included.
    sampled = first.final["output_ids"] + resumed.final["output_ids"]
    assert segment["tokens"] == first.body["input_ids"] + sampled
    assert sum(segment["loss_mask"]) == len(sampled)


def hang_up_after_two_chunks(proxy: Proxy, tap: BackendTap) -> list[dict[str, Any]]:
    """An unstreamed turn whose harness hangs up 50 ms after the second chunk (17 tokens)
    came; the session's turns once one is recorded."""
    session = proxy.new_session()
    base = urlsplit(session["openai_base_url"])
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    head = (
        f"POST {base.path}/chat/completions HTTP/1.1\r\nHost: {base.netloc}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    with socket.create_connection((base.hostname, base.port)) as harness:
        harness.sendall(head.encode() + body.encode())
        deadline = time.monotonic() + 30
        while not (tap.generates and len(tap.generates[0].chunks) >= 2):
            assert time.monotonic() < deadline, "no chunk came"
            time.sleep(0.005)
        time.sleep(0.05)  # about 5 more tokens sampled, not sent: the next chunk is at 33
    while True:  # the harness is gone; the turn is recorded once it has ended
        turns: list[dict[str, Any]] = proxy.trajectory(session["id"])["turns"]
        if turns or time.monotonic() > deadline:
            return turns
        time.sleep(0.05)


def test_a_harness_that_hangs_up_leaves_a_cancelled_turn_with_every_token_sampled(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The harness hangs up between chunks: the proxy aborts the generation and takes the
    aborted request's last chunk, which holds every token sampled since the chunk before,
    so the cancelled turn records all the model sampled, not only the chunks read."""
    with (
        tapped_engine(tiny_model_dir, 0.01) as slow,
        running_proxy(
            slow.url, tiny_model_dir, tmp_path, None, unstreamed_chunk_tokens=CHUNK_TOKENS
        ) as proxy,
    ):
        (turn,) = hang_up_after_two_chunks(proxy, slow)
    assert turn["status"] == "cancelled"
    assert turn["finish_reason"] == "abort"
    assert turn["completion_tokens"] > CHUNK_TOKENS + 1  # more than the two chunks read
    (generation,) = slow.generates
    assert [abort["rid"] for abort in slow.aborts] == [generation.body["rid"]]
    assert generation.final["meta_info"]["finish_reason"]["type"] == "abort"
    assert turn["completion_tokens"] == len(generation.final["output_ids"]) < REPLY_TOKENS


def test_an_abandoned_turn_whose_backend_ignores_the_abort_is_cancelled_in_time(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker that never ends the aborted request holds the abandoned turn only for
    ``ABANDONED_TURN_WAIT_S``: then it is cancelled where it waits (the abort sent again),
    and recorded with the chunks it read."""
    monkeypatch.setattr(inference, "ABANDONED_TURN_WAIT_S", 0.3)
    with (
        tapped_engine(tiny_model_dir, 0.01, reply_tokens=2000) as deaf,
        running_proxy(
            deaf.url, tiny_model_dir, tmp_path, None, unstreamed_chunk_tokens=CHUNK_TOKENS
        ) as proxy,
    ):
        deaf.swallow_aborts = True
        hung_up = time.monotonic()
        (turn,) = hang_up_after_two_chunks(proxy, deaf)
        recorded_in = time.monotonic() - hung_up
        (generation,) = deaf.generates
        read = len(generation.chunks[-1]["output_ids"])  # the chunks the proxy had read
    assert turn["status"] == "cancelled"
    assert turn["finish_reason"] == "error"  # no end came
    assert CHUNK_TOKENS < turn["completion_tokens"] <= read < 2000
    assert [abort["rid"] for abort in deaf.aborts] == [generation.body["rid"]] * 2
    assert recorded_in < 10  # not the 20 s the whole reply takes
