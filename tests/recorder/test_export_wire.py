"""The export wire contract: every form round-trips a claim, and bad bodies are refused.

One round trip per form replaces the twin decoders the server and the trainer once had:
what the export route encodes is what the trainer's client decodes, array for array,
dtype for dtype. The binv1 frame layout, the dtype conversions and every way a body can be
unusable are checked here once.
"""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import Mapping

import numpy as np
import numpy.typing as npt
import orjson
import pytest

from kernel.errors import InvalidRequest, RecorderError
from recorder.export_wire import (
    ALIGN,
    FORMATS,
    MAGIC,
    SCHEMA_VERSION,
    TRAJECTORY_FORMATS,
    BatchHead,
    ClaimedBatch,
    ClaimedGroup,
    ClaimedSample,
    GroupHead,
    Segment,
    binv1_head,
    binv1_sample,
    check_format,
    claim_body,
    claim_json,
    decode_claim,
    decode_trajectory,
    encode_claim,
    encode_frame,
    sample_json,
    segment_json,
)
from recorder.records import DefenseEvent, StageTimes
from tests.recorder.builders import segment


def batch(wire: str) -> ClaimedBatch:
    first = ClaimedSample(
        session_id="s1",
        sample_index=0,
        reward=1.0,
        termination="completed",
        segments=(segment(), segment(6, experts=np.uint16, base=300)),
        reward_details={"tests": {"passed": 3}},
        stages=StageTimes(sandbox_setup=0.75, agent_execution=31.5, verification=2.0),
        defense_events=(
            DefenseEvent("test_path_reverted", {"path": "tests/test_a.py", "lines": [3, 4]}),
            DefenseEvent("history_hidden"),
        ),
    )
    vector = ClaimedSample("s2", 1, (0.5, -1.0), "max_turns", (segment(3, experts=None),))
    empty = ClaimedSample("s3", 2, None, "completed", (segment(0, experts=np.int32),))
    lonely = ClaimedSample("s4", 0, 0.0, "completed", ())
    return ClaimedBatch(
        batch_id="b1",
        groups=(
            ClaimedGroup("g1", "task-a", (first, vector, empty), staleness=1),
            ClaimedGroup("g2", "task-b", (lonely,), staleness=0),
        ),
        zero_variance_groups=1,
        stale_groups=2,
        lease_expires_at=1_760_000_000.5,
        format=wire,
    )


def assert_same_segment(got: Segment, want: Segment, wire: str) -> None:
    for name in ("tokens", "loss_mask", "logprobs"):
        array = getattr(got, name)
        np.testing.assert_array_equal(array, getattr(want, name), strict=True)
    assert got.weight_versions == want.weight_versions
    assert got.turn_ids == want.turn_ids
    assert got.weight_version_spans == want.weight_version_spans
    if want.routed_experts is None:
        assert got.routed_experts is None
        return
    assert got.routed_experts is not None
    if wire == "json" and not len(want.tokens):
        assert got.routed_experts.shape == (0, 0, 0)  # JSON's [] has no inner shape
        return
    np.testing.assert_array_equal(got.routed_experts, want.routed_experts, strict=False)
    # binv1 keeps the stored dtype, b64v1 the smallest that holds every id, json numbers
    # become int32.
    expected = {"binv1": want.routed_experts.dtype, "json": np.dtype(np.int32)}.get(wire)
    if expected is not None:
        assert got.routed_experts.dtype == expected


