"""The training loop: claim -> samples -> replayed forward -> GSPO step -> publish -> ack.

Owns ``run(config, export, backend)``, one step's optimisation ``optimize(...)``, and the
command line ``python -m trainer_bridge.train --model-path ... --proxy-url ... --admin-key
... --run-id ... --backend-url ... [--lr 1e-4 --steps 5 ...]`` (flags: ``TrainConfig``).

One step, top to bottom:
1. claim complete groups until ``groups_per_step`` are held (polling; ``max_wait_s``
   bounds the wait, after which the step trains on what it holds);
2. build ``Sample``s; GRPO advantages per group;
3. pack into micro-batches; for each: forward with routing replay, collect alignment
   inputs, GSPO loss (+ KL loss), backward (gradients accumulate);
4. clip gradients to ``grad_clip``, AdamW step (constant lr);
5. measure alignment (rollout vs recomputed logprobs; recorded vs trainer routing);
6. save the weights as a new version; pause the run, sync the weights to every backend
   worker (``trainer_bridge.weights``: pause, flush, update, continue; a worker that fails
   is reported and taken out), announce the version to the proxy, resume. The update is
   a checkpoint load (``weight_sync="disk"``) or a broadcast from this process
   (``"distributed"``, where the checkpoint is optional: ``save_checkpoints``);
7. post the alignment metrics (flagged or not); ack the step's batches.

The policy is on-policy within a step: the "old" logprobs of GSPO's ratio are the
trainer's own recomputation (importance-sampling correction off, as in LEGO-RL), so the
rollout logprobs serve alignment only.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from kernel.errors import Conflict
from trainer_bridge.advantages import grpo_advantages, zero_variance_share
from trainer_bridge.alignment import (
    AlignmentMetrics,
    AlignmentThresholds,
    flag_reasons,
    measure_alignment,
)
from trainer_bridge.client import ExportClient
from trainer_bridge.config import TrainConfig, config_from_args
from trainer_bridge.loss import gspo_loss
from trainer_bridge.packing import MicroBatch, pack
from trainer_bridge.policy import (
    FrozenReference,
    NoReference,
    Reference,
    checkpoint_tensors,
    forward_logprobs,
    load_policy,
    save_checkpoint,
)
from trainer_bridge.replay import RouterTrace
from trainer_bridge.samples import Sample, samples_from_batch
from trainer_bridge.series import batch_series
from trainer_bridge.weights import WeightSync, weight_sync_for

log = logging.getLogger("trainer_bridge")


@dataclass(frozen=True, slots=True)
class StepOutcome:
    samples: int
    mean_reward: float
    zero_variance_share: float
    policy_loss: float
    kl_loss: float
    grad_norm: float
    clipped_sequences: int
    alignment: AlignmentMetrics


@dataclass(frozen=True, slots=True)
class StepTimes:
    """Wall seconds of one step: waiting for groups, optimising, publishing the weights."""

    claim_s: float
    optimize_s: float
    publish_s: float


@dataclass(frozen=True, slots=True)
class StepReport:
    step: int
    batch_ids: tuple[str, ...]
    weight_version: str  # the version this step published
    outcome: StepOutcome
    flagged: bool
    reasons: tuple[str, ...] = ()
    times: StepTimes = StepTimes(0.0, 0.0, 0.0)
    metrics: Mapping[str, float | None] = field(default_factory=dict)  # as posted


# Called after each step with its report; False stops the run (the closed loop's early stop).
AfterStep = Callable[[StepReport], bool]


def _natural_rows(trace: RouterTrace, mb: MicroBatch) -> torch.Tensor | None:
    """The trainer's own top-k as ``[T, moe_layers, top_k]`` (None without routers)."""
    if not trace.moe_layers:
        return None
    return torch.stack([trace.natural[layer].cpu() for layer in trace.moe_layers], dim=1)


