"""Request bytes stored for one agent session, driven through a real proxy.

A harness loop (OpenAI chat through the official SDK) drives the proxy, backed by the tiny
local engine in scripted mode: every answer is a tool call, every tool result about
``--result-chars`` characters, and the harness re-sends the conversation each turn, as
agents do. Then it reads, from the proxy's SQLite database, the bytes the ``turns`` table
holds in ``request_messages`` for the session (``SUM(length(...))``), next to what the
harness sent (the JSON request bodies, which grow with turns x conversation).

    python -m bench.request_storage [--turns 50] [--result-chars 400]

Nothing here depends on how requests are stored, so the same file run from an older
checkout measures what that version stores. Target (issue 5): storage linear in the
session's length, i.e. request bytes close to the sum of what each turn adds.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

import openai

from engine.config import EngineConfig
from engine.loopback import running_engine
from engine.tiny import ensure_tiny_model
from kernel.paths import TINY_MODEL_NAME
from kernel.threaded import free_port, serve
from proxy.app import create_app
from proxy.settings import Settings

ADMIN_KEY = "bench-admin-key"
CALL = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'
TOOL: Any = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a shell command.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
    },
}


def run(turns: int, result_chars: int, root: Path) -> None:
    model_dir = ensure_tiny_model(root / "models" / TINY_MODEL_NAME)
    script = root / "policy.json"
    script.write_text(json.dumps({"rules": [], "default": CALL}))
    port = free_port()
    settings = Settings(
        port=port,
        data_dir=root / "proxy",
        backend_url=None,
        tokenizer_path=model_dir,
        admin_key=ADMIN_KEY,
        context_length=131072,
    )
    with running_engine(
        EngineConfig(model_path=model_dir, script_path=script, enable_return_routed_experts=True)
    ) as engine:
        settings = settings.model_copy(update={"backend_url": engine})
        with serve(create_app(settings), port=port) as url:
            admin = openai.OpenAI(base_url=url, api_key=ADMIN_KEY)
            run_id = admin.post("/api/v1/runs", body={"name": "bench"}, cast_to=dict)["id"]
            session = admin.post(
                f"/api/v1/runs/{run_id}/sessions",
                body={"task_id": "t", "group_id": "g", "sample_index": 0, "harness": "bench"},
                cast_to=dict,
            )
            client = openai.OpenAI(base_url=session["openai_base_url"], api_key="x")
            messages: list[Any] = [
                {"role": "system", "content": "You are a coding agent. " * 20},
                {"role": "user", "content": "Fix the failing test."},
            ]
            sent = 0
            began = time.perf_counter()
            for turn in range(turns):
                body = {"model": "m", "messages": messages, "tools": [TOOL]}
                sent += len(json.dumps(body, separators=(",", ":")))
                reply = (
                    client.chat.completions.create(model="m", messages=messages, tools=[TOOL])
                    .choices[0]
                    .message
                )
                assert reply.tool_calls, reply
                (call,) = reply.tool_calls
                filler = f"result {turn}: " + "x" * result_chars
                messages += [
                    reply.model_dump(exclude_none=True),
                    {"role": "tool", "tool_call_id": call.id, "content": filler},
                ]
            elapsed = time.perf_counter() - began
            admin.get(f"/api/v1/sessions/{session['id']}", cast_to=dict)  # flushes the writer
    database = next((root / "proxy").rglob("*.sqlite3"))
    with sqlite3.connect(database) as conn:
        count, stored = conn.execute(
            "SELECT count(*), sum(length(request_messages)) FROM turns WHERE session_id = ?",
            (session["id"],),
        ).fetchone()
    print(f"turns recorded: {count} ({elapsed:.1f} s)")
    print(f"request bytes stored (turns.request_messages): {stored}")
    print(f"request bytes the harness sent (JSON bodies): {sent}")
    print(f"stored / sent: {stored / sent:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=50)
    parser.add_argument("--result-chars", type=int, default=400)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run(args.turns, args.result_chars, Path(tmp))


if __name__ == "__main__":
    main()
