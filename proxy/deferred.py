"""Book-keeping a turn hands to the event loop's next pass, applied before anything reads it.

Owns ``Deferred``: a queue of commits (zero-argument callables) that an in-memory book
(the history ledger, the conversations) fills when a turn completes, so that their cost is
paid in the loop's next pass, after the turn's answer has been written, instead of on the
answer's path. At c=1 that pass falls in the harness's own turnaround.

Contract:
- ``later(commit)`` queues ``commit`` and has the running loop apply the queue in its next
  pass; without a running loop (a tool, a test driving a book directly) the queue is
  applied at once, ``commit`` last.
- ``settle()`` applies every queued commit, oldest first. A book calls it at the start of
  every method that reads or changes what the commits change, so no reader ever sees the
  book without a commit already made: commits keep their order, and each read sees what
  it would have seen had every commit run at once. A request that holds a turn's answer
  can only arrive in a pass after the one that wrote the answer, so it never even waits
  for that turn's commit.
- A commit that raises is logged (with its traceback) and dropped; it never raises into
  the unrelated caller that settled it. Commits are pure in-memory work, so this is a bug:
  the book then lacks that turn, and the next request that continues it is planned and
  recorded as what it then is (a fork), not as a wrong continuation.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable

log = logging.getLogger(__name__)


class Deferred:
    def __init__(self, owner: str) -> None:
        self._owner = owner  # named in the log when a commit fails
        self._queue: deque[Callable[[], None]] = deque()
        self._scheduled = False

    def __len__(self) -> int:
        return len(self._queue)

    def later(self, commit: Callable[[], None]) -> None:
        self._queue.append(commit)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.settle()
            return
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._on_loop)

    def settle(self) -> None:
        queue = self._queue
        while queue:
            commit = queue.popleft()
            try:
                commit()
            except Exception:
                log.exception("%s: a deferred commit failed and was dropped", self._owner)

    def _on_loop(self) -> None:
        self._scheduled = False
        self.settle()
