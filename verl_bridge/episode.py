"""One verl sample as one lego-proxy trial, synchronously: session, trial, finish, read.

``Episodes(control, reader, run_id, harness, trial).run(sample)`` does what the rollout
runner does for one job (``rollouts.runner``), then reads the finished session back:

1. creates the session (the sample's task, group, index, group size, the harness, and
   verl's sampling pinned for every turn) through the control API,
2. runs ``trial(task, harness, endpoint, stopwatch)`` (``rollouts.trial.run_trial``
   bound to a ``TrialSetup`` in production; the stopwatch started before the session),
3. finishes the session with the trial's report (``rollouts.runner.finish_body``),
4. returns its ``Trajectory`` from the export API (``TrajectoryReader``, ``b64v1``).

A trial that raises instead of returning a result (a bug, not an outcome) still finishes
its session, as ``aborted`` (excluded, no reward), before the error goes on: the proxy's
record never keeps an open session for a sample verl gave up on.

``TrajectoryReader`` (admin key, one pooled client) raises the exception tree of
``trainer_bridge.client.raise_for``; an unreachable proxy is ``BackendUnavailable``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import httpx
from pydantic import JsonValue

from recorder.export_wire import Trajectory, decode_trajectory
from rollouts.control import ControlClient, Finish, NewSession
from rollouts.harnesses import Endpoint
from rollouts.runner import Trial, finish_body
from rollouts.stages import Stopwatch
from tasks.spec import Task
from trainer_bridge.client import JsonClient

ABORTED = "aborted"


@dataclass(frozen=True, slots=True)
class Sample:
    task: Task
    group_id: str
    sample_index: int
    group_size: int
    sampling: Mapping[str, float] = field(default_factory=dict)  # the session's pins


class TrajectoryReader(JsonClient):
    """``GET /api/v1/sessions/{id}/trajectory`` under the admin key, decoded."""

    def __init__(
        self,
        proxy_url: str,
        admin_key: str,
        *,
        timeout_s: float = 120.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        headers = {"authorization": f"Bearer {admin_key}"}
        super().__init__(proxy_url.rstrip("/"), headers, timeout_s, transport)

    def read(self, session_id: str) -> Trajectory:
        path = f"/api/v1/sessions/{session_id}/trajectory"
        return decode_trajectory(self.get(path, params={"format": "b64v1"}).content)


@dataclass(frozen=True, slots=True)
class Episodes:
    control: ControlClient
    reader: TrajectoryReader
    run_id: str
    harness: str
    trial: Trial

    def run(self, sample: Sample) -> Trajectory:
        watch = Stopwatch()
        body = NewSession(
            task_id=sample.task.id,
            group_id=sample.group_id,
            sample_index=sample.sample_index,
            group_size=sample.group_size,
            harness=self.harness,
            sampling=dict(sample.sampling),
        )
        session = self.control.create_session(self.run_id, body)
        endpoint = Endpoint(session.key, session.openai_base_url, session.anthropic_base_url)
        try:
            result = self.trial(sample.task, self.harness, endpoint, watch)
        except BaseException as exc:
            why: dict[str, JsonValue] = {
                "reason": f"the trial raised {exc.__class__.__name__}: {exc}"[:2000]
            }
            aborted = Finish(
                termination=ABORTED,
                reward=None,
                reward_details=why,
                stages=watch.stages().as_json(),
                events=[],
            )
            self.control.finish(session.id, aborted)
            raise
        self.control.finish(session.id, finish_body(result))
        return self.reader.read(session.id)
