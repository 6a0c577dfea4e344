"""Trainer benchmarks: one step's throughput at 1 and 2 data-parallel ranks, and the bytes
a weight sync moves, by disk and by broadcast.

    python -m bench.trainer [--ranks 1 2] [--threads-per-rank 1] [--steps 3] [--groups 8]
                            [--group-size 4] [--tokens 128] [--micro-batch-tokens 512]
                            [--sync-workers 1] [--sync-repeats 3]

(As a module: run as a script, ``bench/`` would shadow the ``recorder`` package.)

Each measurement is one function ``(args, workdir) -> list[Row]`` in ``MEASUREMENTS``; its
first row is its baseline, measured in the same run, and the printed table gives every
row's ratio to it. A new measurement is one more function and one more entry.

``step_throughput``: the tiny model on the CPU, a fixed synthetic batch (``--groups`` prompt
groups of ``--group-size`` sessions of about ``--tokens`` tokens each, recorded routing,
rewards that differ within groups), the production step (routing replay, the KL reference,
GSPO, AdamW), micro-batches of at most ``--micro-batch-tokens``. The cap matters: a packed
row's attention costs its length squared on the CPU (the block-diagonal mask skips no
work), so with a cap above a shard's size, N ranks would also pack N times shorter rows and
the ratio would mix that gain into data parallelism's. Each rank count runs under
``torchrun`` (the 1-rank baseline too, so both pay the same harness), with
``--threads-per-rank`` threads each (``OMP_NUM_THREADS``); one more row runs 1 rank with as
many threads as the most ranks hold in all, to compare ranks and intra-op threads on the
same cores. One untimed step warms up; each timed step runs from rank 0 dealing the batch
out to every rank having stepped (barriers on both sides), and the median over ``--steps``
is reported as the batch's tokens per second. Timings on a machine shared with other work
say little: ranks need free cores, and OpenMP threads stall on busy ones.

``sync_bytes``: ``bench.weight_sync.measure`` against ``--sync-workers`` local engines: per
sync, the checkpoint written and read by every worker (disk, the baseline) against the
tensors broadcast over the weight-update group (distributed), and the median seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

if not __package__:
    # Run as ``python bench/trainer.py``: the repository, not this directory, must be on
    # sys.path for ``bench.weight_sync`` (a sibling) to import.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from bench import weight_sync
from engine.tiny import ensure_tiny_model
from kernel.paths import default_model_dir
from trainer_bridge.config import TrainConfig
from trainer_bridge.distributed import joined
from trainer_bridge.samples import Sample
from trainer_bridge.sharding import deal
from trainer_bridge.train import optimize, prepare

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True, slots=True)
class Row:
    measurement: str
    setting: str
    value: float
    unit: str
    detail: str = ""


Measurement = Callable[[argparse.Namespace, Path], list[Row]]


# --- step throughput -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TimedSteps:
    tokens: int  # in the whole batch
    seconds: tuple[float, ...]  # per timed step
    threads: int  # per rank


def _batch(groups: int, group_size: int, tokens: int, seed: int = 0) -> list[Sample]:
    rng = np.random.default_rng(seed)
    samples = []
    for g in range(groups):
        for i in range(group_size):
            n = int(rng.integers(tokens * 3 // 4, tokens * 5 // 4 + 1))
            mask = np.zeros(n, np.uint8)
            mask[n // 4 :] = 1  # a prompt, then the response
            experts = np.argsort(rng.random((n, 4, 8)), axis=-1)[..., :2].astype(np.uint8)
            samples.append(
                Sample(
                    tokens=rng.integers(1, 4000, n).astype(np.int32),
                    loss_mask=mask,
                    rollout_logprobs=np.where(mask == 1, -1.0, 0.0).astype(np.float32),
                    routed_experts=experts,
                    reward=float(i % 2),
                    group_id=f"g{g}",
                    session_id=f"g{g}-s{i}",
                    weight_versions=("v0",),
                )
            )
    return samples


def _step_worker(args: argparse.Namespace) -> None:
    """One rank under torchrun: time ``args.steps`` steps; rank 0 writes ``args.worker``."""
    model_dir = ensure_tiny_model(default_model_dir(Path(args.model_root)))
    batch = _batch(args.groups, args.group_size, args.tokens)
    config = TrainConfig(
        model_path=str(model_dir), lr=1e-4, max_tokens_per_micro_batch=args.micro_batch_tokens
    )
    with joined("cpu", timeout_s=600) as world:
        model, optimizer, reference = prepare(config, world)
        seconds = []
        for step in range(args.steps + 1):
            world.barrier()
            began = time.perf_counter()
            shard = deal(world, batch if world.is_leader else None)
            assert shard is not None
            optimize(model, optimizer, reference, shard, config, world)
            world.barrier()
            if step > 0:  # the first step warms up
                seconds.append(time.perf_counter() - began)
        if world.is_leader:
            tokens = sum(len(s) for s in batch)
            Path(args.worker).write_text(json.dumps({"tokens": tokens, "seconds": seconds}))


def _torchrun_steps(
    args: argparse.Namespace, workdir: Path, ranks: int, threads: int
) -> TimedSteps:
    out = workdir / f"steps-{ranks}x{threads}.json"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": str(threads),
    }
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc_per_node", str(ranks), "-m", "bench.trainer", "--worker", str(out)]
    command += ["--model-root", str(workdir), "--steps", str(args.steps)]
    command += ["--groups", str(args.groups), "--group-size", str(args.group_size)]
    command += ["--tokens", str(args.tokens), "--micro-batch-tokens", str(args.micro_batch_tokens)]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{ranks} ranks failed:\n{done.stdout[-2000:]}{done.stderr[-4000:]}")
    result = json.loads(out.read_text())
    return TimedSteps(int(result["tokens"]), tuple(map(float, result["seconds"])), threads)


def step_throughput(args: argparse.Namespace, workdir: Path) -> list[Row]:
    """Tokens per second of one step: 1 rank (the baseline), each of ``--ranks``, and 1 rank
    with as many threads as the most ranks have cores (the same cores, used by intra-op
    threads instead of ranks)."""
    threads = args.threads_per_rank
    most = max(args.ranks)
    settings = [(1, threads)] + [(r, threads) for r in args.ranks if r > 1]
    if most > 1:
        settings.append((1, most * threads))
    rows = []
    for ranks, per_rank in settings:
        timed = _torchrun_steps(args, workdir, ranks, per_rank)
        median = statistics.median(timed.seconds)
        detail = f"{timed.tokens} tokens/step, {median:.3f} s/step (median of {len(timed.seconds)})"
        setting = f"{ranks} rank(s) x {per_rank} thread(s)"
        rows.append(Row("step throughput", setting, timed.tokens / median, "tokens/s", detail))
    return rows


# --- weight sync -------------------------------------------------------------------------


def sync_bytes(args: argparse.Namespace, workdir: Path) -> list[Row]:
    """Bytes moved per weight sync to ``--sync-workers`` local engines: by disk (the
    baseline: the checkpoint written, then read by each worker) and by broadcast over the
    weight-update group (``bench.weight_sync``)."""
    model_dir = ensure_tiny_model(default_model_dir(workdir))
    costs = weight_sync.measure(model_dir, workers=args.sync_workers, repeats=args.sync_repeats)
    rows = []
    for mode, cost in (("disk", costs.disk), ("distributed", costs.distributed)):
        detail = f"{cost.seconds * 1000:.0f} ms/sync (median), {costs.workers} worker(s)"
        rows.append(Row("bytes per weight sync", mode, cost.bytes_moved / 2**20, "MiB", detail))
    return rows


# --- the table -----------------------------------------------------------------------------

MEASUREMENTS: tuple[Measurement, ...] = (step_throughput, sync_bytes)


def table(rows_by_measurement: list[list[Row]]) -> str:
    lines = [
        "| measurement | setting | value | unit | vs baseline | detail |",
        "| --- | --- | ---: | --- | ---: | --- |",
    ]
    for rows in rows_by_measurement:
        baseline = rows[0].value
        for row in rows:
            ratio = f"{row.value / baseline:.2f}x" if baseline else "-"
            lines.append(
                f"| {row.measurement} | {row.setting} | {row.value:,.1f} | {row.unit} | "
                f"{ratio} | {row.detail} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.trainer", description=__doc__)
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--steps", type=int, default=3, help="timed steps per setting")
    parser.add_argument("--threads-per-rank", type=int, default=1, help="OMP_NUM_THREADS")
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=128, help="tokens per sample, about")
    parser.add_argument(
        "--micro-batch-tokens",
        type=int,
        default=512,
        help="packed row length cap (attention is quadratic in it: keep it below a shard)",
    )
    parser.add_argument("--sync-workers", type=int, default=1, help="engines a sync reaches")
    parser.add_argument("--sync-repeats", type=int, default=3, help="syncs timed per mode")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # set when run as one rank
    parser.add_argument("--model-root", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _step_worker(args)
        return
    with tempfile.TemporaryDirectory(prefix="lego-bench-trainer-") as workdir:
        results = [measure(args, Path(workdir)) for measure in MEASUREMENTS]
    print(table(results))


if __name__ == "__main__":
    main()
