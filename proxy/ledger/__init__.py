"""The history ledger: token-faithful multi-turn prompts (DESIGN.md invariants 3 and 4).

One ``LedgerBook`` per app holds, per session, a tree of completed turns. For each request
it plans the prompt ids: an exact continuation of a committed turn (its prompt ids +
sampled ids, then only the new messages rendered incrementally), or a classified fork.
Integration in a pipeline::

    plan = book.plan(session.id, request)          # prompt ids + classification
    ... generate from plan.prompt_ids ...
    book.commit(session.id, plan, request, output_ids, message, turn_id)  # on completion

and ``book.load(session.id, turns, recorded_requests(session.id, turns))`` with
``turns = await store.list_turns(session.id)`` when ``book.has`` is false for a session
that already has turns (restart, another replica); ``proxy.conversations`` rebuilds the
whole requests, which the recorder stores linearly.
"""

from proxy.ledger.book import LedgerBook
from proxy.ledger.codec import decode_message, decode_request
from proxy.ledger.incremental import IncrementalRenderer
from proxy.ledger.plan import Classification, ForkReason, PromptPlan

__all__ = [
    "Classification",
    "ForkReason",
    "IncrementalRenderer",
    "LedgerBook",
    "PromptPlan",
    "decode_message",
    "decode_request",
]
