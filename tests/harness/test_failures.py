"""A backend failure during a real harness run: the harness's own retry, an honest record.

The tap in front of the engine fails the first ``/generate`` of the run once, either with
an HTTP 500 before any token or by dropping the connection after a few streamed chunks.
Codex retries both on its own (a failed stream is retried like a failed request). The
failed attempt must be recorded ``failed`` and left out of every training segment, and the
retried conversation must still be one root followed by token-exact extends.
"""

from __future__ import annotations

import pytest

from tests.harness.checks import RunReport, assert_loss_mask_is_sampled, main_segment, report
from tests.harness.conftest import Workspace
from tests.harness.harnesses import Installed, run_codex
from tests.harness.policy import expected_content, task_prompt
from tests.harness.stack import HarnessStack

pytestmark = pytest.mark.harness


@pytest.mark.parametrize("failure", ["http_500", "stream_dropped"])
def test_a_failed_backend_turn_is_retried_by_codex_and_excluded(
    failure: str,
    installed: Installed,
    stack: HarnessStack,
    workspace: Workspace,
    reports: list[RunReport],
) -> None:
    session = stack.new_session("codex")
    if failure == "http_500":
        stack.tap.fail_status_once = 500
    else:
        stack.tap.drop_after_chunks_once = 3
    run = run_codex(installed, session, workspace.cwd, workspace.home, task_prompt("codex"))
    assert run.returncode == 0, run.describe()
    assert (workspace.cwd / "out.txt").read_text() == expected_content("codex")

    trajectory = stack.trajectory(session["id"])
    reports.append(report("codex", failure, trajectory, run.wall_s))
    failed = [t for t in trajectory["turns"] if t["status"] != "completed"]
    assert [t["status"] for t in failed] == ["failed"]
    assert failed[0]["error"]
    segment, turns = main_segment(trajectory)
    assert len(turns) == 2
    assert len(trajectory["segments"]) == 1
    assert failed[0]["id"] not in segment["turn_ids"]
    # The retry asked for exactly the prompt that failed, and it became the root.
    assert turns[0]["prompt_tokens"] == failed[0]["prompt_tokens"]
    assert trajectory["events"] == []
    assert_loss_mask_is_sampled(trajectory, stack.tap)
    (usage,) = [e["usage"] for e in run.json_lines() if e.get("type") == "turn.completed"]
    assert usage["output_tokens"] == sum(t["completion_tokens"] for t in turns)
