"""SGLang's rules for the sampling values the proxy forwards, checked at the HTTP edge.

Owns the annotated types ``TopK`` and ``SamplingSeed`` that wire models (the adapters' request
bodies, the control API's session pins) use, so a value SGLang 0.5.23 would refuse
(``SamplingParams.verify``) is a 400 in the caller's own shape before anything is sent or
recorded, instead of a failed backend call on every turn.

- ``top_k``: -1 (the whole vocabulary) or at least 1. SGLang accepts 0 only under a greedy
  temperature; it is refused here whatever the temperature, since a pin outlives any one
  request's temperature.
- ``sampling_seed``: 0 to 2**63 - 1. SGLang takes any signed 64-bit value, but smg parses it
  as an unsigned 64-bit integer, so only the overlap passes both.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator

SEED_MAX = 2**63 - 1


def _top_k(value: int) -> int:
    if value == 0 or value < -1:
        raise ValueError(f"top_k must be -1 (disable) or at least 1, got {value}")
    return value


def _seed(value: int) -> int:
    if not 0 <= value <= SEED_MAX:
        raise ValueError(f"seed must be in [0, 2**63 - 1], got {value}")
    return value


TopK = Annotated[int, AfterValidator(_top_k)]
SamplingSeed = Annotated[int, AfterValidator(_seed)]
