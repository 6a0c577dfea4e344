"""Task images: what every trial of a task starts from, built once and cached.

``build_image(task, cache_dir, sandbox)`` returns a ``TaskImage``:

- ``workspace``: the agent's repository. The tree of ``base_commit`` with a ONE-commit
  history: a fresh root commit of that tree (fixed author and date), on ``main``, with no
  remote, no tags, no reflog, no other refs and no object of the real history. Neither
  patch is in it. Trials mount it read-only as the lower layer of their overlay.
- ``history``: a bare copy of the real repository, every commit and ref, kept apart: the
  grader restores it; no sandbox of the agent's ever mounts it.
- ``mounts`` / ``env``: what the repository's code and tests need to run in a sandbox (the
  packaged grading toolchain, ``tasks.toolchain``).
- ``events``: what the image hides (``history_hidden``, ``tests_withheld``), for the trial's
  finish body.

``setup_command`` runs once, at build time, in a ``Network.NONE`` sandbox as the
unprivileged user, in the workspace (after the one commit: what it writes is untracked,
as a built artifact is); if it fails, ``EnvSetupFailure`` carries the reason.

The cache key hashes the image format, the resolved base commit, ``task.json``, both
patches and the toolchain, so an edited task gets a new image; a second call finds
``CACHE/images/<task_id>-<key>/image.json`` and returns at once (``cached=True``). Builds
happen in a staging directory renamed into place, so concurrent builders never see half
an image.
"""

from __future__ import annotations

import hashlib
import shutil
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from pydantic import BaseModel, ConfigDict

from kernel.errors import EnvSetupFailure, SandboxError, TaskError
from sandbox.spec import Mount, Sandbox
from tasks.events import DefenseEvent, DefenseKind
from tasks.git import GitFailed, git
from tasks.patches import patch_files, touched_paths
from tasks.sandboxing import WORKSPACE_TARGET, give_to_sandbox_user, none_spec
from tasks.spec import Task
from tasks.toolchain import Toolchain, ensure_toolchain

IMAGE_FORMAT = "1"
MANIFEST = "image.json"
SETUP_TIMEOUT_S = 1800.0
_TAIL = 2000  # characters of a failing setup's output kept in the reason


@dataclass(frozen=True, slots=True)
class TaskImage:
    task_id: str
    key: str
    root: Path
    base_commit: str  # the real repository's commit, resolved
    workspace: Path
    history: Path
    tests: tuple[str, ...]  # the files tests.patch touches: the test command's {tests}
    mounts: tuple[Mount, ...]
    env: Mapping[str, str]
    events: tuple[DefenseEvent, ...]
    cached: bool


