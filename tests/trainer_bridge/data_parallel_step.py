"""Two optimizer steps on fixed batches, in this process or as one rank under torchrun.

``steps(model_dir, world)`` builds the same batches on every call (seeded, built directly as
``Sample``s: groups of unequal sizes and lengths, a zero-variance group, a session with two
segments, recorded routing), lets rank 0 deal each batch out, and takes ``optimize`` steps.

    python -m torch.distributed.run --standalone --nproc_per_node 2 \\
        -m tests.trainer_bridge.data_parallel_step MODEL_DIR OUT_DIR

writes ``OUT_DIR/rank-R.pt`` per rank: its parameters, its outcomes and its shards' sizes.
"""

from __future__ import annotations

import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainer_bridge.config import TrainConfig
from trainer_bridge.distributed import World, joined
from trainer_bridge.samples import Sample
from trainer_bridge.sharding import deal
from trainer_bridge.train import StepOutcome, optimize, prepare

# (sessions, their lengths, rewards cycle) per group: long and short groups, so the ranks'
# shards hold equal tokens but unequal sequence counts (a loss normalised per rank would
# then weigh the ranks' sequences differently, and the test would see it).
GROUPS = [
    (2, (40, 64), (1.0, 0.0)),
    (3, (24, 40), (0.0, 1.0, 0.5)),
    (2, (24, 40), (1.0,)),  # zero variance: advantages 0
    (6, (10, 16), (0.0, 0.0, 1.0)),
    (1, (10, 16), (1.0,)),
]
LAYERS, EXPERTS, TOP_K = 4, 8, 2  # the tiny model's


def config(model_dir: Path) -> TrainConfig:
    return TrainConfig(
        model_path=str(model_dir),
        lr=1e-4,
        kl_coef=0.1,  # from the second step on the policy has moved: the KL term has a gradient
        max_tokens_per_micro_batch=100,  # several micro-batches per rank: accumulation
    )


def _sample(
    rng: np.random.Generator, lengths: tuple[int, int], group: str, session: str, reward: float
) -> Sample:
    n = int(rng.integers(*lengths))
    prompt = int(rng.integers(4, n // 2))
    mask = np.zeros(n, np.uint8)
    mask[prompt:] = 1
    mask[prompt + (n - prompt) // 2] = 0  # a tool result in the middle of the response
    logprobs = np.where(mask == 1, rng.uniform(-4.0, 0.0, n), 0.0).astype(np.float32)
    experts = np.argsort(rng.random((n, LAYERS, EXPERTS)), axis=-1)[..., :TOP_K]
    return Sample(
        tokens=rng.integers(1, 4000, n).astype(np.int32),
        loss_mask=mask,
        rollout_logprobs=logprobs,
        routed_experts=experts.astype(np.uint8),
        reward=reward,
        group_id=group,
        session_id=session,
        weight_versions=("v0",),
    )


def batch(seed: int) -> list[Sample]:
    rng = np.random.default_rng(seed)
    samples = []
    for g, (sessions, lengths, rewards) in enumerate(GROUPS):
        for i in range(sessions):
            segments = 2 if (g, i) == (1, 0) else 1  # a forked session: two segments
            for _ in range(segments):
                reward = rewards[i % len(rewards)]
                samples.append(_sample(rng, lengths, f"b{seed}-g{g}", f"b{seed}-g{g}-s{i}", reward))
    return samples


def steps(model_dir: Path, world: World) -> tuple[list[StepOutcome], list[int], torch.nn.Module]:
    """``(outcome per step, this rank's shard size per step, the model after)``."""
    cfg = config(model_dir)
    model, optimizer, reference = prepare(cfg, world)
    outcomes, sizes = [], []
    for seed in (1, 2):
        shard = deal(world, batch(seed) if world.is_leader else None)
        assert shard is not None
        sizes.append(len(shard))
        outcomes.append(optimize(model, optimizer, reference, shard, cfg, world))
    return outcomes, sizes, model


def main(argv: list[str]) -> None:
    model_dir, out = Path(argv[0]), Path(argv[1])
    with joined("cpu", timeout_s=120) as world:
        outcomes, sizes, model = steps(model_dir, world)
        record: dict[str, Any] = {
            "outcomes": [asdict(o) for o in outcomes],
            "sizes": sizes,
            "params": {k: v.detach().clone() for k, v in model.state_dict().items()},
        }
        torch.save(record, out / f"rank-{world.rank}.pt")


if __name__ == "__main__":
    main(sys.argv[1:])
