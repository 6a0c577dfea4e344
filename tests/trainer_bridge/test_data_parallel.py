"""Data parallel on the CPU: two gloo ranks under torchrun take the single process's steps.

The first test runs two optimizer steps on fixed batches (``data_parallel_step``) in this
process and as two ranks, and compares the parameters and every reported number. The
second runs the real command line under torchrun against a real proxy and engine: rank 0
claims, deals, publishes and posts once; rank 1 trains and stops when rank 0 does.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.trainer_bridge import data_parallel_step
from tests.trainer_bridge.conftest import ADMIN_KEY, RolloutStack
from trainer_bridge.distributed import SOLO
from trainer_bridge.policy import load_policy

REPO = Path(__file__).resolve().parents[2]
# Float32 sums taken in another order (other micro-batches, then across ranks) move a
# parameter by this much at most after two AdamW steps at lr 1e-4 (measured: 6.2e-6; one
# process differs from itself by 7.0e-6 when only its micro-batch cap changes), while the
# steps themselves move parameters by ~2e-4.
PARAM_ATOL = 1e-5


def _torchrun(*args: str) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        # The checkout under test, whatever the editable install points at.
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
    }
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    return subprocess.Popen(
        [*command, "--nproc_per_node", "2", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _finish(process: subprocess.Popen[str], timeout_s: float = 240) -> str:
    try:
        output, _ = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        output, _ = process.communicate()
    assert process.returncode == 0, output[-4000:]
    return output


def _assert_same_numbers(single: dict[str, Any], parallel: dict[str, Any], where: str) -> None:
    assert single.keys() == parallel.keys()
    for key, value in single.items():
        other = parallel[key]
        if isinstance(value, dict):
            _assert_same_numbers(value, other, f"{where}.{key}")
        elif isinstance(value, int) or value is None:
            assert other == value, f"{where}.{key}"  # counts are exact
        else:
            assert other == pytest.approx(value, rel=1e-5, abs=1e-6), f"{where}.{key}"


def test_two_ranks_take_the_single_process_steps(tiny_model_dir: Path, tmp_path: Path) -> None:
    ranks = _torchrun(
        "-m", "tests.trainer_bridge.data_parallel_step", str(tiny_model_dir), str(tmp_path)
    )
    torch.set_num_threads(1)  # the two ranks have the other cores
    outcomes, sizes, model = data_parallel_step.steps(tiny_model_dir, SOLO)
    _finish(ranks)
    rank0, rank1 = (torch.load(tmp_path / f"rank-{r}.pt") for r in (0, 1))

    # Each step's batch was split in two unequal shards of whole groups.
    assert [a + b for a, b in zip(rank0["sizes"], rank1["sizes"], strict=True)] == sizes
    assert all(a != b for a, b in zip(rank0["sizes"], rank1["sizes"], strict=True))
    # The ranks' models are one model: same start, same summed gradients, same steps.
    for name, value in rank0["params"].items():
        assert torch.equal(value, rank1["params"][name]), name
    # ... and it is the single process's, within float tolerance.
    single = model.state_dict()
    initial = load_policy(tiny_model_dir).state_dict()
    diff = max(float((single[k] - rank0["params"][k]).abs().max()) for k in single)
    moved = max(float((single[k] - initial[k]).abs().max()) for k in single)
    print(f"max |parameter| difference, 2 ranks vs 1 process: {diff:.2e} (moved {moved:.2e})")
    assert diff <= PARAM_ATOL
    assert moved >= 10 * PARAM_ATOL
    # Every reported number describes the whole batch, as the single process's does.
    for step, (outcome, reported) in enumerate(zip(outcomes, rank0["outcomes"], strict=True)):
        _assert_same_numbers(asdict(outcome), reported, f"step {step + 1}")
    assert rank1["outcomes"] == rank0["outcomes"]


def test_the_command_line_under_torchrun(
    stack: RolloutStack, tiny_model_dir: Path, tmp_path: Path
) -> None:
    run_id = stack.new_run()
    prompt = [{"role": "user", "content": "Name a colour."}]
    groups = [
        stack.create_group(run_id, f"g{g}", [50 * g + i for i in range(3)], max_tokens=6)
        for g in range(2)
    ]
    for sessions in groups:
        for index, session in enumerate(sessions):
            stack.chat(session, prompt, turns=1)
            stack.finish(str(session["id"]), reward=float(index % 2))
    checkpoints = tmp_path / "checkpoints"
    output = _finish(
        _torchrun(
            "-m", "trainer_bridge.train",
            "--model-path", str(tiny_model_dir),
            "--proxy-url", stack.proxy_url,
            "--admin-key", ADMIN_KEY,
            "--run-id", run_id,
            "--backend-url", stack.engine_url,
            "--output-dir", str(checkpoints),
            "--steps", "3",
            "--groups-per-step", "2",
            "--max-staleness", "none",
            "--max-wait-s", "2",  # the second step finds nothing: the run ends
            "--poll-interval-s", "0.1",
            "--lr", "1e-3",
            "--kl-coef", "0",
        )
    )  # fmt: skip

    assert "rank 1 of 2: done after 1 steps" in output
    versions = stack.admin.get(f"/api/v1/runs/{run_id}/weight_versions").json()["versions"]
    assert [v["version"] for v in versions] == ["step-1"]  # published once, by rank 0
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step-1"]
    reports = stack.admin.get(f"/api/v1/runs/{run_id}/alignment").json()["reports"]
    assert [r["step"] for r in reports] == [1]
    metrics = reports[0]["metrics"]
    # Rewards 0, 1, 0 in each group: the whole batch's numbers, not one rank's half.
    assert metrics["mean_reward"] == pytest.approx(1 / 3)
    assert metrics["zero_variance_share"] == 0.0
    assert metrics["pearson_r"] >= 0.9999  # both ranks' tokens, replayed
    assert metrics["expert_overlap"] == 1.0
