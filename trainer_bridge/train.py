"""The training loop: claim -> samples -> replayed forward -> GSPO step -> publish -> ack.

Owns ``run(config, export, weights)`` (rank 0, or the one process), ``follow(config,
world)`` (every other data-parallel rank), ``prepare`` (the policy, optimizer and reference,
equal on every rank), one step's optimisation ``optimize(...)``, and the command line
``python -m trainer_bridge.train --model-path ... --proxy-url ... --admin-key ... --run-id
... --backend-url ... [--lr 1e-4 --steps 5 ...]`` (flags: ``TrainConfig``).

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

Data parallel under ``torchrun --nproc_per_node N -m trainer_bridge.train ...``
(``trainer_bridge.distributed``; docs/training.md): rank 0 runs ``run`` and does all of
the above that talks to the proxy or the backend; it deals each claimed batch out in whole
groups (``trainer_bridge.sharding``), and every rank, the others in ``follow``, runs steps
2-5 on its shard in step with the rest. ``optimize`` normalises the loss by the step's
global sequence count and sums gradients over ranks before clipping, so every rank takes
the step one process would take on the whole batch, and its outcome describes the whole
batch. A world of one is the single process, unchanged.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import astuple, dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from kernel.errors import Conflict
from trainer_bridge.advantages import grpo_advantages, zero_variance_groups
from trainer_bridge.alignment import (
    AlignmentMetrics,
    AlignmentThresholds,
    RoutingTally,
    flag_reasons,
    measure_alignment,
    tally_routing,
)
from trainer_bridge.client import ExportClient
from trainer_bridge.config import TrainConfig, config_from_args
from trainer_bridge.distributed import SOLO, World, joined
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
from trainer_bridge.sharding import deal
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
    world: World = SOLO,
) -> StepOutcome:
    """One optimizer step over ``samples`` (gradient accumulation across micro-batches).

    Under data parallelism every rank calls it at once with its shard: whole prompt groups
    (``sharding``), so each group's advantages are those of one process. The losses are
    normalised by the step's global sequence count, gradients are summed over ranks before
    clipping, and the outcome (identical on every rank) describes the whole step.
    """
    device = next(model.parameters()).device
    rewards = np.asarray([s.reward for s in samples], np.float64)
    count, reward_sum, flat_groups, groups = world.sum(
        [len(samples), float(np.sum(rewards)), *zero_variance_groups(samples)]
    )
    num_sequences = int(count)
    advantages = torch.from_numpy(grpo_advantages(samples))
    # Seeded empty: a rank may hold no samples and still gathers its (empty) share.
    rollout_lp: list[torch.Tensor] = [torch.zeros(0, dtype=torch.float64)]
    trainer_lp: list[torch.Tensor] = [torch.zeros(0, dtype=torch.float64)]
    routing = RoutingTally()
    routed = 0  # micro-batches whose routing was compared
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
            num_sequences=num_sequences,
            clip_low=config.clip_low,
            clip_high=config.clip_high,
        )
        kl = reference.kl(mb, logprobs, num_sequences)
        loss: torch.Tensor = policy + kl * config.kl_coef
        torch.autograd.backward(loss)
        policy_total += float(policy.detach())
        kl_total += float(kl.detach())
        clipped += clipped_here
        rollout_lp.append(mb.rollout_logprobs[mb.loss_mask])
        trainer_lp.append(logprobs.detach().double().cpu()[mb.loss_mask])
        rows = _natural_rows(trace, mb)
        if mb.routed_experts is not None and rows is not None:
            recorded = mb.routed_experts[:, trace.moe_layers][mb.loss_mask]
            routing += tally_routing(recorded.numpy(), rows[mb.loss_mask].numpy())
            routed += 1
    world.sum_gradients(model.parameters())
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
    optimizer.step()
    policy_total, kl_total, clipped_total, routed_total, *tally = world.sum(
        [policy_total, kl_total, clipped, routed, *astuple(routing)]
    )
    logprobs_by_rank = world.all_gather((torch.cat(rollout_lp), torch.cat(trainer_lp)))
    alignment = measure_alignment(
        torch.cat([rollout for rollout, _ in logprobs_by_rank]).numpy(),
        torch.cat([trainer for _, trainer in logprobs_by_rank]).numpy(),
        RoutingTally(*(int(n) for n in tally)) if routed_total else None,
    )
    return StepOutcome(
        samples=num_sequences,
        mean_reward=reward_sum / num_sequences,
        zero_variance_share=flat_groups / groups if groups else 0.0,
        policy_loss=policy_total,
        kl_loss=kl_total,
        grad_norm=float(grad_norm),
        clipped_sequences=int(clipped_total),
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


def prepare(
    config: TrainConfig, world: World
) -> tuple[torch.nn.Module, torch.optim.Optimizer, Reference]:
    """The policy, its optimizer and the KL reference, the same on every rank."""
    torch.manual_seed(config.seed)
    model = load_policy(config.model_path, config.dtype, config.device)
    world.broadcast_parameters(model)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.lr, weight_decay=config.weight_decay
    )
    reference: Reference = NoReference()
    if config.kl_coef > 0:
        frozen = load_policy(config.model_path, config.dtype, config.device)
        world.broadcast_parameters(frozen)
        reference = FrozenReference(frozen, config.replay)
    return model, optimizer, reference


def run(
    config: TrainConfig,
    export: ExportClient,
    weights: WeightSync,
    after_step: AfterStep | None = None,
    stop: threading.Event | None = None,
    world: World = SOLO,
) -> list[StepReport]:
    """Train for ``config.steps`` steps (fewer if data stops coming, ``after_step`` says
    stop, or ``stop`` is set while waiting for groups); one report per step.

    Under data parallelism this is rank 0: it claims, deals each batch out, publishes, posts
    and acks; the other ranks run ``follow`` and stop when this returns.
    """
    model, optimizer, reference = prepare(config, world)
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
            if stop is not None and stop.is_set():
                log.info("stopped while waiting for groups, after %d steps", step - 1)
            else:
                log.info(
                    "no batch within %s s; stopping after %d steps", config.max_wait_s, step - 1
                )
            break
        batch_ids, samples = claimed
        shard = deal(world, samples)
        assert shard is not None
        outcome = optimize(model, optimizer, reference, shard, config, world)
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
            **batch_series(samples),  # the whole batch: rank 0 holds it
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
    deal(world, None)  # however the run ended, the other ranks end with it
    return reports


def follow(config: TrainConfig, world: World) -> int:
    """A rank other than 0: take each step on the shard rank 0 deals, until it deals none.

    Returns the number of steps taken. Its model stays equal to rank 0's (same start, same
    summed gradients, same optimizer), so it never publishes and never talks to the proxy.
    """
    model, optimizer, reference = prepare(config, world)
    steps = 0
    while (shard := deal(world, None)) is not None:
        optimize(model, optimizer, reference, shard, config, world)
        steps += 1
    return steps


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
    with joined(config.device, config.dist_timeout_s) as world:
        config = replace(config, device=world.device)
        if not world.is_leader:
            steps = follow(config, world)
            log.info("rank %d of %d: done after %d steps", world.rank, world.size, steps)
            return
        with (
            ExportClient(config.proxy_url, config.admin_key, config.run_id) as export,
            weight_sync_for(config) as weights,
        ):
            run(config, export, weights, world=world)


if __name__ == "__main__":
    main()
