"""``lego-proxy loop``: validate, roll out, train, push weights, roll out again, as one job.

    lego-proxy loop --tasks POOL --harness codex --group-size 4 --steps 3
        [--held-out POOL --validate-every K] [--set-aside-after E] [--collapse RULE ...]
        [--proxy-url URL --admin-key KEY [--backend-url URL --model-path DIR | --trainer external]]

With no ``--proxy-url`` it starts the embedded default in ``--data-dir``: the local CPU
engine (tiny model; ``--engine-args`` e.g. ``--script policy.json``) and ``lego-proxy
serve`` on a SQLite file; the trainer runs in this process and publishes each step's
weights to that engine. Pointed at a deployment, the same loop drives a real SGLang router
(``--backend-url``: where the trainer publishes weights), Postgres behind the proxy, and
either a trainer here (``--model-path``) or one on other machines (``--trainer external``:
the loop watches its steps). docs/loop.md describes each phase.
"""

from __future__ import annotations

import argparse
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from cli.rollout_cmd import (
    harness_dir_of,
    positive,
    print_progress,
    select_tasks,
    trial_function,
)
from kernel.errors import ConfigurationError
from loop.collapse import DEFAULT_RULES, CollapseRule, parse_rule
from loop.orchestrator import LoopConfig, LoopParts, Train, run_loop
from loop.stack import Endpoints, embedded_stack
from loop.trainers import external_trainer, local_trainer
from rollouts.control import ControlClient
from rollouts.harnesses import HARNESSES
from sandbox.backends import BACKENDS, make_sandbox
from tasks.spec import Task
from trainer_bridge.config import TrainConfig


def _not_negative(value: str) -> int:
    number = int(value)
    if number < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, not {number}")
    return number


def _temperature(value: str) -> float:
    number = float(value)
    if not 0.0 <= number <= 2.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 2, not {number}")
    return number


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "loop",
        help="the closed loop: validate, roll out, train, push weights, repeat",
        description=__doc__.split("\n\n", 2)[2] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    data = parser.add_argument_group("data")
    data.add_argument("--tasks", required=True, type=Path, help="the training pool")
    data.add_argument("--held-out", type=Path, default=None, help="the held-out pool")
    data.add_argument("--cache", type=Path, default=None, help="default: POOL/.cache")
    work = parser.add_argument_group("rollouts")
    work.add_argument("--harness", required=True, choices=HARNESSES)
    work.add_argument("--group-size", required=True, type=positive)
    work.add_argument("--concurrency", type=positive, default=1, help="trials at a time")
    work.add_argument("--sandbox", choices=BACKENDS, default="bwrap")
    work.add_argument("--sandbox-image", default=None, help="podman/docker: the trial image")
    work.add_argument("--harness-dir", type=Path, default=None, help="the installed CLIs")
    work.add_argument(
        "--check-trials",
        type=_not_negative,
        default=2,
        help="trials of the validation run (0: none)",
    )
    train = parser.add_argument_group("training")
    train.add_argument("--steps", required=True, type=positive, help="trainer steps")
    train.add_argument("--validate-every", type=positive, default=None, help="K steps")
    train.add_argument("--validation-temperature", type=_temperature, default=0.7)
    train.add_argument(
        "--max-staleness", type=_not_negative, default=1, help="epochs ahead of the trainer"
    )
    train.add_argument(
        "--set-aside-after",
        type=positive,
        default=None,
        help="set aside tasks at 0/N or N/N for the last E epochs (default: never)",
    )
    train.add_argument(
        "--collapse",
        action="append",
        default=None,
        metavar="SERIES:DIRECTION[:T[:MIN_STEPS]]",
        help="an early-stop rule (repeatable; 'none': no rule; default: "
        + ", ".join(str(r) for r in DEFAULT_RULES)
        + ")",
    )
    train.add_argument("--on-collapse", choices=("stop", "pause"), default="stop")
    train.add_argument("--groups-per-step", type=positive, default=None, help="default: tasks")
    train.add_argument("--lr", type=float, default=1e-6)
    train.add_argument("--kl-coef", type=float, default=1e-3)
    where = parser.add_argument_group("components (default: the embedded stack in --data-dir)")
    where.add_argument("--data-dir", type=Path, default=Path("lego-loop"))
    where.add_argument("--engine-args", default="", help="the embedded engine's extra flags")
    where.add_argument("--proxy-url", default=None)
    where.add_argument("--admin-key", default=None)
    where.add_argument("--backend-url", default=None, help="where the trainer pushes weights")
    where.add_argument("--model-path", type=Path, default=None, help="the initial policy")
    where.add_argument("--trainer", choices=("local", "external"), default="local")
    where.add_argument("--run-name", default=None, help="default: loop-<time>")
    parser.set_defaults(func=run)


