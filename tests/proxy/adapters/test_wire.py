"""``proxy.adapters.wire``: the unstorable-value check skips its walk only when the JSON
text cannot hold what it refuses, and refuses the same values, with the same message, as
the full walk; unknown fields are found at any depth."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel.errors import InvalidRequest
from proxy.adapters.anthropic_messages import AnthropicMessagesAdapter
from proxy.adapters.base import Adapter
from proxy.adapters.openai_chat import OpenAIChatAdapter
from proxy.adapters.openai_responses import OpenAIResponsesAdapter
from proxy.adapters.signing import ReasoningSigner
from proxy.adapters.wire import refuse_unstorable

SIGNER = ReasoningSigner(b"secret")

# JSON text of values the walk refuses, each as a client could spell it.
UNSTORABLE = [
    ("9223372036854775808", "integers must fit in 64 bits"),  # INT64_MAX + 1
    ("-9223372036854775809", "integers must fit in 64 bits"),
    ("18446744073709551616", "integers must fit in 64 bits"),
    ("1e400", "numbers must be finite"),
    ("-1.5E+309", "numbers must be finite"),
    ("2" + "0" * 309, "integers must fit in 64 bits"),
    ("2" + "0" * 309 + ".0", "numbers must be finite"),
    ("NaN", "numbers must be finite"),
    ("Infinity", "numbers must be finite"),
    ("-Infinity", "numbers must be finite"),
]


def chat_body(extra: str) -> bytes:
    return (
        '{"model": "m", "messages": [{"role": "user", "content": "hi"}], '
        f'"metadata": {{"deep": [1, {{"value": {extra}}}]}}}}'
    ).encode()


@pytest.mark.parametrize(("value", "reason"), UNSTORABLE)
def test_each_unstorable_spelling_is_refused_with_its_path(value: str, reason: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        OpenAIChatAdapter().parse_request(chat_body(value))
    assert refused.value.param == "metadata.deep[1].value"
    assert reason in refused.value.message


def test_a_nul_in_a_field_name_is_refused_by_every_protocol() -> None:
    nul_key = '{"a\\u0000b": 1}'
    bodies: dict[Adapter, bytes] = {
        OpenAIChatAdapter(): chat_body(nul_key),
        AnthropicMessagesAdapter(SIGNER): (
            '{"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}],'
            f' "metadata": {nul_key}}}'
        ).encode(),
        OpenAIResponsesAdapter(SIGNER): f'{{"model": "m", "input": "hi", "x": {nul_key}}}'.encode(),
    }
    for adapter, body in bodies.items():
        with pytest.raises(InvalidRequest) as refused:
            adapter.parse_request(body)
        assert "names must not contain NUL" in refused.value.message, adapter.name


def test_text_that_only_looks_unstorable_still_parses() -> None:
    """Digits, exponents and the words in strings make the walk run; it finds nothing."""
    content = "id 12345678901234567890, 1e400, NaN, Infinity, a \\\\u0000 escape"
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": content}]})
    request = OpenAIChatAdapter().parse_request(body.encode())
    assert request.messages[0].content == content


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=12,
)


def refusal(node: object, source: bytes | None) -> str | None:
    try:
        refuse_unstorable(node, source=source)
    except InvalidRequest as exc:
        return exc.message
    return None


@settings(max_examples=400, deadline=None)
@given(json_values, st.sampled_from(["python", "compact", "js-exponent"]))
def test_the_scan_never_skips_a_value_the_walk_refuses(value: Any, style: str) -> None:
    """Whatever JSON text a client writes for a value, the scan lets the walk see it."""
    text = json.dumps(value, allow_nan=True)
    if style == "compact":
        text = json.dumps(value, separators=(",", ":"), allow_nan=True)
    elif style == "js-exponent":
        text = text.replace("e+", "e")  # JavaScript writes 1e+300; some write 1e300
    parsed = json.loads(text)
    assert refusal(parsed, text.encode()) == refusal(parsed, None)


def test_unknown_fields_are_found_at_any_depth() -> None:
    """``ignored_extras`` descends only into fields that can hold models or lists, and
    still finds every unknown field, however deep."""
    body = {
        "model": "m",
        "top_extra": 1,
        "messages": [
            {"role": "user", "content": "hi", "name_tag": "x"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c",
                        "type": "function",
                        "function": {"name": "bash", "arguments": "{}", "strict": 1},
                    }
                ],
            },
        ],
    }
    request = OpenAIChatAdapter().parse_request(json.dumps(body).encode())
    assert set(request.ignored_fields) == {
        "top_extra",
        "messages[].name_tag",
        "messages[].tool_calls[].function.strict",
    }
