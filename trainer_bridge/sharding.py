"""A step's batch split over data-parallel ranks: whole prompt groups, balanced by tokens.

Owns ``assign_groups(samples, ranks)`` (which sample indices each rank trains on) and
``deal(world, samples)`` (rank 0 hands each rank its shard; every rank gets its own).

Why rank 0 claims and deals, rather than every rank claiming for itself: the export API
stays the one contract (one claimer, one lease, one ack per batch, so exactly-once is the
proxy's as it is for one process), shards can be balanced over the whole step's batch (a
rank claiming alone gets whatever groups completed first), and the step needs no agreement
between ranks on when a step is full. The cost is one scatter of the samples per step, which
is small beside the forward and backward passes.

The assignment, deterministic and documented because the equality with one process rests
on it:

1. a prompt group is never split: GRPO normalises rewards within a group, so a rank that
   holds the whole group computes exactly the advantages one process would;
2. groups are taken in decreasing token count (a group's samples' tokens, the quantity the
   forward and backward passes scale with; ties: the group seen first in the batch first),
   and each goes to the rank with the fewest tokens so far (ties: the lowest rank). This is
   the longest-processing-time greedy rule: the most loaded rank exceeds the least loaded
   by at most one group's tokens;
3. each rank's shard keeps the batch's order, so one rank (``ranks == 1``) trains on the
   batch exactly as it came. A rank may get nothing when there are fewer groups than ranks;
   it still takes part in every collective of the step.
"""

from __future__ import annotations

from collections.abc import Sequence

from kernel.errors import InvalidRequest
from trainer_bridge.distributed import World
from trainer_bridge.samples import Sample


def assign_groups(samples: Sequence[Sample], ranks: int) -> list[tuple[int, ...]]:
    """One tuple of indices into ``samples`` per rank (see the module doc for the rule)."""
    if ranks < 1:
        raise InvalidRequest("ranks must be at least 1")
    members: dict[str, list[int]] = {}  # group -> sample indices, groups in first-seen order
    for index, sample in enumerate(samples):
        members.setdefault(sample.group_id, []).append(index)
    tokens = {group: sum(len(samples[i]) for i in ids) for group, ids in members.items()}
    order = {group: seen for seen, group in enumerate(members)}
    load = [0] * ranks
    owner: dict[str, int] = {}
    for group in sorted(members, key=lambda g: (-tokens[g], order[g])):
        rank = min(range(ranks), key=lambda r: (load[r], r))
        owner[group] = rank
        load[rank] += tokens[group]
    return [
        tuple(i for i, sample in enumerate(samples) if owner[sample.group_id] == rank)
        for rank in range(ranks)
    ]


def deal(world: World, samples: Sequence[Sample] | None) -> list[Sample] | None:
    """Rank 0 passes the step's whole batch, or None when the run is over; every rank returns
    its shard, or None to stop. The argument of the other ranks is not read."""
    shards: list[list[Sample] | None] | None = None
    if world.is_leader:
        if samples is None:
            shards = [None] * world.size
        else:
            assigned = assign_groups(samples, world.size)
            shards = [[samples[i] for i in ids] for ids in assigned]
    return world.scatter(shards)
