"""One session's tree of committed turns, its lookup indexes and its token store.

Owns ``Turn`` (a node: what one completed turn answered, produced and saw as tokens) and
``SessionTree`` (nodes plus the indexes that make matching O(request)):

- ``by_conversation``: fingerprint of (tools, request messages + produced message) -> the
  latest node with that conversation; the deepest hit while walking a request's prefix
  fingerprints is the turn the request continues.
- ``by_request``: fingerprint of the request alone -> nodes that answered it (retries,
  and the tolerant look-up of an assistant message the harness trimmed).
- ``prefixes``/``free_prefixes``: every prefix of every node's conversation, with and
  without the context, so fork classification can say how far a request agrees.

``recent`` keeps, for the last few committed nodes, the request messages each answered
(``Sent``). ``continuation`` recognises the common case, a harness re-sending such a
request unchanged followed by the answer and new tool results or user text, with one
C-level comparison of message objects and fingerprints of only the answer and the new
messages; it returns exactly what ``match`` would, or ``None`` to let ``match`` decide.

Tokens are stored as a chain: a node keeps its parent's first ``base_len`` tokens by
reference and only its own ``tail``; ``tokens(node)`` materialises, with a small cache of
recent nodes so that a run of extends copies the conversation (int32 ``TokenIds``, one
memcpy) at most once per turn. ``common_prefix`` finds the longest token prefix a prompt
shares with any node in O(total stored tokens), vectorised, without materialising any.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from proxy.canonical import ChatRequest, Message, ToolSpec
from proxy.ledger.fingerprint import (
    Fingerprinter,
    Fingerprints,
    chain,
    effective_tools,
    normalised_content,
    same_tool_calls,
)
from proxy.ledger.plan import Classification, ForkReason
from proxy.tokens import TokenIds

_TOKEN_CACHE_SIZE = 4
_RECENT_SIZE = 4


@dataclass(frozen=True, slots=True)
class Turn:
    turn_id: str
    parent_id: str | None
    base_len: int  # leading tokens shared with the parent (its reused prefix)
    tail: TokenIds  # this node's tokens after base_len
    length: int
    prompt_len: int
    classification: Classification
    fork_reason: ForkReason | None
    context: tuple[str | None, bytes]  # (system text, tool-set key)
    enable_thinking: bool | None
    message_count: int  # request messages; the produced message sits at this index
    new_message_count: int
    message: Message  # what the proxy produced (parsed from the sampled ids)
    ended_with_eos: bool
    # Reasoning in the tokens after the last user query, which a template that drops
    # earlier reasoning would remove once a new query arrives.
    carries_reasoning: bool
    request_fp: bytes
    conversation_fp: bytes
    free_conversation_fp: bytes


@dataclass(frozen=True, slots=True)
class Sent:
    """The request a recent node answered, as the harness sent it."""

    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...]  # the effective tool set
    free: bytes  # the fingerprint of ``messages`` without tools and leading system prompt


@dataclass(frozen=True, slots=True)
class Match:
    turn: Turn | None  # the deepest node whose conversation prefixes the request
    covered: int  # request messages that conversation covers
    prefixes: tuple[bytes, ...]  # the request's prefix fingerprints, tolerance applied


@dataclass(slots=True)
class SessionTree:
    nodes: dict[str, Turn] = field(default_factory=dict)
    by_conversation: dict[bytes, Turn] = field(default_factory=dict)
    by_request: dict[bytes, list[Turn]] = field(default_factory=dict)
    prefixes: set[bytes] = field(default_factory=set)
    free_prefixes: set[bytes] = field(default_factory=set)
    longest: dict[tuple[str | None, bytes], int] = field(default_factory=dict)
    _tokens: OrderedDict[str, TokenIds] = field(default_factory=OrderedDict)
    recent: OrderedDict[str, Sent] = field(default_factory=OrderedDict)

    def __iter__(self) -> Iterator[Turn]:
        return iter(self.nodes.values())

    # -- building ---------------------------------------------------------------
    def add(
        self,
        turn: Turn,
        tokens: TokenIds,
        fingerprints: Fingerprints,
    ) -> None:
        if turn.base_len and (turn.parent_id is None or turn.parent_id not in self.nodes):
            raise ValueError("a node that reuses tokens needs its parent in the tree")
        self.nodes[turn.turn_id] = turn
        self.by_conversation[turn.conversation_fp] = turn
        self.by_request.setdefault(turn.request_fp, []).append(turn)
        self.prefixes.update(fingerprints.prefixes)
        self.prefixes.add(turn.conversation_fp)
        self.free_prefixes.update(fingerprints.free)
        self.free_prefixes.add(turn.free_conversation_fp)
        count = turn.message_count + 1
        if self.longest.get(turn.context, 0) < count:
            self.longest[turn.context] = count
        self._remember(turn.turn_id, tokens)

    def remember_sent(self, turn_id: str, sent: Sent) -> None:
        self.recent[turn_id] = sent
        self.recent.move_to_end(turn_id)
        while len(self.recent) > _RECENT_SIZE:
            self.recent.popitem(last=False)

    def relabel(self, turn_id: str, classification: Classification, reason: ForkReason) -> None:
        """Change a node's classification (a root found to be a side request), in place."""
        old = self.nodes.get(turn_id)
        if old is None:
            return
        new = replace(old, classification=classification, fork_reason=reason)
        self.nodes[turn_id] = new  # an existing key keeps its place: parents stay first
        if self.by_conversation.get(old.conversation_fp) is old:
            self.by_conversation[old.conversation_fp] = new
        answered = self.by_request.get(old.request_fp, [])
        self.by_request[old.request_fp] = [new if t is old else t for t in answered]

    # -- matching ---------------------------------------------------------------
    def continuation(
        self, request: ChatRequest, fingerprinter: Fingerprinter
    ) -> tuple[Match, Fingerprints] | None:
        """``match``'s answer for a recent node's request re-sent as it was, else ``None``.

        The messages before the answer are compared as objects (equal objects have equal
        fingerprints), so only the answer and the new messages are fingerprinted; the
        returned fingerprints start at the answer (``offset``).
        """
        messages = request.messages
        tools: tuple[ToolSpec, ...] | None = None
        for turn_id in reversed(self.recent):
            sent = self.recent[turn_id]
            count = len(sent.messages)
            if len(messages) <= count or messages[count].role != "assistant":
                continue
            if tools is None:
                tools = effective_tools(request)
            if sent.tools != tools or messages[:count] != sent.messages:
                continue
            new = messages[count + 1 :]
            if any(m.role == "assistant" for m in new):
                return None  # a deeper conversation: ``match`` walks it
            self.recent.move_to_end(turn_id)  # continued again and again: keep it
            return self._continued(self.nodes[turn_id], sent, messages[count], new, fingerprinter)
        return None

    def _continued(
        self,
        turn: Turn,
        sent: Sent,
        answer: Message,
        new: Sequence[Message],
        fingerprinter: Fingerprinter,
    ) -> tuple[Match, Fingerprints] | None:
        digest = fingerprinter.message(answer)
        following = chain(turn.request_fp, digest)
        if following not in self.by_conversation:
            trimmed = self._trimmed_answer(turn.request_fp, answer)
            if trimmed is None:
                return None
            following = trimmed.conversation_fp
        best = self.by_conversation.get(following)
        if best is None:
            return None
        digests = [digest]
        prefixes = [following]
        free = [chain(sent.free, digest)]
        for message in new:
            digest = fingerprinter.message(message)
            digests.append(digest)
            prefixes.append(chain(prefixes[-1], digest))
            free.append(chain(free[-1], digest))
        count = len(sent.messages)
        fingerprints = Fingerprints(
            turn.context[1], tuple(digests), tuple(prefixes), tuple(free), offset=count
        )
        return Match(best, count + 1, fingerprints.prefixes), fingerprints

    def match(self, messages: Sequence[Message], fingerprints: Fingerprints) -> Match:
        best: Turn | None = None
        covered = 0
        current = fingerprints.seed
        digests = fingerprints.digests
        prefixes: list[bytes] = []
        for index, message in enumerate(messages):
            following = chain(current, digests[index])
            if message.role == "assistant" and following not in self.by_conversation:
                trimmed = self._trimmed_answer(current, message)
                if trimmed is not None:
                    following = trimmed.conversation_fp
            turn = self.by_conversation.get(following)
            if turn is not None:
                best, covered = turn, index + 1
            prefixes.append(following)
            current = following
        return Match(best, covered, tuple(prefixes))

    def _trimmed_answer(self, before: bytes, message: Message) -> Turn | None:
        """A node whose answer the harness sent back with trailing text dropped."""
        sent = normalised_content(message)
        for turn in self.by_request.get(before, ()):
            produced = normalised_content(turn.message)
            if produced.startswith(sent) and same_tool_calls(turn.message, message):
                return turn
        return None

    # -- tokens -------------------------------------------------------------------
    def tokens(self, turn: Turn) -> TokenIds:
        """The node's prompt + sampled ids (a cache hit for recent nodes)."""
        cached = self._tokens.get(turn.turn_id)
        if cached is not None:
            self._tokens.move_to_end(turn.turn_id)
            return cached
        path: list[Turn] = []
        node: Turn | None = turn
        start = TokenIds()
        while node is not None:
            hit = self._tokens.get(node.turn_id)
            if hit is not None:
                start = hit
                break
            path.append(node)
            node = self.nodes.get(node.parent_id) if node.parent_id and node.base_len else None
        pieces = [start]
        for step in reversed(path):  # each step keeps base_len ids of what came before
            pieces = [*_truncated(pieces, step.base_len), step.tail]
        tokens = TokenIds.join(*pieces)
        self._remember(turn.turn_id, tokens)
        return tokens

    def _remember(self, turn_id: str, tokens: TokenIds) -> None:
        self._tokens[turn_id] = tokens
        self._tokens.move_to_end(turn_id)
        while len(self._tokens) > _TOKEN_CACHE_SIZE:
            self._tokens.popitem(last=False)

    def common_prefix(self, prompt: TokenIds) -> tuple[Turn | None, int]:
        """The node sharing the longest token prefix with ``prompt`` (closest on ties)."""
        shared: dict[str, int] = {}
        best: Turn | None = None
        best_len = 0
        for turn in self.nodes.values():  # parents were added before their children
            # A node with base_len > 0 always has its parent in the tree (see ``add``).
            parent = shared[turn.parent_id] if turn.parent_id and turn.base_len else None
            if parent is not None and parent < turn.base_len:
                length = parent
            else:
                length = turn.base_len + _shared_run(prompt, turn.base_len, turn.tail)
            shared[turn.turn_id] = length
            if length > best_len or (
                best is not None and length == best_len and turn.length < best.length
            ):
                best, best_len = turn, length
        return best, best_len


def _truncated(pieces: list[TokenIds], length: int) -> list[TokenIds]:
    kept: list[TokenIds] = []
    for piece in pieces:
        if length <= 0:
            break
        kept.append(piece if len(piece) <= length else piece[:length])
        length -= len(piece)
    return kept


def _shared_run(prompt: TokenIds, offset: int, tail: TokenIds) -> int:
    """How many of ``tail``'s leading ids equal ``prompt[offset:]``'s."""
    return shared_length(prompt[offset:], tail)


def shared_length(a: TokenIds, b: TokenIds) -> int:
    """The length of the longest common prefix of two id sequences (vectorised)."""
    limit = min(len(a), len(b))
    differ = np.flatnonzero(a.array[:limit] != b.array[:limit])
    return int(differ[0]) if differ.size else limit
