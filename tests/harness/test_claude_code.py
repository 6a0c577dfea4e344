"""Claude Code (npm ``@anthropic-ai/claude-code``), unmodified, over Anthropic Messages.

Claude Code posts ``/v1/messages?beta=true`` after a ``HEAD /``, declares
``Bash{command,description,timeout,...}`` among ~25 tools, moves ``cache_control`` markers
between turns, re-orders ``tool_use.input`` keys and echoes thinking with its signature.
"""

from __future__ import annotations

import json

import pytest

from tests.harness.checks import (
    RunReport,
    assert_loss_mask_is_sampled,
    kind,
    main_segment,
    report,
)
from tests.harness.conftest import Workspace
from tests.harness.harnesses import Installed, run_claude_code
from tests.harness.policy import expected_content, task_prompt
from tests.harness.stack import HarnessStack

pytestmark = pytest.mark.harness


def test_claude_code_runs_bash_and_answers(
    installed: Installed, stack: HarnessStack, workspace: Workspace, reports: list[RunReport]
) -> None:
    session = stack.new_session("claude-code")
    run = run_claude_code(
        installed, session, workspace.cwd, workspace.home, task_prompt("claude-code")
    )
    assert run.returncode == 0, run.describe()
    assert (workspace.cwd / "out.txt").read_text() == expected_content("claude-code")

    trajectory = stack.trajectory(session["id"])
    reports.append(report("claude-code", "basic", trajectory, run.wall_s))
    _, turns = main_segment(trajectory)
    assert len(turns) == 2, run.describe()
    assert len(trajectory["segments"]) == 1
    assert trajectory["events"] == []
    assert_loss_mask_is_sampled(trajectory, stack.tap)
    result = json.loads(run.stdout)
    assert (result["is_error"], result["num_turns"]) == (False, 2)
    assert result["result"].startswith("Done")
    assert result["usage"]["input_tokens"] == sum(t["prompt_tokens"] for t in turns)
    assert result["usage"]["output_tokens"] == sum(t["completion_tokens"] for t in turns)


def test_claude_code_compact_then_continue_is_a_classified_compaction(
    installed: Installed, stack: HarnessStack, workspace: Workspace, reports: list[RunReport]
) -> None:
    """``claude -p /compact --continue``, then a new task on the compacted history."""
    session = stack.new_session("claude-code")
    runs = [
        run_claude_code(installed, session, workspace.cwd, workspace.home, prompt, resume=resume)
        for prompt, resume in [
            (task_prompt("claude-code"), False),
            ("/compact", True),
            (task_prompt("claude-code", "again"), True),
        ]
    ]
    for run in runs:
        assert run.returncode == 0, run.describe()
    assert (workspace.cwd / "out.txt").read_text() == expected_content("claude-code")

    trajectory = stack.trajectory(session["id"])
    reports.append(report("claude-code", "compaction", trajectory, sum(r.wall_s for r in runs)))
    # Claude Code leaves its final answer out of the /compact request and appends the
    # instruction, so that request continues the first turn token-exactly: an extend, on a
    # branch of its own. The next run starts from the summary (then the kept last answer,
    # a caveat and a synthetic "No response requested."): a compaction fork, with its own
    # segment.
    _, main = main_segment(trajectory)
    assert len(main) == 2
    main_ids = {t["id"] for t in main}
    summary_call, fork, after = [t for t in trajectory["turns"] if t["id"] not in main_ids]
    assert kind(summary_call) == "extend"
    assert summary_call["parent_turn_id"] == main[0]["id"]
    assert kind(fork) == "fork/compaction"
    assert (kind(after), after["parent_turn_id"]) == ("extend", fork["id"])
    assert [(e["turn_id"], e["classification"]) for e in trajectory["events"]] == [
        (fork["id"], "fork")
    ]
    assert len(trajectory["segments"]) == 3
    assert_loss_mask_is_sampled(trajectory, stack.tap)
