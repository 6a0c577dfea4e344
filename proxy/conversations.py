"""What a new turn's request adds to the conversation it continues (linear request storage).

Owns ``ConversationBook``, one per app next to the ledger (no globals), holding at most
``max_sessions`` sessions like the ledger (``proxy.lru``). Per session it
holds the conversation of every completed turn, its request then its answer, as a chain:
a turn keeps the number of leading messages it shares with its parent's conversation and
only its own messages after them, so memory grows with what the turns add; the whole
message tuples of a few recent turns are cached, so a run of extends never walks the chain.

Contract:
- ``encode(session_id, parent_turn_id, request) -> EncodedRequest``: ``inherited`` is the
  number of leading messages of ``request`` equal (``==``, so exactly) to the parent's
  conversation, and ``data`` is what ``TurnRecord.request_messages`` stores for it
  (``proxy.ledger.codec.encode_request``). With no parent, an unknown one, or nothing
  shared, ``inherited`` is ``None`` and ``data`` the whole request. The inherited messages
  are compared, never serialized: the cost is one comparison per message plus
  serializing what the turn adds.
- ``commit(session_id, turn_id, parent_turn_id, inherited, request, answer)`` adds a
  completed turn with what ``encode`` said; only completed turns can be parents. It is
  added in the event loop's next pass, after the answer is written (``proxy.deferred``);
  every method here applies such adds first.
- ``get(session_id, turn_id)`` gives a held turn's whole request and answer, or ``None``.
- ``load(session_id, turns, requests)`` replaces a session with recorded turns (the
  completed ones, in seq order) and their whole requests, as the ledger's ``load``;
  ``recorded_requests(session_id, turns)`` rebuilds those requests from the records
  (``RecorderError`` when a parent chain is broken, ``InvalidRequest`` on bad JSON).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from proxy.canonical import ChatRequest, Message
from proxy.deferred import Deferred
from proxy.ledger.codec import RequestDecoder, decode_message, encode_request
from proxy.lru import DEFAULT_MAX_SESSIONS, SessionLru
from recorder.conversations import StoredRequest, rebuild
from recorder.records import TurnRecord, TurnStatus

_CACHE_SIZE = 8  # whole message tuples kept per session


@dataclass(frozen=True, slots=True)
class EncodedRequest:
    inherited: int | None
    data: bytes


@dataclass(frozen=True, slots=True)
class _Node:
    parent_id: str | None
    inherited: int  # leading messages taken from the parent's conversation (0: none)
    own: tuple[Message, ...]  # the request's messages after those
    answer: Message
    context: ChatRequest  # the request without its messages


@dataclass(slots=True)
class _Session:
    nodes: dict[str, _Node] = field(default_factory=dict)
    cache: OrderedDict[str, tuple[Message, ...]] = field(default_factory=OrderedDict)


class ConversationBook:
    def __init__(self, max_sessions: int = DEFAULT_MAX_SESSIONS) -> None:
        self._sessions: SessionLru[_Session] = SessionLru(max_sessions)
        self._commits = Deferred("the conversations")  # each turn's add, after its answer

    def encode(
        self, session_id: str, parent_turn_id: str | None, request: ChatRequest
    ) -> EncodedRequest:
        self._commits.settle()
        session = self._sessions.get(session_id)
        parent = session.nodes.get(parent_turn_id or "") if session is not None else None
        if session is None or parent is None or parent_turn_id is None:
            return EncodedRequest(None, encode_request(request))
        shared = _shared(request.messages, self._messages(session, parent_turn_id), parent.answer)
        if not shared:
            return EncodedRequest(None, encode_request(request))
        return EncodedRequest(shared, encode_request(request, shared, parent.context))

    def commit(
        self,
        session_id: str,
        turn_id: str,
        parent_turn_id: str | None,
        inherited: int | None,
        request: ChatRequest,
        answer: Message,
    ) -> None:
        self._commits.settle()
        session = self._sessions.setdefault(session_id, _Session)
        self._commits.later(
            lambda: self._add(session, turn_id, parent_turn_id, inherited, request, answer)
        )

    def get(self, session_id: str, turn_id: str) -> tuple[ChatRequest, Message] | None:
        self._commits.settle()
        session = self._sessions.get(session_id)
        node = session.nodes.get(turn_id) if session is not None else None
        if session is None or node is None:
            return None
        return replace(node.context, messages=self._messages(session, turn_id)), node.answer

    def load(
        self, session_id: str, turns: Sequence[TurnRecord], requests: Mapping[str, ChatRequest]
    ) -> None:
        self._commits.settle()
        session = _Session()
        for record in sorted(turns, key=lambda r: r.seq):
            if record.status is TurnStatus.COMPLETED:
                answer = decode_message(record.response_message)
                request = requests[record.id]
                self._add(
                    session,
                    record.id,
                    record.parent_turn_id,
                    record.messages_inherited,
                    request,
                    answer,
                )
        self._sessions.put(session_id, session)

    def forget(self, session_id: str) -> None:
        self._commits.settle()
        self._sessions.pop(session_id)

    def _add(
        self,
        session: _Session,
        turn_id: str,
        parent_id: str | None,
        inherited: int | None,
        request: ChatRequest,
        answer: Message,
    ) -> None:
        context = replace(request, messages=())
        parent = session.nodes.get(parent_id or "")
        head: tuple[Message, ...] = ()
        if parent is not None and parent_id is not None and inherited:
            head = self._messages(session, parent_id)
            if inherited > len(head):
                head = (*head, parent.answer)
        if parent is None or not inherited or inherited > len(head):
            session.nodes[turn_id] = _Node(None, 0, request.messages, answer, context)
            return
        own = request.messages[inherited:]
        session.nodes[turn_id] = _Node(parent_id, inherited, own, answer, context)
        # Cached with the parent's message objects, so the cache holds no second copy.
        self._remember(session, turn_id, head[:inherited] + own)

    def _messages(self, session: _Session, turn_id: str) -> tuple[Message, ...]:
        """A held turn's request messages: from the cache, or rebuilt along its chain."""
        cached = session.cache.get(turn_id)
        if cached is not None:
            session.cache.move_to_end(turn_id)
            return cached
        path = [session.nodes[turn_id]]  # nearest first
        messages: tuple[Message, ...] = ()
        while path[-1].inherited:
            parent_id = path[-1].parent_id
            assert parent_id is not None  # a node inherits only from a held parent
            hit = session.cache.get(parent_id)
            if hit is not None:
                messages = hit
                break
            path.append(session.nodes[parent_id])
        for node in reversed(path):
            if node.inherited:
                assert node.parent_id is not None
                if node.inherited > len(messages):
                    messages = (*messages, session.nodes[node.parent_id].answer)
                messages = messages[: node.inherited] + node.own
            else:
                messages = node.own
        self._remember(session, turn_id, messages)
        return messages

    def _remember(self, session: _Session, turn_id: str, messages: tuple[Message, ...]) -> None:
        session.cache[turn_id] = messages
        session.cache.move_to_end(turn_id)
        while len(session.cache) > _CACHE_SIZE:
            session.cache.popitem(last=False)


def recorded_requests(session_id: str, turns: Sequence[TurnRecord]) -> dict[str, ChatRequest]:
    """The whole request of each completed turn among ``turns`` (a session's records)."""
    completed = [turn.id for turn in turns if turn.status is TurnStatus.COMPLETED]
    conversations = rebuild(session_id, map(StoredRequest.of, turns), completed)
    decoder = RequestDecoder()
    return {turn_id: decoder.decode(c) for turn_id, c in conversations.items()}


def _shared(
    messages: tuple[Message, ...], parent_messages: tuple[Message, ...], answer: Message
) -> int:
    """Leading ``messages`` equal to the parent's conversation (its messages, its answer)."""
    count = len(parent_messages)
    if len(messages) >= count and messages[:count] == parent_messages:
        return count + 1 if len(messages) > count and messages[count] == answer else count
    index = 0
    limit = min(len(messages), count)
    while index < limit and messages[index] == parent_messages[index]:
        index += 1
    return index
