"""One trial in real bwrap sandboxes, with a stand-in harness program (no model needed).

The runtime directory holds a ``codex`` that is a shell script: it shows what the trial
gave it (its config, its user, the runtime mount), then does what the test asks (fix
the bug, crash, hang). Everything else is the product: the task image, the overlay, the
proxy-only network spec, the grader, the terminations and the stage times.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kernel.threaded import free_port
from rollouts.harnesses import Endpoint
from rollouts.stages import Stopwatch
from rollouts.trial import TrialResult, TrialSetup, proxy_route, run_trial
from sandbox.bwrap import Bwrap
from tasks import generated
from tasks.spec import load_task

KEY = "lego-sk-trial"
ENDPOINT = Endpoint(KEY, f"http://proxy.test:1/s/{KEY}/v1", f"http://proxy.test:1/s/{KEY}")
SHOW = (
    "cat $CODEX_HOME/config.toml; id -u; "
    "touch /opt/lego/harness/x 2>/dev/null && echo RUNTIME-WRITABLE || echo RUNTIME-READONLY; "
    "git rev-list --all --count\n"
)


def runtime(root: Path, body: str) -> Path:
    """A harness install whose ``codex`` is ``body`` (a shell script)."""
    program = root / "npm" / "node_modules" / ".bin" / "codex"
    program.parent.mkdir(parents=True)
    program.write_text(f"#!/bin/sh\n{SHOW}{body}\n")
    for path in (root, *program.parents, program):
        if path.is_relative_to(root):
            path.chmod(0o755)
    return root


def trial_setup(tmp_path: Path, body: str) -> TrialSetup:
    """Real bwrap for both phases; the harness runtime is a script that runs ``body``."""
    scratch = tmp_path / "trials"
    scratch.mkdir()
    return TrialSetup(
        sandbox=Bwrap(runtime_dir=tmp_path / "sandboxes"),
        grader_sandbox=Bwrap(runtime_dir=tmp_path / "sandboxes"),
        cache_dir=tmp_path / "cache",
        scratch_dir=scratch,
        runtime_dir=runtime(tmp_path / "harness", body),
        proxy=proxy_route("127.0.0.1", free_port()),
    )


def trial(tmp_path: Path, body: str, *, agent_timeout_s: float | None = None) -> TrialResult:
    directory = generated.make_task(tmp_path / "pool", "calc")
    if agent_timeout_s is not None:
        spec = json.loads((directory / "task.json").read_text())
        spec["agent_timeout_s"] = agent_timeout_s
        (directory / "task.json").write_text(json.dumps(spec))
    setup = trial_setup(tmp_path, body)
    result = run_trial(load_task(directory), "codex", ENDPOINT, setup, Stopwatch())
    assert list(setup.scratch_dir.iterdir()) == []  # the trial's directories are gone
    return result


def test_a_fixing_harness_completes_with_reward_one(tmp_path: Path) -> None:
    result = trial(tmp_path, generated.honest_fix_command())
    assert (result.termination, result.reward) == ("completed", 1.0), result
    agent = result.ending.agent
    assert agent is not None
    # The config points at the sandbox's own loopback, the session's path kept.
    assert f'base_url = "http://127.0.0.1:8000/s/{KEY}/v1"' in agent.stdout
    lines = agent.stdout.splitlines()
    assert lines[-3:] == ["1000", "RUNTIME-READONLY", "1"]
    assert {e.kind.value for e in result.ending.events} >= {"history_hidden", "tests_withheld"}
    stages = result.stages
    assert stages.sandbox_setup > 0
    assert stages.agent_execution > 0
    assert stages.verification > 0


def test_a_crashing_harness_is_a_harness_error(tmp_path: Path) -> None:
    result = trial(tmp_path, "echo 'segfault in the harness' >&2; exit 3")
    assert (result.termination, result.reward) == ("harness_error", None)
    assert "codex exited 3: segfault in the harness" in result.ending.detail
    assert result.ending.grade is None
    assert result.stages.verification == 0.0


def test_a_hanging_harness_is_an_agent_timeout(tmp_path: Path) -> None:
    result = trial(tmp_path, "sleep 600", agent_timeout_s=3.0)
    assert (result.termination, result.reward) == ("agent_timeout", None)
    assert "3 s" in result.ending.detail
    assert result.ending.grade is None


@pytest.mark.parametrize("variant", ["setup_fails"])
def test_an_image_that_cannot_be_built_is_an_env_setup_failure(
    tmp_path: Path, variant: str
) -> None:
    directory = generated.make_task(tmp_path / "pool", "calc", variant=variant)
    setup = trial_setup(tmp_path, "echo never; exit 1")
    result = run_trial(load_task(directory), "codex", ENDPOINT, setup)
    assert (result.termination, result.reward) == ("env_setup_failure", None)
    assert "libcalc-dev is not installed" in result.ending.detail
    assert result.ending.agent is None
