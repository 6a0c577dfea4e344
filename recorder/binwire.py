"""The ``binv1`` wire form: JSON headers, each followed by the raw bytes of its arrays.

``json`` sends arrays as numbers and ``b64v1`` as base64 text (a third larger than the
bytes, and encoded then decoded); ``binv1`` sends each array's little-endian bytes as they
are, so a claim costs about what its arrays weigh and a trainer reads every array with one
``numpy.frombuffer`` over the body, without a copy. Layout (integers little-endian)::

    body    := MAGIC frame+
    MAGIC   := b"LEGOBIN1"                            (8 bytes)
    frame   := u32 header_len | header | payload
    header  := a UTF-8 JSON object, padded with trailing spaces so that the payload starts
               at a multiple of 8 bytes from the start of the body; its ``nbytes`` is the
               length of the payload that follows (a multiple of 8)
    payload := the bytes of the arrays its header describes, each starting at a multiple
               of 8, zero-padded between them and at the end

In a header an array appears as ``{"dtype", "shape", "offset"}``: a numpy dtype string
(``"<i4"``, ``"|u1"``, ``"<u2"``, ``"<f4"``), the shape, and where its first byte lies in
its frame's payload. Every array therefore starts 8-aligned in the body. Everything else
in a header is plain JSON.

A claim (``proxy.routes.export``) is one frame for the batch, carrying the keys of the
JSON forms except that each group has ``sample_count`` instead of ``samples`` (its payload
is empty), then one frame per sample, group by group, in order: the sample's keys with its
segments' arrays in its payload. The response streams: each sample is read from the
database and framed while the previous one is on the wire. A body that ends early (the
server failed mid-stream) or runs on is unusable; a client knows from the first frame how
many frames follow.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from kernel.errors import RecorderError

MAGIC = b"LEGOBIN1"
MEDIA_TYPE = "application/x-lego-binv1"
ALIGN = 8
_ARRAY_KINDS = frozenset("biuf")


def encode_frame(header: Mapping[str, object]) -> list[bytes | memoryview]:
    """One frame: ``header`` with each numpy array in it laid out in the payload.

    Returns the frame's pieces in order (the arrays as views, not copies); their total
    length is a multiple of ``ALIGN``.
    """
    payload = _Payload()
    described = _describe(header, payload)
    assert isinstance(described, dict)
    text = orjson.dumps({**described, "nbytes": payload.size + _pad(payload.size)})
    text += b" " * _pad(4 + len(text))
    return [struct.pack("<I", len(text)) + text, *payload.finish()]


class _Payload:
    """The arrays of one frame, in order, with their padding."""

    def __init__(self) -> None:
        self.parts: list[bytes | memoryview] = []
        self.size = 0

    def add(self, array: npt.NDArray[Any]) -> dict[str, object]:
        if array.dtype.kind not in _ARRAY_KINDS:
            raise RecorderError(f"binv1 carries numeric arrays only, not {array.dtype}")
        array = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
        self._pad_to_alignment()
        offset = self.size
        if array.nbytes:
            self.parts.append(array.data.cast("B"))
            self.size += array.nbytes
        return {"dtype": array.dtype.str, "shape": list(array.shape), "offset": offset}

    def finish(self) -> Sequence[bytes | memoryview]:
        self._pad_to_alignment()
        return self.parts

    def _pad_to_alignment(self) -> None:
        pad = _pad(self.size)
        if pad:
            self.parts.append(bytes(pad))
            self.size += pad


def _describe(value: object, payload: _Payload) -> object:
    if isinstance(value, np.ndarray):
        return payload.add(value)
    if isinstance(value, Mapping):
        return {key: _describe(item, payload) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_describe(item, payload) for item in value]
    return value


def _pad(size: int) -> int:
    return -size % ALIGN
