"""Weight updates as SGLang serialises them: the model-update lock and weight-version spans.

Owns ``ModelUpdateLock`` and ``weight_version_spans``.

``ModelUpdateLock`` is SGLang's reader/writer lock around the model (0.5.23
``TokenizerManager.model_update_lock``): every ``/generate`` holds a read side for its whole
life, and ``/update_weights_from_disk`` (unless the server is paused) takes the write side,
so an update waits until every running request has finished and no request starts while
it waits (writer preference: a new request queues behind a waiting update).

``weight_version_spans(events, current, n)`` is the ``meta_info.weight_versions`` list of a
finished request: ``[{"version", "start", "end"}]`` over its ``n`` output tokens, one span per
version that sampled some of them, where each event ``(old, k)`` says the first ``k`` tokens
came from ``old``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager


class ModelUpdateLock:
    def __init__(self) -> None:
        self._cond = asyncio.Condition()
        self._readers = 0
        self._writing = False
        self._writers_waiting = 0

    @property
    def readers(self) -> int:
        return self._readers

    @asynccontextmanager
    async def reading(self) -> AsyncIterator[None]:
        async with self._cond:
            await self._cond.wait_for(lambda: not self._writing and not self._writers_waiting)
            self._readers += 1
        try:
            yield
        finally:
            async with self._cond:
                self._readers -= 1
                self._cond.notify_all()

    @asynccontextmanager
    async def writing(self) -> AsyncIterator[None]:
        async with self._cond:
            self._writers_waiting += 1
            try:
                await self._cond.wait_for(lambda: not self._writing and self._readers == 0)
            finally:
                self._writers_waiting -= 1
            self._writing = True
        try:
            yield
        finally:
            async with self._cond:
                self._writing = False
                self._cond.notify_all()


def weight_version_spans(
    events: Sequence[tuple[str, int]], current: str, num_tokens: int
) -> list[dict[str, object]]:
    spans: list[tuple[str, int, int]] = []
    for version, upto in [*events, (current, num_tokens)]:
        end = min(upto, num_tokens)
        if spans and end <= spans[-1][2]:
            continue  # that version sampled nothing that survived
        if spans and spans[-1][0] == version:
            spans[-1] = (version, spans[-1][1], end)
            continue
        spans.append((version, spans[-1][2] if spans else 0, end))
    return [{"version": v, "start": start, "end": end} for v, start, end in spans]
