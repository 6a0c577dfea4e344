"""Bytes moved and seconds per weight sync: a checkpoint through the disk against a broadcast.

    python -m bench.weight_sync [--model DIR] [--workers 1] [--repeats 5]

One trainer (this process, the policy loaded from ``--model``: the tiny model by default)
publishes to ``--workers`` local engines on loopback, the same weights each way, through
``trainer_bridge.weights.WeightSync`` (pause, flush, update, continue on every worker):

- disk: ``save_checkpoint`` then ``publish`` (each worker loads the checkpoint). Bytes
  moved: the checkpoint written once (every file of its directory) plus its weight files
  read by every worker.
- distributed: ``checkpoint_tensors`` then ``publish_tensors`` (a gloo broadcast from this
  process). Bytes moved: the tensor bytes sent, once per worker (``bytes_broadcast``). The
  first sync also forms the group; it is timed apart.

``measure(...)`` returns the numbers (``SyncCosts``) for other benchmarks to call;
``main`` prints them with the disk/distributed ratios. Seconds are medians over
``repeats`` syncs, each one the trainer's whole cost of publishing a version.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from engine.config import EngineConfig
from engine.loopback import running_engine
from engine.tiny import ensure_tiny_model
from kernel.paths import default_model_dir
from trainer_bridge.policy import checkpoint_tensors, load_policy, save_checkpoint
from trainer_bridge.weights import WeightSync


@dataclass(frozen=True, slots=True)
class SyncCost:
    bytes_moved: int  # per sync, all workers together
    seconds: float  # median per sync


@dataclass(frozen=True, slots=True)
class SyncCosts:
    workers: int
    weight_bytes: int  # the policy's tensors, once
    disk: SyncCost
    distributed: SyncCost
    first_distributed_s: float  # the sync that formed the group

    @property
    def bytes_ratio(self) -> float:
        return self.disk.bytes_moved / self.distributed.bytes_moved

    @property
    def seconds_ratio(self) -> float:
        return self.disk.seconds / self.distributed.seconds


def _size(paths: Sequence[Path]) -> int:
    return sum(p.stat().st_size for p in paths if p.is_file())


def measure(model_dir: Path, *, workers: int = 1, repeats: int = 5) -> SyncCosts:
    """Publish ``repeats`` versions each way to ``workers`` fresh engines; the costs."""
    model = load_policy(model_dir)
    weight_bytes = sum(t.numel() * t.element_size() for _, t in checkpoint_tensors(model))
    config = EngineConfig(model_path=model_dir)
    with ExitStack() as stack:
        urls = [stack.enter_context(running_engine(config)) for _ in range(workers)]
        out = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="wsync-")))
        sync = stack.enter_context(WeightSync(",".join(urls)))
        disk_s: list[float] = []
        disk_bytes = 0
        for i in range(repeats):
            began = time.perf_counter()
            path = save_checkpoint(model, model_dir, out / f"disk-{i}")
            sync.publish(str(path), f"disk-{i}")
            disk_s.append(time.perf_counter() - began)
            files = list(path.iterdir())
            weights = [p for p in files if p.suffix == ".safetensors"]
            disk_bytes = _size(files) + workers * _size(weights)
        dist_s: list[float] = []
        for i in range(repeats + 1):
            began = time.perf_counter()
            sync.publish_tensors(checkpoint_tensors(model), f"dist-{i}")
            dist_s.append(time.perf_counter() - began)
        sent = sync.bytes_broadcast // (repeats + 1)
    return SyncCosts(
        workers=workers,
        weight_bytes=weight_bytes,
        disk=SyncCost(disk_bytes, statistics.median(disk_s)),
        distributed=SyncCost(sent, statistics.median(dist_s[1:])),
        first_distributed_s=dist_s[0],
    )


def report(costs: SyncCosts) -> str:
    mib = 1 << 20
    return "\n".join(
        [
            f"weights {costs.weight_bytes / mib:.2f} MiB, {costs.workers} worker(s)",
            f"{'':>12} {'MiB/sync':>10} {'ms/sync':>9}",
            f"{'disk':>12} {costs.disk.bytes_moved / mib:>10.2f} {costs.disk.seconds * 1e3:>9.1f}",
            f"{'distributed':>12} {costs.distributed.bytes_moved / mib:>10.2f} "
            f"{costs.distributed.seconds * 1e3:>9.1f}"
            f"   (first, forming the group: {costs.first_distributed_s * 1e3:.1f} ms)",
            f"disk/distributed: bytes {costs.bytes_ratio:.2f}x, seconds {costs.seconds_ratio:.2f}x",
        ]
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="default: the tiny model")
    parser.add_argument("--workers", type=int, default=1, help="local engines to sync")
    parser.add_argument("--repeats", type=int, default=5, help="syncs per mode")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model or ensure_tiny_model(default_model_dir(Path(tmp)))
        print(report(measure(model_dir, workers=args.workers, repeats=args.repeats)))


if __name__ == "__main__":
    main()
