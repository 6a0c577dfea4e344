"""Codex CLI (npm ``@openai/codex``), unmodified, over the OpenAI Responses API (its only one).

Codex declares ``exec_command{cmd,...}`` among function tools plus a ``namespace`` tool
group and the hosted ``web_search``; it sends the system prompt as ``developer`` items,
echoes reasoning items with ``encrypted_content`` and arguments verbatim, and reports the
usage of the whole turn in ``turn.completed``. It runs with its default configuration
apart from the provider: the tools the policy cannot call are left out by the adapter.
"""

from __future__ import annotations

import pytest

from tests.harness.checks import RunReport, assert_loss_mask_is_sampled, main_segment, report
from tests.harness.conftest import Workspace
from tests.harness.harnesses import Installed, run_codex
from tests.harness.policy import expected_content, task_prompt
from tests.harness.stack import HarnessStack

pytestmark = pytest.mark.harness


def test_codex_runs_exec_command_and_answers(
    installed: Installed, stack: HarnessStack, workspace: Workspace, reports: list[RunReport]
) -> None:
    session = stack.new_session("codex")
    run = run_codex(installed, session, workspace.cwd, workspace.home, task_prompt("codex"))
    assert run.returncode == 0, run.describe()
    assert (workspace.cwd / "out.txt").read_text() == expected_content("codex")

    trajectory = stack.trajectory(session["id"])
    reports.append(report("codex", "basic", trajectory, run.wall_s))
    _, turns = main_segment(trajectory)
    assert len(turns) == 2, run.describe()
    assert len(trajectory["segments"]) == 1
    assert trajectory["events"] == []
    assert_loss_mask_is_sampled(trajectory, stack.tap)
    (usage,) = [e["usage"] for e in run.json_lines() if e.get("type") == "turn.completed"]
    assert usage["input_tokens"] == sum(t["prompt_tokens"] for t in turns)
    assert usage["output_tokens"] == sum(t["completion_tokens"] for t in turns)
    assert usage["reasoning_output_tokens"] > 0

    # Codex's default tool set reached the proxy; what the policy cannot call is named.
    assert {"tools[type=namespace]", "tools[type=web_search]"} <= set(turns[0]["ignored_fields"])