@pytest.mark.parametrize("wire", FORMATS)
def test_a_claim_round_trips_in_every_form(wire: str) -> None:
    sent = batch(wire)

    got = decode_claim(encode_claim(sent))

    assert (got.batch_id, got.zero_variance_groups, got.stale_groups) == ("b1", 1, 2)
    assert (got.lease_expires_at, got.format) == (sent.lease_expires_at, wire)
    assert len(got.groups) == len(sent.groups)
    for got_group, sent_group in zip(got.groups, sent.groups, strict=True):
        assert (got_group.group_id, got_group.task_id, got_group.staleness) == (
            sent_group.group_id,
            sent_group.task_id,
            sent_group.staleness,
        )
        assert len(got_group.samples) == len(sent_group.samples)
        for got_sample, sent_sample in zip(got_group.samples, sent_group.samples, strict=True):
            assert (got_sample.session_id, got_sample.sample_index) == (
                sent_sample.session_id,
                sent_sample.sample_index,
            )
            assert got_sample.reward == sent_sample.reward
            assert got_sample.termination == sent_sample.termination
            assert got_sample.reward_details == sent_sample.reward_details
            assert got_sample.stages == sent_sample.stages
            assert got_sample.defense_events == sent_sample.defense_events
            assert len(got_sample.segments) == len(sent_sample.segments)
            for got_seg, sent_seg in zip(got_sample.segments, sent_sample.segments, strict=True):
                assert_same_segment(got_seg, sent_seg, wire)


def test_the_trial_report_travels_as_plain_json_and_old_samples_decode_without_one() -> None:
    first = batch("json").groups[0].samples[0]
    encoded = sample_json(first, "json")
    assert encoded["stages"] == {
        "sandbox_setup": 0.75,
        "agent_execution": 31.5,
        "verification": 2.0,
    }
    assert encoded["defense_events"] == [
        {"kind": "test_path_reverted", "path": "tests/test_a.py", "lines": [3, 4]},
        {"kind": "history_hidden"},
    ]
    old = {k: v for k, v in encoded.items() if k not in ("stages", "defense_events")}
    assert first.stages is not None
    newer = {**encoded, "stages": {**first.stages.reported(), "warm_up": 1.0}}
    for sample, stages, events in ((old, None, ()), (newer, first.stages, first.defense_events)):
        groups = [{"group_id": "g", "samples": [sample]}]
        body = {"schema_version": SCHEMA_VERSION, "batch_id": "b", "groups": groups}
        claim = decode_claim(orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY))
        (got,) = claim.groups[0].samples
        assert got.stages == stages  # a stage this decoder does not know is ignored
        assert got.defense_events == events


def test_an_empty_claim_round_trips() -> None:
    for wire in FORMATS:
        empty = ClaimedBatch(None, (), 0, format=wire)
        got = decode_claim(encode_claim(empty))
        assert (got.batch_id, got.groups) == (None, ())


def test_the_json_form_is_plain_json_with_the_recorded_float32_values() -> None:
    data = segment_json(segment())
    assert json.loads(json.dumps(data)) == data
    assert data["tokens"] == [100, 101, 102, 103]
    assert data["loss_mask"] == [0, 1, 0, 1]
    assert data["logprobs"] == segment().logprobs.astype(np.float64).tolist()
    assert segment_json(segment(experts=None))["routed_experts"] is None
    body = orjson.loads(encode_claim(batch("json")))
    assert body["schema_version"] == SCHEMA_VERSION
    assert body["groups"][0]["samples"][1]["reward"] == [0.5, -1.0]


@pytest.mark.parametrize(("ids", "itemsize"), [(10, 1), (300, 2), (70_000, 4)])
def test_b64v1_sends_expert_ids_in_the_smallest_dtype(ids: int, itemsize: int) -> None:
    wide = Segment(
        tokens=np.zeros(2, dtype=np.int32),
        loss_mask=np.zeros(2, dtype=np.uint8),
        logprobs=np.zeros(2, dtype=np.float32),
        routed_experts=np.full((2, 1, 1), ids, dtype=np.int64),
        weight_versions=(),
        turn_ids=(),
    )
    encoded = segment_json(wide, "b64v1")["routed_experts"]
    assert isinstance(encoded, dict)
    assert np.dtype(encoded["dtype"]).itemsize == itemsize
    # binv1 narrows what is not a stored dtype (int64 records built in memory) the same way.
    binary = segment_json(wide, "binv1")["routed_experts"]
    assert isinstance(binary, np.ndarray)
    assert binary.dtype.itemsize == itemsize


