"""Each harness's own tools, with the argument shapes its pinned CLI sends, read as actions;
and the exit status each one's shell results show (OpenCode's show none)."""

from __future__ import annotations

import json

import pytest

from recorder.read_models.harness_tools import VOCABULARIES, exit_status, tool_use
from recorder.read_models.shell_commands import Action, ActionKind

READ, LIST, SEARCH, EDIT = ActionKind.READ, ActionKind.LIST, ActionKind.SEARCH, ActionKind.EDIT
TEST, FINISH = ActionKind.TEST, ActionKind.FINISH
PATCH = "*** Begin Patch\n*** Update File: src/calc.py\n@@\n-a\n+b\n*** End Patch\n"


@pytest.mark.parametrize(
    ("harness", "name", "arguments", "expected", "shell"),
    [
        ("claude-code", "Bash", {"command": "pytest -q", "description": "Run"}, [TEST], True),
        ("claude-code", "Read", {"file_path": "/repo/src/calc.py"}, [READ], False),
        ("claude-code", "Edit", {"file_path": "/repo/a.py", "old_string": "x"}, [EDIT], False),
        ("claude-code", "MultiEdit", {"file_path": "/repo/a.py", "edits": []}, [EDIT], False),
        ("claude-code", "Write", {"file_path": "/repo/a.py", "content": ""}, [EDIT], False),
        ("claude-code", "Glob", {"pattern": "**/*.py"}, [LIST], False),
        ("claude-code", "Grep", {"pattern": "clamp", "path": "src"}, [SEARCH], False),
        ("claude-code", "TodoWrite", {"todos": []}, [], False),
        ("opencode", "bash", {"command": "ls src", "description": "List"}, [LIST], True),
        ("opencode", "read", {"filePath": "/repo/src/calc.py"}, [READ], False),
        ("opencode", "edit", {"filePath": "/repo/a.py", "oldString": "x"}, [EDIT], False),
        ("opencode", "write", {"filePath": "/repo/a.py", "content": ""}, [EDIT], False),
        ("opencode", "apply_patch", {"patchText": PATCH}, [EDIT], False),
        ("opencode", "list", {"path": "/repo"}, [LIST], False),
        ("opencode", "grep", {"pattern": "clamp"}, [SEARCH], False),
        ("opencode", "Read", {"filePath": "/repo/a.py"}, [], False),  # names are exact
        ("codex", "exec_command", {"cmd": "sed -n 1,40p src/calc.py"}, [READ], True),
        ("codex", "shell_command", {"command": "python -m pytest"}, [TEST], True),
        ("codex", "shell", {"command": ["bash", "-lc", "cat a.py"]}, [READ], True),
        ("codex", "shell", {"command": ["apply_patch", PATCH]}, [EDIT], True),
        ("codex", "apply_patch", {"input": PATCH}, [EDIT], False),
        ("codex", "update_plan", {"plan": []}, [], False),
        ("openhands", "terminal", {"command": "pytest", "security_risk": "LOW"}, [TEST], True),
        ("openhands", "file_editor", {"command": "view", "path": "/repo/a.py"}, [READ], False),
        ("openhands", "file_editor", {"command": "str_replace", "path": "/r/a.py"}, [EDIT], False),
        ("openhands", "file_editor", {"command": "create", "path": "/r/b.py"}, [EDIT], False),
        ("openhands", "finish", {"message": "Fixed."}, [FINISH], False),
        ("openhands", "task_tracker", {"command": "view"}, [], False),
    ],
)
def test_each_harness_tool_is_read_with_its_own_argument_shape(
    harness: str,
    name: str,
    arguments: dict[str, object],
    expected: list[ActionKind],
    shell: bool,
) -> None:
    use = tool_use(VOCABULARIES[harness], name, json.dumps(arguments))
    assert [a.kind for a in use.actions] == expected
    assert use.shell is shell


def test_paths_come_from_the_harness_field_and_default_to_the_working_directory() -> None:
    claude = VOCABULARIES["claude-code"]
    assert tool_use(claude, "Read", '{"file_path": "/repo/./src/calc.py"}').actions == (
        Action(READ, ("/repo/src/calc.py",)),
    )
    assert tool_use(claude, "Glob", '{"pattern": "*.py"}').actions == (Action(LIST, (".",)),)
    # Claude Code's field is file_path: OpenCode's filePath names no file here.
    assert tool_use(claude, "Read", '{"filePath": "/repo/a.py"}').actions == (Action(READ),)
    opencode = VOCABULARIES["opencode"]
    assert tool_use(opencode, "apply_patch", json.dumps({"patchText": PATCH})).actions == (
        Action(EDIT, ("src/calc.py",)),
    )


@pytest.mark.parametrize("arguments", ["{not json", '"a string"', "[1, 2]", ""])
def test_arguments_that_are_not_a_json_object_did_nothing(arguments: str) -> None:
    use = tool_use(VOCABULARIES["claude-code"], "Bash", arguments)
    assert use.actions == ()
    assert use.shell is False


@pytest.mark.parametrize(
    ("harness", "result", "status"),
    [
        ("claude-code", "Exit code 1\nFAILED tests/test_calc.py::test_clamp", 1),
        ("claude-code", "3 passed in 0.02s", None),
        ("codex", "Chunk ID: 7\nProcess exited with code 2\nOutput:\nerror", 2),
        ("codex", "Chunk ID: 7\nProcess exited with code 0\nOutput:\nok", 0),
        ("codex", '{"output": "boom", "metadata": {"exit_code": 127}}', 127),
        ("openhands", "boom\n[Command finished with exit code 1]", 1),
        ("openhands", "ok\n[Command finished with exit code 0]", 0),
        ("opencode", "Exit code 1\nProcess exited with code 1", None),  # never says
    ],
)
def test_the_exit_status_a_shell_result_shows(
    harness: str, result: str, status: int | None
) -> None:
    assert exit_status(VOCABULARIES[harness], result) == status
