"""What the ledger decides for one request: ``PromptPlan`` and its vocabularies.

``Classification``: ``root`` (the session's first request), ``extend`` (exact continuation
of a committed turn: its prompt + sampled ids, then only the new messages), ``realign``
(an extend whose previous answer stopped without its end-of-turn token, which is inserted
as prompt tokens), ``fork`` (a new branch rendered whole, with a ``ForkReason``).
``side_requests`` names earlier turns, committed as roots, that this root shows to have
been side requests (``proxy.ledger.classify``): committing it re-labels them.
Both enums are ``StrEnum``s, so their values go straight into ``TurnRecord`` and metric
labels.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from proxy.ledger.fingerprint import Fingerprints
from proxy.tokens import TokenIds


class Classification(StrEnum):
    ROOT = "root"
    EXTEND = "extend"
    REALIGN = "realign"
    FORK = "fork"


class ForkReason(StrEnum):
    COMPACTION = "compaction"
    EDITED_HISTORY = "edited_history"
    SYSTEM_CHANGED = "system_changed"
    TOOLS_CHANGED = "tools_changed"
    SUBAGENT = "subagent"
    SIDE_REQUEST = "side_request"
    REASONING_DROPPED = "reasoning_dropped"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class PromptPlan:
    prompt_ids: TokenIds
    classification: Classification
    fork_reason: ForkReason | None
    parent_turn_id: str | None
    reused_prefix_len: int  # leading prompt ids identical to the parent's tokens
    new_message_count: int  # request messages rendered for this turn
    # The request's fingerprints, so ``commit`` need not hash the conversation again.
    fingerprints: Fingerprints = field(repr=False, compare=False)
    side_requests: tuple[str, ...] = ()  # turn ids re-labelled fork/side_request on commit
