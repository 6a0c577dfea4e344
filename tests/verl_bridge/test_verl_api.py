"""The boundary to verl, the parts that need no verl: what a sample's fields may look
like, verl's sampling as session pins, and the refusal when verl is missing."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from kernel.errors import ConfigurationError
from verl_bridge.verl_api import SampleFields, load, session_pins


def test_sample_fields_take_numpy_and_tensor_scalars_as_verl_sends_them() -> None:
    fields = SampleFields.model_validate(
        {
            "extra_info": {"lego_task_id": "calc-clamp", "index": 4},
            "uid": np.str_("6f1c"),
            "session_id": np.int64(3),
            "global_steps": torch.tensor(12),
            "raw_prompt": [{"role": "user", "content": "ignored: the task has its own"}],
        }
    )
    assert (fields.extra_info.lego_task_id, fields.uid, fields.session_id) == (
        "calc-clamp",
        "6f1c",
        3,
    )
    assert fields.global_steps == 12


@pytest.mark.parametrize(
    "fields",
    [
        {"uid": "u"},  # no extra_info: which task?
        {"uid": "u", "extra_info": {}},
        {"uid": "u", "extra_info": {"lego_task_id": ""}},
        {"extra_info": {"lego_task_id": "t"}},  # no group
    ],
)
def test_a_sample_without_a_task_or_a_group_is_refused(fields: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        SampleFields.model_validate(fields)


def test_verl_sampling_becomes_the_session_pins() -> None:
    verl = {"temperature": 0.7, "top_p": 0.95, "top_k": -1, "repetition_penalty": 1.0}
    assert session_pins({**verl, "logprobs": True}) == {"temperature": 0.7, "top_p": 0.95}
    assert session_pins({**verl, "top_k": 20})["top_k"] == 20
    assert "top_k" not in session_pins({**verl, "top_k": 0})  # HF's "off"
    with pytest.raises(ConfigurationError, match="repetition_penalty"):
        session_pins({**verl, "repetition_penalty": 1.1})


def test_loading_verl_where_it_is_missing_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "verl", None)  # what an absent package imports as
    with pytest.raises(ConfigurationError, match=r"verl cannot be imported.*make test-verl"):
        load()
