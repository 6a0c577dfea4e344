"""Data parallelism's process group: which rank this process is, and the collectives a step uses.

Owns ``World`` (this process's rank among ``size``, and the device its collectives use),
``SOLO`` (the world of one process) and ``joined(device, timeout_s)``, which joins the group
``torchrun`` describes in the environment (``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``,
``MASTER_ADDR``/``MASTER_PORT``) and leaves it on exit.

Contract:

- A world of one (no ``torchrun``, or ``--nproc_per_node 1``) creates no process group and
  every collective is the identity on its input: a single process runs the trainer it ran
  before data parallelism, with no ``torch.distributed`` call.
- Backend: gloo when the policy lives on the CPU, nccl on CUDA, where each rank takes the GPU
  ``cuda:LOCAL_RANK`` (the ``device`` given is overridden: every rank names the same one).
  The tensors of the collectives live on ``World.device``.
- ``timeout_s`` bounds every collective. The ranks other than 0 wait inside ``scatter``
  while rank 0 waits for complete groups and publishes weights, so it must be longer than
  that wait (``TrainConfig.dist_timeout_s``).
- ``sum_gradients`` leaves each gradient the SUM over ranks (not the mean): the loss is
  normalised by the step's global sequence count, so the sum is the single-process gradient.
  A parameter no rank has a gradient for stays ``None`` (AdamW then skips it, as it would in
  one process); one that only some ranks have a gradient for gets zeros on the others first.
  Gradients travel in float32 buckets of ``BUCKET_ELEMENTS``, whatever the parameters' dtype.

Why explicit collectives and not ``DistributedDataParallel``: the step accumulates gradients
over a different number of micro-batches on each rank (shards are balanced by tokens, not by
micro-batches), DDP would average where the loss already normalises globally, and it would
materialise zero gradients for parameters no rank touched, which changes what AdamW does.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import TypeVar, cast

import torch
import torch.distributed as dist

from kernel.errors import Unsupported

T = TypeVar("T")

BUCKET_ELEMENTS = 1 << 24  # 64 MiB of float32 per gradient all-reduce


@dataclass(frozen=True, slots=True)
class World:
    rank: int = 0
    size: int = 1
    device: str = "cpu"  # where this rank's policy and collective tensors live

    @property
    def is_leader(self) -> bool:
        """Rank 0: the one that claims, publishes, posts and acks."""
        return self.rank == 0

    def scatter(self, payloads: Sequence[T] | None) -> T:
        """Rank 0 gives one payload per rank (the others' argument is not read); each rank
        returns its own. Payloads are pickled."""
        if self.size == 1:
            assert payloads is not None
            return payloads[0]
        received: list[T | None] = [None]
        sent = list(payloads) if self.is_leader and payloads is not None else None
        dist.scatter_object_list(received, sent, src=0)
        return cast(T, received[0])  # what rank 0 sent for this rank

    def all_gather(self, value: T) -> list[T]:
        """Every rank's ``value``, in rank order, on every rank (pickled)."""
        if self.size == 1:
            return [value]
        gathered: list[T | None] = [None] * self.size
        dist.all_gather_object(gathered, value)
        return cast(list[T], gathered)

    def sum(self, values: Sequence[float]) -> list[float]:
        """Element-wise sum over ranks, in float64 (exact for counts below 2**53)."""
        if self.size == 1:
            return [float(v) for v in values]
        summed = torch.tensor(list(values), dtype=torch.float64, device=self.device)
        dist.all_reduce(summed)
        return [float(v) for v in summed.tolist()]

    def sum_gradients(self, parameters: Iterable[torch.nn.Parameter]) -> None:
        """Replace each gradient by its sum over ranks (see the module doc)."""
        if self.size == 1:
            return
        trainable = [p for p in parameters if p.requires_grad]
        held = torch.tensor(
            [p.grad is not None for p in trainable], dtype=torch.int32, device=self.device
        )
        dist.all_reduce(held)
        grads: list[torch.Tensor] = []
        for param, holders in zip(trainable, held.tolist(), strict=True):
            if holders == 0:
                continue  # no rank touched it: it stays None everywhere
            if param.grad is None:
                param.grad = torch.zeros_like(param)
            grads.append(param.grad)
        for bucket in gradient_buckets(grads, BUCKET_ELEMENTS):
            flat = torch.cat([g.reshape(-1).to(torch.float32) for g in bucket])
            dist.all_reduce(flat)
            at = 0
            for grad in bucket:
                grad.copy_(flat[at : at + grad.numel()].view(grad.shape))
                at += grad.numel()

    def broadcast_parameters(self, module: torch.nn.Module) -> None:
        """Make every rank's ``module`` rank 0's, parameters and buffers."""
        if self.size == 1:
            return
        with torch.no_grad():
            for tensor in itertools.chain(module.parameters(), module.buffers()):
                dist.broadcast(tensor.data, src=0)

    def barrier(self) -> None:
        if self.size > 1:
            dist.barrier()


SOLO = World()


def gradient_buckets(grads: Sequence[torch.Tensor], limit: int) -> Iterator[list[torch.Tensor]]:
    """Consecutive runs of ``grads`` of at most ``limit`` elements (a bigger one alone)."""
    bucket: list[torch.Tensor] = []
    used = 0
    for grad in grads:
        if bucket and used + grad.numel() > limit:
            yield bucket
            bucket, used = [], 0
        bucket.append(grad)
        used += grad.numel()
    if bucket:
        yield bucket


@contextmanager
def joined(device: str, timeout_s: float) -> Iterator[World]:
    """This process's ``World`` from the ``torchrun`` environment; the group is left on exit.

    torch reads the rendezvous (``MASTER_ADDR``, ``MASTER_PORT``, or the store of torchrun's
    agent) from the environment itself (``env://``), as torchrun means it to.
    """
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size == 1:
        yield World(0, 1, device)
        return
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    kind = torch.device(device).type
    if kind == "cuda":
        device = f"cuda:{local_rank}"
        torch.cuda.set_device(device)
    elif kind != "cpu":
        raise Unsupported(f"data parallelism runs on cpu (gloo) or cuda (nccl), not {kind}")
    dist.init_process_group(
        "nccl" if kind == "cuda" else "gloo",
        rank=rank,
        world_size=size,
        timeout=timedelta(seconds=timeout_s),
    )
    try:
        yield World(rank, size, device)
    finally:
        dist.destroy_process_group()
