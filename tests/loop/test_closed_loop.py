"""The closed loop end to end on the CPU: ``lego-proxy loop`` with real Codex in bwrap.

The command starts the embedded stack itself (the local engine with the tiny model in
scripted-policy mode, ``lego-proxy serve`` on SQLite), validates the pool, makes its
validation run, then rolls out and trains side by side: two trainer steps, each pushing
its weights to the engine, a held-out validation after each, task selection on. The
policy is stochastic where it must be: the ``mixed`` task's first reply is drawn per
sample (fix the bug, or give up), so its groups can carry signal; ``solved`` is always
fixed (2/2: set aside after one epoch). Afterwards a proxy on the same data directory
serves what was recorded, and the test reads each number back through the API and the
Live UI.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest

from kernel.paths import default_model_dir
from kernel.threaded import free_port, serve
from proxy.app import create_app
from proxy.settings import Settings
from tasks import generated
from tests.harness.conftest import installed as installed
from tests.harness.harnesses import Installed
from tests.harness.policy import shell_call
from tests.rollouts.policy import DONE, NOTHING

pytestmark = pytest.mark.harness

ROOT = Path(__file__).resolve().parents[2]
ADMIN_KEY = "closed-loop-admin-key"


def marker(task: str) -> str:
    return f"LEGO-LOOP-{task}:"


def policy() -> dict[str, Any]:
    fix = shell_call("codex", generated.honest_fix_command(), thought="Fix it.", what="fix")
    return {
        "rules": [
            {"match": "<tool_response>", "reply": DONE},
            {"match": marker("mixed"), "replies": [fix, NOTHING]},
            {"match": marker("solved"), "reply": fix},
            {"match": marker("held"), "reply": fix},
        ],
        "default": NOTHING,
        "seed": 3,
    }


def pool(root: Path, *names: str) -> Path:
    for name in names:
        task = generated.make_task(root, name)
        spec = json.loads((task / "task.json").read_text())
        spec["instruction"] = f"{marker(name)} {spec['instruction']}"
        (task / "task.json").write_text(json.dumps(spec, indent=2) + "\n")
    return root


@pytest.fixture(scope="module")
def finished_loop(installed: Installed, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("loop")
    script = root / "policy.json"
    script.write_text(json.dumps(policy()))
    data_dir = root / "data"
    argv = [
        sys.executable,
        "-m",
        "cli",
        "loop",
        "--tasks",
        str(pool(root / "pool", "mixed", "solved")),
    ]
    argv += ["--held-out", str(pool(root / "held-out", "held")), "--harness", "codex"]
    argv += ["--group-size", "2", "--steps", "2", "--validate-every", "1", "--check-trials", "1"]
    argv += ["--set-aside-after", "1", "--concurrency", "2", "--lr", "1e-5"]
    argv += ["--harness-dir", str(installed.cache), "--data-dir", str(data_dir)]
    argv += ["--engine-args", f"--script {script}", "--run-name", "closed-loop"]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=1500, check=False)
    print(done.stdout[-6000:])
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return {"out": done.stdout, "data_dir": data_dir}


@pytest.fixture(scope="module")
def recorded(finished_loop: dict[str, Any]) -> Any:
    """A proxy on the loop's data directory (no backend: it only reads), and the run."""
    data_dir: Path = finished_loop["data_dir"]
    port = free_port()
    settings = Settings(
        port=port,
        data_dir=data_dir,
        backend_url=f"http://127.0.0.1:{free_port()}",
        tokenizer_path=default_model_dir(data_dir),
        admin_key=ADMIN_KEY,
    )
    with (
        serve(create_app(settings), port=port) as url,
        httpx.Client(
            base_url=url, headers={"authorization": f"Bearer {ADMIN_KEY}"}, timeout=60
        ) as admin,
    ):
        runs = admin.get("/api/v1/runs").raise_for_status().json()["items"]
        (run,) = [r for r in runs if r["name"] == "closed-loop"]
        yield admin, run["id"]


def _sessions(admin: httpx.Client, run_id: str) -> list[dict[str, Any]]:
    page = admin.get(f"/api/v1/runs/{run_id}/trajectories", params={"limit": 1000})
    return list(page.raise_for_status().json()["items"])


def test_the_loop_reports_each_phase(finished_loop: dict[str, Any]) -> None:
    out = finished_loop["out"]
    assert "validation run: 1 trial(s) that must all grade" in out
    assert "loop ended: 2 trainer step(s) done" in out
    assert "validation after step 1: reward" in out
    assert "validation after step 2: reward" in out
    assert "set aside: solved (2/2 in epoch(s) 0)" in out
    assert "wall time by phase:" in out
    assert "trainer: publishing weights" in out


