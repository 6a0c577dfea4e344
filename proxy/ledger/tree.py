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

Tokens are stored as a chain: a node keeps its parent's first ``base_len`` tokens by
reference and only its own ``tail``; ``tokens(node)`` materialises, with a small cache of
recent nodes so that a run of extends never copies the conversation more than once per
turn. ``common_prefix`` finds the longest token prefix a prompt shares with any node in
O(total stored tokens) without materialising any of them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace

from proxy.canonical import Message
from proxy.ledger.fingerprint import Fingerprints, chain, normalised_content, same_tool_calls
from proxy.ledger.plan import Classification, ForkReason

_CHUNK = 512
_TOKEN_CACHE_SIZE = 8


@dataclass(frozen=True, slots=True)
class Turn:
    turn_id: str
    parent_id: str | None
    base_len: int  # leading tokens shared with the parent (its reused prefix)
    tail: tuple[int, ...]  # this node's tokens after base_len
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
    _tokens: OrderedDict[str, tuple[tuple[int, ...], tuple[int, ...]]] = field(
        default_factory=OrderedDict
    )

    def __iter__(self) -> Iterator[Turn]:
        return iter(self.nodes.values())

    # -- building ---------------------------------------------------------------
    def add(
        self,
        turn: Turn,
        prompt_ids: tuple[int, ...],
        output_ids: tuple[int, ...],
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
        self._remember(turn.turn_id, prompt_ids, output_ids)

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
    def tokens(self, turn: Turn) -> tuple[int, ...]:
        head, rest = self.token_parts(turn)
        return head + rest if rest else head

    def token_parts(self, turn: Turn) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The node's tokens as two tuples to concatenate (cheap for recent nodes)."""
        cached = self._tokens.get(turn.turn_id)
        if cached is not None:
            self._tokens.move_to_end(turn.turn_id)
            return cached
        path: list[Turn] = []
        node: Turn | None = turn
        start: list[int] = []
        while node is not None:
            hit = self._tokens.get(node.turn_id)
            if hit is not None:
                start = [*hit[0], *hit[1]]
                break
            path.append(node)
            node = self.nodes.get(node.parent_id) if node.parent_id and node.base_len else None
        for step in reversed(path):
            del start[step.base_len :]
            start.extend(step.tail)
        tokens = tuple(start)
        self._remember(turn.turn_id, tokens, ())
        return tokens, ()

    def _remember(self, turn_id: str, head: tuple[int, ...], rest: tuple[int, ...]) -> None:
        self._tokens[turn_id] = (head, rest)
        self._tokens.move_to_end(turn_id)
        while len(self._tokens) > _TOKEN_CACHE_SIZE:
            self._tokens.popitem(last=False)

    def common_prefix(self, prompt: Sequence[int]) -> tuple[Turn | None, int]:
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


def _shared_run(prompt: Sequence[int], offset: int, tail: Sequence[int]) -> int:
    """How many of ``tail``'s leading ids equal ``prompt[offset:]``'s, chunk by chunk."""
    limit = min(len(prompt) - offset, len(tail))
    done = 0
    while done < limit:
        step = min(_CHUNK, limit - done)
        if prompt[offset + done : offset + done + step] == tail[done : done + step]:
            done += step
            continue
        while prompt[offset + done] == tail[done]:
            done += 1
        return done
    return done
