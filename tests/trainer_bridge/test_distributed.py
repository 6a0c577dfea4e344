"""``World``: identity collectives alone; under two gloo ranks, what each collective promises."""

from __future__ import annotations

import multiprocessing
import os

import pytest
import torch
import torch.distributed as dist

from kernel.errors import Unsupported
from kernel.threaded import free_port
from trainer_bridge.distributed import SOLO, World, gradient_buckets, joined


def test_without_torchrun_there_is_one_rank_and_no_process_group(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with joined("cpu", timeout_s=5) as world:
        assert world == World(0, 1, "cpu")
        assert not dist.is_initialized()
        assert world.scatter(["only"]) == "only"
        assert world.all_gather({"a": 1}) == [{"a": 1}]
        assert world.sum([1, 2.5]) == [1.0, 2.5]
        param = torch.nn.Parameter(torch.ones(2))
        param.grad = torch.full((2,), 3.0)
        world.sum_gradients([param])
        assert param.grad.tolist() == [3.0, 3.0]
    monkeypatch.setenv("WORLD_SIZE", "1")  # torchrun --nproc_per_node 1
    with joined("cuda", timeout_s=5) as world:
        assert world.device == "cuda"  # one process keeps the device it was given


def test_data_parallel_runs_on_cpu_or_cuda_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(Unsupported), joined("mps", timeout_s=5):
        pass


def test_buckets_are_consecutive_and_bounded() -> None:
    grads = [torch.zeros(n) for n in (3, 4, 10, 2, 2)]
    sizes = [[g.numel() for g in bucket] for bucket in gradient_buckets(grads, limit=8)]
    assert sizes == [[3, 4], [10], [2, 2]]


def _rank(rank: int, port: int) -> None:
    # What torchrun would set (this is a spawned child: its environment is its own).
    os.environ.update(
        WORLD_SIZE="2", RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    with joined("cpu", timeout_s=60) as world:
        assert (world.rank, world.size, world.is_leader) == (rank, 2, rank == 0)
        assert world.scatter(["for 0", "for 1"] if rank == 0 else None) == f"for {rank}"
        assert world.scatter([None, None] if rank == 0 else ["ignored"]) is None
        assert world.all_gather((rank, "x" * rank)) == [(0, ""), (1, "x")]
        assert world.sum([rank + 1, 0.25, 2**52 + rank]) == [3.0, 0.5, 2.0**53 + 1]

        everyone, only_rank_0, no_one = (torch.nn.Parameter(torch.zeros(3)) for _ in range(3))
        everyone.grad = torch.full((3,), float(rank + 1))
        if rank == 0:
            only_rank_0.grad = torch.full((3,), 5.0)
        half = torch.nn.Parameter(torch.zeros(2, dtype=torch.bfloat16))
        half.grad = torch.full((2,), 0.5, dtype=torch.bfloat16)
        world.sum_gradients([everyone, only_rank_0, no_one, half])
        params = {"everyone": everyone, "rank 0": only_rank_0, "no one": no_one, "bf16": half}
        summed = {
            name: None if param.grad is None else (param.grad.dtype, param.grad.tolist())
            for name, param in params.items()
        }
        assert summed == {
            "everyone": (torch.float32, [3.0] * 3),  # a sum, not a mean
            "rank 0": (torch.float32, [5.0] * 3),  # zeros stood in on rank 1
            "no one": None,  # AdamW skips it, as one process would
            "bf16": (torch.bfloat16, [1.0, 1.0]),  # reduced in float32, kept in its dtype
        }

        module = torch.nn.Linear(2, 2)
        with torch.no_grad():
            module.weight.fill_(float(rank + 7))
        world.broadcast_parameters(module)
        assert module.weight.tolist() == [[7.0, 7.0], [7.0, 7.0]]
        world.barrier()
    assert not dist.is_initialized()


def test_two_gloo_ranks_keep_each_collectives_promise() -> None:
    port = free_port()
    spawn = multiprocessing.get_context("spawn")  # a fresh interpreter per rank, as torchrun
    ranks = [spawn.Process(target=_rank, args=(rank, port)) for rank in range(2)]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join(timeout=120)
        if process.is_alive():  # its peer failed and it waits in a collective: end it
            process.kill()
            process.join()
    # A failed assertion in a rank prints its traceback (captured) and exits 1.
    assert [process.exitcode for process in ranks] == [0, 0]


def test_solo_is_the_default_world() -> None:
    assert (SOLO.rank, SOLO.size, SOLO.is_leader) == (0, 1, True)