def test_what_the_loop_recorded(recorded: Any) -> None:
    admin, run_id = recorded
    sessions = _sessions(admin, run_id)
    purposes = Counter(s["purpose"] for s in sessions)
    assert purposes["check"] == 1
    assert purposes["validation"] == 2  # one held-out task, after each of the two steps
    # Every check and validation trial graded (the environment works).
    assert all(s["reward"] is not None for s in sessions if s["purpose"] != "train")
    train = [s for s in sessions if s["purpose"] == "train"]
    groups = Counter(s["group_id"] for s in train)
    assert groups["solved.e0"] == 2
    assert not [g for g in groups if g.startswith("solved.") and g != "solved.e0"]  # set aside
    assert groups["mixed.e0"] == groups["mixed.e1"] == 2

    versions = admin.get(f"/api/v1/runs/{run_id}/weight_versions").raise_for_status().json()
    assert [v["version"] for v in versions["versions"]] == ["step-1", "step-2"]
    # Turns carry the version they were sampled under: the later validation ran on step-2.
    (late,) = [s for s in sessions if s["group_id"] == "val-s2.held.e0"]
    trajectory = admin.get(f"/api/v1/sessions/{late['id']}/trajectory").raise_for_status().json()
    assert {turn["weight_version"] for turn in trajectory["turns"]} == {"step-2"}

    reports = admin.get(f"/api/v1/runs/{run_id}/alignment").raise_for_status().json()["reports"]
    assert [r["step"] for r in reports] == [1, 2]
    for report in reports:
        for series in ("mean_reward", "entropy", "response_tokens", "turns_per_trajectory", "kl"):
            assert report["metrics"][series] is not None, series


def _cell(page: str, row: str, field: str) -> str:
    """The text of ``<td ... data-field=field>`` in the first ``<tr row>`` of ``page``."""
    start = page.index(row)
    end = page.index("</tr>", start)
    match = re.search(rf'data-(?:field|bin|reason)="{re.escape(field)}">([^<]*)<', page[start:end])
    assert match is not None, (row, field)
    return match.group(1).strip()


def test_the_live_ui_shows_the_loops_numbers(recorded: Any) -> None:
    admin, run_id = recorded
    sessions = _sessions(admin, run_id)
    train = [s for s in sessions if s["purpose"] == "train" and s["reward"] is not None]

    # Epochs (Figure 5): per epoch, the groups and their k of N, as recorded.
    epochs = admin.get(f"/ui/runs/{run_id}/epochs").raise_for_status().text
    by_group: dict[str, list[float]] = {}
    for s in train:
        by_group.setdefault(s["group_id"], []).append(s["reward"])
    for epoch in sorted({int(g.rsplit(".e", 1)[1]) for g in by_group}):
        groups = {g: r for g, r in by_group.items() if g.endswith(f".e{epoch}") and len(r) > 1}
        row = f'data-epoch="{epoch}"'
        assert _cell(epochs, row, "groups") == str(len(groups))
        for rewards in groups.values():
            k = sum(1 for r in rewards if r > 0)
            expected = sum(1 for r2 in groups.values() if sum(1 for r in r2 if r > 0) == k)
            assert _cell(epochs, row, f"{k}/{len(rewards)}") == str(expected)

    # Overview (Figure 3): the held-out reward where it was sampled, and training apart.
    overview = admin.get(f"/ui/runs/{run_id}").raise_for_status().text
    for version in ("step-1", "step-2"):
        held = [
            s["reward"]
            for s in sessions
            if s["purpose"] == "validation" and s["group_id"] == f"val-s{version[-1]}.held.e0"
        ]
        row = f'data-version="{version}"'
        assert _cell(overview, row, "validation_sessions") == str(len(held))
        assert float(_cell(overview, row, "validation_reward")) == pytest.approx(held[0])

    # Steps (Table 4, Figure 4): every graded training session of a version is counted.
    steps = admin.get(f"/ui/runs/{run_id}/steps").raise_for_status().text
    total = sum(1 for s in sessions if s["purpose"] == "train")
    assert _cell(steps, '<tr data-version="all"', "sessions") == str(total)
    assert "agent_execution" in steps

    # Sessions, filtered to the held-out ones; behaviour over the training sessions.
    listed = admin.get(f"/ui/runs/{run_id}/sessions", params={"purpose": "validation"}).text
    assert listed.count("val-s") >= 2
    behaviour = admin.get(f"/ui/runs/{run_id}/behaviour").raise_for_status().text
    assert 'data-indicator="runs_tests"' in behaviour
