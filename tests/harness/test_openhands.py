"""OpenHands SDK (PyPI ``openhands-sdk``), unmodified, over OpenAI Chat through LiteLLM.

The SDK runs in its own Python 3.12 venv (``rollouts/openhands_driver.py``). It declares
``terminal{command,is_input,timeout,reset,summary,security_risk}``, omits the assistant's
``content`` key, drops ``reasoning_content`` and re-serializes arguments with ``json.dumps``.
"""

from __future__ import annotations

import pytest

from tests.harness.checks import RunReport, assert_loss_mask_is_sampled, main_segment, report
from tests.harness.conftest import Workspace
from tests.harness.harnesses import Installed, run_openhands
from tests.harness.policy import expected_content, task_prompt
from tests.harness.stack import HarnessStack

pytestmark = pytest.mark.harness


@pytest.mark.parametrize("stream", [False, True], ids=["default", "streamed"])
def test_openhands_runs_terminal_and_finishes(
    stream: bool,
    installed: Installed,
    stack: HarnessStack,
    workspace: Workspace,
    reports: list[RunReport],
) -> None:
    """The SDK's default (one JSON answer per call) and ``LLM(stream=True)`` (SSE)."""
    session = stack.new_session("openhands")
    prompt = task_prompt("openhands")
    run = run_openhands(installed, session, workspace.cwd, workspace.home, prompt, stream=stream)
    assert run.returncode == 0, run.describe()
    assert (workspace.cwd / "out.txt").read_text() == expected_content("openhands")

    trajectory = stack.trajectory(session["id"])
    reports.append(report("openhands", "streamed" if stream else "basic", trajectory, run.wall_s))
    _, turns = main_segment(trajectory)
    assert len(turns) == 2, run.describe()
    assert len(trajectory["segments"]) == 1
    assert trajectory["events"] == []
    assert_loss_mask_is_sampled(trajectory, stack.tap)
    (summary,) = run.json_lines()[-1:]
    assert summary["status"] == "finished"
    assert (summary["streamed_chunks"] > 0) == stream
    assert [(c["prompt_tokens"], c["completion_tokens"]) for c in summary["calls"]] == [
        (t["prompt_tokens"], t["completion_tokens"]) for t in turns
    ]
