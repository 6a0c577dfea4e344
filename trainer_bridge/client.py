"""HTTP clients of the trainer: the proxy's export/control API, and the error mapping the
backend's weight sync (``trainer_bridge.weights``) shares.

Owns the trainer's HTTP, nothing else:

- ``ExportClient`` (admin key): ``claim`` complete groups of a run, in ``binv1`` by default
  (raw little-endian arrays, read as views of the body) or ``json``/``b64v1``, decoded by
  ``recorder.export_wire.decode_claim`` into its frozen ``ClaimedBatch``; ``ack`` a batch,
  ``pause``/``resume`` the run around a weight sync, ``set_worker_exclusions`` (workers out
  of every replica's rotation after a failed sync), ``announce_weight_version``, and
  ``post_alignment`` metrics.
- ``JsonClient``: the pooled client both build on (``trainer_bridge.weights`` too);
  ``raise_for(response)``: an HTTP error status as the exception tree (below);
  ``on_each(items, call)``: one call per item (a backend worker), all at once, and what
  went wrong with each.

Errors are raised from ``kernel.errors``: an HTTP error status becomes the ``LegoError``
subclass carrying that status (401, 403, 404, 409, 413, 400; anything else ``BackendError``
with the upstream status), an unreachable server ``BackendUnavailable``, an unusable claim
body ``InvalidRequest``. One pooled ``httpx.Client`` per client object; close it (or use
it as a context manager).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType
from typing import Self, TypeVar

import httpx

from kernel.errors import (
    AuthenticationFailed,
    BackendError,
    BackendUnavailable,
    Conflict,
    InvalidRequest,
    LegoError,
    NotFound,
    PayloadTooLarge,
    PermissionDenied,
)
from recorder.export_wire import ClaimedBatch, decode_claim

_BY_STATUS: dict[int, type[LegoError]] = {
    400: InvalidRequest,
    401: AuthenticationFailed,
    403: PermissionDenied,
    404: NotFound,
    409: Conflict,
    413: PayloadTooLarge,
}


T = TypeVar("T")


def on_each(items: Sequence[T], call: Callable[[T], object]) -> list[tuple[T, str | None]]:
    """Run ``call`` on every item at once; each item's error message, or None."""

    def attempt(item: T) -> tuple[T, str | None]:
        try:
            call(item)
        except LegoError as exc:
            return item, exc.message
        return item, None

    if not items:
        return []
    with ThreadPoolExecutor(max_workers=len(items)) as pool:
        return list(pool.map(attempt, items))


def raise_for(response: httpx.Response) -> None:
    if response.is_success:
        return
    # OpenAI-style {"error": {"message"}}, SGLang's {"error": "..."} or {"message": "..."}.
    try:
        body = response.json()
    except ValueError:
        body = None
    message = response.text[:500]
    if isinstance(body, dict):
        error = body.get("error")
        found = error.get("message") if isinstance(error, dict) else error or body.get("message")
        message = str(found) if found else message
    where = f"{response.request.method} {response.request.url.path}"
    text = f"{where} -> {response.status_code}: {message}"
    kind = _BY_STATUS.get(response.status_code)
    if kind is not None:
        raise kind(text)
    raise BackendError(text, backend_status=response.status_code)


class JsonClient:
    """One pooled ``httpx.Client``; ``get``/``post`` raise the exception tree, never return
    errors."""

    def __init__(
        self,
        base_url: str,
        headers: dict[str, str],
        timeout_s: float,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._http = httpx.Client(
            base_url=base_url, headers=headers, timeout=timeout_s, transport=transport
        )

    def get(self, path: str, params: dict[str, str] | None = None) -> httpx.Response:
        try:
            response = self._http.get(path, params=params)
        except httpx.TransportError as exc:
            raise BackendUnavailable(f"GET {path}: {exc}") from exc
        raise_for(response)
        return response

    def post(self, path: str, body: object) -> httpx.Response:
        try:
            response = self._http.post(path, json=body)
        except httpx.TransportError as exc:
            raise BackendUnavailable(f"POST {path}: {exc}") from exc
        raise_for(response)
        return response

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        _type: type[BaseException] | None,
        _value: BaseException | None,
        _tb: TracebackType | None,
    ) -> None:
        self.close()


class ExportClient(JsonClient):
    """The proxy's export/control API for one run, under the admin key."""

    def __init__(
        self, proxy_url: str, admin_key: str, run_id: str, *, timeout_s: float = 120.0
    ) -> None:
        super().__init__(proxy_url, {"authorization": f"Bearer {admin_key}"}, timeout_s)
        self.run_id = run_id

    def claim(
        self, groups: int, max_staleness: int | None, lease_s: float, wire_format: str = "binv1"
    ) -> ClaimedBatch:
        body = {"groups": groups, "max_staleness": max_staleness, "lease_s": lease_s}
        path = f"/api/v1/runs/{self.run_id}/claims?format={wire_format}"
        return decode_claim(self.post(path, body).content)

    def ack(self, batch_id: str) -> None:
        self.post(f"/api/v1/batches/{batch_id}/ack", {})

    def pause(self) -> None:
        self.post(f"/api/v1/runs/{self.run_id}/pause", {})

    def resume(self) -> None:
        self.post(f"/api/v1/runs/{self.run_id}/resume", {})

    def set_worker_exclusions(self, exclude: dict[str, str], include: list[str]) -> dict[str, str]:
        """Take ``exclude`` workers (url -> why) out of every replica's rotation, put
        ``include`` back; the exclusions in force afterwards."""
        body = {"exclude": exclude, "include": include}
        excluded = self.post("/api/v1/workers/exclusions", body).json()["excluded"]
        return {str(url): str(why) for url, why in excluded.items()}

    def announce_weight_version(self, version: str) -> int:
        """Tell the proxy ``version`` is now served; return its announcement index."""
        response = self.post(f"/api/v1/runs/{self.run_id}/weight_versions", {"version": version})
        return int(response.json()["index"])

    def post_alignment(
        self,
        step: int,
        weight_version: str,
        metrics: dict[str, float | None],
        flagged: bool,
        reasons: Sequence[str] = (),
    ) -> None:
        body = {"step": step, "weight_version": weight_version, "metrics": metrics}
        extra = {"flagged": flagged, "reasons": list(reasons)}
        self.post(f"/api/v1/runs/{self.run_id}/alignment", {**body, **extra})
