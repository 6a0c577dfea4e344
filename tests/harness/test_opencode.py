"""OpenCode (npm ``opencode-ai``), unmodified, over OpenAI Chat Completions.

OpenCode declares ``bash{command,timeout,workdir,description}``, streams with
``include_usage``, echoes ``reasoning_content`` and re-serializes tool arguments; it asks
the same model for a session title and compacts on the usage the endpoint reports.
"""

from __future__ import annotations

import pytest

from tests.harness.checks import (
    RunReport,
    assert_loss_mask_is_sampled,
    kind,
    main_segment,
    report,
)
from tests.harness.conftest import Workspace
from tests.harness.harnesses import HarnessRun, Installed, run_opencode
from tests.harness.policy import expected_content, task_prompt
from tests.harness.stack import HarnessStack

pytestmark = pytest.mark.harness


def seen_usage(run: HarnessRun) -> list[tuple[int, int, int]]:
    """(prompt, completion, reasoning) tokens of each step, as OpenCode accounted them."""
    steps = [e["part"]["tokens"] for e in run.json_lines() if e.get("type") == "step_finish"]
    return [(s["input"], s["output"] + s["reasoning"], s["reasoning"]) for s in steps]


def test_opencode_runs_its_bash_tool_and_answers(
    installed: Installed, stack: HarnessStack, workspace: Workspace, reports: list[RunReport]
) -> None:
    session = stack.new_session("opencode")
    run = run_opencode(installed, session, workspace.cwd, workspace.home, task_prompt("opencode"))
    assert run.returncode == 0, run.describe()
    assert (workspace.cwd / "out.txt").read_text() == expected_content("opencode")

    trajectory = stack.trajectory(session["id"])
    reports.append(report("opencode", "basic", trajectory, run.wall_s))
    _, turns = main_segment(trajectory)
    assert len(turns) == 2, run.describe()  # the tool call, then the answer after its result
    assert len(trajectory["segments"]) == 1
    assert trajectory["events"] == []
    assert_loss_mask_is_sampled(trajectory, stack.tap)
    usage = seen_usage(run)
    assert [u[:2] for u in usage] == [(t["prompt_tokens"], t["completion_tokens"]) for t in turns]
    assert all(reasoning > 0 for _, _, reasoning in usage)  # <think> arrived as reasoning


def test_opencode_compaction_is_a_classified_fork(
    installed: Installed, stack: HarnessStack, workspace: Workspace, reports: list[RunReport]
) -> None:
    """A window that the bulky tool output overflows but the fixed prompt fits (no loop)."""
    session = stack.new_session("opencode")
    run = run_opencode(
        installed,
        session,
        workspace.cwd,
        workspace.home,
        task_prompt("opencode", "bulky"),
        context_limit=15000 + 4096,  # usable input = context - output limit
    )
    assert run.returncode == 0, run.describe()
    assert (workspace.cwd / "out.txt").read_text() == expected_content("opencode")

    trajectory = stack.trajectory(session["id"])
    reports.append(report("opencode", "compaction", trajectory, run.wall_s))
    _, main = main_segment(trajectory)
    assert len(main) == 2
    # The summary call over the same history (no tools), then the loop restarted from the
    # summary: a compaction fork, recorded as an event, never a silent break.
    later = [kind(t) for t in trajectory["turns"] if t["id"] not in {m["id"] for m in main}]
    assert later == ["fork/side_request", "fork/compaction"]
    assert [(e["classification"], e["fork_reason"]) for e in trajectory["events"]] == [
        ("fork", "side_request"),
        ("fork", "compaction"),
    ]
    assert len(trajectory["segments"]) == 3
    assert_loss_mask_is_sampled(trajectory, stack.tap)
    by_seq = sorted(trajectory["turns"], key=lambda t: t["seq"])
    assert [u[:2] for u in seen_usage(run)] == [
        (t["prompt_tokens"], t["completion_tokens"]) for t in by_seq
    ]
    assert 'reason="compaction"' in stack.metrics()


def test_opencode_title_request_is_a_side_request(
    installed: Installed, stack: HarnessStack, workspace: Workspace, reports: list[RunReport]
) -> None:
    """The title request usually comes first (so it is recorded as the root at first); the
    main conversation's first request shows it was a side request, and re-labels it."""
    session = stack.new_session("opencode")
    run = run_opencode(
        installed, session, workspace.cwd, workspace.home, task_prompt("opencode"), title=None
    )
    assert run.returncode == 0, run.describe()
    trajectory = stack.trajectory(session["id"])
    reports.append(report("opencode", "title", trajectory, run.wall_s))
    assert sorted(kind(t) for t in trajectory["turns"]) == ["extend", "fork/side_request", "root"]
    _, main = main_segment(trajectory)
    assert len(main) == 2
    [title] = [t for t in trajectory["turns"] if t["id"] not in {m["id"] for m in main}]
    [event] = trajectory["events"]
    assert (event["turn_id"], event["fork_reason"]) == (title["id"], "side_request")
    if title["seq"] < main[0]["seq"]:  # it came first: re-labelled by the main root
        assert event["relabelled_by"] == main[0]["id"]
    assert len(trajectory["segments"]) == 2
    assert_loss_mask_is_sampled(trajectory, stack.tap)
