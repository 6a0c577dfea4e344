"""Per-session state held in memory, bounded: the least recently used session goes first.

Owns ``SessionLru``, the container the ledger (``proxy.ledger.LedgerBook``) and the
conversation book (``proxy.conversations.ConversationBook``) keep their sessions in. Both
can rebuild a session from the database (``Pipeline._replan_if_stale``), so dropping one
loses nothing: its next request reloads it. Without a bound, a long run would hold every
session it ever served until the process runs out of memory.

Contract: ``get`` and ``setdefault`` count as a use; ``setdefault`` and ``put`` may drop
the least recently used other session to stay within ``limit`` (at least 1); ``pop``
forgets one (a finished session). ``was_dropped`` says whether a session not held now was
dropped to make room (the last ``limit`` such ids are remembered), so that its next
request, even one that looks like a first turn, is checked against the database.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

V = TypeVar("V")

# About 1 MB each for a 30k-token session (int32 tokens, a few materialised prompts, the
# messages of recent requests): a few GB per replica at the limit.
DEFAULT_MAX_SESSIONS = 4096


class SessionLru(Generic[V]):
    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("a session limit must be at least 1")
        self._limit = limit
        self._items: OrderedDict[str, V] = OrderedDict()
        self._dropped: OrderedDict[str, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._items

    def get(self, session_id: str) -> V | None:
        item = self._items.get(session_id)
        if item is not None:
            self._items.move_to_end(session_id)
        return item

    def setdefault(self, session_id: str, factory: Callable[[], V]) -> V:
        item = self.get(session_id)
        if item is None:
            item = factory()
            self.put(session_id, item)
        return item

    def was_dropped(self, session_id: str) -> bool:
        return session_id in self._dropped

    def put(self, session_id: str, item: V) -> None:
        self._items[session_id] = item
        self._items.move_to_end(session_id)
        self._dropped.pop(session_id, None)
        while len(self._items) > self._limit:
            dropped, _ = self._items.popitem(last=False)
            self._dropped[dropped] = None
            if len(self._dropped) > self._limit:
                self._dropped.popitem(last=False)

    def pop(self, session_id: str) -> None:
        self._items.pop(session_id, None)
