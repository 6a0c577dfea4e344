"""Rollout-to-training alignment with and without routing replay (LEGO-RL Table 7 style).

Rollouts are sampled by the local engine (the tiny Qwen3-MoE model, temperature 1)
through a real proxy, claimed over the export API, and recomputed by the trainer in fp32
three ways: replay disabled, replay enabled but misaligned by one row (each position gets
the previous token's routing: the off-by-one bug class), replay enabled and aligned. The
rollout runs in bf16 (``--dtype bfloat16``) so that, without replay, the trainer's fp32
routing really differs from the rollout's; an fp32 rollout is measured too, as the
same-precision baseline.

    python -m bench.alignment [--sessions 24] [--output docs/alignment.md]

(As a module: run as a script, ``bench/`` would shadow the ``recorder`` package.)

Columns: Pearson r of rollout vs recomputed logprobs, mean |p_rollout - p_trainer|, k3 KL,
|dlogp| p50/p99, expert overlap and top-1 agreement (recorded routing vs the trainer's own
router choice on the same rows; with replay disabled this is how often the trainer would
route as the rollout did anyway).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import httpx
import numpy as np
import torch

from engine.config import EngineConfig
from engine.server import create_engine_app
from engine.tiny import ensure_tiny_model
from kernel.paths import default_model_dir
from kernel.threaded import free_port, serve
from proxy.app import create_app
from proxy.settings import Settings
from trainer_bridge.alignment import AlignmentMetrics, measure_alignment, tally_routing
from trainer_bridge.client import ExportClient
from trainer_bridge.packing import pack
from trainer_bridge.policy import forward_logprobs, load_policy
from trainer_bridge.samples import Sample, samples_from_batch

ADMIN_KEY = "bench-admin-key"
PROMPTS = [
    "Describe the weather today.",
    "Write a short poem about rivers.",
    "List three fruits and a vegetable.",
    "What does a compiler do?",
]


@contextmanager
def _stack(model: Path, data_dir: Path, dtype: str) -> Iterator[tuple[str, httpx.Client]]:
    engine_port, proxy_port = free_port(), free_port()
    engine = replace(
        EngineConfig(model_path=model, dtype=dtype, enable_return_routed_experts=True),
        port=engine_port,
    )
    with serve(create_engine_app(engine), port=engine_port) as engine_url:
        settings = Settings(
            port=proxy_port,
            data_dir=data_dir,
            backend_url=engine_url,
            tokenizer_path=model,
            admin_key=ADMIN_KEY,
            context_length=8192,
        )
        headers = {"authorization": f"Bearer {ADMIN_KEY}"}
        with (
            serve(create_app(settings), port=proxy_port) as url,
            httpx.Client(base_url=url, headers=headers, timeout=300) as admin,
        ):
            yield url, admin


def collect(model: Path, data_dir: Path, dtype: str, sessions: int, tokens: int) -> list[Sample]:
    """``sessions`` two-turn rollouts in one group per prompt; claimed over the export API."""
    with _stack(model, data_dir, dtype) as (url, admin):
        run = admin.post("/api/v1/runs", json={"name": f"bench-{uuid.uuid4().hex[:6]}"}).json()
        created = []
        for i in range(sessions):
            body = {
                "task_id": f"t{i % len(PROMPTS)}",
                "group_id": f"g{i % len(PROMPTS)}",
                "sample_index": i // len(PROMPTS),
                "sampling": {"temperature": 1.0, "seed": i, "max_tokens": tokens},
            }
            created.append(admin.post(f"/api/v1/runs/{run['id']}/sessions", json=body).json())
        for i, session in enumerate(created):
            history = [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}]
            for turn in range(2):
                reply = httpx.post(
                    f"{session['openai_base_url']}/chat/completions",
                    json={"model": "policy", "messages": history},
                    timeout=300,
                ).raise_for_status()
                text = reply.json()["choices"][0]["message"]["content"] or ""
                history += [
                    {"role": "assistant", "content": text},
                    {"role": "user", "content": f"And then? ({turn})"},
                ]
            finish = {"termination": "completed", "reward": float(i % 2)}
            admin.post(f"/api/v1/sessions/{session['id']}/finish", json=finish)
        with ExportClient(url, ADMIN_KEY, run["id"]) as export:
            batch = export.claim(len(PROMPTS), None, 600)
            if batch.batch_id is not None:
                export.ack(batch.batch_id)
        return samples_from_batch(batch)


def _shifted(sample: Sample) -> Sample:
    experts = sample.routed_experts
    return replace(sample, routed_experts=None if experts is None else np.roll(experts, 1, 0))


def recompute(model: torch.nn.Module, samples: list[Sample], replay: bool) -> AlignmentMetrics:
    rollout, trainer, recorded, natural = [], [], [], []
    with torch.no_grad():
        for mb in pack(samples, max_tokens=8192):
            logprobs, trace = forward_logprobs(model, mb, replay)
            mask = mb.loss_mask
            rollout.append(mb.rollout_logprobs[mask].numpy())
            trainer.append(logprobs.double()[mask].numpy())
            if mb.routed_experts is not None:
                layers = trace.moe_layers
                chosen = torch.stack([trace.natural[layer] for layer in layers], dim=1)
                recorded.append(mb.routed_experts[:, layers][mask].numpy())
                natural.append(chosen[mask].numpy())
    routing = tally_routing(np.concatenate(recorded), np.concatenate(natural)) if recorded else None
    return measure_alignment(np.concatenate(rollout), np.concatenate(trainer), routing)


def _row(name: str, m: AlignmentMetrics) -> str:
    overlap = "-" if m.expert_overlap is None else f"{m.expert_overlap:.3f}"
    top1 = "-" if m.top1_agreement is None else f"{m.top1_agreement:.3f}"
    return (
        f"| {name} | {m.pearson_r:.4f} | {m.abs_dp_mean:.4f} | {m.k3_kl:.2e} | "
        f"{m.abs_dlogp_p50:.1e} / {m.abs_dlogp_p99:.1e} | {overlap} | {top1} |"
    )


def table(model_dir: Path, samples: list[Sample]) -> list[str]:
    model = load_policy(model_dir, "float32")
    rows = [
        "| Configuration | Pearson r | mean abs dp | k3 KL | abs dlogp p50 / p99 "
        "| expert overlap | top-1 agreement |",
        "|---|---|---|---|---|---|---|",
        _row("replay disabled", recompute(model, samples, replay=False)),
        _row(
            "enabled, misaligned by one row", recompute(model, [_shifted(s) for s in samples], True)
        ),
        _row("enabled, aligned", recompute(model, samples, replay=True)),
    ]
    tokens = sum(s.num_sampled for s in samples)
    return [f"{len(samples)} sequences, {tokens} sampled tokens.", "", *rows]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="default: the tiny model")
    parser.add_argument("--sessions", type=int, default=24)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--output", type=Path, default=None, help="also write markdown here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # what the engine uses; the trainer's matmuls are tiny too
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or ensure_tiny_model(default_model_dir(Path(tmp)))
        lines = [
            "# Rollout-to-training alignment (bench/alignment.py)",
            "",
            "Generated by `python -m bench.alignment"
            + (f" --output {args.output}`." if args.output else "`."),
            f"Model: `{model.name}` (Qwen3-MoE, 3 MoE layers of 8 experts, top-2); "
            f"{args.sessions} two-turn sessions of up to {args.max_tokens} tokens per turn, "
            "temperature 1.0, through the proxy; the trainer recomputes in fp32.",
            "",
        ]
        for dtype in ("bfloat16", "float32"):
            samples = collect(
                model, Path(tmp) / f"db-{dtype}", dtype, args.sessions, args.max_tokens
            )
            label = "bf16" if dtype == "bfloat16" else "fp32"
            lines += [f"## Rollout in {label}, trainer in fp32", "", *table(model, samples), ""]
    lines += [
        "Expert overlap and top-1 agreement compare the recorded routing with the trainer's "
        "own router choice on the same rows (with replay disabled: how often it would route "
        "as the rollout did anyway). A one-row misalignment collapses both towards chance "
        "(2/8 overlap, 1/8 top-1) and is flagged by the trainer's alignment thresholds.",
        "",
        f"Wall time: {time.monotonic() - started:.0f} s on the CPU.",
    ]
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