def test_the_streamed_binv1_pieces_make_the_whole_body() -> None:
    sent = batch("binv1")
    head = BatchHead("b1", sent.lease_expires_at, "binv1", 1, 2, sent.head.groups)
    assert head.groups[0] == GroupHead("g1", "task-a", 1, 3)
    pieces = binv1_head(head)
    for group in sent.groups:
        for sample in group.samples:
            pieces += binv1_sample(sample)
    assert b"".join(pieces) == encode_claim(sent)


def test_binv1_arrays_are_views_of_the_body_not_copies() -> None:
    body = encode_claim(batch("binv1"))
    whole = np.frombuffer(body, dtype=np.uint8)

    narrow, wider = decode_claim(body).groups[0].samples[0].segments

    for got, dtype in ((narrow, np.uint8), (wider, np.uint16)):
        assert got.routed_experts is not None
        assert got.routed_experts.dtype == dtype
        for array in (got.tokens, got.loss_mask, got.logprobs, got.routed_experts):
            assert np.shares_memory(array, whole)


# --- the binv1 frame layout ------------------------------------------------------------


def split(frame: bytes) -> tuple[dict[str, object], bytes]:
    (size,) = struct.unpack_from("<I", frame)
    header = orjson.loads(frame[4 : 4 + size])
    assert isinstance(header, dict)
    payload = frame[4 + size :]
    assert len(payload) == header["nbytes"]
    return header, payload


def test_frame_arrays_travel_as_their_bytes_at_aligned_offsets() -> None:
    tokens = np.array([1, 2, 3], dtype=np.int32)
    mask = np.array([0, 1, 1], dtype=np.uint8)
    routed = np.arange(3 * 2 * 2, dtype=np.uint16).reshape(3, 2, 2)
    frame = b"".join(encode_frame({"id": "s", "segments": [{"t": tokens, "m": mask, "r": routed}]}))

    assert len(MAGIC) % ALIGN == 0
    assert len(frame) % ALIGN == 0  # so the next frame starts aligned too
    meta, payload = split(frame)
    assert (len(frame) - len(payload)) % ALIGN == 0  # the payload starts aligned
    segments = meta["segments"]
    assert isinstance(segments, list)
    [described] = segments
    for key, array in (("t", tokens), ("m", mask), ("r", routed)):
        ref = described[key]
        assert (ref["dtype"], ref["shape"]) == (array.dtype.str, list(array.shape))
        assert ref["offset"] % ALIGN == 0
        assert payload[ref["offset"] : ref["offset"] + array.nbytes] == array.tobytes()


def test_frames_without_arrays_and_big_endian_arrays() -> None:
    meta, payload = split(b"".join(encode_frame({"batch_id": None, "groups": []})))
    assert (meta, payload) == ({"batch_id": None, "groups": [], "nbytes": 0}, b"")
    meta, payload = split(b"".join(encode_frame({"a": np.array([1, 258], dtype=">u2")})))
    assert meta["a"] == {"dtype": "<u2", "shape": [2], "offset": 0}
    assert payload[:4] == np.array([1, 258], dtype="<u2").tobytes()


def test_frames_view_the_arrays_and_refuse_non_numeric_ones() -> None:
    routed = np.arange(64, dtype=np.uint8).reshape(8, 4, 2)
    [view] = [p for p in encode_frame({"routed": routed}) if isinstance(p, memoryview)]
    assert np.shares_memory(np.frombuffer(view, dtype=np.uint8), routed)
    with pytest.raises(RecorderError, match="numeric"):
        encode_frame({"a": np.array(["x"], dtype=object)})


# --- what the decoder converts and refuses -----------------------------------------------


def _b64(array: npt.NDArray[np.generic]) -> dict[str, object]:
    data = base64.b64encode(array.tobytes()).decode()
    return {"dtype": array.dtype.str, "shape": list(array.shape), "data": data}


def _json_claim(seg: Mapping[str, object], **batch_fields: object) -> bytes:
    sample = {"session_id": "s1", "reward": 1.0, "segments": [seg]}
    group = {"group_id": "g", "task_id": "t", "samples": [sample]}
    return orjson.dumps({"batch_id": "b1", "schema_version": 1, "groups": [group]} | batch_fields)


