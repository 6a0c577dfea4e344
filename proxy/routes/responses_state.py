"""``previous_response_id`` for OpenAI Responses: the conversation a response id stands for.

Owns the IO half of Responses conversation state; the pure half (merging) is
``proxy.adapters.openai_responses.continue_from``. State lives in the recorder, not in the
adapter or in memory: a response id is ``"resp_" + turn_id``, and the turn's recorded
request (the whole canonical conversation) plus its recorded answer are the conversation so
far, so any replica can continue any response of the session.

Contract: ``resolve_previous_response(state, session, request)`` returns ``request``
unchanged when it names no previous response; else the merged request. It raises
``NotFound`` for an id that is not a completed turn of this session, ``InvalidRequest``
for a response created with ``store: false``, and ``RecorderError`` when the recorder cannot
answer within ``RECORDER_WAIT_S`` (the database never holds an inference request longer).
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import orjson

from proxy.adapters.openai_responses import continue_from, turn_id_of
from proxy.canonical import ChatRequest
from proxy.errors import InvalidRequest, NotFound, RecorderError
from proxy.ledger.codec import decode_message, decode_request
from proxy.state import AppState
from recorder.records import SessionInfo, TurnStatus

RECORDER_WAIT_S = 1.0


async def _recorded_turn(
    state: AppState, session: SessionInfo, turn_id: str
) -> tuple[bytes, bytes] | None:
    """The turn's recorded request and answer, if it is a completed turn of ``session``."""
    pending = state.writer.pending_turn(turn_id)  # answered moments ago, not yet written
    if pending is not None:
        if pending.session_id != session.id or pending.status is not TurnStatus.COMPLETED:
            return None
        return pending.request_messages, pending.response_message
    try:
        async with asyncio.timeout(RECORDER_WAIT_S):
            found = await state.store.turn_conversation(session.id, turn_id)
    except TimeoutError:
        raise RecorderError(
            "the recorder is behind and cannot look up 'previous_response_id' now; retry"
        ) from None
    if found is None or found[0] is not TurnStatus.COMPLETED:
        return None
    return found[1], found[2]


async def resolve_previous_response(
    state: AppState, session: SessionInfo, request: ChatRequest
) -> ChatRequest:
    previous = request.previous_response_id
    if previous is None:
        return request
    recorded_turn = await _recorded_turn(state, session, turn_id_of(previous))
    if recorded_turn is None:
        raise NotFound(
            f"previous response with id '{previous}' not found", param="previous_response_id"
        )
    request_messages, response_message = recorded_turn
    recorded = orjson.loads(request_messages)
    if recorded.get("store") is False:
        raise InvalidRequest(
            f"previous response '{previous}' was created with 'store': false and cannot be "
            "continued; send the whole conversation in 'input'",
            param="previous_response_id",
        )
    # The ledger's decoder reads what the ledger needs; the Responses fields are read here.
    prior = replace(decode_request(request_messages), instructions=recorded.get("instructions"))
    answer = decode_message(response_message)
    return continue_from(prior, answer, request)
