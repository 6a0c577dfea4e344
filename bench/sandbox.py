"""Image caching in the bwrap sandbox, as Table 5 of LEGO-RL: each optimization against the
per-trial work it saves, measured in the same run, in interleaved rounds.

1. **Prebuilt task image**: a trial's sandbox setup from the cached image (``build_image``
   finds it) against building the task image for the trial (the one-commit repository,
   the kept-apart history, the setup command in its sandbox); then a fresh overlay
   workspace and a first command in it, both ways.
2. **Mounted agent runtime**: the harness install dir mounted read-only into the trial's
   sandbox against copied into it (``cp -a`` inside the sandbox, as a per-trial install
   from a host tarball does); then ``node --version`` and a look at the runtime, both
   ways. The runtime is the Codex CLI's npm tree that ``make harness-install`` leaves
   (``--runtime`` for another), else a generated tree of ``--runtime-mb``.
3. **Packaged grading toolchain**: the task's tests run in a fresh ``Network.NONE``
   grading sandbox with the toolchain packaged with the images, against a venv created
   and pytest installed into it at grade time from a local wheel dir (built here from the
   installed distributions: no network either way).

Each round runs every optimization once each way, the order flipped every round, so
drift and caches hit both sides alike. Printed per optimization: the median seconds with
and without, and the median of the per-round ratio without/with (the speed-up the
optimization buys; Table 5 reports 33x, 15x and 0.71x) with its p10-p90.

    python -m bench.sandbox [--rounds 5] [--runtime DIR | --runtime-mb 256]
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __package__:
    # Run as ``python bench/sandbox.py``: this directory comes first on sys.path, and this
    # file would shadow the ``sandbox`` package it measures.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    sys.path.remove(str(Path(__file__).resolve().parent))

import argparse
import base64
import hashlib
import os
import shutil
import statistics
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata

from sandbox.bwrap import Bwrap
from sandbox.spec import ExecResult, Mount, Sandbox
from tasks.generated import make_task
from tasks.images import TaskImage, build_image
from tasks.sandboxing import give_to_sandbox_user, none_spec
from tasks.spec import Task, load_task
from tasks.toolchain import DISTRIBUTIONS
from tasks.workspaces import new_workspace

ROUNDS = 5
RUNTIME = Path.home() / ".cache/lego-proxy/harness/npm/node_modules/@openai"
RUNTIME_MB = 256
RUNTIME_TARGET = "/opt/lego/agent"
WHEELS_TARGET = "/opt/lego/wheels"
TESTS = "python -m pytest -q -p no:cacheprovider tests"
PLAIN_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "LC_ALL": "C.UTF-8"}


@dataclass(frozen=True, slots=True)
class Case:
    """One optimization: a trial's step with it and without it."""

    name: str
    with_it: Callable[[Path], None]  # each gets a fresh directory of its own
    without_it: Callable[[Path], None]


@dataclass(frozen=True, slots=True)
class Row:
    name: str
    with_s: list[float]
    without_s: list[float]

    def ratios(self) -> list[float]:
        return [b / a for a, b in zip(self.with_s, self.without_s, strict=True)]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def checked(result: ExecResult, what: str) -> None:
    if result.timed_out or result.returncode != 0:
        output = (result.stdout + result.stderr).strip()[-1500:]
        raise SystemExit(f"{what} failed (exit {result.returncode}): {output}")


# -- 1. prebuilt task image ------------------------------------------------------------


def first_command(image: TaskImage, sandbox: Sandbox, trial: Path) -> None:
    """A fresh overlay over the image and one command in it: the rest of sandbox setup."""
    workspace = new_workspace(image, trial / "ws")
    spec = none_spec(
        "bench-setup", mounts=image.mounts, env=image.env, timeout_s=120, workspace=workspace
    )
    checked(sandbox.run(spec, ["git", "rev-parse", "HEAD"]), "the first command")


def image_case(task: Task, cache: Path, sandbox: Sandbox) -> Case:
    build_image(task, cache, sandbox)  # the prebuilt image every trial then finds

    def cached(trial: Path) -> None:
        image = build_image(task, cache, sandbox)
        assert image.cached
        first_command(image, sandbox, trial)

    def built(trial: Path) -> None:
        own = trial / "cache"
        own.mkdir()
        # The toolchain stays shared: packaging it is the third optimization, not this one.
        (own / "toolchains").symlink_to(cache / "toolchains")
        image = build_image(task, own, sandbox)
        assert not image.cached
        first_command(image, sandbox, trial)

    return Case("prebuilt task image", cached, built)


# -- 2. mounted agent runtime ----------------------------------------------------------


