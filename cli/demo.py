"""``lego-proxy demo``: one scripted rollout through the whole system on the embedded default.

It starts the proxy (SQLite file + the local CPU engine in scripted-policy mode) on a free
loopback port, creates a run and a session through the control API, plays a harness with
the official ``openai`` SDK (a streamed tool call, the tool actually run, a final answer),
finishes the session with a reward, and prints the recorded trajectory. The output reads
as a short guided tour: each step says what happened and what was recorded, and the end
says how to see it all in the Live UI (``--keep`` keeps the data for that).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import httpx

from kernel.threaded import free_port, serve
from proxy.app import create_app
from proxy.settings import Settings, ToolParser

SHELL_TOOL: Any = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a shell command in the workspace and return its output.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string", "description": "The command."}},
            "required": ["command"],
        },
    },
}

# The policy the engine plays, written in the model's own format; the engine tokenizes it and
# the proxy parses it back out of the sampled ids like any other model output.
SCRIPT = {
    "rules": [
        {
            "match": "<tool_response>",
            "reply": "<think>\nThe command printed hello, so the file is right.\n</think>\n\n"
            "demo.txt now contains: hello",
        }
    ],
    "default": "<think>\nI should create the file with the shell tool.\n</think>\n\n"
    '<tool_call>\n{"name": "bash", "arguments": {"command": "echo hello > demo.txt && '
    'cat demo.txt"}}\n</tool_call>',
}


def run_demo(*, keep: bool = False) -> None:
    from openai import OpenAI

    root = Path(tempfile.mkdtemp(prefix="lego-demo-"))
    workspace = root / "workspace"
    workspace.mkdir()
    script = root / "policy.json"
    script.write_text(json.dumps(SCRIPT, indent=2))
    # Every setting that could point elsewhere is pinned: the demo runs on the embedded
    # default in its own directory even when LEGO_* variables are exported for a real
    # deployment (it must never write into that deployment's database).
    settings = Settings(
        env="development",
        host="127.0.0.1",
        port=free_port(),
        public_url=None,
        data_dir=root / "data",
        database_url=None,
        backend_url=None,
        admin_key=None,
        tokenizer_path=None,
        tool_parser=ToolParser.QWEN3,
        engine_args=f"--script {script}",
    )
    try:
        _say(
            "lego-proxy demo: one agent rollout through the whole system.",
            f"Everything lives in {root}: a SQLite file and the local CPU engine, which serves "
            "a tiny random-weight model",
            "driven by a scripted policy (it writes a tool call, then an answer), so the "
            "rollout is the same every time.",
        )
        with serve(create_app(settings), port=settings.port) as base_url:
            admin = httpx.Client(
                base_url=f"{base_url}/api/v1",
                headers={"authorization": f"Bearer {settings.effective_admin_key}"},
                timeout=60,
            )
            run = admin.post("/runs", json={"name": "demo"}).raise_for_status().json()
            session = (
                admin.post(
                    f"/runs/{run['id']}/sessions",
                    json={"task_id": "create-demo-file", "group_id": "g0", "harness": "demo"},
                )
                .raise_for_status()
                .json()
            )
            _say(
                "",
                f"1. The orchestrator creates a run ({run['id']}) and a session for one "
                f"rollout ({session['id']}).",
                "   The session hands the harness its own base URL, with its key in the path:",
                f"   OPENAI_BASE_URL={session['openai_base_url']}",
                "",
                "2. A harness (here the official openai SDK) talks to that URL as it would to "
                "any model API:",
            )

            client = OpenAI(base_url=session["openai_base_url"], api_key="unused-key-in-path")
            messages: list[Any] = [
                {"role": "system", "content": "You are a coding agent with a shell."},
                {"role": "user", "content": "Create demo.txt containing hello."},
            ]
            for turn in range(1, 4):
                stream = client.chat.completions.create(
                    model="demo-model",
                    messages=messages,
                    tools=[SHELL_TOOL],
                    stream=True,
                    stream_options={"include_usage": True},
                )
                text, calls, usage, finish = _read_stream(stream)
                print(f"\n   turn {turn}: the harness gets finish_reason={finish}, usage {usage}")
                if text:
                    print(f"   assistant: {text}")
                messages.append(
                    {
                        "role": "assistant",
                        "content": text or None,
                        **({"tool_calls": calls} if calls else {}),
                    }
                )
                if not calls:
                    break
                for call in calls:
                    command = json.loads(call["function"]["arguments"])["command"]
                    print(f"   tool call {call['function']['name']}: {command}  (run here)")
                    result = subprocess.run(
                        command,
                        shell=True,
                        cwd=workspace,
                        capture_output=True,
                        text=True,
                        timeout=30,
                        check=False,
                    )
                    print(f"   tool result: {result.stdout.strip()!r}")
                    messages.append(
                        {"role": "tool", "tool_call_id": call["id"], "content": result.stdout}
                    )

            solved = (workspace / "demo.txt").read_text().strip() == "hello"
            _say(
                "",
                "3. The orchestrator grades the result (demo.txt holds 'hello': "
                f"{'solved' if solved else 'not solved'}) and finishes the session with its "
                "reward.",
            )
            admin.post(
                f"/sessions/{session['id']}/finish",
                json={"termination": "completed", "reward": 1.0 if solved else 0.0},
            ).raise_for_status()
            trajectory = admin.get(f"/sessions/{session['id']}/trajectory").json()
            _print_trajectory(trajectory)
    finally:
        if keep:
            _say(
                "",
                f"The data is kept in {root}. To browse it in the Live UI:",
                f"   LEGO_DATA_DIR={root / 'data'} lego-proxy serve",
                "   then open http://127.0.0.1:8000/ui and log in with the admin key "
                f"{settings.effective_admin_key}",
            )
        else:
            shutil.rmtree(root, ignore_errors=True)
            _say(
                "",
                "The demo's data is deleted. Run 'lego-proxy demo --keep' to keep it and "
                "browse the session in the Live UI.",
            )


def _say(*lines: str) -> None:
    print("\n".join(lines), flush=True)


def _read_stream(stream: Any) -> tuple[str, list[dict[str, Any]], object, str | None]:
    text: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    usage: object = None
    finish: str | None = None
    for chunk in stream:
        if chunk.usage is not None:
            usage = {
                "prompt": chunk.usage.prompt_tokens,
                "completion": chunk.usage.completion_tokens,
            }
        for choice in chunk.choices:
            delta = choice.delta
            if delta.content:
                text.append(delta.content)
            for tc in delta.tool_calls or []:
                call = calls.setdefault(
                    tc.index,
                    {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
                )
                call["id"] = tc.id or call["id"]
                if tc.function is not None:
                    call["function"]["name"] += tc.function.name or ""
                    call["function"]["arguments"] += tc.function.arguments or ""
            finish = choice.finish_reason or finish
    return "".join(text), [calls[i] for i in sorted(calls)], usage, finish


def _print_trajectory(trajectory: dict[str, Any]) -> None:
    _say(
        "",
        "4. What the recorder kept, and what a trainer will get "
        f"(termination={trajectory['termination']} reward={trajectory['reward']} "
        f"turns={trajectory['turn_count']}):",
    )
    for order, turn in enumerate(trajectory["turns"], start=1):
        print(
            f"   turn {order}: {turn['status']:<9} {turn['classification']:<7} "
            f"prompt={turn['prompt_tokens']:>4} sampled={turn['completion_tokens']:>3} "
            f"backend finish={turn['finish_reason']} weights={turn['weight_version']}"
        )
    _say(
        "   'backend finish' is why the model stopped: 'stop' means it sampled its end token. "
        "The proxy",
        "   parsed a tool call out of the sampled ids of turn 1, so the harness was told "
        "finish_reason=tool_calls.",
        "   'extend' means turn 2's prompt began with turn 1's exact prompt and sampled ids: "
        "no re-tokenization.",
    )
    for index, segment in enumerate(trajectory["segments"]):
        mask = segment["loss_mask"]
        sampled = [lp for lp, m in zip(segment["logprobs"], mask, strict=True) if m]
        experts = segment["routed_experts"]
        shape = f"{len(experts)}x{len(experts[0])}x{len(experts[0][0])}" if experts else "none"
        print(
            f"   segment {index}: {len(segment['tokens'])} tokens, {sum(mask)} sampled "
            f"(loss mask), mean sampled logprob {sum(sampled) / max(len(sampled), 1):.3f}, "
            f"routed experts {shape}, turns {len(segment['turn_ids'])}"
        )
    _say(
        "   A segment is one training sequence: prompt and sampled tokens, a loss mask that is "
        "1 exactly on",
        "   the sampled ones, their logprobs as the backend returned them, and the MoE experts "
        "each token was",
        "   routed to (tokens x layers x top-k) for routing replay. The logprobs are very "
        "negative because the",
        "   tiny model has random weights and the script forces its tokens; a trained model's "
        "are near 0.",
    )
