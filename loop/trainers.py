"""The loop's trainer: ``trainer_bridge`` in this process, or one elsewhere it only watches.

``local_trainer(config)`` runs ``trainer_bridge.train.run`` (claims over the export API,
GSPO steps with routing replay, weights published to ``config.backend_url``) and reports
each step to the loop. ``external_trainer(control, run_id)`` is for a trainer on other
machines: the loop polls the run's alignment reports (every trainer step posts one) and
treats each new one as a step; it never stops that trainer, it only stops watching.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from pydantic import JsonValue

from loop.orchestrator import StepSeen, Train
from rollouts.control import ControlClient
from trainer_bridge.client import ExportClient
from trainer_bridge.config import TrainConfig
from trainer_bridge.train import StepReport, run
from trainer_bridge.weights import weight_sync_for


def step_seen(report: StepReport) -> StepSeen:
    return StepSeen(
        step=report.step,
        weight_version=report.weight_version,
        metrics=dict(report.metrics),
        flagged=report.flagged,
        reasons=report.reasons,
        claim_s=report.times.claim_s,
        optimize_s=report.times.optimize_s,
        publish_s=report.times.publish_s,
    )


def local_trainer(config: TrainConfig) -> Train:
    def train(after: Callable[[StepSeen], bool], stop: threading.Event) -> None:
        with (
            ExportClient(config.proxy_url, config.admin_key, config.run_id) as export,
            weight_sync_for(config) as weights,
        ):
            run(config, export, weights, after_step=lambda r: after(step_seen(r)), stop=stop)

    return train


def reported_step(report: dict[str, JsonValue]) -> StepSeen:
    """A step from the proxy's alignment record (``GET /api/v1/runs/{id}/alignment``)."""
    metrics = report.get("metrics")
    reasons = report.get("reasons")
    return StepSeen(
        step=int(str(report.get("step", 0))),
        weight_version=str(report.get("weight_version", "")),
        metrics={
            str(k): float(v) if isinstance(v, int | float) else None
            for k, v in (metrics.items() if isinstance(metrics, dict) else ())
        },
        flagged=bool(report.get("flagged")),
        reasons=tuple(str(r) for r in reasons) if isinstance(reasons, list) else (),
    )


def external_trainer(control: ControlClient, run_id: str, poll_s: float = 5.0) -> Train:
    def train(after: Callable[[StepSeen], bool], stop: threading.Event) -> None:
        seen = 0
        while not stop.is_set():
            reports = control.alignment(run_id)
            for report in reports[seen:]:
                seen += 1
                if not after(reported_step(report)):
                    return
            stop.wait(poll_s)

    return train