class _Event(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: DefenseKind
    detail: str
    items: list[str]


class _Manifest(BaseModel):
    """``image.json``: written last, so its presence means the image is whole."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: str
    task_id: str
    key: str
    base_commit: str
    tests: list[str]
    toolchain: str
    events: list[_Event]


def image_key(task: Task, base_commit: str, toolchain_key: str) -> str:
    digest = hashlib.sha256()
    for part in (IMAGE_FORMAT, base_commit, toolchain_key):
        digest.update(part.encode() + b"\0")
    for path in (task.task_file, task.solution_patch, task.tests_patch):
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:20]


def resolve_base(task: Task) -> str:
    try:
        commit = f"{task.base_commit}^{{commit}}"
        return git(task.repo, "rev-parse", "--verify", "--end-of-options", commit).strip()
    except GitFailed as exc:
        raise TaskError(
            f"task {task.id}: task.json: base_commit: {task.base_commit!r} is not a commit "
            f"of {task.repo.name}"
        ) from exc


def build_image(
    task: Task, cache_dir: Path, sandbox: Sandbox, *, setup_timeout_s: float = SETUP_TIMEOUT_S
) -> TaskImage:
    base = resolve_base(task)
    toolchain = ensure_toolchain(cache_dir)
    key = image_key(task, base, toolchain.key)
    root = cache_dir / "images" / f"{task.id}-{key}"
    if (root / MANIFEST).is_file():
        return _load(root, toolchain, cached=True)
    tests_patch = task.tests_patch.read_text()
    try:
        tests = patch_files(tests_patch)
        outside = [path for path in touched_paths(tests_patch) if not task.owns(path)]
    except TaskError as exc:
        raise TaskError(f"task {task.id}: tests.patch: {exc.message}") from exc
    if outside:
        raise TaskError(
            f"task {task.id}: tests.patch changes {', '.join(outside)}, outside test_paths "
            "(the grader reverts only test_paths, so the agent could edit those)"
        )
    stage = root.with_name(f".build-{task.id}-{uuid.uuid4().hex[:8]}")
    stage.mkdir(parents=True)
    try:
        events = _assemble(task, base, stage)
        events.append(
            DefenseEvent(
                DefenseKind.TESTS_WITHHELD,
                f"{len(tests)} test file(s) of tests.patch withheld until grading",
                tuple(tests),
            )
        )
        give_to_sandbox_user(stage / "workspace")
        if task.setup_command is not None:
            _setup(
                task, task.setup_command, stage / "workspace", toolchain, sandbox, setup_timeout_s
            )
        manifest = _Manifest(
            format=IMAGE_FORMAT,
            task_id=task.id,
            key=key,
            base_commit=base,
            tests=list(tests),
            toolchain=toolchain.key,
            events=[_Event(kind=e.kind, detail=e.detail, items=list(e.items)) for e in events],
        )
        (stage / MANIFEST).write_text(manifest.model_dump_json(indent=2))
        try:
            stage.rename(root)
        except OSError:
            if not (root / MANIFEST).is_file():
                raise
            shutil.rmtree(stage)  # a concurrent build finished first: the same image
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return _load(root, toolchain, cached=False)


def _assemble(task: Task, base: str, stage: Path) -> list[DefenseEvent]:
    """The bare real history and the one-commit workspace, in ``stage``."""
    history = stage / "history.git"
    try:
        git(stage, "clone", "--quiet", "--bare", "--no-hardlinks", str(task.repo), str(history))
        history.chmod(0o700)  # the grader's alone: no sandbox user may read it, even by mistake
        refs = git(task.repo, "for-each-ref", "--format=%(refname)").split()
        commits = int(git(task.repo, "rev-list", "--all", "--count").strip())
        workspace = stage / "workspace"
        workspace.mkdir()
        index = {"GIT_INDEX_FILE": str(stage / "base.index")}
        trees = (f"--git-dir={history}", f"--work-tree={workspace}")
        git(stage, *trees, "read-tree", base, env=index)
        git(stage, *trees, "checkout-index", "--all", env=index)
        (stage / "base.index").unlink()
        git(workspace, "init", "--quiet", "--template=", "--initial-branch=main")
        git(workspace, "config", "core.logAllRefUpdates", "false")
        git(workspace, "add", "--all", "--force")
        git(workspace, "commit", "--quiet", "--no-verify", "--allow-empty", "-m", "base")
    except GitFailed as exc:
        raise EnvSetupFailure(
            f"task {task.id}: the repository could not be checked out at {base}: {exc.stderr}",
            task_id=task.id,
            reason=f"checkout failed: {exc.stderr}",
        ) from exc
    for leftover in ("logs", "COMMIT_EDITMSG", "ORIG_HEAD", "index.lock"):
        path = workspace / ".git" / leftover
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    return [
        DefenseEvent(
            DefenseKind.HISTORY_HIDDEN,
            f"the agent's repository has 1 commit; the real history's {commits} commits "
            f"and {len(refs)} refs are kept apart",
            tuple(refs),
        )
    ]


def _setup(
    task: Task,
    command: str,
    workspace: Path,
    toolchain: Toolchain,
    sandbox: Sandbox,
    timeout_s: float,
) -> None:
    spec = none_spec(
        f"setup-{task.id}",
        mounts=(toolchain.mount, Mount(workspace, WORKSPACE_TARGET, writable=True)),
        env=toolchain.env,
        timeout_s=timeout_s,
    )
    try:
        result = sandbox.run(spec, ["sh", "-c", command])
    except SandboxError as exc:
        raise EnvSetupFailure(
            f"task {task.id}: no sandbox for setup_command: {exc.message}",
            task_id=task.id,
            reason=f"sandbox: {exc.message}",
        ) from exc
    if result.timed_out or result.returncode != 0:
        why = (
            f"setup_command timed out after {timeout_s:g} s"
            if result.timed_out
            else f"setup_command exited {result.returncode}"
        )
        output = (result.stdout + result.stderr).strip()[-_TAIL:]
        raise EnvSetupFailure(
            f"task {task.id}: {why}: {output}", task_id=task.id, reason=f"{why}: {output}"
        )


def _load(root: Path, toolchain: Toolchain, *, cached: bool) -> TaskImage:
    manifest = _Manifest.model_validate_json((root / MANIFEST).read_bytes())
    return TaskImage(
        task_id=manifest.task_id,
        key=manifest.key,
        root=root,
        base_commit=manifest.base_commit,
        workspace=root / "workspace",
        history=root / "history.git",
        tests=tuple(manifest.tests),
        mounts=(toolchain.mount,),
        env=MappingProxyType(dict(toolchain.env)),
        events=tuple(DefenseEvent(e.kind, e.detail, tuple(e.items)) for e in manifest.events),
        cached=cached,
    )
