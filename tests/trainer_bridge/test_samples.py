"""Claimed groups -> the trainer's samples: scalar rewards, the claimed arrays themselves."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from kernel.errors import Unsupported
from recorder.export_wire import (
    ClaimedBatch,
    ClaimedGroup,
    ClaimedSample,
    decode_claim,
    encode_claim,
)
from tests.recorder.builders import segment
from trainer_bridge.samples import samples_from_batch


def claimed(*samples: ClaimedSample) -> ClaimedBatch:
    return ClaimedBatch("b", (ClaimedGroup("g", "t", samples),), 0, format="binv1")


def test_each_segment_with_sampled_tokens_is_a_sample_in_delivery_order() -> None:
    nothing_sampled = dataclasses.replace(segment(3), loss_mask=np.zeros(3, dtype=np.uint8))
    first = ClaimedSample("s1", 0, 1.0, "completed", (segment(), nothing_sampled, segment(6)))
    second = ClaimedSample("s2", 1, None, "completed", (segment(2),))

    samples = samples_from_batch(claimed(first, second))

    assert [(s.session_id, len(s)) for s in samples] == [("s1", 4), ("s1", 6), ("s2", 2)]
    assert [s.reward for s in samples] == [1.0, 1.0, 0.0]  # no reward: graded 0
    assert {s.group_id for s in samples} == {"g"}
    assert samples[0].weight_versions == ("v1", "v2")
    assert samples[0].num_sampled == 2


def test_a_vector_reward_is_refused() -> None:
    vector = ClaimedSample("s1", 0, (1.0, 0.0), "completed", (segment(),))
    with pytest.raises(Unsupported, match="vector reward"):
        samples_from_batch(claimed(vector))


def test_samples_hold_the_claimed_arrays_not_copies() -> None:
    body = encode_claim(claimed(ClaimedSample("s1", 0, 1.0, "completed", (segment(),))))
    batch = decode_claim(body)
    (got,) = batch.groups[0].samples[0].segments

    (sample,) = samples_from_batch(batch)

    assert sample.tokens is got.tokens
    assert sample.routed_experts is got.routed_experts
    assert np.shares_memory(sample.rollout_logprobs, np.frombuffer(body, dtype=np.uint8))
