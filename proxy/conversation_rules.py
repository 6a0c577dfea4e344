"""What every upstream API refuses in a conversation, checked on the canonical form.

Owns the protocol-independent rules a request's conversation must follow, so that what
the OpenAI and Anthropic APIs answer with a 400 is a 400 here too, in the caller's own
error shape, instead of a turn rendered from a conversation no real model server takes:

- a tool result answers a tool call of an earlier assistant message (its id);
- the tool calls of one assistant message have distinct ids;
- a tool call's arguments are a JSON object, as the model wrote them (what a harness
  sends back for its own calls);
- a stop string is not empty.

``check_conversation(request)`` raises ``InvalidRequest`` naming the canonical message
(``messages[i]``) or field. Pure; the pipeline calls it once a request is complete
(after ``previous_response_id`` was resolved).
"""

from __future__ import annotations

import orjson

from kernel.errors import InvalidRequest
from proxy.canonical import ChatRequest


def check_conversation(request: ChatRequest) -> None:
    if any(stop == "" for stop in request.sampling.stop):
        raise InvalidRequest("stop strings must not be empty", param="stop")
    calls: set[str] = set()
    for i, message in enumerate(request.messages):
        if message.role == "tool" and message.tool_call_id not in calls:
            raise InvalidRequest(
                f"messages[{i}] is a tool result for call {message.tool_call_id!r}, which no "
                "earlier assistant message made",
                param=f"messages[{i}].tool_call_id",
            )
        own: set[str] = set()
        for k, call in enumerate(message.tool_calls):
            where = f"messages[{i}].tool_calls[{k}]"
            if call.id in own:
                raise InvalidRequest(f"{where} repeats the tool call id {call.id!r}", param=where)
            own.add(call.id)
            if not _is_object(call.arguments):
                raise InvalidRequest(
                    f"{where}: the arguments must be a JSON object", param=f"{where}.arguments"
                )
        calls |= own


def _is_object(arguments: str) -> bool:
    try:
        return isinstance(orjson.loads(arguments), dict)
    except orjson.JSONDecodeError:
        return False
