"""``lego-proxy tasks``: validate a task pool, import SWE-bench instances into one.

    lego-proxy tasks validate POOL [--cache DIR] [--sandbox bwrap|podman|docker] [--image I]
    lego-proxy tasks import-swebench INSTANCES.jsonl --repos DIR --out POOL

``validate`` prints one JSON line per task (``{"task", "status", "reason", "cached"}``,
status ``valid``, ``invalid`` or ``env_setup_failure``) and then one summary line
(``{"summary": {"valid": n, ...}}``); it exits 0 when it ran, whatever the verdicts.
``import-swebench`` prints one JSON line per instance written and a summary line.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from sandbox.backends import BACKENDS, make_sandbox

DEFAULT_CACHE = ".cache"  # under the pool: the pool loader skips hidden directories


def add_parser(commands: Any) -> None:
    """Registers ``tasks`` on the top-level subcommand set."""
    tasks = commands.add_parser("tasks", help="coding-task pools: validate, import SWE-bench")
    sub = tasks.add_subparsers(dest="tasks_command", required=True, metavar="COMMAND")

    validate = sub.add_parser(
        "validate",
        help="build each task's image and check its grader",
        description="Builds each task's image once (cached), grades the reference patch "
        "(must resolve) and the empty patch (must not). One JSON line per task, then a "
        "summary; invalid tasks are left out of rollouts.",
    )
    validate.add_argument("pool", type=Path, metavar="POOL")
    validate.add_argument(
        "--cache", type=Path, default=None, help=f"image and verdict cache (POOL/{DEFAULT_CACHE})"
    )
    validate.add_argument("--sandbox", choices=BACKENDS, default="bwrap")
    validate.add_argument(
        "--image", default=None, help="the container image (podman, docker): the toolchain's root"
    )
    validate.set_defaults(func=_validate)

    imports = sub.add_parser(
        "import-swebench",
        help="convert SWE-bench instances into a task pool",
        description="Converts SWE-bench instances (JSON lines, the swebench package's "
        "schema) into POOL/<instance_id>/, given local clones of their repositories in "
        "DIR/<owner>__<name> (or DIR/<owner>/<name>).",
    )
    imports.add_argument("instances", type=Path, metavar="INSTANCES.jsonl")
    imports.add_argument("--repos", type=Path, required=True, metavar="DIR")
    imports.add_argument("--out", type=Path, required=True, metavar="POOL")
    imports.add_argument(
        "--test-command",
        default=None,
        help="the tasks' test_command (default: python -m pytest -q -rA {tests})",
    )
    imports.add_argument(
        "--setup-command", default=None, help="the tasks' setup_command (default: none)"
    )
    imports.set_defaults(func=_import_swebench)


def _validate(args: argparse.Namespace) -> None:
    from tasks.pool import load_pool
    from tasks.validate import validate_pool

    pool = load_pool(args.pool)
    cache = args.cache if args.cache is not None else args.pool / DEFAULT_CACHE
    counts: Counter[str] = Counter()
    for verdict in validate_pool(pool, cache, make_sandbox(args.sandbox, image=args.image)):
        counts[verdict.verdict.value] += 1
        print(json.dumps(verdict.as_json()), flush=True)
    summary = {key: counts[key] for key in ("valid", "invalid", "env_setup_failure")}
    print(json.dumps({"summary": {**summary, "total": sum(counts.values())}}), flush=True)


def _import_swebench(args: argparse.Namespace) -> None:
    from tasks.swebench_import import import_instances

    written = import_instances(
        args.instances,
        repos=args.repos,
        out=args.out,
        test_command=args.test_command,
        setup_command=args.setup_command,
    )
    for task_dir in written:
        print(json.dumps({"task": task_dir.name, "path": str(task_dir)}), flush=True)
    print(json.dumps({"summary": {"imported": len(written)}}), file=sys.stdout, flush=True)
