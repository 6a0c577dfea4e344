"""``TrainConfig``: the trainer's one configuration, with command-line overrides.

Owns ``TrainConfig`` (frozen) and ``config_from_args(argv)``. Defaults are LEGO-RL's
production hyperparameters (Table 10: GSPO with clip range (3e-4, 4e-4), GRPO advantages,
seq-mean-token-mean, KL loss 1e-3, constant lr 1e-6, grad clip 1.0, 64 prompts per batch,
staleness threshold 1, 126 steps); a small-model demo overrides what it must
(``--lr 1e-4 --steps 5 ...``). Every field is a flag: ``--field-name VALUE``; booleans take
``--replay/--no-replay``; a field whose default is None takes ``none`` to stay unset.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import MISSING, dataclass, fields

from kernel.errors import ConfigurationError


@dataclass(frozen=True, slots=True)
class TrainConfig:
    model_path: str  # the initial policy checkpoint (a transformers directory)
    proxy_url: str = "http://127.0.0.1:8000"
    admin_key: str = ""
    run_id: str = ""
    backend_url: str = "http://127.0.0.1:30000"
    output_dir: str = "checkpoints"  # one sub-directory per published weight version
    version_prefix: str = "step-"
    # Weight sync: "disk" (each worker loads the saved checkpoint) or "distributed" (the
    # trainer broadcasts the weights to every worker over a process group; trainer_bridge.
    # broadcast). With "distributed" the checkpoints are written only if save_checkpoints.
    weight_sync: str = "disk"
    save_checkpoints: bool = True
    weight_sync_address: str = "127.0.0.1"  # this trainer, as the workers reach it
    weight_sync_port: int = 0  # 0: a free port each time the group forms
    weight_sync_backend: str = "gloo"  # "nccl" when trainer and workers are on GPUs
    weight_sync_bucket_mb: int = 512
    # Data
    steps: int = 126
    groups_per_step: int = 64
    max_staleness: int | None = 1
    lease_s: float = 600.0
    poll_interval_s: float = 2.0
    max_wait_s: float | None = None  # stop when no batch arrives in this long (None: wait)
    max_tokens_per_micro_batch: int = 16384
    # Optimisation
    lr: float = 1e-6
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    clip_low: float = 3e-4
    clip_high: float = 4e-4
    kl_coef: float = 1e-3  # 0 disables the reference model entirely
    replay: bool = True
    # Alignment thresholds: a step outside them is flagged
    min_pearson_r: float = 0.99
    max_abs_dlogp_p99: float = 0.05
    min_expert_overlap: float = 0.9
    # Runtime
    dtype: str = "float32"  # "float32" | "bfloat16"
    device: str = "cpu"
    seed: int = 0
    # Data parallel (torchrun): ranks other than 0 wait in a collective while rank 0 waits
    # for groups and publishes; a collective that waits longer than this fails the run.
    dist_timeout_s: float = 4 * 3600.0

    def __post_init__(self) -> None:
        if self.weight_sync not in ("disk", "distributed"):
            raise ConfigurationError(
                f"weight_sync must be 'disk' or 'distributed', not {self.weight_sync!r}"
            )
        if self.weight_sync == "disk" and not self.save_checkpoints:
            raise ConfigurationError("a disk weight sync loads the saved checkpoints")
        if self.weight_sync_backend not in ("gloo", "nccl"):
            raise ConfigurationError(
                f"weight_sync_backend must be 'gloo' or 'nccl', not {self.weight_sync_backend!r}"
            )


# What ``--help`` says of each flag (its default is appended).
_HELP = {
    "model_path": "the initial policy checkpoint (a transformers directory)",
    "proxy_url": "the lego-proxy to claim from",
    "admin_key": "the proxy's admin key (LEGO_ADMIN_KEY)",
    "run_id": "the run whose groups to train on",
    "backend_url": "the SGLang server (or local engine) to publish weights to",
    "output_dir": "where each published weight version is written",
    "version_prefix": "weight versions are named PREFIX + step",
    "weight_sync": "'disk' (workers load the saved checkpoint) or 'distributed' (broadcast)",
    "save_checkpoints": "write every published version to output_dir (disk sync needs it)",
    "weight_sync_address": "this trainer's address as the workers reach it (distributed)",
    "weight_sync_port": "the weight group's port on this trainer; 0: a free one (distributed)",
    "weight_sync_backend": "the weight group's backend: gloo (CPU) or nccl (GPU)",
    "weight_sync_bucket_mb": "most MiB of weights per broadcast batch (distributed)",
    "steps": "optimizer steps to take",
    "groups_per_step": "prompt groups claimed per step",
    "max_staleness": "skip groups sampled more than this many versions ago ('none': any)",
    "lease_s": "how long a claimed batch is held before others may take it",
    "poll_interval_s": "seconds between claims while no group is ready",
    "max_wait_s": "stop when no batch arrives in this long ('none': wait forever)",
    "max_tokens_per_micro_batch": "tokens packed into one forward-backward pass",
    "lr": "learning rate (constant)",
    "weight_decay": "AdamW weight decay",
    "grad_clip": "gradient norm clip",
    "clip_low": "GSPO lower clip range",
    "clip_high": "GSPO upper clip range",
    "kl_coef": "KL loss coefficient (0: no reference model)",
    "replay": "replay the recorded MoE routing (R3) when recomputing logprobs",
    "min_pearson_r": "flag a step whose rollout/trainer logprob Pearson r is below this",
    "max_abs_dlogp_p99": "flag a step whose |dlogp| p99 is above this",
    "min_expert_overlap": "flag a step whose routed-expert overlap is below this",
    "dtype": "float32 or bfloat16",
    "device": "torch device",
    "seed": "random seed",
    "dist_timeout_s": "under torchrun: how long a rank may wait for the others (rank 0 waits "
    "for groups and publishes meanwhile)",
}


def _optional(kind: Callable[[str], object]) -> Callable[[str], object]:
    def parse(text: str) -> object:
        return None if text.lower() == "none" else kind(text)

    return parse


def _parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Train a policy from a lego-proxy run: claim complete prompt groups, "
        "recompute logprobs with routing replay, take a GSPO step, publish the weights to the "
        "backend, ack. Defaults are LEGO-RL's production hyperparameters (Table 10).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    # Types are taken from each default's runtime type; the None-defaulted fields are listed.
    optional_types: dict[str, type] = {"max_staleness": int, "max_wait_s": float}
    for f in fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-")
        if f.default is MISSING:
            parser.add_argument(flag, dest=f.name, required=True, help=_HELP.get(f.name))
        elif isinstance(f.default, bool):
            parser.add_argument(
                flag,
                dest=f.name,
                action=argparse.BooleanOptionalAction,
                default=f.default,
                help=_HELP.get(f.name, f.name),
            )
        elif f.name in optional_types:
            parser.add_argument(
                flag,
                dest=f.name,
                type=_optional(optional_types[f.name]),
                default=f.default,
                help=_HELP.get(f.name, "'none' to leave unset"),
            )
        else:
            parser.add_argument(
                flag,
                dest=f.name,
                type=type(f.default),
                default=f.default,
                help=_HELP.get(f.name, f.name.replace("_", " ")),
            )
    return parser


def config_from_args(
    argv: Sequence[str] | None = None, *, prog: str = "python -m trainer_bridge.train"
) -> TrainConfig:
    return TrainConfig(**vars(_parser(prog).parse_args(argv)))
