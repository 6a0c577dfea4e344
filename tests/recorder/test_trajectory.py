"""build_segments: alignment of tokens, mask, logprobs and routing.

Their wire forms are tested in ``test_export_wire``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import replace

import numpy as np
import numpy.typing as npt
import pytest

from kernel.errors import RecorderError
from recorder.records import RoutedExperts, TurnArrays, TurnRecord, TurnStatus
from recorder.trajectory import build_segments
from tests.recorder.builders import experts, make_turn


def rows(n: int, base: int, layers: int = 2, top_k: int = 2) -> list[list[list[int]]]:
    """n distinct routing rows: row j holds base + j in every slot (plus the slot index)."""
    return [
        [[base + j + 100 * (layer * top_k + k) for k in range(top_k)] for layer in range(layers)]
        for j in range(n)
    ]


def as_stored(turn: TurnRecord, dtype: npt.DTypeLike) -> TurnArrays:
    """The turn as the store reads it back: its routing rows in a stored dtype."""
    arrays = TurnArrays.of(turn)
    assert arrays.routed_rows is not None
    return dataclasses.replace(arrays, routed_rows=arrays.routed_rows.astype(dtype))


def test_single_turn_segment() -> None:
    turn = make_turn(
        "s",
        0,
        prompt=(10, 11, 12),
        output=(13, 14),
        logprobs=(-0.25, -0.5),
        routed=experts(0, rows(4, 1)),
        weight_version="v1",
    )

    [seg] = build_segments([turn])

    assert seg.tokens.tolist() == [10, 11, 12, 13, 14]
    assert seg.loss_mask.tolist() == [0, 0, 0, 1, 1]
    assert seg.logprobs.tolist() == [0.0, 0.0, 0.0, -0.25, -0.5]
    assert [seg.tokens.dtype, seg.loss_mask.dtype, seg.logprobs.dtype] == [
        np.dtype(np.int32),
        np.dtype(np.uint8),
        np.dtype(np.float32),
    ]
    assert seg.weight_versions == ("v1",)
    assert seg.turn_ids == (turn.id,)
    assert seg.routed_experts is not None
    assert seg.routed_experts.dtype == np.int32  # the dtype its turn's rows came in
    assert seg.routed_experts.shape == (5, 2, 2)
    np.testing.assert_array_equal(seg.routed_experts[:4], np.asarray(rows(4, 1)))
    np.testing.assert_array_equal(seg.routed_experts[4], np.zeros((2, 2)))  # padding row


def test_multi_turn_extension_aligns_mask_logprobs_and_routing() -> None:
    first = make_turn(
        "s",
        0,
        prompt=(1, 2, 3),
        output=(4, 5),
        logprobs=(-0.1, -0.2),
        routed=experts(0, rows(4, 10)),
        weight_version="v1",
    )
    # The second turn fetched only the rows the first did not hold (start_len = 4).
    second = make_turn(
        "s",
        1,
        prompt=(1, 2, 3, 4, 5, 6, 7),
        output=(8, 9),
        logprobs=(-0.3, -0.4),
        routed=experts(4, rows(4, 50)),
        weight_version="v2",
    )

    [seg] = build_segments([second, first])  # order comes from seq, not the input

    assert seg.tokens.tolist() == [1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert seg.loss_mask.tolist() == [0, 0, 0, 1, 1, 0, 0, 1, 1]
    want = np.asarray([0.0, 0.0, 0.0, -0.1, -0.2, 0.0, 0.0, -0.3, -0.4], dtype=np.float32)
    np.testing.assert_array_equal(seg.logprobs, want)  # logprobs are recorded as float32
    assert seg.weight_versions == ("v1", "v2")
    assert seg.turn_ids == (first.id, second.id)
    expected = np.zeros((9, 2, 2), dtype=np.int32)
    expected[0:4] = rows(4, 10)
    expected[4:8] = rows(4, 50)
    assert seg.routed_experts is not None
    np.testing.assert_array_equal(seg.routed_experts, expected)


def test_later_turn_routing_overwrites_earlier_rows() -> None:
    first = make_turn("s", 0, prompt=(1, 2), output=(3,), routed=experts(0, rows(2, 10)))
    second = make_turn("s", 1, prompt=(1, 2, 3, 4), output=(5,), routed=experts(0, rows(4, 70)))

    [seg] = build_segments([first, second])

    assert seg.routed_experts is not None
    np.testing.assert_array_equal(seg.routed_experts[:4], np.asarray(rows(4, 70)))
    np.testing.assert_array_equal(seg.routed_experts[4], np.zeros((2, 2)))


def test_non_prefix_prompt_forks_a_second_segment_and_main_continues() -> None:
    main1 = make_turn("s", 0, prompt=(1, 2, 3), output=(4,))
    side = make_turn("s", 1, prompt=(1, 2, 99), output=(98,), weight_version="v9")
    main2 = make_turn("s", 2, prompt=(1, 2, 3, 4, 5), output=(6,))

    main, fork = build_segments([main1, side, main2])

    assert main.turn_ids == (main1.id, main2.id)
    assert main.tokens.tolist() == [1, 2, 3, 4, 5, 6]
    assert main.loss_mask.tolist() == [0, 0, 0, 1, 0, 1]
    assert fork.turn_ids == (side.id,)
    assert fork.tokens.tolist() == [1, 2, 99, 98]
    assert fork.loss_mask.tolist() == [0, 0, 0, 1]
    assert fork.weight_versions == ("v9",)
    assert main.routed_experts is None
    assert fork.routed_experts is None


def test_prefers_the_most_recently_extended_matching_segment() -> None:
    a = make_turn("s", 0, prompt=(1, 2, 3), output=(4,))  # segment A: 1 2 3 4
    b = make_turn("s", 1, prompt=(1, 2), output=(3,))  # not an extension of A: B = 1 2 3
    c = make_turn("s", 2, prompt=(1, 2, 3, 4, 5), output=(6,))  # both A and B are prefixes

    seg_a, seg_b = build_segments([a, b, c])

    assert seg_a.turn_ids == (a.id,)
    assert seg_b.turn_ids == (b.id, c.id)
    assert seg_b.tokens.tolist() == [1, 2, 3, 4, 5, 6]
    assert seg_b.loss_mask.tolist() == [0, 0, 1, 0, 0, 1]


@pytest.mark.parametrize("status", [TurnStatus.FAILED, TurnStatus.CANCELLED])
def test_only_completed_turns_count(status: TurnStatus) -> None:
    first = make_turn("s", 0, prompt=(1,), output=(2,))
    broken = make_turn("s", 1, prompt=(7, 7), output=(8,), status=status)
    second = make_turn("s", 2, prompt=(1, 2, 3), output=(4,))

    segments = build_segments([first, broken, second])

    assert [seg.turn_ids for seg in segments] == [(first.id, second.id)]
    assert build_segments([broken]) == []


def test_mismatched_logprobs_are_refused() -> None:
    with pytest.raises(RecorderError, match="logprobs"):
        build_segments([make_turn("s", 0, output=(4, 5), logprobs=(-0.1,))])


def test_mismatched_routing_shapes_are_refused() -> None:
    first = make_turn("s", 0, prompt=(1,), output=(2,), routed=experts(0, rows(1, 0, layers=2)))
    second = make_turn("s", 1, prompt=(1, 2), output=(3,), routed=experts(0, rows(2, 0, layers=3)))
    with pytest.raises(RecorderError, match="routed experts"):
        build_segments([first, second])


def test_the_segment_a_root_began_comes_first() -> None:
    """A side request recorded before the main conversation (re-labelled) comes after it."""
    title = replace(
        make_turn("s", 0, prompt=(50, 51), output=(52,)),
        classification="fork",
        fork_reason="side_request",
    )
    main1 = make_turn("s", 1, prompt=(1, 2), output=(3,))
    main2 = replace(make_turn("s", 2, prompt=(1, 2, 3, 4), output=(5,)), classification="extend")
    compacted = replace(
        make_turn("s", 3, prompt=(1, 9), output=(8,)),
        classification="fork",
        fork_reason="compaction",
    )

    segments = build_segments([title, main1, main2, compacted])

    assert [seg.turn_ids for seg in segments] == [
        (main1.id, main2.id),
        (title.id,),
        (compacted.id,),
    ]


def test_routed_experts_keep_their_stored_dtype_widened_to_the_widest_turn() -> None:
    first = make_turn("s", 0, prompt=(1, 2), output=(3,), routed=experts(0, rows(3, 1, 1)))
    # ids up to 501: this turn's rows were stored as uint16.
    second = make_turn("s", 1, prompt=(1, 2, 3, 4), output=(5,), routed=experts(3, rows(2, 400, 1)))
    [reference] = build_segments([first, second])  # int32 rows, as the backend sent them

    [narrow] = build_segments([as_stored(first, np.uint8)])
    [mixed] = build_segments([as_stored(first, np.uint8), as_stored(second, np.uint16)])

    assert narrow.routed_experts is not None
    assert narrow.routed_experts.dtype == np.uint8
    assert mixed.routed_experts is not None
    assert mixed.routed_experts.dtype == np.uint16
    assert reference.routed_experts is not None
    np.testing.assert_array_equal(mixed.routed_experts, reference.routed_experts)


def test_an_empty_turn_gives_an_empty_aligned_segment() -> None:
    empty_rows = RoutedExperts(start=0, rows=np.zeros((0, 2, 2), dtype=np.int32))
    turn = make_turn("s", 0, prompt=(), output=(), logprobs=(), routed=empty_rows)

    [seg] = build_segments([turn])

    assert (len(seg.tokens), len(seg.loss_mask), len(seg.logprobs)) == (0, 0, 0)
    assert seg.routed_experts is not None
    assert seg.routed_experts.shape == (0, 2, 2)
    assert seg.weight_version_spans == ()
    assert seg.turn_ids == (turn.id,)