def collapse_rules(values: list[str] | None) -> tuple[CollapseRule, ...]:
    if values is None:
        return DEFAULT_RULES
    if values == ["none"]:
        return ()
    return tuple(parse_rule(value) for value in values)


def run(args: argparse.Namespace) -> None:
    harness_dir = harness_dir_of(args.harness_dir)
    rules = collapse_rules(args.collapse)
    with ExitStack() as stack:
        if args.proxy_url is None:
            print(f"starting the embedded engine and proxy in {args.data_dir}", flush=True)
            endpoints = stack.enter_context(embedded_stack(args.data_dir, args.engine_args))
        else:
            if not args.admin_key:
                raise ConfigurationError("--admin-key is required with --proxy-url")
            model = args.model_path
            if args.trainer == "local" and (args.backend_url is None or model is None):
                raise ConfigurationError(
                    "a local trainer needs --backend-url and --model-path (or --trainer external)"
                )
            endpoints = Endpoints(args.proxy_url, args.admin_key, args.backend_url, model)
        control = stack.enter_context(ControlClient(endpoints.proxy_url, endpoints.admin_key))
        run_id = control.create_run(args.run_name or f"loop-{time.strftime('%Y%m%d-%H%M%S')}")
        print(f"run {run_id} on {endpoints.proxy_url}", flush=True)
        cache: Path = args.cache or args.tasks / ".cache"
        sandbox = make_sandbox(args.sandbox, image=args.sandbox_image)
        tasks = select_tasks(args.tasks, cache, sandbox)
        held_out: list[Task] = []
        if args.held_out is not None:
            held_out = select_tasks(args.held_out, args.held_out / ".cache", sandbox)
        config = LoopConfig(
            run_id=run_id,
            harness=args.harness,
            group_size=args.group_size,
            steps=args.steps,
            concurrency=args.concurrency,
            check_trials=args.check_trials,
            validate_every=args.validate_every,
            validation_temperature=args.validation_temperature,
            max_staleness=args.max_staleness,
            set_aside_after=args.set_aside_after,
            collapse_rules=rules,
            on_collapse=args.on_collapse,
        )
        parts = LoopParts(
            control=control,
            trial=trial_function(sandbox, cache, harness_dir, endpoints.proxy_url),
            tasks=tasks,
            held_out=held_out,
            train=_trainer(args, endpoints, run_id, control, len(tasks), args.data_dir),
            progress=print_progress,
        )
        result = run_loop(config, parts)
        print(result.render(), flush=True)
        print(f"Live UI: {endpoints.proxy_url}/ui/runs/{run_id}", flush=True)


def _trainer(
    args: argparse.Namespace,
    endpoints: Endpoints,
    run_id: str,
    control: ControlClient,
    tasks: int,
    data_dir: Path,
) -> Train:
    if args.trainer == "external":
        return external_trainer(control, run_id)
    assert endpoints.backend_url is not None, "checked in run()"
    assert endpoints.model_path is not None, "checked in run()"
    config = TrainConfig(
        model_path=str(endpoints.model_path),
        proxy_url=endpoints.proxy_url,
        admin_key=endpoints.admin_key,
        run_id=run_id,
        backend_url=endpoints.backend_url,
        output_dir=str(data_dir / "checkpoints" / run_id),
        steps=args.steps,
        groups_per_step=args.groups_per_step or max(1, tasks),
        max_staleness=args.max_staleness,
        poll_interval_s=0.5,
        lr=args.lr,
        kl_coef=args.kl_coef,
    )
    return local_trainer(config)
