"""The RL loop closed on the CPU: proxy + sampling engine + trainer + weight push.

A toy task with a programmatic reward: answer a prompt with text containing a target word
the untrained tiny model emits now and then. The trainer (``trainer_bridge.train.run``)
claims groups over the export API, takes GSPO steps with routing replay, saves and pushes
each new version to the engine, which reloads it (or broadcasts it to the engine over a
process group, no checkpoint written); the proxy records the version per turn. Every seed
is fixed, so the run is the same each time.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.trainer_bridge.conftest import ADMIN_KEY, RolloutStack, rollout_stack
from trainer_bridge.client import ExportClient
from trainer_bridge.config import TrainConfig
from trainer_bridge.train import StepReport, run
from trainer_bridge.weights import weight_sync_for

TARGET = " street"
PROMPTS = ["Say one word.", "Name a place.", "Where do you live?", "Pick a noun."]
GROUP_SIZE = 8
MAX_TOKENS = 8
STEPS = 4


def reward(answer: str) -> float:
    return 1.0 if TARGET in answer else 0.0


@dataclass
class TrainerThread:
    config: TrainConfig
    reports: list[StepReport] = field(default_factory=list)
    error: BaseException | None = None

    def __call__(self) -> None:
        try:
            with (
                ExportClient(self.config.proxy_url, ADMIN_KEY, self.config.run_id) as export,
                weight_sync_for(self.config) as weights,
            ):
                self.reports = run(self.config, export, weights)
        except BaseException as exc:  # surfaced by the test thread
            self.error = exc


def _round(stack: RolloutStack, run_id: str, step: int) -> float:
    groups = [
        stack.create_group(
            run_id,
            f"s{step}-g{g}",
            [10_000 * step + 100 * g + i for i in range(GROUP_SIZE)],
            max_tokens=MAX_TOKENS,
        )
        for g in range(len(PROMPTS))
    ]
    rewards = []
    for prompt, sessions in zip(PROMPTS, groups, strict=True):
        for session in sessions:
            answer = stack.chat(session, [{"role": "user", "content": prompt}], turns=1)
            rewards.append(reward(answer))
            stack.finish(str(session["id"]), rewards[-1])
    return sum(rewards) / len(rewards)


def _versions(stack: RolloutStack, run_id: str) -> list[str]:
    body = stack.admin.get(f"/api/v1/runs/{run_id}/weight_versions").raise_for_status().json()
    return [v["version"] for v in body["versions"]]


def _wait_for_version(stack: RolloutStack, run_id: str, count: int, trainer: TrainerThread) -> None:
    deadline = time.monotonic() + 120
    while len(_versions(stack, run_id)) < count:
        if trainer.error is not None:
            raise trainer.error
        assert time.monotonic() < deadline, "the trainer published no new version"
        time.sleep(0.05)


def test_mean_reward_rises(tiny_model_dir: Path, tmp_path: Path) -> None:
    with rollout_stack(tiny_model_dir, tmp_path / "proxy") as stack:
        run_id = stack.new_run()
        config = TrainConfig(
            model_path=str(tiny_model_dir),
            proxy_url=stack.proxy_url,
            admin_key=ADMIN_KEY,
            run_id=run_id,
            backend_url=stack.engine_url,
            output_dir=str(tmp_path / "checkpoints"),
            steps=STEPS,
            groups_per_step=len(PROMPTS),
            max_staleness=0,
            poll_interval_s=0.05,
            max_wait_s=120,
            lr=5e-3,  # Table 10 says 1e-6 for a 35B model; a random tiny one needs more
            seed=0,
        )
        trainer = TrainerThread(config)
        thread = threading.Thread(target=trainer, daemon=True)
        thread.start()
        means = []
        for step in range(STEPS):
            means.append(_round(stack, run_id, step))
            _wait_for_version(stack, run_id, step + 1, trainer)
        thread.join(timeout=60)
        if trainer.error is not None:
            raise trainer.error
        means.append(_round(stack, run_id, STEPS))  # the policy after the last update
        print("mean reward per round:", means)  # measured: 0.125, 0.031, 0.219, 0.406, 0.5

        assert [r.weight_version for r in trainer.reports] == [f"step-{k}" for k in range(1, 5)]
        # Each step trained on exactly one whole round: every group complete, none stale.
        assert [r.outcome.samples for r in trainer.reports] == [len(PROMPTS) * GROUP_SIZE] * STEPS
        assert _versions(stack, run_id) == [f"step-{k}" for k in range(1, STEPS + 1)]
        alignment = stack.admin.get(f"/api/v1/runs/{run_id}/alignment").json()["reports"]
        assert [a["step"] for a in alignment] == list(range(1, STEPS + 1))
        assert not any(a["flagged"] for a in alignment)
        assert all(a["metrics"]["pearson_r"] >= 0.9999 for a in alignment)
        # The engine served the pushed weights and the proxy recorded it per turn.
        items = stack.admin.get(f"/api/v1/runs/{run_id}/trajectories?limit=1000").json()["items"]
        last = next(s for s in items if s["group_id"].startswith(f"s{STEPS}-"))
        trajectory = stack.admin.get(f"/api/v1/sessions/{last['id']}/trajectory").json()
        assert trajectory["segments"][0]["weight_versions"] == [f"step-{STEPS}"]
        assert means[-1] >= means[0] + 0.2


def test_broadcast_weights_are_what_the_next_turns_sample(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    steps = 2
    with rollout_stack(tiny_model_dir, tmp_path / "proxy") as stack:
        run_id = stack.new_run()
        config = TrainConfig(
            model_path=str(tiny_model_dir),
            proxy_url=stack.proxy_url,
            admin_key=ADMIN_KEY,
            run_id=run_id,
            backend_url=stack.engine_url,
            output_dir=str(tmp_path / "checkpoints"),
            weight_sync="distributed",
            save_checkpoints=False,
            steps=steps,
            groups_per_step=len(PROMPTS),
            max_staleness=0,
            poll_interval_s=0.05,
            max_wait_s=120,
            lr=5e-3,
            seed=0,
        )
        trainer = TrainerThread(config)
        thread = threading.Thread(target=trainer, daemon=True)
        thread.start()
        for step in range(steps):
            _round(stack, run_id, step)
            _wait_for_version(stack, run_id, step + 1, trainer)
        thread.join(timeout=60)
        if trainer.error is not None:
            raise trainer.error
        alignment = stack.admin.get(f"/api/v1/runs/{run_id}/alignment").json()["reports"]
        items = stack.admin.get(f"/api/v1/runs/{run_id}/trajectories?limit=1000").json()["items"]
    assert [r.weight_version for r in trainer.reports] == ["step-1", "step-2"]
    assert not (tmp_path / "checkpoints").exists()
    # Step 2 trained on turns sampled after the first broadcast, recomputed with the
    # trainer's in-memory weights: they agree only if the engine served exactly those.
    assert alignment[1]["weight_version"] == "step-1"
    assert alignment[1]["metrics"]["pearson_r"] >= 0.9999
    assert alignment[1]["metrics"]["abs_dlogp_p99"] < 1e-3
    second = [s for s in items if s["group_id"].startswith("s1-")]
    assert len(second) == len(PROMPTS) * GROUP_SIZE
