"""The trainer's side of a weight sync over a process group: rank 0, across syncs.

Owns ``GroupSettings`` and ``Broadcaster``. ``Broadcaster.send(workers, tensors, version)``
is the update step of a distributed sync (``trainer_bridge.weights`` pauses and flushes
before it and continues after it); it returns what went wrong on each worker that failed.

The group (SGLang 0.5.23's routes, ``kernel.weight_group``'s layout): the trainer is rank
0 and hosts the store at ``master_address:port``; each worker joins with ``rank_offset``
1 + the TP ranks of the workers before it (``/server_info``'s ``tp_size``), so the world
is 1 + every worker's TP ranks. It forms on first use: the trainer joins while every
worker's ``/init_weights_update_group`` runs, since each blocks until all ranks are in.
It lasts across syncs while the workers stay the same; when they change, or one fails,
it is destroyed everywhere (``/destroy_weights_update_group``) and formed again without
the failed ones, the next batch or sync onwards.

One sync: ``/begin_weight_update`` on every worker (0.5.23 refuses an update outside
such a session), then per batch (``bucket_bytes`` of one dtype, in the order given)
``/update_weights_from_distributed`` (names, dtypes, shapes, ``load_format:
"flattened_bucket"``, ``flush_cache``; ``weight_version`` on the last batch) on every
worker at once while the trainer broadcasts the batch as one ``uint8`` tensor, then
``/end_weight_update`` everywhere. A worker answers an update once it has received and
loaded the batch, so the call and the broadcast must run together.

Failures: a worker whose call fails is out of this sync, and its group is destroyed
first, so its connection closes and the broadcast it will never receive fails at once
rather than at the timeout (the others already have the batch: the broadcast sends to
every rank at once). A broadcast that fails on the trainer's side closes the group, so
no worker waits out its own 30-minute default. If the group cannot form, the workers
that refused before the trainer gave up are the failed ones (the rest failed only
because it did), and it forms again without them.
A worker that fails after an earlier batch holds a mix of weights under its old label:
the caller takes it out of service like any failed worker.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass

import torch

from kernel.errors import BackendError, InvalidRequest, LegoError
from kernel.threaded import free_port
from kernel.weight_group import DEFAULT_GROUP_NAME, GroupAddress, WeightGroup, flatten, spec_of
from trainer_bridge.client import JsonClient, on_each

log = logging.getLogger("trainer_bridge")

Named = Sequence[tuple[str, torch.Tensor]]


@dataclass(frozen=True, slots=True)
class GroupSettings:
    master_address: str = "127.0.0.1"  # the trainer, as the workers reach it
    master_port: int = 0  # 0: a free port each time the group forms
    backend: str = "gloo"  # "nccl" when the trainer and the workers are on GPUs
    group_name: str = DEFAULT_GROUP_NAME
    timeout_s: float = 600.0  # joining, and each batch's broadcast
    bucket_bytes: int = 512 << 20


@dataclass(frozen=True, slots=True)
class _Membership:
    group: WeightGroup
    workers: tuple[str, ...]


def buckets(tensors: Named, max_bytes: int) -> list[list[tuple[str, torch.Tensor]]]:
    """Consecutive runs of one dtype, each at most ``max_bytes`` (or one bigger tensor):
    one dtype per bucket keeps every tensor's byte offset aligned."""
    out: list[list[tuple[str, torch.Tensor]]] = []
    size = 0
    for name, tensor in tensors:
        nbytes = tensor.numel() * tensor.element_size()
        if not out or out[-1][-1][1].dtype != tensor.dtype or size + nbytes > max_bytes:
            out.append([])
            size = 0
        out[-1].append((name, tensor))
        size += nbytes
    return out


