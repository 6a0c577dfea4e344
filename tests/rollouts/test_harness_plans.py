"""The launch plans are pure and put every config under HOME, with the session's URL."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from rollouts.harnesses import (
    HARNESSES,
    Endpoint,
    LaunchPlan,
    Layout,
    PlannedFile,
    codex_plan,
    opencode_plan,
    plan_for,
)

SESSION = {
    "key": "lego-sk-abc",
    "openai_base_url": "http://proxy.example:8080/s/lego-sk-abc/v1",
    "anthropic_base_url": "http://proxy.example:8080/s/lego-sk-abc",
}
INSIDE = Layout(home="/home/agent", workspace="/testbed", runtime="/opt/lego/harness")


def test_the_endpoint_is_rebased_onto_the_sandbox_loopback() -> None:
    endpoint = Endpoint.of_session(SESSION).rebased("http://127.0.0.1:8000")
    assert endpoint.openai_base_url == "http://127.0.0.1:8000/s/lego-sk-abc/v1"
    assert endpoint.anthropic_base_url == "http://127.0.0.1:8000/s/lego-sk-abc"
    assert endpoint.key == "lego-sk-abc"
    with pytest.raises(ValueError, match="not an origin"):
        Endpoint.of_session(SESSION).rebased("127.0.0.1:8000")


@pytest.mark.parametrize("harness", HARNESSES)
def test_every_plan_runs_from_the_runtime_with_a_private_home(harness: str) -> None:
    plan = plan_for(harness, INSIDE, Endpoint.of_session(SESSION), "fix the bug")
    assert plan.harness == harness
    assert plan.argv[0].startswith("/opt/lego/harness/")
    assert "fix the bug" in plan.argv
    assert plan.env["HOME"] == "/home/agent"
    assert plan.env["PATH"] == "/usr/bin:/bin"
    assert all(not f.path.startswith("/") for f in plan.files)  # under HOME, not the repo


def test_codex_talks_responses_to_the_session_and_bypasses_its_own_sandbox() -> None:
    plan = codex_plan(INSIDE, Endpoint.of_session(SESSION), "p")
    assert plan.argv[1:] == (
        "exec",
        "--json",
        "--dangerously-bypass-approvals-and-sandbox",
        "p",
    )
    (config,) = plan.files
    assert config.path == ".codex/config.toml"
    parsed = tomllib.loads(config.content)
    assert parsed["model_providers"]["lego"]["base_url"] == SESSION["openai_base_url"]
    assert parsed["model_providers"]["lego"]["wire_api"] == "responses"
    assert plan.env["LEGO_SESSION_KEY"] == "lego-sk-abc"
    assert plan.env["CODEX_HOME"] == "/home/agent/.codex"
    outside_git = Layout(home="/h", workspace="/w", runtime="/r", workspace_is_git=False)
    outside = codex_plan(outside_git, Endpoint.of_session(SESSION), "p")
    assert "--skip-git-repo-check" in outside.argv


def test_opencode_reads_its_global_config(tmp_path: Path) -> None:
    plan = opencode_plan(INSIDE, Endpoint.of_session(SESSION), "p", title=None)
    assert "--title" not in plan.argv
    plan.write_files(tmp_path)
    config = json.loads((tmp_path / ".config/opencode/opencode.json").read_text())
    assert config["provider"]["lego"]["options"] == {
        "baseURL": SESSION["openai_base_url"],
        "apiKey": "lego-sk-abc",
    }
    assert plan.env["XDG_CONFIG_HOME"] == "/home/agent/.config"


def test_openhands_carries_its_driver_into_home(tmp_path: Path) -> None:
    plan = plan_for("openhands", INSIDE, Endpoint.of_session(SESSION), "p")
    assert plan.argv[:2] == (
        "/opt/lego/harness/py312/bin/python",
        "/home/agent/.lego/openhands_driver.py",
    )
    plan.write_files(tmp_path)
    assert "Conversation(" in (tmp_path / ".lego/openhands_driver.py").read_text()


def test_unknown_harnesses_and_escaping_files_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown harness 'aider'"):
        plan_for("aider", INSIDE, Endpoint.of_session(SESSION), "p")
    with pytest.raises(ValueError, match="under HOME"):
        LaunchPlan("x", ("x",), {}, (PlannedFile("../.bashrc", ""),))
    with pytest.raises(ValueError, match="under HOME"):
        PlannedFile("/etc/passwd", "")
