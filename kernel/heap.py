"""What a server holds for long, kept out of the cyclic garbage collector's sight, and how
long the collector's full passes stop it.

Owns ``frozen_startup_heap()`` (the local engine's lifespan holds it while it serves) and
``long_lived_frozen()`` with ``reclaim_if_due()`` (the proxy's), whose counts the proxy's
``/metrics`` reports (``lego_gc_*``).

Why: a full pass of the collector walks every tracked object while every request in
flight waits. A server's modules, tokenizer and schemas live as long as it does, and the
proxy's ledger holds a few objects for every turn of the sessions it keeps
(``LEGO_MAX_SESSIONS_HELD``). Measured on the development machine (``bench.gc_pauses``,
1024 sessions of 20 turns): nothing frozen, 6 full passes of 224-339 ms; the start-up heap
frozen, 19 of up to 142 ms (the passes come as often as the heap that is still seen grows
by a quarter); survivors frozen too, 22 of at most 13 ms (88-95 ms in all).

- ``frozen_startup_heap()``: everything alive when the block starts (after one full pass,
  so start-up's garbage is freed rather than kept) is frozen until it ends.
- ``long_lived_frozen()``: the same, and after every full pass what survived it is frozen
  too (it is long-lived by then), so the next pass walks only what survived since. A
  frozen object that later becomes cyclic garbage (a closed connection's protocol and
  transport, say) is not freed by those passes; refcounting still frees everything
  acyclic, as the ledger's evicted sessions are. ``reclaim_if_due()`` bounds that: when the
  frozen set has grown by ``RECLAIM_GROWTH`` since the last reclaim (looked at once in
  ``RECLAIM_EVERY_S``), everything is given back for one full pass (as long as one
  unfrozen pass: 400 ms in the fill above) and frozen again. While the held data grows
  that comes at most every ten minutes; at a steady state only as frozen garbage piles
  up.

The callback only adds to plain numbers and moves the collector's lists (no lock: a
collection can start inside any allocation). The collector is the process's: two servers
in one process (tests) share it. The first to stop gives everything back
(``gc.unfreeze``), which costs the other only the saving, and each server's counts see
every full pass of the process.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

FULL = 2  # the oldest generation: a pass over everything tracked
RECLAIM_GROWTH = 1.5  # the frozen set's growth since the last reclaim that calls for one
# The least time between two looks at the frozen set's size, so between two reclaims:
# counting it walks every frozen object (20 ms per 250k on the development machine).
RECLAIM_EVERY_S = 600.0


@contextmanager
def frozen_startup_heap() -> Iterator[None]:
    """Freeze every object alive now (after a full collection, so that start-up's garbage
    is freed, not kept) until the block ends."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@dataclass(slots=True)
class FullCollections:
    """The full passes of the process's collector since ``long_lived_frozen`` began."""

    count: int = 0
    seconds: float = 0.0  # in all
    longest_s: float = 0.0
    reclaims: int = 0
    frozen_at_reclaim: int = 0  # objects frozen after the last reclaim (or the start)
    looked_at: float = 0.0  # time.monotonic() of the last look at the frozen set's size


@contextmanager
def long_lived_frozen() -> Iterator[FullCollections]:
    """The start-up heap frozen, then the survivors of every full pass, until the block
    ends; every full pass counted and timed."""
    with frozen_startup_heap():
        seen = FullCollections(frozen_at_reclaim=gc.get_freeze_count(), looked_at=time.monotonic())
        callback = _after_full_passes(seen)
        gc.callbacks.append(callback)
        try:
            yield seen
        finally:
            gc.callbacks.remove(callback)


def _after_full_passes(seen: FullCollections) -> Callable[[str, dict[str, Any]], None]:
    started = 0.0

    def callback(phase: str, info: dict[str, Any]) -> None:
        nonlocal started
        if info["generation"] != FULL:
            return
        if phase == "start":
            started = time.perf_counter()
            return
        took = time.perf_counter() - started
        seen.count += 1
        seen.seconds += took
        seen.longest_s = max(seen.longest_s, took)
        gc.freeze()  # what survived a full pass is long-lived: the next passes skip it

    return callback


def reclaim_if_due(
    seen: FullCollections, growth: float = RECLAIM_GROWTH, every_s: float = RECLAIM_EVERY_S
) -> bool:
    """When the frozen set has grown past ``growth`` times its size after the last reclaim,
    give it all back for one full pass (freeing the cyclic garbage frozen since) and freeze
    what is left; True then. Its size is looked at only ``every_s`` after the last look.
    Call it from the server's own code, never from a collection."""
    now = time.monotonic()
    if now - seen.looked_at < every_s:
        return False
    seen.looked_at = now
    if gc.get_freeze_count() <= growth * seen.frozen_at_reclaim:
        return False
    gc.unfreeze()
    gc.collect()  # counted and timed by the callback, which freezes the survivors
    gc.freeze()
    seen.reclaims += 1
    seen.frozen_at_reclaim = gc.get_freeze_count()
    return True
