"""What start-up built, kept out of the cyclic garbage collector's sight while a server runs.

Owns ``frozen_startup_heap()``, which the proxy's and the local engine's lifespans hold
while they serve. A server's modules, tokenizer and schemas live as long as it does, yet
every full collection walked all of them: 150-260 ms on the development machine (the
proxy, a forced collection every 3 s under load), with every request in flight waiting on
it; 0.7-5 ms with them frozen. Collections of what requests make since are unchanged.

The collector is the process's: two servers in one process (tests) share it. The first to
stop gives everything back (``gc.unfreeze``), which costs the other only the saving.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


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
