"""Linear storage of prompt ids: what a turn stores of its prompt, and how full prompts
come back.

A turn with a parent stores only ``prompt_ids[prompt_offset:]``; the leading ids are the
parent's prompt + output, which the ledger guarantees (its contract). So a session's bytes
grow with its new tokens, not with turns x context (``recorder.conversations`` does the
same for requests).

Contract:
- ``prompt_offset(record)`` is how many leading prompt ids a record does not store.
- ``full_prompts(session_id, rows)`` gives every row's full prompt ids, in the order of
  ``rows`` (``turns`` rows holding ``id``, ``parent_turn_id``, ``prompt_ids``,
  ``prompt_offset`` and ``output_ids``), walking each parent chain inside the session
  once. A parent missing from ``rows`` (or a cycle), or an offset past the parent's
  tokens, raises ``RecorderError``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from kernel.errors import RecorderError
from recorder.records import TurnRecord


def prompt_offset(record: TurnRecord) -> int:
    if record.parent_turn_id is None:
        return 0
    return max(0, min(record.reused_prefix_len, len(record.prompt_ids)))


def full_prompts(session_id: str, rows: Sequence[Mapping[Any, Any]]) -> list[npt.NDArray[np.int32]]:
    by_id = {row["id"]: row for row in rows}
    tokens: dict[str, npt.NDArray[np.int32]] = {}  # turn id -> full prompt + output

    def prompt_of(row: Mapping[Any, Any]) -> npt.NDArray[np.int32]:
        stored = np.frombuffer(row["prompt_ids"], dtype="<i4")
        offset = row["prompt_offset"]
        if offset == 0:
            return stored
        chain: list[Mapping[Any, Any]] = []  # unresolved ancestors, nearest first
        parent_id = row["parent_turn_id"]
        while parent_id not in tokens:
            parent = by_id.get(parent_id)
            if parent is None or len(chain) > len(rows):  # missing, or a cycle
                raise RecorderError(
                    f"turn {row['id']} of session {session_id} continues turn "
                    f"{parent_id!r}, which is not recorded in that session"
                )
            chain.append(parent)
            if parent["prompt_offset"] == 0:
                break
            parent_id = parent["parent_turn_id"]
        for ancestor in reversed(chain):
            full_prompt = prompt_of(ancestor)  # ancestors above it are resolved by now
            output = np.frombuffer(ancestor["output_ids"], dtype="<i4")
            tokens[ancestor["id"]] = np.concatenate([full_prompt, output])
        prefix = tokens[row["parent_turn_id"]][:offset]
        if len(prefix) != offset:
            raise RecorderError(
                f"turn {row['id']} reuses {offset} ids of a parent that has {len(prefix)}"
            )
        return np.concatenate([prefix, stored])

    prompts = []
    for row in rows:
        prompt = prompt_of(row)
        output = np.frombuffer(row["output_ids"], dtype="<i4")
        tokens[row["id"]] = np.concatenate([prompt, output])
        prompts.append(prompt)
    return prompts
