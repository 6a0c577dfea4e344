"""The loop's trainers: an external one is watched through the run's alignment reports."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cli.main import main
from loop.orchestrator import StepSeen
from loop.trainers import external_trainer
from rollouts.control import ControlClient
from tests.support.control_proxy import control_proxy

ADMIN_KEY = "loop-trainers-admin-key"


@pytest.fixture(scope="module")
def proxy(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    data_dir = tmp_path_factory.mktemp("loop-trainers")
    with control_proxy(tiny_model_dir, data_dir, ADMIN_KEY) as (url, _):
        yield url


def test_an_external_trainers_steps_reach_the_loop_in_order_with_their_reasons(proxy: str) -> None:
    with ControlClient(proxy, ADMIN_KEY) as control:
        run_id = control.create_run(f"ext-{uuid.uuid4().hex[:8]}")
        headers = {"authorization": f"Bearer {ADMIN_KEY}"}
        path = f"{proxy}/api/v1/runs/{run_id}/alignment"
        for step in (1, 2, 3):
            body = {
                "step": step,
                "weight_version": f"step-{step - 1}",
                "metrics": {"mean_reward": step / 10, "expert_overlap": None},
                "flagged": step == 2,
                "reasons": ["pearson_r 0.9 < 0.99"] if step == 2 else [],
            }
            httpx.post(path, json=body, headers=headers).raise_for_status()
        seen: list[StepSeen] = []

        def after(step: StepSeen) -> bool:
            seen.append(step)
            return step.step < 2  # the loop stops watching after the second

        external_trainer(control, run_id, poll_s=0.05)(after, threading.Event())
    assert [(s.step, s.metrics["mean_reward"], s.flagged, s.reasons) for s in seen] == [
        (1, 0.1, False, ()),
        (2, 0.2, True, ("pearson_r 0.9 < 0.99",)),
    ]
    assert seen[0].metrics["expert_overlap"] is None


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--proxy-url", "http://127.0.0.1:9"], "--admin-key is required with --proxy-url"),
        (
            ["--proxy-url", "http://127.0.0.1:9", "--admin-key", "k"],
            "a local trainer needs --backend-url and --model-path",
        ),
        (["--collapse", "loss:falling"], "series is one of"),
    ],
)
def test_the_command_line_refuses_what_cannot_work_before_starting_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    harness_dir = tmp_path / "harness"
    (harness_dir / "npm").mkdir(parents=True)
    argv = ["loop", "--tasks", str(tmp_path), "--harness", "codex", "--group-size", "2"]
    argv += ["--steps", "1", "--harness-dir", str(harness_dir), "--data-dir", str(tmp_path / "d")]
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, *extra])
    assert exit_info.value.code == 1
    assert message in capsys.readouterr().err
    assert not (tmp_path / "d").exists()  # nothing was started
