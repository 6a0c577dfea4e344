"""binv1 frames: headers describe arrays whose raw bytes follow, every array 8-aligned."""

from __future__ import annotations

import struct

import numpy as np
import orjson
import pytest

from kernel.errors import RecorderError
from recorder.binwire import ALIGN, MAGIC, encode_frame


def split(frame: bytes) -> tuple[dict[str, object], bytes]:
    (size,) = struct.unpack_from("<I", frame)
    header = orjson.loads(frame[4 : 4 + size])
    assert isinstance(header, dict)
    payload = frame[4 + size :]
    assert len(payload) == header["nbytes"]
    return header, payload


def test_arrays_travel_as_their_bytes_at_aligned_offsets() -> None:
    tokens = np.array([1, 2, 3], dtype=np.int32)
    mask = np.array([0, 1, 1], dtype=np.uint8)
    routed = np.arange(3 * 2 * 2, dtype=np.uint16).reshape(3, 2, 2)
    header = {"id": "s", "segments": [{"tokens": tokens, "mask": mask, "routed": routed}]}

    frame = b"".join(encode_frame(header))

    assert len(MAGIC) % ALIGN == 0
    assert len(frame) % ALIGN == 0  # so the next frame starts aligned too
    meta, payload = split(frame)
    assert (len(frame) - len(payload)) % ALIGN == 0  # the payload starts aligned
    assert meta["id"] == "s"
    [seg] = meta["segments"]  # type: ignore[misc]
    for key, array in (("tokens", tokens), ("mask", mask), ("routed", routed)):
        described = seg[key]
        assert described["dtype"] == array.dtype.str
        assert described["shape"] == list(array.shape)
        assert described["offset"] % ALIGN == 0
        start = described["offset"]
        assert payload[start : start + array.nbytes] == array.tobytes()
        decoded = np.frombuffer(payload, array.dtype, array.size, start).reshape(array.shape)
        np.testing.assert_array_equal(decoded, array)


def test_empty_arrays_and_frames_without_arrays() -> None:
    meta, payload = split(b"".join(encode_frame({"batch_id": None, "groups": []})))
    assert (meta, payload) == ({"batch_id": None, "groups": [], "nbytes": 0}, b"")

    empty = np.zeros((0, 4, 2), dtype=np.uint8)
    meta, payload = split(b"".join(encode_frame({"routed": empty, "tokens": np.arange(2)})))
    assert meta["routed"] == {"dtype": "|u1", "shape": [0, 4, 2], "offset": 0}
    assert meta["tokens"] == {"dtype": "<i8", "shape": [2], "offset": 0}
    assert payload == np.arange(2).tobytes()


def test_big_endian_arrays_are_sent_little_endian() -> None:
    array = np.array([1, 258], dtype=">u2")
    meta, payload = split(b"".join(encode_frame({"a": array})))
    assert meta["a"] == {"dtype": "<u2", "shape": [2], "offset": 0}
    assert payload[:4] == np.array([1, 258], dtype="<u2").tobytes()


def test_arrays_are_not_copied_into_the_frame() -> None:
    routed = np.arange(64, dtype=np.uint8).reshape(8, 4, 2)
    parts = encode_frame({"routed": routed})
    [view] = [part for part in parts if isinstance(part, memoryview)]
    # The frame holds a view of the array's own buffer.
    assert np.shares_memory(np.frombuffer(view, dtype=np.uint8), routed)


def test_non_numeric_arrays_are_refused() -> None:
    with pytest.raises(RecorderError, match="numeric"):
        encode_frame({"a": np.array(["x"], dtype=object)})
