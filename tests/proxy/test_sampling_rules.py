"""SGLang's sampling rules at the proxy's edge: a value SGLang would refuse on every turn is
a 400 in the caller's own shape, before any backend call (``proxy.sampling_rules``)."""

from __future__ import annotations

from typing import Any

import anthropic
import openai
import pytest

from tests.proxy.conftest import Proxy
from tests.support.tap import BackendTap

MESSAGES: Any = [{"role": "user", "content": "hello"}]


@pytest.mark.parametrize("top_k", [0, -2])
def test_chat_refuses_a_top_k_sglang_refuses(proxy: Proxy, tap: BackendTap, top_k: int) -> None:
    session = proxy.new_session()
    tap.reset()
    client = openai.OpenAI(base_url=session["openai_base_url"], api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="m", messages=MESSAGES, extra_body={"top_k": top_k})
    body = info.value.body
    assert isinstance(body, dict)
    assert body["param"] == "top_k"
    assert body["type"] == "invalid_request_error"
    assert f"top_k must be -1 (disable) or at least 1, got {top_k}" in body["message"]
    assert tap.generates == []


def test_responses_refuses_a_top_k_sglang_refuses(proxy: Proxy, tap: BackendTap) -> None:
    session = proxy.new_session()
    tap.reset()
    client = openai.OpenAI(base_url=session["openai_base_url"], api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model="m", input="hello", extra_body={"top_k": 0})
    body = info.value.body
    assert isinstance(body, dict)
    assert body["param"] == "top_k"
    assert tap.generates == []


def test_messages_refuses_top_k_zero(proxy: Proxy, tap: BackendTap) -> None:
    session = proxy.new_session()
    tap.reset()
    client = anthropic.Anthropic(base_url=session["anthropic_base_url"], api_key="x", max_retries=0)
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(model="m", max_tokens=8, messages=MESSAGES, extra_body={"top_k": 0})
    assert tap.generates == []


def test_valid_top_k_values_reach_the_backend(proxy: Proxy, tap: BackendTap) -> None:
    session = proxy.new_session()
    client = openai.OpenAI(base_url=session["openai_base_url"], api_key="x", max_retries=0)
    for top_k in (-1, 1, 40):
        tap.reset()
        client.chat.completions.create(model="m", messages=MESSAGES, extra_body={"top_k": top_k})
        (call,) = tap.generates
        assert call.body["sampling_params"]["top_k"] == top_k