def test_arrays_in_other_dtypes_are_converted_exactly() -> None:
    seg = {
        "tokens": _b64(np.array([5, 6, 7, 8], dtype="<i8")),
        "loss_mask": _b64(np.array([False, False, True, True])),
        "logprobs": _b64(np.array([0.0, 0.0, -0.5, -1.25], dtype="<f8")),
        "routed_experts": _b64(np.array([[[0, 1]], [[2, 3]], [[4, 5]], [[0, 300]]], dtype=">u2")),
    }
    (got,) = decode_claim(_json_claim(seg)).groups[0].samples[0].segments
    np.testing.assert_array_equal(got.tokens, np.array([5, 6, 7, 8], np.int32), strict=True)
    np.testing.assert_array_equal(got.loss_mask, np.array([0, 0, 1, 1], np.uint8), strict=True)
    want = np.array([0.0, 0.0, -0.5, -1.25], np.float32)
    np.testing.assert_array_equal(got.logprobs, want, strict=True)
    assert got.routed_experts is not None
    assert got.routed_experts.dtype == np.uint16  # in native byte order
    assert got.routed_experts[:, 0].tolist() == [[0, 1], [2, 3], [4, 5], [0, 300]]


def _broken_array(**changes: object) -> bytes:
    """A binv1 body whose one segment's tokens array is described by ``changes``."""
    one = ClaimedBatch("b1", (ClaimedGroup("g", "t", batch("binv1").groups[0].samples[:1]),), 0)
    head = b"".join(binv1_head(one.head))
    frame = b"".join(binv1_sample(one.groups[0].samples[0]))
    (size,) = struct.unpack_from("<I", frame)
    header = orjson.loads(frame[4 : 4 + size])
    header["segments"][0]["tokens"].update(changes)
    text = orjson.dumps(header)
    return head + struct.pack("<I", len(text)) + text + frame[4 + size :]


BINV1 = encode_claim(batch("binv1"))
JSON_SEGMENT = {"tokens": [1, 2], "loss_mask": [0, 1], "logprobs": [0.0, -0.5]}


@pytest.mark.parametrize(
    "body",
    [
        BINV1[:-8],  # the server failed mid-stream
        BINV1[: len(MAGIC) + 2],
        BINV1 + BINV1[len(MAGIC) :],  # frames after the last
        _broken_array(offset=10_000),  # outside its payload
        _broken_array(dtype="|O"),
        _broken_array(shape=[-1]),
        _broken_array(dtype="<i8"),  # its i4 bytes read in pairs: values past int32
        _json_claim({**JSON_SEGMENT, "tokens": {"dtype": "<i4", "shape": [2], "offset": 0}}),
        _json_claim({**JSON_SEGMENT, "logprobs": [0.0]}),
        _json_claim({**JSON_SEGMENT, "routed_experts": [[[1]]]}),
        _json_claim({**JSON_SEGMENT, "tokens": _b64(np.array([5, 2**40], dtype="<i8"))}),
        _json_claim(JSON_SEGMENT, schema_version=SCHEMA_VERSION + 1),
        _json_claim(JSON_SEGMENT, batch_id=None),
        b"not json",
    ],
    ids=[
        "truncated",
        "cut-in-header",
        "trailing",
        "offset",
        "object",
        "negative",
        "past-int32",
        "reference-outside-binv1",
        "misaligned",
        "routing-rows",
        "too-wide",
        "schema-version",
        "groups-without-batch",
        "garbage",
    ],
)
def test_unusable_claims_are_refused(body: bytes) -> None:
    with pytest.raises(InvalidRequest):
        decode_claim(body)


def test_claim_json_leaves_arrays_to_orjson() -> None:
    sample = claim_json(batch("json"))["groups"]
    assert isinstance(sample, list)
    tokens = sample[0]["samples"][0]["segments"][0]["tokens"]
    assert isinstance(tokens, np.ndarray)


