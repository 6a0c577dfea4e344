"""``EngineConfig``: everything one local engine process is started with (frozen)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class EngineConfig:
    model_path: Path
    host: str = "127.0.0.1"
    port: int = 30000
    script_path: Path | None = None  # scripted policy (engine.script)
    zero_compute: bool = False  # fixed replies, no forward pass (overhead benchmarks)
    # Zero compute only: the reply's length in tokens (None: the short fixed reply), and
    # the time between two of its tokens (0: all at once; > 0: streamed a chunk a token).
    zero_compute_reply_tokens: int | None = None
    zero_compute_token_s: float = 0.0
    incremental_streaming_output: bool = False  # SGLang's --incremental-streaming-output
    # SGLang's --enable-return-routed-experts: without it no request gets routed experts.
    enable_return_routed_experts: bool = False
    # SGLang's --enable-deterministic-inference: without it sampling_seed is ignored.
    enable_deterministic_inference: bool = False
    context_length: int | None = None  # SGLang's --context-length; None: the model's
    max_total_tokens: int | None = None  # SGLang's --max-total-tokens (the KV pool's size)
    # SGLang's SGLANG_REQ_RUNNING_TIMEOUT: a request running longer ends in a 503 abort.
    req_running_timeout_s: float | None = None
    weight_version: str = "default"
    served_model_name: str | None = None  # unset: the model path, as SGLang does
    # CPU intra-op threads (process-wide). For the tiny model one thread is fastest: waking
    # a thread pool for every small op costs more than the math (measured: 2x per token).
    torch_threads: int | None = 1
    # Precision of the forward pass: "float32" (exact, the default) or "bfloat16" (rollouts
    # in a precision other than the trainer's, for the alignment experiment).
    dtype: str = "float32"
    # How long a weight-update group waits for its peers (joining, each broadcast). SGLang
    # has no knob: its groups take torch's default, 30 minutes.
    weight_group_timeout_s: float = 1800.0
