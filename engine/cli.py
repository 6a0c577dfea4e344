"""The engine's command line: ``lego-proxy engine ...`` and ``python -m engine``.

Owns ``add_engine_arguments(parser)`` (the flags) and ``run_engine(args)`` (resolve the
model directory, building the tiny model when ``--model`` is unset, then serve with
uvicorn until interrupted). ``--data-dir`` defaults to ``$LEGO_DATA_DIR`` or
``~/.local/share/lego-proxy``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path

from engine.config import EngineConfig
from engine.tiny import ensure_tiny_model
from kernel.paths import default_model_dir


def _default_data_dir() -> Path:
    env = os.environ.get("LEGO_DATA_DIR")
    return Path(env) if env else Path.home() / ".local" / "share" / "lego-proxy"


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        type=Path,
        default=None,
        help="HF model directory to serve (default: the tiny model, built on first use under "
        "--data-dir)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="bind address")
    parser.add_argument("--port", type=int, default=30000, help="port")
    parser.add_argument(
        "--script",
        type=Path,
        default=None,
        help="scripted policy JSON: replies chosen by what the prompt contains, written in the "
        "model's own format (docs/scripted-policy.md)",
    )
    parser.add_argument(
        "--zero-compute",
        action="store_true",
        help="answer every request at once with a fixed reply, no forward pass (benchmarks)",
    )
    parser.add_argument(
        "--zero-compute-reply-tokens",
        type=int,
        default=None,
        help="with --zero-compute: a reply of this many tokens (the eos included)",
    )
    parser.add_argument(
        "--zero-compute-token-ms",
        type=float,
        default=0.0,
        help="with --zero-compute: emit a token every this many ms, as decoding streams them "
        "(0: the whole reply at once; the event loop's timers tick in whole milliseconds, "
        "so under 1 ms several tokens come together)",
    )
    parser.add_argument(
        "--incremental-streaming-output",
        action="store_true",
        help="stream only what is new in each chunk, as SGLang's flag of that name",
    )
    parser.add_argument(
        "--enable-return-routed-experts",
        action="store_true",
        help="return routed experts when a request asks (SGLang's flag)",
    )
    parser.add_argument(
        "--enable-deterministic-inference",
        action="store_true",
        help="honour sampling_seed (SGLang ignores it without this flag)",
    )
    parser.add_argument(
        "--context-length",
        type=int,
        default=None,
        help="the longest prompt + output accepted (default: the model config's)",
    )
    parser.add_argument(
        "--max-total-tokens", type=int, default=None, help="KV pool size (limits prompts)"
    )
    parser.add_argument(
        "--req-running-timeout",
        type=float,
        default=None,
        help="seconds a request may run before a 503 abort (SGLANG_REQ_RUNNING_TIMEOUT)",
    )
    parser.add_argument(
        "--weight-version", default="default", help="the weight version reported at start"
    )
    parser.add_argument(
        "--served-model-name", default=None, help="model name reported (default: the directory)"
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="where the tiny model is built (default: $LEGO_DATA_DIR or ~/.local/share/lego-proxy)",
    )
    parser.add_argument(
        "--torch-threads", type=int, default=1, help="CPU threads for torch (0: torch's default)"
    )
    parser.add_argument(
        "--dtype", choices=("float32", "bfloat16"), default="float32", help="forward precision"
    )
    parser.add_argument(
        "--log-level",
        default="info",
        choices=("critical", "error", "warning", "info", "debug"),
        help="uvicorn's log level (info includes the access log)",
    )


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    model: Path | None = args.model
    if model is None:
        data_dir: Path = args.data_dir or _default_data_dir()
        model = ensure_tiny_model(default_model_dir(data_dir))
    return EngineConfig(
        model_path=model,
        host=args.host,
        port=args.port,
        script_path=args.script,
        zero_compute=args.zero_compute,
        zero_compute_reply_tokens=args.zero_compute_reply_tokens,
        zero_compute_token_s=args.zero_compute_token_ms / 1000,
        incremental_streaming_output=args.incremental_streaming_output,
        enable_return_routed_experts=args.enable_return_routed_experts,
        enable_deterministic_inference=args.enable_deterministic_inference,
        context_length=args.context_length,
        max_total_tokens=args.max_total_tokens,
        req_running_timeout_s=args.req_running_timeout,
        weight_version=args.weight_version,
        served_model_name=args.served_model_name,
        torch_threads=args.torch_threads or None,
        dtype=args.dtype,
    )


def run_engine(args: argparse.Namespace) -> None:
    import uvicorn
    from transformers.utils import logging as hf_logging

    from engine.server import create_engine_app

    if args.log_level in ("critical", "error", "warning"):
        quiet: Callable[[], None] = hf_logging.disable_progress_bar
        quiet()  # building and loading the model: its progress bars are not news

    config = engine_config_from_args(args)
    uvicorn.run(
        create_engine_app(config), host=config.host, port=config.port, log_level=args.log_level
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m engine",
        description="The SGLang-compatible local engine (lego-proxy engine).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_engine_arguments(parser)
    run_engine(parser.parse_args(argv))