def test_a_claim_body_from_samples_encoded_one_by_one_is_the_whole_claim() -> None:
    sent = batch("b64v1")
    samples = [sample_json(s, "b64v1") for g in sent.groups for s in g.samples]
    assert orjson.dumps(claim_body(sent.head, samples), option=orjson.OPT_SERIALIZE_NUMPY) == (
        encode_claim(sent)
    )
    with pytest.raises(RecorderError):
        claim_body(sent.head, samples[:-1])


# -- one session's trajectory ---------------------------------------------------------------


def trajectory_body(wire: str, **changes: object) -> bytes:
    """What the trajectory route sends (``proxy.routes.control``), its turns left out."""
    body: dict[str, object] = {
        "id": "s1",
        "run_id": "r1",
        "task_id": "task-a",
        "group_id": "g1",
        "sample_index": 3,
        "purpose": "train",
        "status": "finished",
        "termination": "completed",
        "reward": 1.0,
        "reward_details": {"tests": [{"id": "t", "passed": True}]},
        "excluded": False,
        "stages": {"agent_execution": 31.5, "verification": 2.0, "a_later_stage": 1.0},
        "schema_version": SCHEMA_VERSION,
        "format": wire,
        "turns": [{"id": "t1"}],
        "segments": [
            segment_json(segment(), wire),
            segment_json(segment(6, experts=np.uint16, base=300), wire),
        ],
        "events": [],
    }
    return orjson.dumps({**body, **changes})


@pytest.mark.parametrize("wire", TRAJECTORY_FORMATS)
def test_a_trajectory_round_trips_in_both_of_its_forms(wire: str) -> None:
    got = decode_trajectory(trajectory_body(wire))

    fields = (got.session_id, got.run_id, got.task_id, got.group_id, got.sample_index)
    assert fields == ("s1", "r1", "task-a", "g1", 3)
    outcome = (got.status, got.termination, got.reward, got.excluded)
    assert outcome == ("finished", "completed", 1.0, False)
    assert got.reward_details == {"tests": [{"id": "t", "passed": True}]}
    assert got.stages == StageTimes(agent_execution=31.5, verification=2.0)
    sent = (segment(), segment(6, experts=np.uint16, base=300))
    assert len(got.segments) == len(sent)
    for decoded, want in zip(got.segments, sent, strict=True):
        assert_same_segment(decoded, want, wire)


def test_an_excluded_or_vector_rewarded_trajectory_and_an_older_body_decode() -> None:
    excluded = decode_trajectory(
        trajectory_body("json", termination="harness_error", reward=None, excluded=True)
    )
    assert (excluded.excluded, excluded.reward) == (True, None)
    vector = decode_trajectory(trajectory_body("b64v1", reward=[0.5, -1.0]))
    assert vector.reward == (0.5, -1.0)
    older = orjson.loads(trajectory_body("json"))
    del older["schema_version"], older["format"]  # what a server before version 1's field sent
    assert len(decode_trajectory(orjson.dumps(older)).segments) == 2


def test_binv1_is_not_a_trajectory_form() -> None:
    with pytest.raises(InvalidRequest, match="format"):
        check_format("binv1", TRAJECTORY_FORMATS)


@pytest.mark.parametrize(
    "body",
    [
        trajectory_body("json", schema_version=SCHEMA_VERSION + 1),
        trajectory_body("json", segments=[{**JSON_SEGMENT, "logprobs": [0.0]}]),
        trajectory_body("json", segments=[{**JSON_SEGMENT, "routed_experts": [[[1]]]}]),
        trajectory_body(
            "json",
            segments=[{**JSON_SEGMENT, "tokens": {"dtype": "<i4", "shape": [2], "offset": 0}}],
        ),
        orjson.dumps({"id": "s1", "segments": []}),  # not a session
        b"[]",
    ],
    ids=["schema-version", "misaligned", "routing-rows", "reference", "not-a-session", "garbage"],
)
def test_unusable_trajectories_are_refused(body: bytes) -> None:
    with pytest.raises(InvalidRequest):
        decode_trajectory(body)
