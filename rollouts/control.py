"""The runner's side of the control API: check the run, create sessions, finish them.

``ControlClient(url, admin_key)`` is one pooled HTTP client (thread-safe: the runner's
workers share it). Bodies are validated here before they leave (``NewSession``,
``Finish``), answers are parsed into ``SessionCreated``. Whatever the proxy refuses is a
``ConfigurationError`` whose message says what to change: a wrong admin key, an unknown
run, a proxy that does not answer, or the proxy's own error message for the body.
"""

from __future__ import annotations

from types import TracebackType

import httpx
from pydantic import BaseModel, ConfigDict, JsonValue, ValidationError

from kernel.errors import ConfigurationError

RUNS_PAGE = 1000


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class NewSession(_Body):
    task_id: str
    group_id: str
    sample_index: int
    group_size: int
    harness: str
    purpose: str = "train"  # "validation": recorded and charted, never exported
    sampling: dict[str, JsonValue] = {}  # pinned for every turn (e.g. the validation temperature)


class Finish(_Body):
    termination: str
    reward: float | None
    reward_details: dict[str, JsonValue] | None
    stages: dict[str, float]
    events: list[dict[str, JsonValue]]


class SessionCreated(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    id: str
    key: str
    openai_base_url: str
    anthropic_base_url: str


class ControlClient:
    def __init__(
        self, url: str, admin_key: str, *, transport: httpx.BaseTransport | None = None
    ) -> None:
        self._url = url.rstrip("/")
        self._http = httpx.Client(
            base_url=self._url,
            headers={"authorization": f"Bearer {admin_key}"},
            timeout=httpx.Timeout(60.0, connect=10.0),
            transport=transport,
        )

    def __enter__(self) -> ControlClient:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._http.close()

    def check_run(self, run_id: str) -> None:
        """The proxy answers, the admin key is right, and the run exists."""
        cursor: str | None = None
        while True:
            params = {"limit": str(RUNS_PAGE), **({"cursor": cursor} if cursor else {})}
            page = self._call("GET", "/api/v1/runs", params=params)
            items = page.get("items")
            if not isinstance(items, list):
                raise ConfigurationError(f"{self._url} did not answer as lego-proxy's control API")
            if any(isinstance(run, dict) and run.get("id") == run_id for run in items):
                return
            next_cursor = page.get("next_cursor")
            if not isinstance(next_cursor, str):
                raise ConfigurationError(
                    f"run {run_id!r} does not exist on {self._url} (create it with "
                    "POST /api/v1/runs, or check --run-id)"
                )
            cursor = next_cursor

    def create_run(self, name: str) -> str:
        """A new run's id (``name`` must be unused on the proxy)."""
        answer = self._call("POST", "/api/v1/runs", json={"name": name})
        run_id = answer.get("id")
        if not isinstance(run_id, str):
            raise ConfigurationError(f"{self._url} answered a run without an id")
        return run_id

    def alignment(self, run_id: str) -> list[dict[str, JsonValue]]:
        """The trainer's per-step reports (step order): metrics, flagged, reasons."""
        reports = self._call("GET", f"/api/v1/runs/{run_id}/alignment").get("reports")
        return [r for r in reports if isinstance(r, dict)] if isinstance(reports, list) else []

    def pause(self, run_id: str) -> None:
        """Hold the run's new turns at the proxy (the loop's collapse action "pause")."""
        self._call("POST", f"/api/v1/runs/{run_id}/pause", json={})

    def create_session(self, run_id: str, body: NewSession) -> SessionCreated:
        answer = self._call("POST", f"/api/v1/runs/{run_id}/sessions", json=body.model_dump())
        try:
            return SessionCreated.model_validate(answer)
        except ValidationError as exc:
            raise ConfigurationError(f"{self._url} answered a session without {exc}") from exc

    def finish(self, session_id: str, body: Finish) -> None:
        self._call("POST", f"/api/v1/sessions/{session_id}/finish", json=body.model_dump())

    def _call(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, str] | None = None,
        json: dict[str, JsonValue] | None = None,
    ) -> dict[str, JsonValue]:
        try:
            response = self._http.request(method, path, params=params, json=json)
        except httpx.HTTPError as exc:
            raise ConfigurationError(
                f"the proxy at {self._url} cannot be reached ({exc.__class__.__name__}: {exc}); "
                "check --proxy-url and that it is running"
            ) from exc
        if response.status_code == 401:
            raise ConfigurationError(
                f"the proxy at {self._url} refused the admin key (401); check --admin-key"
            )
        if response.status_code == 404 and "/runs/" in path:
            raise ConfigurationError(f"{method} {path}: no such run on {self._url} (404)")
        try:
            answer = response.json()
        except ValueError:
            answer = None
        if response.status_code >= 400 or not isinstance(answer, dict):
            raise ConfigurationError(
                f"{method} {path} on {self._url} failed ({response.status_code}): "
                f"{_message(answer) or response.text[:500]}"
            )
        return answer


def _message(answer: object) -> str | None:
    if isinstance(answer, dict):
        error = answer.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
    return None
