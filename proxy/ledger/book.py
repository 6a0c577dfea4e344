"""The history ledger: per session, which tokens a request's prompt must start with.

Owns ``LedgerBook``, one per app (no globals), holding a ``SessionTree`` per session id,
for at most ``max_sessions`` sessions (least recently used dropped first; a dropped or
forgotten session is rebuilt from the database by ``load`` when it is used again).

Contract:
- ``plan(session_id, request) -> PromptPlan``: synchronous, no IO, so atomic under
  asyncio. For an ``extend``/``realign`` the prompt is the matched turn's prompt ids +
  sampled ids (stop token included), then only the new messages rendered incrementally;
  its cost grows with the new messages. When the request re-sends one of the session's
  recent requests unchanged (what harnesses do), the earlier messages are only compared
  as objects (C speed, no hashing) and the prompt is one int32 copy (``TokenIds``); any
  other request is fingerprinted whole and matched against every committed turn.
  ``root`` and ``fork`` render the whole conversation (the one full render on the hot
  path; forks are rare) and report the longest token prefix shared with any committed
  turn as ``reused_prefix_len`` and that turn as the parent.
- ``await plan_off_loop(session_id, request, max_prompt_tokens=n)`` is the same plan with
  each large render in a worker thread, refusing (``ContextLengthExceeded``) before it
  starts a render of more text than ``n`` tokens can hold.
- A retry (a request equal to one already answered) gets that turn's prompt again.
- ``keep_reasoning=False`` mimics templates that drop the reasoning of answers before the
  last user query: a new user query after a turn whose tokens hold such reasoning forks
  (``reasoning_dropped``) with a whole render, so the prompt is what the template gives.
  "Reasoning" is any think block since the last user query, empty ones included (a
  sampled ``<think>``, Qwen3.5's generation prompt, a pre-filled empty block), since the
  templates drop the block whole.
- A fresh request with tools after nothing but tool-less exchanges (a title request that
  came first) is a ``root`` naming those turns in ``side_requests`` (``classify``).
- ``commit(...)`` adds a completed turn and returns the plan as committed: ``classify.settle``
  may revise a ``root`` planned while another first turn was in flight; the turns named in
  its ``side_requests`` are re-labelled ``fork``/``side_request``. The turn itself is
  added in the event loop's next pass, after its answer is written (``proxy.deferred``);
  every method here applies such adds first, so no plan ever misses a committed turn.
  Nothing else mutates a session, so concurrent plans of one session (sub-agents, side
  requests) need no lock.
- ``load(session_id, turns, requests)`` rebuilds a session from recorded turns (completed
  ones become nodes, in seq order) and their whole requests by turn id (stored linearly,
  see ``proxy.conversations.recorded_requests``), replacing what was held; plans
  afterwards are the same as before the restart.
- Template and rendering errors raise ``InvalidRequest``; ``self_check`` raises
  ``LegoError`` when the served template cannot be rendered incrementally
  (``proxy.ledger.template_check``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

import numpy as np
import numpy.typing as npt
from transformers import PreTrainedTokenizerBase

from kernel.errors import ContextLengthExceeded
from proxy.canonical import ChatRequest, Message
from proxy.deferred import Deferred
from proxy.ledger.classify import fork_reason, settle, side_requests_before
from proxy.ledger.codec import decode_message
from proxy.ledger.fingerprint import (
    FREE_SEED,
    Fingerprinter,
    Fingerprints,
    chain,
    effective_tools,
    system_text,
)
from proxy.ledger.incremental import IncrementalRenderer
from proxy.ledger.plan import Classification, ForkReason, PromptPlan
from proxy.ledger.template_check import check_template
from proxy.ledger.tree import Sent, SessionTree, Turn, shared_length
from proxy.lru import DEFAULT_MAX_SESSIONS, SessionLru
from proxy.render import Renderer
from proxy.tokens import TokenIds
from recorder.records import TurnRecord, TurnStatus

_CONTINUATIONS = (Classification.EXTEND, Classification.REALIGN)
# The generation prompt (``<|im_start|>assistant\n<think>\n\n</think>\n\n`` at most) sits
# after the prompt's last eos within this many ids.
_GENERATION_PROMPT_WINDOW = 32
# Answers up to this many ids are searched for ``<think>`` as a Python list, not by numpy.
_LIST_SEARCH_IDS = 256
# Renders of less text than this run on the event loop: a thread hop would cost more.
INLINE_RENDER_CHARS = 32 * 1024
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class _Render:
    """One render a plan needs: how much text it renders, and the render itself."""

    chars: int
    run: Callable[[], TokenIds]


_Steps = Generator[_Render, TokenIds, _T]


def _chars(messages: Sequence[Message]) -> int:
    """Characters of message text a render tokenizes (a lower bound of its work)."""
    return sum(
        len(m.content) + len(m.reasoning or "") + sum(len(c.arguments) for c in m.tool_calls)
        for m in messages
    )


def max_token_chars(tokenizer: PreTrainedTokenizerBase) -> int:
    """The most characters one token of ``tokenizer`` stands for (its longest entry; a
    byte-level vocabulary writes a byte as one character, so this also bounds bytes)."""
    vocabulary: dict[str, int] = tokenizer.get_vocab()
    return max((len(token) for token in vocabulary), default=1) or 1


class LedgerBook:
    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        *,
        keep_reasoning: bool = True,
        max_sessions: int = DEFAULT_MAX_SESSIONS,
    ) -> None:
        self._tokenizer = tokenizer
        self._renderer = Renderer(tokenizer)
        self._incremental = IncrementalRenderer(tokenizer)
        self._fingerprinter = Fingerprinter()
        self._keep_reasoning = keep_reasoning
        think = tokenizer.encode("<think>", add_special_tokens=False)
        self._think_id: int | None = think[0] if len(think) == 1 else None
        self._max_token_chars = max_token_chars(tokenizer)
        self._sessions: SessionLru[SessionTree] = SessionLru(max_sessions)
        self._commits = Deferred("the history ledger")  # each turn's add, after its answer

    def self_check(self) -> None:
        check_template(self._tokenizer, self._incremental)

    def has(self, session_id: str) -> bool:
        self._commits.settle()
        return session_id in self._sessions

    def was_dropped(self, session_id: str) -> bool:
        """The session was let go to make room (not held now): the database knows more."""
        self._commits.settle()
        return self._sessions.was_dropped(session_id)

    def size(self, session_id: str) -> int:
        """Committed turns held for a session (0 when none)."""
        self._commits.settle()
        tree = self._sessions.get(session_id)
        return len(tree.nodes) if tree is not None else 0

    def tree(self, session_id: str) -> SessionTree | None:
        """The session's tree, for inspection (tests, tools); never mutate it."""
        self._commits.settle()
        return self._sessions.get(session_id)

    def forget(self, session_id: str) -> None:
        self._commits.settle()
        self._sessions.pop(session_id)

    # -- planning ---------------------------------------------------------------
    def plan(self, session_id: str, request: ChatRequest) -> PromptPlan:
        steps = self._plan(session_id, request)
        try:
            render = next(steps)
            while True:
                render = steps.send(render.run())
        except StopIteration as done:
            plan: PromptPlan = done.value
            return plan

    async def plan_off_loop(
        self, session_id: str, request: ChatRequest, *, max_prompt_tokens: int
    ) -> PromptPlan:
        """``plan``, with every large render run in a worker thread (the tokenizer lets go
        of the GIL), so a huge request never stalls other sessions' streams or the health
        probes. A render whose text cannot fit ``max_prompt_tokens`` (it has more than
        that many times the longest token's characters) raises ``ContextLengthExceeded``
        before it starts: refusing costs time in the budget, not in the body."""
        steps = self._plan(session_id, request)
        try:
            render = next(steps)
            while True:
                if render.chars > max_prompt_tokens * self._max_token_chars:
                    raise ContextLengthExceeded(
                        f"the prompt holds {render.chars} characters to render, more than "
                        f"{max_prompt_tokens} tokens can hold",
                        param="messages",
                    )
                if render.chars < INLINE_RENDER_CHARS:
                    ids = render.run()
                else:
                    ids = await asyncio.to_thread(render.run)
                render = steps.send(ids)
        except StopIteration as done:
            plan: PromptPlan = done.value
            return plan

    def _whole(self, request: ChatRequest) -> _Render:
        return _Render(_chars(request.messages), lambda: TokenIds(self._renderer.render(request)))

    def _plan(self, session_id: str, request: ChatRequest) -> _Steps[PromptPlan]:
        """The plan, as steps: it yields each render it needs and is sent back the ids.
        Between steps the session may gain turns (commits only add), which is the same
        as a commit landing right after a plan."""
        self._commits.settle()
        tree = self._sessions.get(session_id)
        if tree is None or not tree.nodes:
            prompt = yield self._whole(request)
            fingerprints = self._fingerprinter.of(request)
            return PromptPlan(
                prompt, Classification.ROOT, None, None, 0, len(request.messages), fingerprints
            )
        fast = tree.continuation(request, self._fingerprinter)
        if fast is not None:
            match, fingerprints = fast
        else:
            fingerprints = self._fingerprinter.of(request)
            match = tree.match(request.messages, fingerprints)
            fingerprints = replace(fingerprints, prefixes=match.prefixes)
        retried = self._retried(tree, request, fingerprints)
        if retried is not None:
            return retried
        turn = match.turn
        new = request.messages[match.covered :]
        if turn is not None and all(m.role != "assistant" for m in new):
            if (
                not self._keep_reasoning
                and turn.carries_reasoning
                and any(m.role == "user" for m in new)
            ):
                prompt = yield self._whole(request)
                reused = shared_length(prompt, tree.tokens(turn))
                return PromptPlan(
                    prompt,
                    Classification.FORK,
                    ForkReason.REASONING_DROPPED,
                    turn.turn_id,
                    reused,
                    len(request.messages),
                    fingerprints,
                )
            return (yield from self._continue(tree, turn, new, request, fingerprints))
        roots = side_requests_before(tree, request, fingerprints)
        if roots is not None:
            prompt = yield self._whole(request)
            return PromptPlan(
                prompt,
                Classification.ROOT,
                None,
                None,
                0,
                len(request.messages),
                fingerprints,
                roots,
            )
        reason = fork_reason(tree, request, fingerprints)
        prompt = yield self._whole(request)
        parent, reused = tree.common_prefix(prompt)
        return PromptPlan(
            prompt,
            Classification.FORK,
            reason,
            parent.turn_id if parent is not None else None,
            reused,
            len(request.messages),
            fingerprints,
        )

    def _continue(
        self,
        tree: SessionTree,
        turn: Turn,
        new: Sequence[Message],
        request: ChatRequest,
        fingerprints: Fingerprints,
    ) -> _Steps[PromptPlan]:
        closing = () if turn.ended_with_eos else self._incremental.closing_ids
        suffix = yield _Render(
            _chars(new),
            lambda: TokenIds(self._incremental.suffix_ids(new, request.enable_thinking)),
        )
        prompt = TokenIds.join(tree.tokens(turn), closing, suffix)  # one copy per turn
        return PromptPlan(
            prompt,
            Classification.EXTEND if turn.ended_with_eos else Classification.REALIGN,
            None,
            turn.turn_id,
            turn.length,
            len(new),
            fingerprints,
        )

    def _retried(
        self, tree: SessionTree, request: ChatRequest, fingerprints: Fingerprints
    ) -> PromptPlan | None:
        for turn in tree.by_request.get(fingerprints.request, ()):
            if turn.enable_thinking != request.enable_thinking:
                continue
            prompt = tree.tokens(turn)[: turn.prompt_len]
            return PromptPlan(
                prompt,
                turn.classification,
                turn.fork_reason,
                turn.parent_id,
                turn.base_len,
                turn.new_message_count,
                fingerprints,
            )
        return None

    # -- committing -------------------------------------------------------------
    def commit(
        self,
        session_id: str,
        plan: PromptPlan,
        request: ChatRequest,
        output_ids: Sequence[int],
        message: Message,
        turn_id: str,
    ) -> PromptPlan:
        """Add a completed turn; ``plan`` must be what ``plan`` returned for ``request``.

        Returns the plan as committed, which is what the turn's record must say. The turn
        is added to the tree in the loop's next pass (``proxy.deferred``: after the
        answer is written), and before anything reads the session again."""
        self._commits.settle()
        tree = self._sessions.setdefault(session_id, SessionTree)
        plan = settle(tree, plan, request)
        for earlier in plan.side_requests:
            tree.relabel(earlier, Classification.FORK, ForkReason.SIDE_REQUEST)
        output = TokenIds(output_ids)  # a copy: the caller's list may change

        def add() -> None:
            self._add(
                tree,
                turn_id=turn_id,
                request=request,
                fingerprints=plan.fingerprints,
                prompt_ids=plan.prompt_ids,
                output_ids=output,
                message=message,
                classification=plan.classification,
                reason=plan.fork_reason,
                parent_id=plan.parent_turn_id,
                reused=plan.reused_prefix_len,
                new_message_count=plan.new_message_count,
            )

        self._commits.later(add)
        return plan

    def load(
        self,
        session_id: str,
        turns: Sequence[TurnRecord],
        requests: Mapping[str, ChatRequest],
    ) -> None:
        self._commits.settle()
        tree = SessionTree()
        for record in sorted(turns, key=lambda r: r.seq):
            if record.status is not TurnStatus.COMPLETED:
                continue
            request = requests[record.id]
            fingerprints = self._fingerprinter.of(request)
            match = tree.match(request.messages, fingerprints)
            fingerprints = replace(fingerprints, prefixes=match.prefixes)
            classification = _classification(record.classification)
            parent = tree.nodes.get(record.parent_turn_id or "")
            reused = record.reused_prefix_len if parent is not None else 0
            prompt_ids = TokenIds(record.prompt_ids)
            if parent is not None and reused:
                shared = tree.tokens(parent)[:reused]
                if len(shared) < reused or prompt_ids[:reused] != shared:
                    reused = 0  # an inconsistent record: store its tokens whole
            new_count = len(request.messages)
            if classification in _CONTINUATIONS and match.turn is not None:
                new_count = len(request.messages) - match.covered
            self._add(
                tree,
                turn_id=record.id,
                request=request,
                fingerprints=fingerprints,
                prompt_ids=prompt_ids,
                output_ids=TokenIds(record.output_ids),
                message=decode_message(record.response_message),
                classification=classification,
                reason=_reason(record.fork_reason),
                parent_id=parent.turn_id if parent is not None else None,
                reused=reused,
                new_message_count=new_count,
            )
        self._sessions.put(session_id, tree)

    def _add(
        self,
        tree: SessionTree,
        *,
        turn_id: str,
        request: ChatRequest,
        fingerprints: Fingerprints,
        prompt_ids: TokenIds,
        output_ids: TokenIds,
        message: Message,
        classification: Classification,
        reason: ForkReason | None,
        parent_id: str | None,
        reused: int,
        new_message_count: int,
    ) -> None:
        parent = tree.nodes.get(parent_id) if parent_id is not None else None
        base_len = reused if parent is not None else 0
        answer = self._fingerprinter.message(message)
        free_before = fingerprints.free[-1] if fingerprints.free else FREE_SEED
        messages = request.messages
        if classification in _CONTINUATIONS and parent is not None:
            new = messages[len(messages) - new_message_count :] if new_message_count else ()
            inherited = parent.carries_reasoning and all(m.role != "user" for m in new)
        else:
            last_query = max((i for i, m in enumerate(messages) if m.role == "user"), default=-1)
            answers = [m for m in messages[last_query + 1 :] if m.role == "assistant"]
            inherited = any((m.reasoning or "").strip() for m in answers) or (
                bool(answers) and self._holds_think(prompt_ids.array)
            )
        tokens = TokenIds.join(prompt_ids, output_ids)
        turn = Turn(
            turn_id=turn_id,
            parent_id=parent.turn_id if parent is not None else None,
            base_len=base_len,
            # A copy of its own: a view would keep the whole prompt alive with every turn.
            tail=TokenIds.join(tokens[base_len:], copy=True),
            length=len(prompt_ids) + len(output_ids),
            prompt_len=len(prompt_ids),
            classification=classification,
            fork_reason=reason,
            context=(system_text(request), fingerprints.seed),
            enable_thinking=request.enable_thinking,
            message_count=len(messages),
            new_message_count=new_message_count,
            message=message,
            ended_with_eos=bool(output_ids) and output_ids[-1] == self._incremental.eos_id,
            carries_reasoning=inherited
            or bool((message.reasoning or "").strip())
            or self._thinks(prompt_ids, output_ids),
            request_fp=fingerprints.request,
            conversation_fp=chain(fingerprints.request, answer),
            free_conversation_fp=chain(free_before, answer),
        )
        tree.add(turn, tokens, fingerprints)
        parent_sent = tree.recent.get(parent.turn_id) if parent is not None else None
        if (
            fingerprints.offset
            and parent_sent is not None
            and len(parent_sent.messages) == fingerprints.offset
        ):
            # The request re-sent the parent's messages unchanged (the fast path's test):
            # keep the parent's objects rather than a second copy of the conversation.
            sent = parent_sent.messages + messages[fingerprints.offset :]
        else:
            sent = messages
        tree.remember_sent(turn_id, Sent(sent, effective_tools(request), free_before))

    def _holds_think(self, ids: npt.NDArray[np.int32]) -> bool:
        return self._think_id is not None and bool(np.any(ids == self._think_id))

    def _thinks(self, prompt_ids: TokenIds, output_ids: TokenIds) -> bool:
        """The turn's own tokens open a think block: sampled, or in the generation prompt
        (Qwen3.5's ends in ``<think>``; ``enable_thinking=false`` pre-fills an empty one).
        An empty block counts: a template that drops reasoning drops the whole block."""
        think = self._think_id
        if think is None:
            return False
        output = output_ids.array
        # A short answer is searched as a list: numpy's per-call cost is 3 us, the list's
        # under 1 (the generation prompt's window too).
        if output.shape[0] <= _LIST_SEARCH_IDS:
            sampled = think in output.tolist()
        else:
            sampled = self._holds_think(output)
        if sampled:
            return True
        tail = prompt_ids.array[-_GENERATION_PROMPT_WINDOW:].tolist()
        eos = self._incremental.eos_id
        if eos in tail:
            tail = tail[len(tail) - tail[::-1].index(eos) :]  # after the last eos
        return think in tail


def _classification(value: str) -> Classification:
    try:
        return Classification(value)
    except ValueError:
        return Classification.FORK


def _reason(value: str | None) -> ForkReason | None:
    if value is None:
        return None
    try:
        return ForkReason(value)
    except ValueError:
        return ForkReason.UNKNOWN
