"""The pause gate: holds new turns of a paused run while the trainer syncs weights.

Contract: ``pause(run)``/``resume(run)`` are idempotent and take effect at once for this
proxy process; ``sync(paused)`` makes the gate match the set of paused runs recorded in the
database, which the app polls, so a pause sent to any replica reaches every replica within
a poll interval. ``await wait(run)`` returns at once for a running run; for a paused one it waits
until ``resume`` or ``max_wait_s``, then raises ``Overloaded`` with ``retry_after_s`` so the
harness backs off and retries. Turns already running are never held: only ``prepare``
calls ``wait``.
"""

from __future__ import annotations

import asyncio
import contextlib

from kernel.errors import Overloaded
from proxy.metrics import Metrics


class RunGate:
    def __init__(
        self,
        metrics: Metrics | None = None,
        *,
        max_wait_s: float = 30.0,
        retry_after_s: float = 5.0,
    ) -> None:
        self._metrics = metrics
        self._max_wait_s = max_wait_s
        self._retry_after_s = retry_after_s
        self._resumed: dict[str, asyncio.Event] = {}  # paused runs -> set on resume

    def pause(self, run_id: str) -> None:
        self._resumed.setdefault(run_id, asyncio.Event())

    def resume(self, run_id: str) -> None:
        event = self._resumed.pop(run_id, None)
        if event is not None:
            event.set()

    def sync(self, paused: frozenset[str]) -> None:
        for run_id in paused - self._resumed.keys():
            self.pause(run_id)
        for run_id in set(self._resumed) - paused:
            self.resume(run_id)

    async def wait(self, run_id: str) -> None:
        event = self._resumed.get(run_id)
        if event is None:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._max_wait_s):
                await event.wait()
        if not event.is_set():
            self._count("rejected")
            raise Overloaded(
                f"run {run_id} is paused for a weight update; retry in {self._retry_after_s:g} s",
                retry_after_s=self._retry_after_s,
            )
        self._count("resumed")

    def _count(self, outcome: str) -> None:
        if self._metrics is not None:
            self._metrics.paused_waits.labels(outcome=outcome).inc()