def optimize(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    reference: Reference,
    samples: Sequence[Sample],
    config: TrainConfig,
) -> StepOutcome:
    """One optimizer step over ``samples`` (gradient accumulation across micro-batches)."""
    device = next(model.parameters()).device
    advantages = torch.from_numpy(grpo_advantages(samples))
    rollout_lp: list[torch.Tensor] = []
    trainer_lp: list[torch.Tensor] = []
    recorded: list[torch.Tensor] = []
    natural: list[torch.Tensor] = []
    policy_total = kl_total = 0.0
    clipped = 0
    optimizer.zero_grad(set_to_none=True)
    for mb in pack(samples, config.max_tokens_per_micro_batch):
        logprobs, trace = forward_logprobs(model, mb, config.replay)
        mask = mb.loss_mask.to(device)
        seq_index = mb.seq_index.to(device)
        policy, clipped_here = gspo_loss(
            logprobs,
            logprobs.detach(),
            advantages[list(mb.sample_ids)].to(device),
            seq_index,
            mask,
            num_sequences=len(samples),
            clip_low=config.clip_low,
            clip_high=config.clip_high,
        )
        kl = reference.kl(mb, logprobs, len(samples))
        loss: torch.Tensor = policy + kl * config.kl_coef
        torch.autograd.backward(loss)
        policy_total += float(policy.detach())
        kl_total += float(kl.detach())
        clipped += clipped_here
        rollout_lp.append(mb.rollout_logprobs[mb.loss_mask])
        trainer_lp.append(logprobs.detach().double().cpu()[mb.loss_mask])
        rows = _natural_rows(trace, mb)
        if mb.routed_experts is not None and rows is not None:
            recorded.append(mb.routed_experts[:, trace.moe_layers][mb.loss_mask])
            natural.append(rows[mb.loss_mask])
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
    optimizer.step()
    alignment = measure_alignment(
        torch.cat(rollout_lp).numpy(),
        torch.cat(trainer_lp).numpy(),
        torch.cat(recorded).numpy() if recorded else None,
        torch.cat(natural).numpy() if natural else None,
    )
    return StepOutcome(
        samples=len(samples),
        mean_reward=float(np.mean([s.reward for s in samples])),
        zero_variance_share=zero_variance_share(samples),
        policy_loss=policy_total,
        kl_loss=kl_total,
        grad_norm=float(grad_norm),
        clipped_sequences=clipped,
        alignment=alignment,
    )


def _claim(
    export: ExportClient, config: TrainConfig, stop: threading.Event | None = None
) -> tuple[list[str], list[Sample]] | None:
    """Claim until ``groups_per_step`` groups are held: ``(batch ids, samples)``.

    Groups complete one by one, so a full step usually takes several claims. When
    ``max_wait_s`` passes, the step makes do with what it holds; None if that is nothing.
    """
    deadline = None if config.max_wait_s is None else time.monotonic() + config.max_wait_s
    batch_ids: list[str] = []
    samples: list[Sample] = []
    groups = 0
    while groups < config.groups_per_step:
        wanted = config.groups_per_step - groups
        batch = export.claim(wanted, config.max_staleness, config.lease_s)
        if batch.batch_id is not None:
            batch_ids.append(batch.batch_id)
            samples += samples_from_batch(batch)
            groups += len(batch.groups)
            continue
        if deadline is not None and time.monotonic() >= deadline:
            break
        if stop is not None and stop.wait(config.poll_interval_s):
            break  # the caller is done: train on what is held, or stop
        if stop is None:
            time.sleep(config.poll_interval_s)
    if not samples:
        for batch_id in batch_ids:
            export.ack(batch_id)  # nothing sampled in them: nothing to train, done with them
        return None
    return batch_ids, samples


def _publish(
    model: torch.nn.Module,
    config: TrainConfig,
    version: str,
    export: ExportClient,
    weights: WeightSync,
) -> None:
    path = None
    if config.save_checkpoints:
        path = save_checkpoint(model, Path(config.model_path), Path(config.output_dir) / version)
    # New turns wait while the backend swaps weights, so no turn mixes two versions
    # without the proxy recording it.
    export.pause()
    try:
        if config.weight_sync == "disk" and path is not None:
            report = weights.publish(str(path.resolve()), version)
        else:
            report = weights.publish_tensors(checkpoint_tensors(model), version)
        export.set_worker_exclusions(*report.rotation_changes())
        export.announce_weight_version(version)
    finally:
        export.resume()


