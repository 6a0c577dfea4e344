"""Shard assignment: whole groups, every sample once, batch order kept, tokens balanced."""

from __future__ import annotations

import numpy as np
import pytest

from kernel.errors import InvalidRequest
from trainer_bridge.distributed import SOLO
from trainer_bridge.samples import Sample
from trainer_bridge.sharding import assign_groups, deal


def _sample(group: str, session: str, length: int) -> Sample:
    tokens = np.arange(length, dtype=np.int32)
    mask = np.ones(length, np.uint8)
    return Sample(tokens, mask, np.zeros(length, np.float32), None, 1.0, group, session, ("v",))


def _batch(seed: int, groups: int) -> list[Sample]:
    """Groups of 1-8 sessions of 5-300 tokens, their samples interleaved as claims mix them."""
    rng = np.random.default_rng(seed)
    samples = [
        _sample(f"g{g}", f"g{g}-s{i}", int(rng.integers(5, 300)))
        for g in range(groups)
        for i in range(int(rng.integers(1, 9)))
    ]
    return [samples[i] for i in rng.permutation(len(samples))]


def _tokens(samples: list[Sample], ids: tuple[int, ...]) -> int:
    return sum(len(samples[i]) for i in ids)


@pytest.mark.parametrize("ranks", [2, 3, 8])
@pytest.mark.parametrize("seed", range(5))
def test_groups_stay_whole_and_tokens_balance(seed: int, ranks: int) -> None:
    samples = _batch(seed, groups=16)
    shards = assign_groups(samples, ranks)
    assert len(shards) == ranks
    assert sorted(i for shard in shards for i in shard) == list(range(len(samples)))
    owners: dict[str, set[int]] = {}
    for rank, shard in enumerate(shards):
        assert list(shard) == sorted(shard)  # the batch's order
        for i in shard:
            owners.setdefault(samples[i].group_id, set()).add(rank)
    assert all(len(ranks_of_group) == 1 for ranks_of_group in owners.values())
    loads = [_tokens(samples, shard) for shard in shards]
    biggest_group = max(sum(len(s) for s in samples if s.group_id == group) for group in owners)
    assert max(loads) - min(loads) <= biggest_group


def test_the_assignment_is_the_documented_greedy_rule() -> None:
    # Group tokens a 50, b 40, c 30, d 20, e 10, taken in that order, each to the lighter
    # rank: a -> r0 (tie: lower rank), b -> r1, c -> r1 (40 < 50), d -> r0 (50 < 70),
    # e -> r0 (70 = 70: lower rank).
    samples = [
        _sample("e", "e1", 10),
        _sample("a", "a1", 30),
        _sample("b", "b1", 40),
        _sample("c", "c1", 30),
        _sample("a", "a2", 20),
        _sample("d", "d1", 20),
    ]
    assert assign_groups(samples, 2) == [(0, 1, 4, 5), (2, 3)]


def test_equal_groups_break_ties_by_first_seen_and_lowest_rank() -> None:
    samples = [_sample(g, g, 10) for g in "xyzw"]
    assert assign_groups(samples, 3) == [(0, 3), (1,), (2,)]
    assert assign_groups(samples, 3) == assign_groups(list(samples), 3)  # deterministic


def test_one_rank_keeps_the_batch_as_it_came() -> None:
    samples = _batch(0, groups=5)
    assert assign_groups(samples, 1) == [tuple(range(len(samples)))]
    shard = deal(SOLO, samples)
    assert shard is not None
    assert all(a is b for a, b in zip(shard, samples, strict=True))
    assert deal(SOLO, None) is None  # the stop signal


def test_more_ranks_than_groups_leaves_ranks_empty() -> None:
    samples = [_sample("a", "a1", 10), _sample("a", "a2", 10), _sample("b", "b1", 5)]
    assert assign_groups(samples, 4) == [(0, 1), (2,), (), ()]
    with pytest.raises(InvalidRequest):
        assign_groups(samples, 0)
