"""slime's OpenAI agent adapter as a server of its own, for ``bench.peers``.

slime (THUDM/slime, not on PyPI) has no command that serves its agent adapter: its coding-agent
rollout (``examples/coding_agent_rl/generate.py``) builds ``slime.agent.adapters.OpenAIAdapter``
(an ``aiohttp`` application: ``/v1/chat/completions``, ``/healthz``) with the served model's
tokenizer and the SGLang URL, and serves it on a thread with
``slime.agent.aiohttp_threaded.run_app_in_thread`` (``handler_cancellation`` on, its filtered
access log). This script does the same in a process of its own, in front of ``--backend``
(SGLang's native ``/generate``: the adapter renders the chat template itself and sends
``input_ids``), and stays up until it is terminated.

It runs with slime's interpreter, not necessarily this project's, so it imports nothing from
this repository: only the standard library, ``transformers`` and the slime checkout given as
``--slime`` (which needs ``aiohttp``, ``httpx``, ``torch`` and ``transformers``; no Ray, GPU
or SGLang unless a tool-call or reasoning parser is named, and none is here).

    python bench/slime_runner.py --slime PATH --model DIR --backend URL --port N
"""

from __future__ import annotations

import argparse
import importlib
import sys
import threading
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--slime", type=Path, required=True, help="a THUDM/slime checkout")
    parser.add_argument("--model", required=True, help="the served model's tokenizer directory")
    parser.add_argument("--backend", required=True, help="the SGLang server's URL")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    sys.path.insert(0, str(args.slime.resolve()))
    adapters = importlib.import_module("slime.agent.adapters")
    threaded = importlib.import_module("slime.agent.aiohttp_threaded")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model, trust_remote_code=True)
    adapter = adapters.OpenAIAdapter(tokenizer=tokenizer, sglang_url=args.backend)
    threaded.run_app_in_thread(
        adapter.app,
        host="127.0.0.1",
        port=args.port,
        runner_kwargs={
            "handler_cancellation": True,
            "access_log_class": threaded.FilteredAccessLogger,
        },
    )
    threading.Event().wait()  # the server lives on its thread until SIGTERM


if __name__ == "__main__":
    main()
