"""Shell command lines an agent runs, read as actions: the programs the indicators count,
the shell syntax around them, and the commands that must count as nothing."""

from __future__ import annotations

import pytest

from recorder.read_models.shell_commands import (
    Action,
    ActionKind,
    patch_paths,
    same_file,
    shell_actions,
)

READ, LIST, SEARCH, EDIT = ActionKind.READ, ActionKind.LIST, ActionKind.SEARCH, ActionKind.EDIT
TEST, SCRIPT = ActionKind.TEST, ActionKind.SCRIPT

PATCH = """apply_patch <<'EOF'
*** Begin Patch
*** Update File: src/calc.py
@@
-    return low
+    return high
*** Add File: src/new.py
+x = 1
*** End Patch
EOF"""


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ("cat src/calc.py", [Action(READ, ("src/calc.py",))]),
        ("sed -n '1,80p' ./src/calc.py", [Action(READ, ("src/calc.py",))]),
        ("head -n 20 a.py b.py", [Action(READ, ("a.py", "b.py"))]),
        ("nl -ba src/x.py | sed -n 10,20p", [Action(READ, ("src/x.py",))]),
        ("python run.py < input.txt", [Action(SCRIPT), Action(READ, ("input.txt",))]),
        ("ls", [Action(LIST, (".",))]),
        (
            "ls -la src/ && find tests -name '*.py'",
            [Action(LIST, ("src",)), Action(LIST, ("tests",))],
        ),
        ("rg --files src", [Action(LIST, ("src",))]),
        ("grep -rn 'def clamp' src --include=*.py", [Action(SEARCH, ("src",))]),
        ("rg -A 3 clamp src/calc.py", [Action(SEARCH, ("src/calc.py",))]),
        ("echo hi > out.txt", [Action(EDIT, ("out.txt",))]),
        ("printf 'x' >> notes.md 2>/dev/null", [Action(EDIT, ("notes.md",))]),
        ("sed -i 's/low/high/' src/calc.py", [Action(EDIT, ("src/calc.py",))]),
        ("perl -pi -e 's/a/b/' f.txt", [Action(EDIT, ("f.txt",))]),
        ("echo x | tee -a log.txt", [Action(EDIT, ("log.txt",))]),
        (PATCH, [Action(EDIT, ("src/calc.py", "src/new.py"))]),
        ("git apply <<EOF\n--- a/q.py\n+++ b/q.py\n@@\nEOF", [Action(EDIT, ("q.py",))]),
        ("git apply fix.diff", [Action(EDIT)]),  # an edit, of files the words do not name
        ("python -m pytest -q tests/test_calc.py", [Action(TEST)]),
        ("pytest -x", [Action(TEST)]),
        ("cd /repo && timeout -s KILL 600 tox -e py311", [Action(TEST)]),
        ("FOO=1 uv run pytest -k clamp", [Action(TEST)]),
        ("make test", [Action(TEST)]),
        ("npm run test:unit", [Action(TEST)]),
        ("go test ./...", [Action(TEST)]),
        ("./tests/runtests.py basic", [Action(TEST)]),
        ("python manage.py test app", [Action(TEST)]),
        ("python reproduce.py", [Action(SCRIPT)]),
        ("python3 -c 'import calc; print(calc.clamp(5, 0, 3))'", [Action(SCRIPT)]),
        ("./reproduce.sh", [Action(SCRIPT)]),
        ("bash -lc 'cat a.py && pytest'", [Action(READ, ("a.py",)), Action(TEST)]),
        # Nothing the indicators count.
        ("git diff", []),
        ("git status && git log --oneline -3", []),
        ("python -m pip install -e .", []),
        ("make build", []),
        ("echo done", []),
        ("cat <<EOF | python -\nprint(1)\nEOF", [Action(SCRIPT)]),
        ("echo 'an unbalanced quote", []),
    ],
)
def test_a_command_line_becomes_its_actions_in_order(command: str, expected: list[Action]) -> None:
    assert list(shell_actions(command)) == expected


def test_newlines_separate_commands_but_not_inside_quotes_or_comments() -> None:
    command = 'python -c "import x\nprint(1)" && cat y.py # then > not-written\nls src'
    assert shell_actions(command) == (
        Action(SCRIPT),
        Action(READ, ("y.py",)),
        Action(LIST, ("src",)),
    )


def test_a_heredoc_body_is_no_command_of_its_own() -> None:
    # The body mentions pytest and a redirection; only the write to new.py happened.
    command = "cat > new.py <<'EOF'\n# pytest > log.txt\nprint(1)\nEOF\npython new.py"
    assert shell_actions(command) == (Action(EDIT, ("new.py",)), Action(SCRIPT))


def test_patch_paths_reads_both_patch_formats() -> None:
    assert patch_paths("*** Update File: a.py\n*** Move to: b.py\n") == ("a.py", "b.py")
    assert patch_paths("--- /dev/null\n+++ b/src/new.py\n") == ("src/new.py",)
    assert patch_paths("--- a/x.py\n+++ /dev/null\n") == ()


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        ("src/calc.py", "src/calc.py", True),
        ("/repo/src/calc.py", "src/calc.py", True),
        ("calc.py", "/repo/src/calc.py", True),
        ("/repo/src/calc.py", "/other/src/calc.py", False),
        ("/repo/xcalc.py", "calc.py", False),
        ("src/calc.py", "lib/calc.py", False),
        ("/repo", ".", False),
    ],
)
def test_same_file_matches_an_absolute_path_with_the_relative_path_that_ends_it(
    a: str, b: str, same: bool
) -> None:
    assert same_file(a, b) is same
    assert same_file(b, a) is same
