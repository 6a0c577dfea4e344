"""``lego-proxy rollout``: a real harness on every task of a pool, in sandboxes, graded.

    lego-proxy rollout --proxy-url URL --admin-key KEY --run-id RUN --tasks POOL
        --harness {claude-code,opencode,codex,openhands} --group-size N
        [--concurrency C] [--sandbox bwrap|podman|docker [--sandbox-image I]]
        [--epochs E] [--harness-dir DIR] [--cache DIR]

The pool is validated first (``tasks.validate``: remembered per task, so only new or
edited tasks cost anything): ``invalid`` tasks are left out and named; a task whose
image cannot be built still gets its trials, each finished as an excluded
``env_setup_failure`` (the orchestrator asked for those samples; the record says why
they are missing). Then ``rollouts.runner`` runs the trials, printing one line per
trial, and the summary (trials by termination, Table 4's stage times) at the end.
"""

from __future__ import annotations

import argparse
import os
import sys
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from kernel.errors import ConfigurationError
from rollouts.control import ControlClient
from rollouts.harnesses import HARNESSES, Endpoint
from rollouts.runner import RolloutConfig, Trial, run_rollout
from rollouts.stages import Stopwatch
from rollouts.summary import Summary
from rollouts.trial import TrialResult, TrialSetup, proxy_route, run_trial
from sandbox.backends import BACKENDS, make_sandbox
from sandbox.spec import Sandbox
from tasks.pool import load_pool
from tasks.spec import Task
from tasks.validate import Verdict, validate_pool


def default_harness_dir() -> Path:
    """Where ``make harness-install`` puts the CLIs (``tests/harness/install.sh``)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "lego-proxy" / "harness"


def positive(value: str) -> int:
    """An argparse type: an integer of at least 1."""
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {number}")
    return number


def harness_dir_of(given: Path | None) -> Path:
    """The harness CLIs' directory (``--harness-dir`` or the install's), checked."""
    harness_dir = given or default_harness_dir()
    if not (harness_dir / "npm").is_dir() and not (harness_dir / "py312").is_dir():
        raise ConfigurationError(
            f"no harness CLIs in {harness_dir}: run `make harness-install` or pass --harness-dir"
        )
    return harness_dir


def trial_function(sandbox: Sandbox, cache: Path, harness_dir: Path, proxy_url: str) -> Trial:
    """``rollouts.trial.run_trial`` bound to one setup: trials in ``sandbox`` reaching the
    proxy at ``proxy_url``, images and scratch space under ``cache``."""
    host, port = proxy_host_port(proxy_url)
    scratch = cache / "trials"
    scratch.mkdir(parents=True, exist_ok=True)
    setup = TrialSetup(
        sandbox=sandbox,
        grader_sandbox=sandbox,
        cache_dir=cache,
        scratch_dir=scratch,
        runtime_dir=harness_dir.resolve(),
        proxy=proxy_route(host, port),
    )
    return partial(_trial, setup=setup)


def print_progress(line: str) -> None:
    print(line, file=sys.stdout, flush=True)


def add_parser(commands: Any) -> None:
    """Registers ``rollout`` on the top-level subcommand set."""
    parser = commands.add_parser(
        "rollout",
        help="run a real harness on every task of a pool, sandboxed and graded",
        description=__doc__.split("\n\n", 2)[2] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--proxy-url", required=True, help="the proxy, as this machine reaches it")
    parser.add_argument(
        "--admin-key",
        default=os.environ.get("LEGO_ADMIN_KEY"),
        help="the proxy's admin key (default: $LEGO_ADMIN_KEY)",
    )
    parser.add_argument("--run-id", required=True, help="an existing run (POST /api/v1/runs)")
    parser.add_argument("--tasks", required=True, type=Path, help="the pool: POOL/<task_id>/")
    parser.add_argument("--harness", required=True, choices=HARNESSES)
    parser.add_argument("--group-size", required=True, type=positive, help="samples per task")
    parser.add_argument("--concurrency", type=positive, default=1, help="trials at a time")
    parser.add_argument("--sandbox", choices=BACKENDS, default="bwrap")
    parser.add_argument(
        "--sandbox-image",
        default=None,
        help="podman/docker: the image the trials run in (it must hold the task's toolchain "
        "and what the harness needs, e.g. node; bwrap uses the host's /usr)",
    )
    parser.add_argument("--epochs", type=positive, default=1, help="passes over the pool")
    parser.add_argument(
        "--harness-dir",
        type=Path,
        default=None,
        help="the installed harness CLIs (default: make harness-install's cache)",
    )
    parser.add_argument(
        "--cache", type=Path, default=None, help="task images and verdicts (default: POOL/.cache)"
    )
    parser.set_defaults(func=run)


def proxy_host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ConfigurationError(f"--proxy-url {url!r}: expected http://HOST:PORT")
    return parts.hostname, parts.port or 80


def select_tasks(pool_dir: Path, cache: Path, sandbox: Sandbox) -> list[Task]:
    """The tasks that get trials: valid ones, and those whose image cannot be built."""
    pool = load_pool(pool_dir)
    verdicts = {v.task_id: v for v in validate_pool(pool, cache, sandbox)}
    for verdict in verdicts.values():
        if verdict.verdict is not Verdict.VALID:
            print(f"task {verdict.task_id}: {verdict.verdict.value}: {verdict.reason}")
    keep = {Verdict.VALID, Verdict.ENV_SETUP_FAILURE}
    return [task for task in pool.tasks if verdicts[task.id].verdict in keep]


def run(args: argparse.Namespace) -> None:
    if not args.admin_key:
        raise ConfigurationError("--admin-key (or LEGO_ADMIN_KEY) is required")
    harness_dir = harness_dir_of(args.harness_dir)
    proxy_host_port(args.proxy_url)  # a wrong URL is refused before anything is built
    cache: Path = args.cache or args.tasks / ".cache"
    config = RolloutConfig(
        run_id=args.run_id,
        harness=args.harness,
        group_size=args.group_size,
        epochs=args.epochs,
        concurrency=args.concurrency,
    )
    sandbox = make_sandbox(args.sandbox, image=args.sandbox_image)
    with ControlClient(args.proxy_url, args.admin_key) as control:
        control.check_run(config.run_id)  # before any image is built
        tasks = select_tasks(args.tasks, cache, sandbox)
        trial = trial_function(sandbox, cache, harness_dir, args.proxy_url)
        print(f"{len(tasks)} task(s) x {config.group_size} sample(s) x {config.epochs} epoch(s)")
        done = run_rollout(control, tasks, config, trial, print_progress)
    print(Summary.of(done).render())


def _trial(
    task: Task, harness: str, endpoint: Endpoint, watch: Stopwatch, *, setup: TrialSetup
) -> TrialResult:
    return run_trial(task, harness, endpoint, setup, watch)