class Broadcaster:
    def __init__(self, client: JsonClient, settings: GroupSettings) -> None:
        # Checked before any worker is asked to join: a worker told to meet a trainer
        # that cannot host the group would wait out its own timeout (SGLang's: 30 min).
        if settings.backend not in ("gloo", "nccl"):
            raise InvalidRequest(f"unknown weight-sync backend {settings.backend!r}")
        if settings.backend == "nccl" and not torch.distributed.is_nccl_available():
            raise InvalidRequest("backend 'nccl' needs a CUDA build of torch; use 'gloo'")
        self._client = client  # posts to full worker URLs
        self.settings = settings
        self._device = "cpu" if settings.backend == "gloo" else "cuda"
        self._membership: _Membership | None = None
        self.bytes_sent = 0  # tensor bytes broadcast, over all syncs (the benchmark reads it)

    def send(self, workers: Sequence[str], tensors: Named, version: str) -> dict[str, str]:
        """Broadcast ``tensors`` (checkpoint names) to ``workers``; the failed ones, why."""
        if not tensors:
            raise InvalidRequest("no tensors to publish")
        failed: dict[str, str] = {}
        self._group_for(list(workers), failed)
        begun: list[str] = []
        live = [w for w in workers if w not in failed]
        for worker, error in on_each(live, lambda w: self._call(w, "/begin_weight_update", {})):
            if error is None:
                begun.append(worker)
            else:
                failed[worker] = f"begin: {error}"
        batches = buckets(tensors, self.settings.bucket_bytes)
        for index, batch in enumerate(batches):
            live = [w for w in begun if w not in failed]
            membership = self._group_for(live, failed)
            if membership is None:
                break
            last = index == len(batches) - 1
            for worker, why in self._send_batch(membership, batch, version if last else None):
                failed[worker] = f"update: {why}"
            if any(w in failed for w in membership.workers):
                self.close()
        ended = on_each(begun, lambda w: self._call(w, "/end_weight_update", {}))
        for worker, error in ended:
            if error is not None:
                failed.setdefault(worker, f"end: {error}")
        return failed

    def close(self) -> None:
        """Destroy the group on its workers (best effort) and leave it."""
        membership, self._membership = self._membership, None
        if membership is None:
            return
        membership.group.close()
        on_each(membership.workers, self._destroy_quietly)

    # -- the group ---------------------------------------------------------------------

    def _group_for(self, workers: list[str], failed: dict[str, str]) -> _Membership | None:
        """The group of exactly ``workers``, formed if need be; failures go to ``failed``."""
        while workers:
            if self._membership is not None and self._membership.workers == tuple(workers):
                return self._membership
            self.close()
            formed, failures = self._form(workers)
            failed.update({w: f"init: {why}" for w, why in failures.items()})
            if formed is not None:
                self._membership = formed
                return formed
            workers = [w for w in workers if w not in failures]
        return None

    def _form(self, workers: list[str]) -> tuple[_Membership | None, dict[str, str]]:
        sizes: dict[str, int] = {}
        failures: dict[str, str] = {}
        for worker, error in on_each(workers, lambda w: sizes.__setitem__(w, self._tp_size(w))):
            if error is not None:
                failures[worker] = error
        live = [w for w in workers if w not in failures]
        if not live:
            return None, failures
        offsets = {w: 1 + sum(sizes[v] for v in live[:i]) for i, w in enumerate(live)}
        world = 1 + sum(sizes[w] for w in live)
        settings = self.settings
        address = GroupAddress(
            settings.master_address,
            settings.master_port or free_port(),
            world,
            settings.group_name,
            settings.backend,
        )
        finished: dict[str, float] = {}

        def init(worker: str) -> None:
            body = {
                "master_address": address.master_address,
                "master_port": address.master_port,
                "rank_offset": offsets[worker],
                "world_size": world,
                "group_name": address.group_name,
                "backend": address.backend,
            }
            try:
                self._call(worker, "/init_weights_update_group", body)
            finally:
                finished[worker] = time.monotonic()

        def join() -> WeightGroup:
            try:
                return WeightGroup.join(address, 0, settings.timeout_s)
            finally:
                finished[""] = time.monotonic()

        with ThreadPoolExecutor(max_workers=1) as pool:
            joining = pool.submit(join)
            refused = {w: why for w, why in on_each(live, init) if why is not None}
            trainer_error = joining.exception()
        if trainer_error is None:
            group = joining.result()
            if not refused:
                return _Membership(group, tuple(live)), failures
            # Every rank joined, yet a call failed (say, it timed out): start again without it.
            group.close()
            for worker in live:
                if worker not in refused:
                    self._destroy_quietly(worker)
            return None, {**failures, **refused}
        # The trainer gave up waiting: whoever refused before that is why; the others'
        # calls failed only because the trainer's store went away then.
        culprits = {w: why for w, why in refused.items() if finished[w] < finished[""]}
        if not culprits:
            why = f"the group did not form: {_message(trainer_error)}"
            culprits = {w: refused.get(w, why) for w in live}
        return None, {**failures, **culprits}

    def _tp_size(self, worker: str) -> int:
        # SGLang joins rank_offset + tp_rank: data-parallel replicas are refused by its
        # route, and pipeline stages would take the same ranks.
        info = self._client.get(f"{worker}/server_info").json()
        for field in ("dp_size", "pp_size"):
            if int(info.get(field, 1)) != 1:
                raise BackendError(f"{field} {info[field]}: SGLang's weight group needs 1")
        return int(info.get("tp_size", 1))

    # -- one batch -----------------------------------------------------------------------

    def _send_batch(
        self, membership: _Membership, batch: Named, version: str | None
    ) -> list[tuple[str, str]]:
        specs = [spec_of(name, tensor) for name, tensor in batch]
        flat = flatten([tensor.detach().to(self._device) for _, tensor in batch])
        body = {
            "names": [s.name for s in specs],
            "dtypes": [s.dtype for s in specs],
            "shapes": [list(s.shape) for s in specs],
            "group_name": self.settings.group_name,
            "load_format": "flattened_bucket",
            "flush_cache": True,
            "weight_version": version,
        }
        group = membership.group
        workers = membership.workers
        errors: dict[str, str] = {}
        with ThreadPoolExecutor(max_workers=len(workers) + 1) as pool:
            sending = pool.submit(group.broadcast, [flat])
            posts = {
                pool.submit(self._call, w, "/update_weights_from_distributed", body): w
                for w in workers
            }
            waiting = set(posts)
            for done in as_completed([*posts, sending]):
                if done is sending:
                    if done.exception() is not None:
                        group.close()  # the workers still receiving fail now, not at timeout
                    continue
                waiting.discard(done)
                error = done.exception()
                if error is not None:
                    errors[posts[done]] = _message(error)
                    # It will never receive: its leaving ends the broadcast's wait on it.
                    self._destroy_quietly(posts[done])
                if not waiting:
                    break
            failure = sending.exception()
        if failure is not None and not errors:
            return [(w, f"broadcast: {_message(failure)}") for w in workers]
        if failure is None:
            self.bytes_sent += flat.numel() * (len(workers) - len(errors))
        return list(errors.items())

    # -- HTTP -----------------------------------------------------------------------------

    def _call(self, worker: str, path: str, body: object) -> None:
        """POST, and raise unless SGLang answered ``success``."""
        answer = self._client.post(f"{worker}{path}", body).json()
        if not answer.get("success", False):
            raise BackendError(f"{path} refused: {answer.get('message')}")

    def _destroy_quietly(self, worker: str) -> None:
        body = {"group_name": self.settings.group_name}
        try:
            self._call(worker, "/destroy_weights_update_group", body)
        except LegoError as exc:  # it left already, or it is gone: its end is closed either way
            log.info("destroying the weight group on %s: %s", worker, exc.message)


def _message(error: BaseException) -> str:
    return error.message if isinstance(error, LegoError) else repr(error)
