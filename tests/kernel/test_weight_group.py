"""The weight-update group (kernel.weight_group): SGLang's layout, real gloo on loopback."""

from __future__ import annotations

import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import (
    GroupName,
    PrefixStore,
    _new_process_group_helper,
    _world,
)
from torch.distributed.rendezvous import rendezvous

from kernel.errors import InvalidRequest, WeightGroupFailed
from kernel.threaded import free_port
from kernel.weight_group import (
    GroupAddress,
    TensorSpec,
    WeightGroup,
    empty_bucket,
    flatten,
    spec_of,
    unflatten,
)

TIMEOUT_S = 20.0


def _address(world_size: int) -> GroupAddress:
    return GroupAddress("127.0.0.1", free_port(), world_size, f"wug-{uuid.uuid4().hex[:8]}")


def _sglang_worker(address: GroupAddress, rank: int, shape: tuple[int, ...]) -> torch.Tensor:
    """A worker's side as SGLang 0.5.23 builds it: ``init_custom_process_group``
    (``utils/common.py:2860-2925``) hands torch's own group helper the rendezvous store
    prefixed by the group name; the receive is ``torch.distributed.broadcast(src=0)``."""
    timeout = timedelta(seconds=TIMEOUT_S)
    url = f"tcp://{address.master_address}:{address.master_port}"
    store, rank, size = next(rendezvous(url, rank, address.world_size, timeout=timeout))
    store.set_timeout(timeout)
    pg, _ = _new_process_group_helper(
        size,
        rank,
        [],
        "gloo",
        PrefixStore(address.group_name, store),
        group_name=GroupName(address.group_name),
        timeout=timeout,
    )
    _world.pg_group_ranks[pg] = {i: i for i in range(size)}
    try:
        received = torch.empty(shape)
        work = dist.broadcast(received, src=0, group=pg, async_op=True)
        assert work is not None
        work.wait()
        return received
    finally:
        dist.destroy_process_group(pg)


def test_a_trainer_and_an_engine_meet_a_real_sglang_worker_in_one_group() -> None:
    address = _address(3)
    sent = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    with ThreadPoolExecutor(2) as pool:
        sglang = pool.submit(_sglang_worker, address, 1, (3, 4))
        ours = pool.submit(WeightGroup.join, address, 2, TIMEOUT_S)
        trainer = WeightGroup.join(address, 0, TIMEOUT_S)
        engine = ours.result()
        into = torch.zeros(3, 4)
        receiving = pool.submit(engine.broadcast, [into])
        trainer.broadcast([sent])
        receiving.result()
        assert torch.equal(sglang.result(), sent)
    assert torch.equal(into, sent)
    engine.close()
    trainer.close()


def test_a_peer_that_leaves_fails_a_waiting_broadcast_at_once() -> None:
    address = _address(2)
    with ThreadPoolExecutor(1) as pool:
        joining = pool.submit(WeightGroup.join, address, 1, TIMEOUT_S)
        trainer = WeightGroup.join(address, 0, TIMEOUT_S)
        worker = joining.result()
        sending = pool.submit(trainer.broadcast, [torch.ones(4)])
        time.sleep(0.2)
        began = time.monotonic()
        worker.close()  # it never received: a refused update
        with pytest.raises(WeightGroupFailed):
            sending.result()
    assert time.monotonic() - began < TIMEOUT_S / 2
    trainer.close()
    with pytest.raises(WeightGroupFailed, match="closed"):
        trainer.broadcast([torch.ones(1)])


def test_a_trainer_that_gives_up_releases_the_peers_already_waiting() -> None:
    address = _address(3)  # rank 2 never comes
    began = time.monotonic()
    with ThreadPoolExecutor(2) as pool:
        waiting = pool.submit(WeightGroup.join, address, 1, TIMEOUT_S * 3)
        trainer = pool.submit(WeightGroup.join, address, 0, 2.0)
        # The trainer's error is still held (as a caller holds it while it waits on the
        # workers' answers), yet rank 1 is let go: the error keeps no store alive.
        with pytest.raises(WeightGroupFailed):
            waiting.result()
        assert isinstance(trainer.exception(), WeightGroupFailed)
    assert time.monotonic() - began < TIMEOUT_S / 2  # not rank 1's own timeout


def test_nobody_at_the_address_is_a_group_failure() -> None:
    address = _address(2)
    with pytest.raises(WeightGroupFailed):
        WeightGroup.join(address, 1, 1.0)
    with pytest.raises(InvalidRequest, match="unknown backend"):
        WeightGroup.join(GroupAddress("127.0.0.1", 1, 2, backend="mpi"), 0, 1.0)


def test_a_bucket_holds_mixed_dtypes_and_comes_back_whole() -> None:
    tensors = {
        "a": torch.randn(4, 4),
        "c": torch.arange(6, dtype=torch.int64).reshape(2, 3),
        "b": torch.randn(7).to(torch.bfloat16),
    }
    specs = [spec_of(name, t) for name, t in tensors.items()]
    assert specs[2] == TensorSpec("b", "bfloat16", (7,))
    flat = flatten(list(tensors.values()))
    assert flat.dtype == torch.uint8
    assert flat.numel() == sum(s.nbytes for s in specs) == 4 * 4 * 4 + 6 * 8 + 7 * 2
    bucket = empty_bucket(specs)
    bucket.copy_(flat)
    for (name, got), want in zip(unflatten(bucket, specs), tensors.values(), strict=True):
        assert torch.equal(got, want), name


def test_a_bucket_refuses_what_sglang_refuses() -> None:
    with pytest.raises(InvalidRequest, match="Unaligned received tensor b"):
        empty_bucket([TensorSpec("a", "bfloat16", (3,)), TensorSpec("b", "float32", (2,))])
    with pytest.raises(InvalidRequest, match="Negative dimension"):
        empty_bucket([TensorSpec("a", "float32", (-1, 2))])
    with pytest.raises(InvalidRequest, match="unknown dtype"):
        empty_bucket([TensorSpec("a", "float99", (2,))])
    with pytest.raises(InvalidRequest, match="empty"):
        empty_bucket([])
