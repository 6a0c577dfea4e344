"""Weight sync to every SGLang worker, never to the router: discover, pause, flush, update,
continue.

Owns ``discover_workers(backend_url)``, ``WeightSync`` (with its ``SyncReport``) and
``weight_sync_for(config)`` (the one a ``TrainConfig`` asks for), in two modes that differ
only in the update step:

- ``publish(model_path, version)``: each worker loads a checkpoint the trainer wrote
  (``/update_weights_from_disk``); the disk round trip is the checkpoint's size, twice.
- ``publish_tensors(tensors, version)``: the trainer broadcasts the weights, named as a
  checkpoint names them, over a process group it shares with every worker
  (``/update_weights_from_distributed``; ``trainer_bridge.broadcast``: the group, the
  weight-update session, batches, failures). Nothing touches the disk.

Workers: ``backend_url`` is what the proxy's ``LEGO_BACKEND_URL`` is: a comma-separated list
of SGLang workers, or one URL. One URL that answers ``GET /workers`` with
``{"workers": [{"id", "url"}, ...]}`` is an smg router (it has no pause or weight routes,
so every call below goes to its workers); any other URL is a worker.

Either way, in SGLang's order (as slime does it), each step on every worker at once and
every worker through a step before the next begins:

1. ``POST /pause_generation {"mode": "abort"}``: running turns come back as aborts with a
   null status, which the proxy re-sends once generation continues (they then wait on
   the pause, not sample under a mix of weights);
2. ``POST /flush_cache``: cached KV (and its routing rows) was computed by the old
   weights; retried while the worker still reports running requests, up to
   ``flush_timeout_s``;
3. ``POST /update_weights_from_disk {"model_path", "weight_version", "flush_cache"}``, or
   the broadcast (``/begin_weight_update``, an ``/update_weights_from_distributed`` per
   batch while the trainer sends it, ``/end_weight_update``; the group is formed with
   ``/init_weights_update_group`` the first time);
4. ``POST /continue_generation``.

A worker that fails any step is reported (``SyncReport.failed``, logged) and taken out: it
is removed from the router when there is one, then continued, so the turns waiting on its
pause finish instead of hanging, on the weights it still has and labelled with the version
it reports (SGLang's ``meta_info.weight_version``), so the proxy records them as what they
are and the export's staleness bound keeps them out of optimisation. With a plain worker
list there is no router to take it out of: the trainer records it in the proxy's worker
exclusions (``trainer_bridge.train``), and every replica stops routing turns to it until a
later sync succeeds on it. ``publish`` raises ``BackendError`` when no worker took the new
weights (there is nothing left to train against).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import httpx
import torch

from kernel.errors import BackendError, BackendUnavailable, LegoError
from trainer_bridge.broadcast import Broadcaster, GroupSettings
from trainer_bridge.client import JsonClient, on_each
from trainer_bridge.config import TrainConfig

log = logging.getLogger("trainer_bridge")


@dataclass(frozen=True, slots=True)
class Worker:
    url: str
    router_id: str | None = None  # its id in the smg router, when there is one


@dataclass(frozen=True, slots=True)
class SyncReport:
    version: str
    updated: tuple[str, ...]  # workers now serving ``version``
    failed: tuple[tuple[str, str], ...]  # (worker URL, what went wrong)
    removed: tuple[str, ...]  # failed workers taken out of the router

    def rotation_changes(self) -> tuple[dict[str, str], list[str]]:
        """(workers to take out of the proxy's rotation with why, workers to put back).

        A failed worker of a plain list keeps serving the old policy, so it goes out of
        every replica's rotation (one behind smg was removed from the router already); a
        worker that took this version comes back if an earlier sync had taken it out."""
        out = {
            url: f"weight sync to {self.version} failed: {why}"
            for url, why in self.failed
            if url not in self.removed
        }
        return out, list(self.updated)


def weight_sync_for(config: TrainConfig) -> WeightSync:
    group = GroupSettings(
        master_address=config.weight_sync_address,
        master_port=config.weight_sync_port,
        backend=config.weight_sync_backend,
        bucket_bytes=config.weight_sync_bucket_mb << 20,
    )
    return WeightSync(config.backend_url, group=group)


def discover_workers(http: httpx.Client, backend_url: str) -> tuple[str | None, tuple[Worker, ...]]:
    """``(router URL or None, workers)`` behind ``backend_url`` (see the module docstring)."""
    urls = [u.strip().rstrip("/") for u in backend_url.split(",") if u.strip()]
    if len(urls) != 1:
        return None, tuple(Worker(u) for u in urls)
    (url,) = urls
    try:
        response = http.get(f"{url}/workers", timeout=10.0)
    except httpx.TransportError as exc:
        raise BackendUnavailable(f"GET {url}/workers: {exc}") from exc
    listed = response.json().get("workers") if _is_json_object(response) else None
    if response.status_code != 200 or not isinstance(listed, list):
        return None, (Worker(url),)
    workers = tuple(
        Worker(str(w["url"]).rstrip("/"), str(w.get("id")) if w.get("id") else None)
        for w in listed
        if isinstance(w, dict) and w.get("url")
    )
    if not workers:
        raise BackendUnavailable(f"the smg router at {url} lists no workers")
    return url, workers


def _is_json_object(response: httpx.Response) -> bool:
    try:
        return isinstance(response.json(), dict)
    except ValueError:
        return False


class WeightSync(JsonClient):
    def __init__(
        self,
        backend_url: str,
        *,
        timeout_s: float = 600.0,
        flush_timeout_s: float = 60.0,
        group: GroupSettings | None = None,
    ) -> None:
        super().__init__("", {}, timeout_s)  # every call names its worker's URL
        self._backend_url = backend_url
        self._flush_timeout_s = flush_timeout_s
        self._group_settings = group or GroupSettings(timeout_s=timeout_s)
        self._broadcaster: Broadcaster | None = None

    def publish(self, model_path: str, version: str) -> SyncReport:
        """Every worker loads the checkpoint at ``model_path`` (which it must see)."""
        update = {"model_path": model_path, "weight_version": version, "flush_cache": True}

        def load(workers: Sequence[Worker]) -> dict[str, str]:
            answers = on_each(workers, lambda w: self._update(w, update))
            return {w.url: f"update: {why}" for w, why in answers if why is not None}

        return self._sync(version, load)

    def publish_tensors(
        self, tensors: Sequence[tuple[str, torch.Tensor]], version: str
    ) -> SyncReport:
        """Every worker receives ``tensors`` (checkpoint names) from this process."""
        if self._broadcaster is None:
            self._broadcaster = Broadcaster(self, self._group_settings)
        broadcaster = self._broadcaster
        return self._sync(
            version, lambda workers: broadcaster.send([w.url for w in workers], tensors, version)
        )

    @property
    def bytes_broadcast(self) -> int:
        """Tensor bytes sent to workers by ``publish_tensors`` so far (all syncs)."""
        return 0 if self._broadcaster is None else self._broadcaster.bytes_sent

    def close(self) -> None:
        if self._broadcaster is not None:
            self._broadcaster.close()
        super().close()

    def _sync(
        self, version: str, update: Callable[[Sequence[Worker]], dict[str, str]]
    ) -> SyncReport:
        router, workers = discover_workers(self._http, self._backend_url)
        failed: dict[str, str] = {}
        steps: list[tuple[str, Callable[[Worker], object]]] = [
            ("pause", lambda w: self._post(w, "/pause_generation", {"mode": "abort"})),
            ("flush", self._flush),
        ]
        for name, step in steps:
            live = [w for w in workers if w.url not in failed]
            for worker, error in on_each(live, step):
                if error is not None:
                    failed[worker.url] = f"{name}: {error}"
        failed.update(update([w for w in workers if w.url not in failed]))
        removed = tuple(w.url for w in workers if w.url in failed and self._take_out(router, w))
        # Every worker is continued, the failed ones too: a turn waiting on a pause must
        # not hang; what a failed worker serves carries the version it reports.
        for worker, error in on_each(workers, lambda w: self._post(w, "/continue_generation", {})):
            if error is not None:
                failed.setdefault(worker.url, f"continue: {error}")
        report = SyncReport(
            version=version,
            updated=tuple(w.url for w in workers if w.url not in failed),
            failed=tuple(failed.items()),
            removed=removed,
        )
        for url, why in report.failed:
            taken = "taken out of the router" if url in removed else "still listed"
            log.error("weight sync to %s failed (%s); %s", url, why, taken)
        if not report.updated:
            raise BackendError(
                f"no worker took weight version {version}: "
                + "; ".join(f"{u}: {why}" for u, why in report.failed),
                retryable=False,
            )
        return report

    def _post(self, worker: Worker, path: str, body: object) -> httpx.Response:
        return self.post(f"{worker.url}{path}", body)

    def _flush(self, worker: Worker) -> None:
        # SGLang refuses (400) while requests still run; an abort-mode pause drains them.
        deadline = time.monotonic() + self._flush_timeout_s
        while True:
            try:
                self._post(worker, "/flush_cache", {})
                return
            except LegoError:
                if time.monotonic() >= deadline:
                    raise
            time.sleep(0.5)

    def _update(self, worker: Worker, body: dict[str, object]) -> None:
        result = self._post(worker, "/update_weights_from_disk", body).json()
        if not result.get("success", False):
            raise BackendError(f"weight update refused: {result.get('message')}")

    def _take_out(self, router: str | None, worker: Worker) -> bool:
        if router is None or worker.router_id is None:
            return False
        try:
            response = self._http.delete(f"{router}/workers/{worker.router_id}")
        except httpx.TransportError as exc:
            log.error("could not remove %s from the router %s: %s", worker.url, router, exc)
            return False
        return response.status_code in (200, 202, 204)
