"""The process group a weight update travels on, laid out as SGLang 0.5.23 lays out its own.

Owns ``GroupAddress`` (where and how a group meets), ``WeightGroup`` (one rank's membership:
``join``, ``broadcast`` from rank 0, ``close``), the tensor metadata SGLang's
``/update_weights_from_distributed`` carries (``TensorSpec``, ``spec_of``, ``torch_dtype``)
and its ``flattened_bucket`` layout (``flatten``, ``empty_bucket``, ``unflatten``). Both
ends use it: the trainer as rank 0, the local engine as a worker.

Why not ``torch.distributed.init_process_group``: that is the one default group of a
process, and a trainer may hold it already (data parallel), while one test process hosts a
trainer and several engines. A ``WeightGroup`` is built from the primitives instead, in the
key layout SGLang's ``init_custom_process_group`` (``srt/utils/common.py:2860-2925``) gets
from torch's group helper: the ``tcp://master_address:master_port`` rendezvous store (rank 0
hosts it), prefixed by the group name, then by ``"{group_name}/"``, then by the device
(``cpu/`` for gloo, ``cuda/`` for nccl). So this project's trainer meets a real SGLang
worker in it, and a real trainer meets the local engine (``tests/kernel/test_weight_group.py``
joins a group that torch's own helper built the way SGLang calls it).

``broadcast`` posts one asynchronous broadcast per tensor, then waits for all of them, as
SGLang's receiver does; rank 0's tensors are sent, every other rank's are filled in. Every
failure (the store or a peer unreachable, a peer gone mid-broadcast, the timeout) raises
``WeightGroupFailed`` with torch's message. ``close`` drops the group: its connections
close, so a peer still waiting in a broadcast fails at once instead of at its timeout.

``flattened_bucket`` (SGLang's ``weight_sync/tensor_bucket.py``): the tensors' bytes
concatenated in order into one ``uint8`` tensor, so a batch is one broadcast; each tensor's
byte offset must be a multiple of its item size.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import PrefixStore
from torch.distributed.rendezvous import rendezvous

from kernel.errors import InvalidRequest, WeightGroupFailed

DEFAULT_GROUP_NAME = "weight_update_group"  # SGLang's default
_DEVICE_OF_BACKEND = {"gloo": "cpu", "nccl": "cuda"}


@dataclass(frozen=True, slots=True)
class GroupAddress:
    master_address: str
    master_port: int
    world_size: int
    group_name: str = DEFAULT_GROUP_NAME
    backend: str = "gloo"


@dataclass(frozen=True, slots=True)
class TensorSpec:
    name: str
    dtype: str  # torch's name without the "torch." prefix: "float32", "bfloat16"
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * torch_dtype(self.dtype).itemsize


def torch_dtype(name: str) -> torch.dtype:
    """The dtype SGLang's receiver builds from the name (``getattr(torch, name)``)."""
    found = getattr(torch, name, None)
    if not isinstance(found, torch.dtype):
        raise InvalidRequest(f"unknown dtype {name!r}")
    return found


def spec_of(name: str, tensor: torch.Tensor) -> TensorSpec:
    return TensorSpec(name, str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape))