def run(
    config: TrainConfig,
    export: ExportClient,
    weights: WeightSync,
    after_step: AfterStep | None = None,
    stop: threading.Event | None = None,
) -> list[StepReport]:
    """Train for ``config.steps`` steps (fewer if data stops coming, ``after_step`` says
    stop, or ``stop`` is set while waiting for groups); one report per step."""
    torch.manual_seed(config.seed)
    model = load_policy(config.model_path, config.dtype, config.device)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.lr, weight_decay=config.weight_decay
    )
    reference: Reference = NoReference()
    if config.kl_coef > 0:
        frozen = load_policy(config.model_path, config.dtype, config.device)
        reference = FrozenReference(frozen, config.replay)
    thresholds = AlignmentThresholds(
        config.min_pearson_r, config.max_abs_dlogp_p99, config.min_expert_overlap
    )
    current_version = "initial"
    reports: list[StepReport] = []
    for step in range(1, config.steps + 1):
        began = time.monotonic()
        claimed = _claim(export, config, stop)
        claimed_at = time.monotonic()
        if claimed is None:
            log.info("no batch within %s s; stopping after %d steps", config.max_wait_s, step - 1)
            break
        batch_ids, samples = claimed
        outcome = optimize(model, optimizer, reference, samples, config)
        optimized_at = time.monotonic()
        version = f"{config.version_prefix}{step}"
        _publish(model, config, version, export, weights)
        times = StepTimes(
            claimed_at - began, optimized_at - claimed_at, time.monotonic() - optimized_at
        )
        reasons = flag_reasons(outcome.alignment, thresholds)
        flagged = bool(reasons)
        # The metrics describe the policy the trainer recomputed with: the one before this
        # step's update.
        metrics: dict[str, float | None] = {
            **outcome.alignment.as_dict(),
            "grad_norm": outcome.grad_norm,
            "mean_reward": outcome.mean_reward,
            "kl": outcome.kl_loss,
            "zero_variance_share": outcome.zero_variance_share,
            **batch_series(samples),
        }
        export.post_alignment(step, current_version, metrics, flagged, reasons)
        for batch_id in batch_ids:
            try:
                export.ack(batch_id)
            except Conflict:
                # The lease ran out mid-step and the groups went to another trainer; this
                # step's update stands, the duplicate is theirs to drop. Logged, not fatal.
                log.warning("batch %s acked after its lease expired", batch_id)
        current_version = version
        report = StepReport(
            step, tuple(batch_ids), version, outcome, flagged, tuple(reasons), times, metrics
        )
        reports.append(report)
        log.info("%s", progress_line(step, config.steps, outcome, version, reasons))
        if after_step is not None and not after_step(report):
            log.info("stopped after step %d by the caller", step)
            break
    return reports


def progress_line(
    step: int, steps: int, outcome: StepOutcome, version: str, flagged: Sequence[str]
) -> str:
    """One step as a researcher reads it: data, loss, alignment, what was published."""
    a = outcome.alignment
    experts = "" if a.expert_overlap is None else f" experts {a.expert_overlap:.3f}"
    line = (
        f"step {step}/{steps}: {outcome.samples} samples, reward {outcome.mean_reward:.3f} "
        f"(zero-variance groups {outcome.zero_variance_share:.0%}), "
        f"loss {outcome.policy_loss:+.4g}, kl {outcome.kl_loss:.3g}, "
        f"grad norm {outcome.grad_norm:.3g}, clipped {outcome.clipped_sequences} seqs; "
        f"alignment r {a.pearson_r:.4f} |dlogp| p99 {a.abs_dlogp_p99:.2e}{experts} "
        f"over {a.tokens} tokens; published {version}"
    )
    if flagged:
        line += " -- FLAGGED: " + "; ".join(flagged)
    return line


def main(
    argv: Sequence[str] | None = None, *, prog: str = "python -m trainer_bridge.train"
) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    # Polling for batches is an HTTP request every poll_interval_s: not news.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    config = config_from_args(argv, prog=prog)
    with (
        ExportClient(config.proxy_url, config.admin_key, config.run_id) as export,
        weight_sync_for(config) as weights,
    ):
        run(config, export, weights)


if __name__ == "__main__":
    main()
