"""Task images: the agent's one-commit repository, the hidden history, setup, the cache.

What the agent sees is asked the way an agent would ask it: git commands run in the
sandbox, as the sandbox user, over a fresh trial workspace.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import zlib
from pathlib import Path

import pytest

from kernel.errors import EnvSetupFailure
from sandbox.bwrap import Bwrap
from tasks.events import DefenseKind
from tasks.generated import FIX_MARKER, HIDDEN_TEST, make_task
from tasks.images import TaskImage, build_image
from tasks.sandboxing import SANDBOX_UID
from tasks.spec import Task, load_task
from tasks.workspaces import new_workspace
from tests.tasks.agent import shell

SECRETS = (FIX_MARKER, HIDDEN_TEST, "Fix clamp above the range")


def _as_agent(image: TaskImage, tmp_path: Path, bwrap: Bwrap, command: str) -> str:
    workspace = new_workspace(image, tmp_path / "trial")
    result = shell(image, workspace, command, bwrap)
    assert result.returncode == 0, result.stderr
    return result.stdout


def _files_holding(git_dir: Path, needles: tuple[str, ...]) -> list[str]:
    """Files under ``git_dir`` whose bytes, raw or zlib-inflated, hold any of ``needles``."""
    found = []
    for root, _, files in os.walk(git_dir):
        for name in files:
            data = Path(root, name).read_bytes()
            readings = [data]
            with contextlib.suppress(zlib.error):  # not a loose object: raw bytes only
                readings.append(zlib.decompress(data))
            if any(n.encode() in reading for n in needles for reading in readings):
                found.append(str(Path(root, name).relative_to(git_dir)))
    return found


def test_the_agent_sees_one_commit_and_no_ref_remote_or_tag(
    ok_image: TaskImage, tmp_path: Path, bwrap: Bwrap
) -> None:
    out = _as_agent(
        ok_image,
        tmp_path,
        bwrap,
        "git log --all --format=%H%n%an%n%ad%n%s --date=iso-strict; echo ---;"
        "git rev-list --all --count; echo ---; git remote -v; echo ---; git tag; echo ---;"
        "git for-each-ref --format='%(refname)'; echo ---; git reflog; echo ---;"
        "git stash list; git status --porcelain; echo ---; ls .git",
    )
    log, count, remotes, tags, refs, reflog, status, layout = out.split("---\n")
    commit, author, date, subject = log.strip().splitlines()  # one commit, four lines
    assert (author, date, subject) == ("lego-proxy", "2000-01-01T00:00:00+00:00", "base")
    assert count.strip() == "1"
    assert remotes == tags == reflog == status == ""
    assert refs.split() == ["refs/heads/main"]
    assert "packed-refs" not in layout.split()
    assert "logs" not in layout.split()
    assert commit != ok_image.base_commit  # a fresh root commit, not the real one


def test_no_later_commit_is_anywhere_in_the_agents_git(
    ok_task: Task, ok_image: TaskImage, tmp_path: Path, bwrap: Bwrap
) -> None:
    objects = _as_agent(
        ok_image,
        tmp_path,
        bwrap,
        "git cat-file --batch-all-objects --batch; git log --all -p;"
        f"git log --all -S'{FIX_MARKER}' --oneline;"
        "git grep -n clamp_above $(git rev-list --all) || true",
    )
    assert not [s for s in SECRETS if s in objects]
    assert _files_holding(ok_image.workspace / ".git", SECRETS) == []
    # The same searches find the fix in the real repository: they would catch a leak.
    assert _files_holding(ok_task.repo / ".git", SECRETS) != []
    real = subprocess.run(
        ["git", "-C", str(ok_task.repo), "cat-file", "--batch-all-objects", "--batch"],
        capture_output=True,
        check=True,
    ).stdout
    assert all(s.encode() in real for s in SECRETS)


def test_the_patches_and_the_hidden_tests_are_not_in_the_workspace(
    ok_image: TaskImage, tmp_path: Path, bwrap: Bwrap
) -> None:
    listing = _as_agent(ok_image, tmp_path, bwrap, "find . -path ./.git -prune -o -type f -print")
    contents = _as_agent(
        ok_image, tmp_path / "again", bwrap, "grep -rI -l -e clamp_above . || true"
    )
    assert not [f for f in listing.split() if f.endswith(".patch")]
    assert contents.strip() == ""
    assert "./tests/test_ops.py" in listing.split()  # the base's own tests stay


def test_the_image_keeps_the_real_history_apart_and_says_what_it_hid(
    ok_task: Task, ok_image: TaskImage
) -> None:
    history = subprocess.run(
        ["git", "--git-dir", str(ok_image.history), "log", "--all", "--format=%s"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "Fix clamp above the range" in history
    kinds = {event.kind: event for event in ok_image.events}
    hidden = kinds[DefenseKind.HISTORY_HIDDEN]
    assert set(hidden.items) == {
        "refs/heads/fix-clamp",
        "refs/heads/main",
        "refs/tags/v0.1",
        "refs/tags/v0.2",
    }
    assert "3 commits" in hidden.detail
    assert kinds[DefenseKind.TESTS_WITHHELD].items == ("tests/test_ops.py",)
    assert ok_image.tests == ("tests/test_ops.py",)
    assert ok_image.base_commit == ok_task.base_commit


def test_setup_ran_once_in_the_sandbox_as_the_unprivileged_user(ok_image: TaskImage) -> None:
    built = ok_image.workspace / "calc" / "_build.py"
    assert built.read_text() == "BUILT = True\n"
    if os.geteuid() == 0:
        assert built.stat().st_uid == SANDBOX_UID  # written from inside, not by the host


def test_a_second_build_is_a_cache_hit(
    ok_task: Task, ok_image: TaskImage, cache_dir: Path, bwrap: Bwrap
) -> None:
    marker = ok_image.workspace / "calc" / "_build.py"
    marker.write_text("BUILT = 'left by the first build'\n")  # a rebuild would rewrite it
    try:
        again = build_image(ok_task, cache_dir, bwrap)
        assert again.cached
        assert again.root == ok_image.root
        assert marker.read_text() == "BUILT = 'left by the first build'\n"
    finally:
        marker.write_text("BUILT = True\n")


def test_an_edited_task_gets_a_new_image(tmp_path: Path, cache_dir: Path, bwrap: Bwrap) -> None:
    root = make_task(tmp_path, "calc-edited", variant="no_setup")
    first = build_image(load_task(root), cache_dir, bwrap)
    spec = (
        (root / "task.json")
        .read_text()
        .replace('"grade_timeout_s": 120.0', '"grade_timeout_s": 90.0')
    )
    (root / "task.json").write_text(spec)
    second = build_image(load_task(root), cache_dir, bwrap)
    assert not first.cached
    assert not second.cached
    assert second.root != first.root


def test_a_failing_setup_is_an_env_setup_failure_with_its_reason(
    pool_dir: Path, cache_dir: Path, bwrap: Bwrap
) -> None:
    task = load_task(pool_dir / "calc-setup-fails")
    with pytest.raises(EnvSetupFailure) as caught:
        build_image(task, cache_dir, bwrap)
    assert caught.value.task_id == "calc-setup-fails"
    assert caught.value.reason == "setup_command exited 3: setup: libcalc-dev is not installed"
    assert not list((cache_dir / "images").glob("calc-setup-fails*"))  # no half image left


def test_the_packaged_toolchain_runs_pytest_without_the_hosts_interpreter(
    ok_image: TaskImage, tmp_path: Path, bwrap: Bwrap
) -> None:
    out = _as_agent(
        ok_image,
        tmp_path,
        bwrap,
        "python -c 'import pytest, sys; print(pytest.__file__); print(sys.executable)';"
        "id -u; test -e /root/.pyenv && echo pyenv-visible || echo pyenv-absent",
    )
    pytest_file, executable, uid, pyenv = out.split()
    assert pytest_file.startswith("/opt/lego/toolchain/site/pytest/")
    assert executable == "/opt/lego/toolchain/bin/python"
    assert uid == str(SANDBOX_UID)
    assert pyenv == "pyenv-absent"
