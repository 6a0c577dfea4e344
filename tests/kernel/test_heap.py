"""kernel.heap: what is alive when a server starts is frozen until it stops, start-up's
cyclic garbage is freed first, survivors of full passes are frozen after them, and a
reclaim frees the cyclic garbage frozen since."""

from __future__ import annotations

import gc
import weakref

from kernel.heap import frozen_startup_heap, long_lived_frozen, reclaim_if_due


class _Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the collector frees it


def _in_a_generation(obj: object) -> bool:
    """Whether the collector's passes still walk ``obj`` (it is not frozen)."""
    return any(found is obj for found in gc.get_objects())


def test_live_objects_are_frozen_and_garbage_is_freed_first() -> None:
    gc.unfreeze()  # whatever another test's server left frozen
    garbage = _Node()
    freed = weakref.ref(garbage)
    del garbage
    kept = [_Node() for _ in range(100)]
    with frozen_startup_heap():
        assert freed() is None  # collected before the freeze, not frozen with it
        assert gc.get_freeze_count() >= len(kept)
        assert not _in_a_generation(kept[0])
    assert gc.get_freeze_count() == 0
    assert _in_a_generation(kept[0])


def test_survivors_of_a_full_pass_are_frozen_and_the_pass_counted() -> None:
    with long_lived_frozen() as seen:
        later = _Node()
        gc.collect(0)  # a young generation only: not a full pass, nothing frozen
        assert seen.count == 0
        assert _in_a_generation(later)
        gc.collect()
        assert seen.count == 1
        assert 0 < seen.longest_s <= seen.seconds
        assert not _in_a_generation(later)  # it outlived a full pass: frozen
    gc.collect()
    assert seen.count == 1  # no longer watched
    assert gc.get_freeze_count() == 0


def test_a_reclaim_frees_the_cyclic_garbage_frozen_since_and_only_when_due() -> None:
    with long_lived_frozen() as seen:
        assert not reclaim_if_due(seen, every_s=0)  # nothing grew
        nodes = [_Node() for _ in range(1000)]
        gc.collect()  # they outlive it: frozen
        freed = weakref.ref(nodes[0])
        del nodes
        gc.collect()
        assert freed() is not None  # frozen cyclic garbage: no pass frees it
        assert not reclaim_if_due(seen, growth=1.0)  # grown, but too soon after the start
        assert reclaim_if_due(seen, growth=1.0, every_s=0)
        assert freed() is None
        assert seen.reclaims == 1
        assert seen.frozen_at_reclaim >= gc.get_freeze_count() > 0
        assert not reclaim_if_due(seen, growth=1.0, every_s=0)  # no growth since