def flatten(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """One ``uint8`` tensor holding every tensor's bytes, in order (on the first's device)."""
    if not tensors:
        raise InvalidRequest("cannot flatten an empty batch")
    return torch.cat([t.detach().contiguous().reshape(-1).view(torch.uint8) for t in tensors])


def empty_bucket(specs: Sequence[TensorSpec], device: str = "cpu") -> torch.Tensor:
    """The receive buffer for ``specs``, checked as SGLang checks it."""
    offset = 0
    for spec in specs:
        dtype = torch_dtype(spec.dtype)
        if any(dim < 0 for dim in spec.shape):
            raise InvalidRequest(f"Negative dimension in received tensor {spec.name}: {spec.shape}")
        if offset % dtype.itemsize:
            raise InvalidRequest(
                f"Unaligned received tensor {spec.name}: byte offset {offset}, dtype {dtype}"
            )
        offset += spec.nbytes
    if not specs:
        raise InvalidRequest("Cannot create empty tensor bucket")
    return torch.empty(offset, dtype=torch.uint8, device=device)


def unflatten(bucket: torch.Tensor, specs: Sequence[TensorSpec]) -> list[tuple[str, torch.Tensor]]:
    """Views of ``bucket`` as the named tensors ``specs`` describe."""
    out: list[tuple[str, torch.Tensor]] = []
    offset = 0
    for spec in specs:
        end = offset + spec.nbytes
        tensor = bucket[offset:end].view(torch_dtype(spec.dtype)).reshape(spec.shape)
        out.append((spec.name, tensor))
        offset = end
    return out


class WeightGroup:
    """One rank's membership of a weight-update group (see the module docstring)."""

    def __init__(self, address: GroupAddress, rank: int, backend: Any, store: Any) -> None:
        self.address = address
        self.rank = rank
        self._backend: Any = backend
        self._store: Any = store  # rank 0 hosts it: it lives as long as the group

    @classmethod
    def join(cls, address: GroupAddress, rank: int, timeout_s: float) -> WeightGroup:
        """Join as ``rank``; blocks until every rank of the group has joined."""
        device = _DEVICE_OF_BACKEND.get(address.backend)
        if device is None:
            raise InvalidRequest(
                f"unknown backend {address.backend!r}; expected one of {sorted(_DEVICE_OF_BACKEND)}"
            )
        if not address.group_name:
            raise InvalidRequest("Group name cannot be empty")
        try:
            backend, store = _connect(address, device, rank, timedelta(seconds=timeout_s))
        except (RuntimeError, ValueError) as exc:  # torch's DistError and store errors
            failure = str(exc).splitlines()[0]  # torch appends its C++ stack
        else:
            return cls(address, rank, backend, store)
        # Raised out here, the error holds no frame that holds the store: rank 0's store
        # closes now, so the peers still waiting in it fail at once, not at their timeout.
        raise WeightGroupFailed(failure)

    def broadcast(self, tensors: Sequence[torch.Tensor]) -> None:
        """Rank 0 sends ``tensors``; every other rank receives into its own."""
        if self._backend is None:
            raise WeightGroupFailed(f"group {self.address.group_name} is closed")
        options = dist.BroadcastOptions()
        options.rootRank = 0
        try:
            works = [self._backend.broadcast([tensor], options) for tensor in tensors]
            for work in works:
                work.wait()
        except RuntimeError as exc:
            raise WeightGroupFailed(str(exc).splitlines()[0]) from exc

    def close(self) -> None:
        """Leave the group; its connections close once nothing else holds it."""
        backend, self._backend = self._backend, None
        if backend is not None:
            backend.shutdown()
        self._store = None


def _connect(address: GroupAddress, device: str, rank: int, timeout: timedelta) -> tuple[Any, Any]:
    url = f"tcp://{address.master_address}:{address.master_port}"
    store, rank, size = next(rendezvous(url, rank, address.world_size, timeout=timeout))
    store.set_timeout(timeout)
    name = address.group_name
    scoped = PrefixStore(f"{device}/", PrefixStore(f"{name}/", PrefixStore(name, store)))
    return _backend(address.backend, scoped, rank, size, timeout), store


def _backend(name: str, store: Any, rank: int, size: int, timeout: timedelta) -> Any:
    if name == "gloo":
        return dist.ProcessGroupGloo(store, rank, size, timeout)
    # Absent from CPU builds of torch; nccl ranks need a CUDA device each.
    nccl: Any = getattr(dist, "ProcessGroupNCCL", None)
    if nccl is None:
        raise InvalidRequest("this torch has no NCCL: use backend 'gloo'")
    options = nccl.Options()
    options._timeout = timeout
    return nccl(store, rank, size, options)
