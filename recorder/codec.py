"""Compact binary encodings of the per-token arrays stored with each turn (pure, no IO).

Contract:
- token ids: little-endian int32 bytes; decoding gives back the same Python ints.
- logprobs: little-endian float32 bytes. Recorded logprobs are therefore float32-rounded
  (SGLang computes them in float32, so nothing the backend produced is lost); decoding
  gives Python floats equal to ``float(np.float32(x))`` of what was written.
- routed experts: the rows in the smallest dtype that holds every id (``uint8`` when all
  ids are in [0, 256), else ``uint16`` when in [0, 65536), else ``int32``), with the
  layers and top_k needed to restore the shape; decoding gives an int32 array equal to
  the one written. ``stored_rows`` gives the same rows in their stored dtype, as a
  read-only view of the stored bytes (no copy), for the export path.

Values that do not fit (a token id outside int32, a routing array that is not 3-D) raise
``InvalidRequest``: such a record can never be stored, and retrying will not help.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from kernel.errors import InvalidRequest
from recorder.records import RoutedExperts

_IDS = np.dtype("<i4")
ID_BYTES = _IDS.itemsize  # so SQL can count stored ids by their bytes
_LOGPROBS = np.dtype("<f4")
_EXPERT_DTYPES: dict[str, np.dtype[np.integer[Any]]] = {
    "uint8": np.dtype("<u1"),
    "uint16": np.dtype("<u2"),
    "int32": np.dtype("<i4"),
}


@dataclass(frozen=True, slots=True)
class EncodedExperts:
    data: bytes
    start: int
    num_layers: int
    top_k: int
    dtype: str  # a key of _EXPERT_DTYPES


def encode_ids(ids: Sequence[int]) -> bytes:
    try:
        return np.asarray(ids, dtype=_IDS).tobytes()
    except (OverflowError, ValueError, TypeError) as exc:
        raise InvalidRequest(f"token ids must be int32: {exc}") from None


def decode_ids(data: bytes) -> tuple[int, ...]:
    return tuple(np.frombuffer(data, dtype=_IDS).tolist())


def encode_logprobs(logprobs: tuple[float, ...]) -> bytes:
    try:
        return np.asarray(logprobs, dtype=_LOGPROBS).tobytes()
    except (ValueError, TypeError) as exc:
        raise InvalidRequest(f"logprobs must be floats: {exc}") from None


def decode_logprobs(data: bytes) -> tuple[float, ...]:
    return tuple(np.frombuffer(data, dtype=_LOGPROBS).astype(np.float64).tolist())


def expert_dtype_for(rows: npt.NDArray[np.integer[Any]]) -> str:
    """Name of the smallest stored dtype that holds every id in ``rows``."""
    if rows.size == 0:
        return "uint8"
    low, high = int(rows.min()), int(rows.max())
    if low >= 0 and high < 2**8:
        return "uint8"
    if low >= 0 and high < 2**16:
        return "uint16"
    return "int32"


def encode_experts(experts: RoutedExperts) -> EncodedExperts:
    rows = np.asarray(experts.rows)
    if rows.ndim != 3:
        raise InvalidRequest(f"routed experts must be [rows, layers, top_k], got {rows.shape}")
    if experts.start < 0:
        raise InvalidRequest(f"routed experts start must be >= 0, got {experts.start}")
    name = expert_dtype_for(rows)
    return EncodedExperts(
        data=rows.astype(_EXPERT_DTYPES[name]).tobytes(),
        start=experts.start,
        num_layers=int(rows.shape[1]),
        top_k=int(rows.shape[2]),
        dtype=name,
    )


def stored_rows(encoded: EncodedExperts) -> npt.NDArray[np.integer[Any]]:
    """The rows ``[rows, layers, top_k]`` in their stored dtype, viewing ``encoded.data``."""
    flat = np.frombuffer(encoded.data, dtype=_EXPERT_DTYPES[encoded.dtype])
    per_row = encoded.num_layers * encoded.top_k
    num_rows = flat.size // per_row if per_row else 0
    return flat.reshape(num_rows, encoded.num_layers, encoded.top_k)


def decode_experts(encoded: EncodedExperts) -> RoutedExperts:
    return RoutedExperts(start=encoded.start, rows=stored_rows(encoded).astype(np.int32))
