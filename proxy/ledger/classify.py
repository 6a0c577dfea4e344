"""Why a request forks, and which request is a session's root: the ledger's heuristics.

``fork_reason(tree, request, fingerprints)`` is called only when no committed turn's
conversation is a prefix of the request followed by nothing but user/tool/system messages.
"Context" is (system prompt, tool set); "agrees" means equal normalised messages
(``proxy.ledger.fingerprint``). In order:

1. The context was seen before in this session:
   - ``compaction``: the history was replaced from its start. The request agrees with the
     session on no assistant message; the first message where it departs is a user
     message (the summary, or a question standing in for the history); and none of the
     request's later assistant messages is an answer the session produced at that same
     position in this context. What may survive: the system prompt, leading user/system
     messages, and answers that moved (Claude Code's ``/compact`` keeps its last answer
     right after the summary message, then adds its own caveat and a synthetic "No
     response requested." answer). The request's length does not matter: a compacted
     history plus a new task can be longer than a short history.
   - ``edited_history``: otherwise: a message the model already saw was changed while
     the history around it stayed (an edited first message followed by the same answers
     in place, pruned tool output, a re-rendered answer, a changed in-array system
     message). Limit: a one-exchange history compacted with its only answer kept in
     place looks exactly like an edit of the first user message, and is called one.
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

The root (``side_requests_before``, ``settle``). A side request that arrives before the
main conversation (OpenCode asks for a session title first) cannot be recognised on
arrival: it is the session's first request, so it becomes the root. The main
conversation's first request then shows what it was. When a fresh request (no assistant
message) *with tools* arrives, and every committed turn of the session is a tool-less,
never-continued exchange (a root or a side request) under another system prompt, the new
request is the session's root, and the earlier roots are re-labelled ``fork`` /
``side_request`` once it commits (``PromptPlan.side_requests`` names them; the recorder
updates their rows, counts the re-label and reports it). Nothing else is ever
re-labelled, and the rule looks only at committed turns, so it is deterministic.
``settle`` applies the same rule when a root commits after another request's first turn
committed meanwhile (both arrived at an empty session): a main-conversation root
re-labels the tool-less roots before it, and a request that is a side request of the
committed turns (rule 2 or 3, with a tool-using turn in the session) commits as
``fork`` / ``side_request``. Either commit order gives the same labels.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from proxy.canonical import ChatRequest, Message
from proxy.ledger.fingerprint import (
    Fingerprints,
    normalised_content,
    same_tool_calls,
    system_text,
    tools_key,
)
from proxy.ledger.plan import Classification, ForkReason, PromptPlan
from proxy.ledger.tree import SessionTree

_NO_TOOLS = tools_key(())


def fork_reason(tree: SessionTree, request: ChatRequest, fingerprints: Fingerprints) -> ForkReason:
    messages = request.messages
    system = system_text(request)
    tools = fingerprints.seed
    offset = 1 if system is not None else 0
    if (system, tools) in tree.longest:
        agreed = _agreed(fingerprints.prefixes, tree.prefixes, 0)
        if _history_replaced(tree, messages, agreed, (system, tools)):
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


def side_requests_before(
    tree: SessionTree, request: ChatRequest, fingerprints: Fingerprints
) -> tuple[str, ...] | None:
    """The roots to re-label when ``request`` is the session's real first main turn.

    ``None`` when it is not (see the module docstring); otherwise the ids of the committed
    turns still labelled ``root`` (possibly none, when all are side requests already).
    """
    if not tree.nodes or fingerprints.seed == _NO_TOOLS:
        return None
    if any(m.role == "assistant" for m in request.messages):
        return None
    system = system_text(request)
    for turn in tree:
        if turn.context[1] != _NO_TOOLS or turn.context[0] == system:
            return None
        side = turn.classification is Classification.FORK and (
            turn.fork_reason is ForkReason.SIDE_REQUEST
        )
        if not (side or turn.classification is Classification.ROOT):
            return None  # an exchange that was continued, or another kind of fork
    return tuple(t.turn_id for t in tree if t.classification is Classification.ROOT)


def settle(tree: SessionTree, plan: PromptPlan, request: ChatRequest) -> PromptPlan:
    """The plan to commit, for a root planned before other first turns committed."""
    if plan.classification is not Classification.ROOT or not tree.nodes:
        return plan
    fingerprints = plan.fingerprints
    roots = side_requests_before(tree, request, fingerprints)
    if roots is not None:
        return replace(plan, side_requests=roots)
    if plan.side_requests:
        plan = replace(plan, side_requests=())  # named when planned; another root came since
    agent_seen = any(tools != _NO_TOOLS for _, tools in tree.longest)  # per context, not turn
    if agent_seen and fork_reason(tree, request, fingerprints) is ForkReason.SIDE_REQUEST:
        return replace(
            plan, classification=Classification.FORK, fork_reason=ForkReason.SIDE_REQUEST
        )
    return plan


def _history_replaced(
    tree: SessionTree,
    messages: Sequence[Message],
    agreed: int,
    context: tuple[str | None, bytes],
) -> bool:
    """Compaction rather than an edit (rule 1): nothing of the history stays in place."""
    if agreed >= len(messages) or messages[agreed].role != "user":
        return False
    if any(m.role == "assistant" for m in messages[:agreed]):
        return False
    later = {i: m for i, m in enumerate(messages) if i > agreed and m.role == "assistant"}
    if not later:
        return True
    for turn in tree:
        kept = later.get(turn.message_count) if turn.context == context else None
        if kept is not None and _same_answer(kept, turn.message):
            return False
    return True


def _same_answer(sent: Message, produced: Message) -> bool:
    return normalised_content(sent) == normalised_content(produced) and same_tool_calls(
        sent, produced
    )


def _agreed(prefixes: tuple[bytes, ...], known: set[bytes], start: int) -> int:
    """How many leading messages agree with some recorded conversation (from ``start``)."""
    agreed = start
    for index in range(start, len(prefixes)):
        if prefixes[index] not in known:
            break
        agreed = index + 1
    return agreed
