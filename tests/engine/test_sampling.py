"""sampling_params parsing (SGLang's contract) and token choice."""

from __future__ import annotations

import pytest
import torch

from engine.sampling import (
    SamplingContractError,
    choose_token,
    parse_sampling_params,
    verify_sampling_params,
)
from kernel.errors import InvalidRequest, Unsupported


def test_defaults_and_nulls() -> None:
    params = parse_sampling_params({"temperature": None, "max_new_tokens": None})
    assert params.temperature == 1.0
    assert params.max_new_tokens == 128
    assert params.skip_special_tokens is True


def test_unknown_key_is_a_contract_error() -> None:
    with pytest.raises(SamplingContractError) as info:
        parse_sampling_params({"max_tokens": 5})
    assert info.value.message.startswith("unknown field `max_tokens`, expected one of `max_new")


def test_stop_string_becomes_tuple() -> None:
    assert parse_sampling_params({"stop": "X"}).stop == ("X",)
    assert parse_sampling_params({"stop": ["a", "b"]}).stop == ("a", "b")


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        ({"json_schema": "{}"}, Unsupported),
        ({"n": 2}, Unsupported),
        ({"temperature": "hot"}, InvalidRequest),
    ],
)
def test_refusals(raw: dict[str, object], error: type[Exception]) -> None:
    with pytest.raises(error):
        parse_sampling_params(raw)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"top_p": 0}, "top_p must be in (0, 1], got 0.0."),
        ({"max_new_tokens": -1}, "max_new_tokens must be at least 0, got -1."),
        ({"top_k": 0}, "top_k must be -1 (disable) or at least 1, got 0."),
        ({"top_k": -2}, "top_k must be -1 (disable) or at least 1, got -2."),
        ({"repetition_penalty": 2.5}, "repetition_penalty must be in (0, 2]"),
        ({"sampling_seed": 2**63}, "sampling_seed must be in [-2**63, 2**63 - 1]"),
        ({"stop_regex": "("}, "stop_regex is not a valid regex"),
    ],
)
def test_ranges_are_checked_with_sglangs_rules(raw: dict[str, object], message: str) -> None:
    params = parse_sampling_params(raw)  # the schema gate lets values of the right type in
    with pytest.raises(InvalidRequest) as info:
        verify_sampling_params(params)
    assert message in info.value.message


def test_a_greedy_temperature_lets_top_k_zero_through() -> None:
    # SGLang turns temperature < 1e-6 into top_k = 1 before it checks top_k.
    verify_sampling_params(parse_sampling_params({"temperature": 0, "top_k": 0}))


def test_greedy_and_banned() -> None:
    logits = torch.tensor([0.0, 5.0, 1.0, 4.0])
    gen = torch.Generator().manual_seed(0)
    greedy = parse_sampling_params({"temperature": 0})
    assert choose_token(logits, greedy, gen, seen=[], generated=[], banned=[]) == 1
    assert choose_token(logits, greedy, gen, seen=[], generated=[], banned=[1]) == 3


def test_top_k_and_seed() -> None:
    logits = torch.zeros(50)
    params = parse_sampling_params({"top_k": 2, "sampling_seed": 7})
    logits[10] = logits[20] = 1.0
    picks = {
        choose_token(
            logits, params, torch.Generator().manual_seed(s), seen=[], generated=[], banned=[]
        )
        for s in range(30)
    }
    assert picks == {10, 20}
    a = [
        choose_token(
            torch.zeros(50),
            params,
            torch.Generator().manual_seed(3),
            seen=[],
            generated=[],
            banned=[],
        )
        for _ in range(3)
    ]
    assert len(set(a)) == 1


def test_logit_bias_and_repetition_penalty() -> None:
    logits = torch.tensor([1.0, 2.0, 0.5])
    biased = parse_sampling_params({"temperature": 0, "logit_bias": {"2": 10.0}})
    gen = torch.Generator()
    assert choose_token(logits, biased, gen, seen=[], generated=[], banned=[]) == 2
    penal = parse_sampling_params({"temperature": 0, "repetition_penalty": 4.0})
    assert choose_token(logits, penal, gen, seen=[1], generated=[], banned=[]) == 0
