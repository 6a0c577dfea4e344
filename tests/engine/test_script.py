"""The scripted policy's stochastic rules: drawn per generation, seeded, resumable."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from engine.script import ScriptedPolicy
from kernel.errors import InvalidRequest

PROMPT = "<|im_start|>user\nTRY it<|im_end|>\n<|im_start|>assistant\n"


def load(tmp_path: Path, body: dict[str, object]) -> ScriptedPolicy:
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(body))
    return ScriptedPolicy.load(path)


def test_a_rule_with_replies_draws_each_of_them_and_the_seed_fixes_the_sequence(
    tmp_path: Path,
) -> None:
    body = {"rules": [{"match": "TRY", "replies": ["win", "lose"]}], "seed": 7}
    first = [load(tmp_path, body).reply_for(PROMPT).text for _ in range(1)]
    policy = load(tmp_path, body)
    drawn = [policy.reply_for(PROMPT).text for _ in range(200)]
    assert set(Counter(drawn)) == {"win", "lose"}
    assert min(Counter(drawn).values()) > 60  # uniform, not stuck on one
    assert drawn[:1] == first
    again = load(tmp_path, body)
    assert [again.reply_for(PROMPT).text for _ in range(200)] == drawn


def test_a_resumed_generation_keeps_the_reply_it_began(tmp_path: Path) -> None:
    policy = load(tmp_path, {"rules": [{"match": "TRY", "replies": ["alpha one", "beta two"]}]})
    for _ in range(20):
        assert policy.reply_for(PROMPT + "beta").text == "beta two"
        assert policy.reply_for(PROMPT + "alpha o").text == "alpha one"


def test_a_single_reply_never_touches_the_random_stream(tmp_path: Path) -> None:
    policy = load(tmp_path, {"rules": [{"match": "TRY", "reply": "fixed"}]})
    assert {policy.reply_for(PROMPT).text for _ in range(10)} == {"fixed"}


def test_empty_replies_are_refused_when_the_script_loads(tmp_path: Path) -> None:
    with pytest.raises(InvalidRequest, match="non-empty list"):
        load(tmp_path, {"rules": [{"match": "TRY", "replies": []}]})
