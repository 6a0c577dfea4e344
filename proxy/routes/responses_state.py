"""``previous_response_id`` for OpenAI Responses: the conversation a response id stands for.

Owns the IO half of Responses conversation state; the pure half (merging) is
``proxy.adapters.openai_responses.continue_from``. State lives in the recorder, not in the
adapter: a response id is ``"resp_" + turn_id``, and the turn's whole recorded request plus
its recorded answer are the conversation so far, so any replica can continue any response
of the session. A turn this replica answered (or loaded) is read from its
``ConversationBook``, even before the recorder has written it; any other from the recorder,
which rebuilds the request from linear storage in one query
(``Store.conversations``).

Contract: ``resolve_previous_response(state, session, request)`` returns ``request``
unchanged when it names no previous response; else the merged request. It raises
``NotFound`` for an id that is not a completed turn of this session, ``InvalidRequest``
for a response created with ``store: false``, and ``RecorderError`` when the recorder cannot
answer within ``RECORDER_WAIT_S`` (the database never holds an inference request longer).
"""

from __future__ import annotations

import asyncio

from kernel.errors import InvalidRequest, NotFound, RecorderError
from proxy.adapters.openai_responses import continue_from, turn_id_of
from proxy.canonical import ChatRequest, Message
from proxy.ledger.codec import RequestDecoder, decode_message
from proxy.state import AppState
from recorder.records import SessionInfo

RECORDER_WAIT_S = 1.0


async def _recorded_turn(
    state: AppState, session: SessionInfo, turn_id: str
) -> tuple[ChatRequest, Message] | None:
    """The turn's whole request and answer, if it is a completed turn of ``session``."""
    held = state.conversations.get(session.id, turn_id)
    if held is not None:
        return held
    try:
        async with asyncio.timeout(RECORDER_WAIT_S):
            found = await state.store.conversations(session.id, [turn_id], completed_only=True)
    except TimeoutError:
        raise RecorderError(
            "the recorder is behind and cannot look up 'previous_response_id' now; retry"
        ) from None
    conversation = found.get(turn_id)
    if conversation is None:
        return None
    return RequestDecoder().decode(conversation), decode_message(conversation.answer)


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
    prior, answer = recorded_turn
    if prior.store is False:
        raise InvalidRequest(
            f"previous response '{previous}' was created with 'store': false and cannot be "
            "continued; send the whole conversation in 'input'",
            param="previous_response_id",
        )
    return continue_from(prior, answer, request)
