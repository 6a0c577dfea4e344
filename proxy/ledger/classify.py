"""Why a request forks: the heuristics behind ``ForkReason``, in one function.

``fork_reason(tree, request, fingerprints)`` is called only when no committed turn's
conversation is a prefix of the request followed by nothing but user/tool/system messages.
"Context" is (system prompt, tool set); "agrees" means equal normalised messages
(``proxy.ledger.fingerprint``). In order:

1. The context was seen before in this session:
   - ``compaction``: the request is shorter than the longest conversation in that context
     and agrees with it on no assistant message (the history was replaced by a summary;
     a leading system prompt or first task message may survive);
   - ``edited_history``: otherwise (a message the model already saw was changed).
2. The context is new, and the request without its system prompt agrees with an earlier
   conversation on at least one message, followed by nothing but user/tool messages:
   - ``side_request``: the request has no tools while the session had some (a summary or
     classification call over the same history; it never continues an agent loop);
   - ``tools_changed``: the system prompt was seen, so the tool set changed;
   - ``system_changed``: otherwise.
3. The context is new and the conversation fresh (no assistant message):
   - ``subagent``: one user message, with tools, under a system prompt not seen before;
   - ``side_request``: no tools, or a tool set not seen before (title generation, ...).
4. ``unknown``: anything else.
"""

from __future__ import annotations

from proxy.canonical import ChatRequest
from proxy.ledger.fingerprint import Fingerprints, system_text, tools_key
from proxy.ledger.plan import ForkReason
from proxy.ledger.tree import SessionTree

_NO_TOOLS = tools_key(())


def fork_reason(tree: SessionTree, request: ChatRequest, fingerprints: Fingerprints) -> ForkReason:
    messages = request.messages
    system = system_text(request)
    tools = fingerprints.seed
    offset = 1 if system is not None else 0
    longest = tree.longest.get((system, tools))
    if longest is not None:
        agreed = _agreed(fingerprints.prefixes, tree.prefixes, 0)
        answers_agreed = any(m.role == "assistant" for m in messages[:agreed])
        if len(messages) < longest and not answers_agreed:
            return ForkReason.COMPACTION
        return ForkReason.EDITED_HISTORY
    systems = {context[0] for context in tree.longest}
    tool_sets = {context[1] for context in tree.longest}
    agreed_free = _agreed(fingerprints.free, tree.free_prefixes, offset)
    if agreed_free > offset and all(m.role != "assistant" for m in messages[agreed_free:]):
        if tools == _NO_TOOLS and tool_sets - {_NO_TOOLS}:
            return ForkReason.SIDE_REQUEST
        return ForkReason.TOOLS_CHANGED if system in systems else ForkReason.SYSTEM_CHANGED
    body = messages[offset:]
    if all(m.role != "assistant" for m in body):
        one_query = len(body) == 1 and body[0].role == "user"
        if one_query and tools != _NO_TOOLS and system not in systems:
            return ForkReason.SUBAGENT
        if tools == _NO_TOOLS or tools not in tool_sets:
            return ForkReason.SIDE_REQUEST
    return ForkReason.UNKNOWN


def _agreed(prefixes: tuple[bytes, ...], known: set[bytes], start: int) -> int:
    """How many leading messages agree with some recorded conversation (from ``start``)."""
    agreed = start
    for index in range(start, len(prefixes)):
        if prefixes[index] not in known:
            break
        agreed = index + 1
    return agreed
