"""What a fork changed of the history it departs from: messages and tokens, as a diff.

The ledger forks a request whose prompt rewrote what the model already saw while the
history around it stayed (``edited_history``, ``proxy.ledger.classify``): the harness
pruned a tool output, edited an earlier message, re-rendered an answer. The fork is
recorded with the committed turn it shares the longest token prefix with as its parent
and that prefix's length as ``reused_prefix_len``. ``history_edit`` says what changed
against that parent:

- messages: the parent's conversation (its request, then its answer) against the fork's
  request, as spans in order: ``same``, ``changed`` (parent messages replaced by fork
  messages), ``removed``, ``added``. Messages are compared by the ``key`` the caller
  passes (the page compares what the model saw, ignoring dropped reasoning);
- tokens: the parent's tokens (prompt + sampled) against the fork's prompt, past the
  shared prefix, as ``same``/``removed``/``added`` spans (a replacement is a removal
  then an addition), over at most ``MAX_COMPARED`` tokens of each side; each span keeps
  at most ``MAX_SHOWN`` of its ids, and its ``count`` says how many it holds.

Pure functions over values; nothing here reads the database.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher
from typing import Generic, Literal, TypeVar

EDITED_HISTORY = "edited_history"  # proxy.ledger.plan.ForkReason.EDITED_HISTORY
MAX_COMPARED = 2000  # tokens of each side past the shared prefix (the diff is quadratic)
MAX_SHOWN = 200  # ids kept per token span

M = TypeVar("M")
Kind = Literal["same", "changed", "removed", "added"]


@dataclass(frozen=True, slots=True)
class MessageSpan(Generic[M]):
    kind: Kind
    parent_start: int  # index of the span's first message in the parent's conversation
    fork_start: int  # and in the fork's request
    before: tuple[M, ...]  # the parent's messages in the span
    after: tuple[M, ...]  # the fork's


@dataclass(frozen=True, slots=True)
class TokenSpan:
    kind: Literal["same", "removed", "added"]
    start: int  # position of the first id: in the parent's tokens, or the fork's prompt
    count: int
    ids: tuple[int, ...]  # the first MAX_SHOWN of them


@dataclass(frozen=True, slots=True)
class HistoryEdit(Generic[M]):
    parent_turn_id: str
    shared_tokens: int  # leading ids of the fork's prompt that are the parent's tokens
    parent_tokens: int  # the parent's prompt + sampled ids
    fork_tokens: int  # the fork's prompt
    messages: tuple[MessageSpan[M], ...]
    tokens: tuple[TokenSpan, ...]
    truncated: bool  # the token comparison stopped at MAX_COMPARED on a side

    @property
    def changed_messages(self) -> int:
        return sum(len(s.before) for s in self.messages if s.kind in ("changed", "removed"))


def history_edit(
    parent_turn_id: str,
    parent_conversation: Sequence[M],
    fork_request: Sequence[M],
    key: Callable[[M], Hashable],
    parent_tokens: Sequence[int],
    fork_prompt: Sequence[int],
) -> HistoryEdit[M]:
    shared = _common_prefix(parent_tokens, fork_prompt)
    return HistoryEdit(
        parent_turn_id=parent_turn_id,
        shared_tokens=shared,
        parent_tokens=len(parent_tokens),
        fork_tokens=len(fork_prompt),
        messages=diff_messages(parent_conversation, fork_request, key),
        tokens=diff_tokens(parent_tokens, fork_prompt, shared),
        truncated=max(len(parent_tokens), len(fork_prompt)) - shared > MAX_COMPARED,
    )


def diff_messages(
    before: Sequence[M], after: Sequence[M], key: Callable[[M], Hashable]
) -> tuple[MessageSpan[M], ...]:
    matcher = SequenceMatcher(None, [key(m) for m in before], [key(m) for m in after], False)
    kinds: dict[str, Kind] = {
        "equal": "same",
        "replace": "changed",
        "delete": "removed",
        "insert": "added",
    }
    return tuple(
        MessageSpan(kinds[tag], i1, j1, tuple(before[i1:i2]), tuple(after[j1:j2]))
        for tag, i1, i2, j1, j2 in matcher.get_opcodes()
    )


def diff_tokens(
    parent_tokens: Sequence[int], fork_prompt: Sequence[int], shared: int
) -> tuple[TokenSpan, ...]:
    """Spans past the first ``shared`` ids, which both sides hold."""
    old = list(parent_tokens[shared : shared + MAX_COMPARED])
    new = list(fork_prompt[shared : shared + MAX_COMPARED])
    spans: list[TokenSpan] = []

    def span(kind: Literal["same", "removed", "added"], start: int, ids: list[int]) -> None:
        spans.append(TokenSpan(kind, shared + start, len(ids), tuple(ids[:MAX_SHOWN])))

    for tag, i1, i2, j1, j2 in SequenceMatcher(None, old, new, False).get_opcodes():
        if tag == "equal":
            span("same", i1, old[i1:i2])
            continue
        if i2 > i1:
            span("removed", i1, old[i1:i2])
        if j2 > j1:
            span("added", j1, new[j1:j2])
    return tuple(spans)


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
