"""frozen_startup_heap: what is alive when the block starts is frozen until it ends, and
start-up's cyclic garbage is freed first rather than kept forever."""

from __future__ import annotations

import gc
import weakref

from kernel.heap import frozen_startup_heap


class _Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the collector frees it


def test_live_objects_are_frozen_and_garbage_is_freed_first() -> None:
    gc.unfreeze()  # whatever another test's server left frozen
    garbage = _Node()
    freed = weakref.ref(garbage)
    del garbage
    kept = [_Node() for _ in range(100)]
    with frozen_startup_heap():
        assert freed() is None  # collected before the freeze, not frozen with it
        assert gc.get_freeze_count() >= len(kept)
        assert not any(obj is kept[0] for obj in gc.get_objects(generation=2))  # not scanned
    assert gc.get_freeze_count() == 0