def generated_runtime(directory: Path, megabytes: int) -> Path:
    """A tree shaped like an npm install: many small files and a few large binaries."""
    root = directory / "runtime"
    large = max(1, megabytes // 64)
    for n in range(large):
        vendor = root / "pkg" / "vendor" / f"bin{n}"
        vendor.parent.mkdir(parents=True, exist_ok=True)
        vendor.write_bytes(os.urandom(megabytes * 2**20 // (2 * large)))
    small_total = megabytes * 2**20 // 2
    for n in range(1000):
        module = root / "pkg" / "node_modules" / f"m{n % 50}" / f"f{n}.js"
        module.parent.mkdir(parents=True, exist_ok=True)
        module.write_bytes(os.urandom(small_total // 1000))
    return root


def runtime_case(runtime: Path, sandbox: Sandbox) -> Case:
    look = f"node --version && ls {RUNTIME_TARGET} >/dev/null"

    def mounted(trial: Path) -> None:
        spec = none_spec(
            "bench-runtime",
            mounts=(Mount(runtime, RUNTIME_TARGET),),
            env=PLAIN_ENV,
            timeout_s=300,
        )
        checked(sandbox.run(spec, ["sh", "-c", look]), "the mounted runtime")

    def copied(trial: Path) -> None:
        into = trial / "agent"
        into.mkdir()
        spec = none_spec(
            "bench-runtime",
            mounts=(Mount(runtime, "/opt/lego/source"), Mount(into, RUNTIME_TARGET, True)),
            env=PLAIN_ENV,
            timeout_s=300,
        )
        copy = f"cp -a /opt/lego/source/. {RUNTIME_TARGET} && {look}"
        checked(sandbox.run(spec, ["sh", "-c", copy]), "the copied runtime")

    return Case("agent runtime mounted", mounted, copied)


# -- 3. packaged grading toolchain -----------------------------------------------------


def build_wheels(dest: Path) -> None:
    """Pure-Python wheels of the toolchain's distributions, from their installed files."""
    dest.mkdir(parents=True)
    for name in DISTRIBUTIONS:
        dist = metadata.distribution(name)
        base = Path(str(dist.locate_file(""))).resolve()
        info = next(str(f.parent) for f in dist.files or () if f.name == "METADATA")
        records: list[str] = []
        wheel = dest / f"{info.removesuffix('.dist-info')}-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
            for entry in dist.files or ():
                source = Path(str(dist.locate_file(entry))).resolve()
                if not source.is_relative_to(base) or source.suffix == ".pyc":
                    continue
                relative = source.relative_to(base).as_posix()
                if not source.is_file() or relative.endswith(("/RECORD", "/INSTALLER")):
                    continue
                data = source.read_bytes()
                archive.writestr(relative, data)
                digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
                records.append(f"{relative},sha256={digest.decode()},{len(data)}")
            records.append(f"{info}/RECORD,,")
            archive.writestr(f"{info}/RECORD", "\n".join(records) + "\n")


def grading_case(image: TaskImage, wheels: Path, sandbox: Sandbox) -> Case:
    def grade(trial: Path, mounts: tuple[Mount, ...], env: dict[str, str], script: str) -> None:
        workspace = new_workspace(image, trial / "ws")
        spec = none_spec("bench-grade", mounts=mounts, env=env, timeout_s=600, workspace=workspace)
        result = sandbox.run(spec, ["sh", "-c", script])
        # The base commit's tests pass; only the run's cost is measured here.
        checked(result, "the grading run")

    def packaged(trial: Path) -> None:
        grade(trial, image.mounts, {**PLAIN_ENV, **image.env}, TESTS)

    def installed(trial: Path) -> None:
        venv = "/tmp/venv"
        script = (
            f"python3 -m venv {venv} && {venv}/bin/pip install -q --no-index "
            f"--disable-pip-version-check --find-links {WHEELS_TARGET} pytest && "
            f"{venv}/bin/{TESTS}"
        )
        grade(trial, (Mount(wheels, WHEELS_TARGET),), PLAIN_ENV, script)

    return Case("grading toolchain packaged", packaged, installed)


# -- the run ---------------------------------------------------------------------------


def measure(cases: list[Case], rounds: int, scratch: Path) -> list[Row]:
    rows = [Row(case.name, [], []) for case in cases]
    for n in range(rounds):
        for case, row in zip(cases, rows, strict=True):
            sides = [(case.with_it, row.with_s), (case.without_it, row.without_s)]
            for step, times in sides if n % 2 == 0 else sides[::-1]:
                trial = Path(tempfile.mkdtemp(dir=scratch))
                give_to_sandbox_user(trial)
                began = time.perf_counter()
                step(trial)
                times.append(time.perf_counter() - began)
                shutil.rmtree(trial)
        print(f"round {n + 1}/{rounds} done", file=sys.stderr)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="interleaved rounds")
    parser.add_argument(
        "--runtime", type=Path, default=None, help=f"agent runtime to mount/copy ({RUNTIME})"
    )
    parser.add_argument(
        "--runtime-mb", type=int, default=RUNTIME_MB, help="size of a generated runtime"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-sandbox-") as directory:
        scratch = Path(directory)
        os.chmod(scratch, 0o755)  # the sandbox user walks into each trial's directory
        sandbox = Bwrap(runtime_dir=scratch / "sandbox-runtime")
        task = load_task(make_task(scratch / "pool", "calc-bench"))
        cache = scratch / "cache"
        runtime = args.runtime or (RUNTIME if RUNTIME.is_dir() else None)
        if runtime is None:
            runtime = generated_runtime(scratch, args.runtime_mb)
        wheels = scratch / "wheels"
        build_wheels(wheels)
        cases = [image_case(task, cache, sandbox), runtime_case(runtime, sandbox)]
        cases.append(grading_case(build_image(task, cache, sandbox), wheels, sandbox))
        size = sum(f.stat().st_size for f in runtime.rglob("*") if f.is_file())
        trials = scratch / "trials"
        trials.mkdir()
        rows = measure(cases, args.rounds, trials)
    print(f"bwrap, {args.rounds} rounds; agent runtime {runtime} ({size / 2**20:.0f} MiB)")
    header = ("optimization", "with s", "without s", "speed-up", "p10-p90")
    print("{:<28} {:>9} {:>10} {:>8} {:>15}".format(*header))
    for row in rows:
        ratios = row.ratios()
        spread = f"{percentile(ratios, 0.1):.1f}-{percentile(ratios, 0.9):.1f}x"
        print(
            f"{row.name:<28} {statistics.median(row.with_s):>9.3f} "
            f"{statistics.median(row.without_s):>10.3f} "
            f"{statistics.median(ratios):>7.1f}x {spread:>15}"
        )


if __name__ == "__main__":
    main()
