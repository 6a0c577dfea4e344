"""Fixtures for the verl bridge: a real scripted engine and a real proxy on loopback, a
generated task, and a scripted coding agent in place of the sandboxed harness.

The harness is the one edge faked here: ``coding_agent`` is a ``rollouts.runner.Trial``
that drives the session's OpenAI endpoint with the official SDK the way an agent does (a
tool call, its result, the answer), with a title request and a sub-agent on the same key
in between, so the session's trajectory has a main conversation and two forks. Everything
else (control API, ledger, recorder, export API) is the real proxy's.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from engine.config import EngineConfig
from engine.loopback import running_engine
from rollouts.control import ControlClient
from rollouts.harnesses import Endpoint
from rollouts.runner import Trial
from rollouts.stages import Stage, Stopwatch
from rollouts.trial import Ending, Termination, TrialResult
from tasks import generated
from tasks.grading import GradeResult, GradeTermination
from tasks.spec import Task, load_task
from tests.proxy.conftest import ADMIN_KEY, SCRIPT, SHELL_TOOL, Proxy, running_proxy
from verl_bridge.episode import TrajectoryReader

TASK_ID = "calc-clamp"


@pytest.fixture(scope="module")
def verl_proxy(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    script = tmp_path_factory.mktemp("verl-script") / "policy.json"
    script.write_text(json.dumps(SCRIPT))
    config = EngineConfig(
        model_path=tiny_model_dir, script_path=script, enable_return_routed_experts=True
    )
    data_dir = tmp_path_factory.mktemp("verl-proxy")
    with (
        running_engine(config) as engine_url,
        running_proxy(engine_url, tiny_model_dir, data_dir, None) as proxy,
    ):
        yield proxy


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("verl-pool")
    generated.make_task(root, TASK_ID)
    return root


@pytest.fixture(scope="module")
def task(pool: Path) -> Task:
    return load_task(pool / TASK_ID)


@pytest.fixture
def control(verl_proxy: Proxy) -> Iterator[ControlClient]:
    with ControlClient(verl_proxy.url, ADMIN_KEY) as client:
        yield client


@pytest.fixture
def reader(verl_proxy: Proxy) -> Iterator[TrajectoryReader]:
    with TrajectoryReader(verl_proxy.url, ADMIN_KEY) as client:
        yield client


def new_run(proxy: Proxy) -> str:
    body = {"name": f"verl-{uuid.uuid4().hex[:8]}"}
    return str(proxy.admin.post("/api/v1/runs", json=body).raise_for_status().json()["id"])


def _reply(base_url: str, messages: list[Any], **kwargs: Any) -> Any:
    client = openai.OpenAI(base_url=base_url, api_key="set-by-the-path", max_retries=0)
    return client.chat.completions.create(model="policy", messages=messages, **kwargs)


def play_coding_agent(endpoint: Endpoint) -> None:
    """Main conversation: a tool call and, after its result, the answer; between the two,
    a title request and a sub-agent through the same key (two forks)."""
    base = endpoint.openai_base_url
    main: list[Any] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "CALL_TOOL to fix clamp"},
    ]
    first = _reply(base, main, tools=[SHELL_TOOL]).choices[0].message
    _reply(base, [{"role": "user", "content": "Write a 3-word title for: fix clamp"}])
    sub_agent = [
        {"role": "system", "content": "You are a sub-agent that searches code."},
        {"role": "user", "content": "find where clamp is defined"},
    ]
    _reply(base, sub_agent, tools=[SHELL_TOOL])
    (call,) = first.tool_calls
    echoed = {
        "role": "assistant",
        "content": first.content or "",
        "tool_calls": [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.function.name, "arguments": call.function.arguments},
            }
        ],
    }
    main += [echoed, {"role": "tool", "tool_call_id": call.id, "content": "clamp fixed"}]
    _reply(base, main, tools=[SHELL_TOOL])


def graded(reward: float) -> GradeResult:
    return GradeResult(GradeTermination.COMPLETED, reward, (), (), "graded by the test")


def coding_agent(reward: float = 1.0) -> Trial:
    def trial(task: Task, harness: str, endpoint: Endpoint, watch: Stopwatch) -> TrialResult:
        with watch.stage(Stage.AGENT_EXECUTION):
            play_coding_agent(endpoint)
        ending = Ending(Termination.COMPLETED, "", grade=graded(reward))
        return TrialResult(task.id, harness, ending, watch.stages())

    return trial


def crashing_harness(task: Task, harness: str, endpoint: Endpoint, watch: Stopwatch) -> TrialResult:
    """One turn, then the harness exits non-zero: an excluded trial."""
    _reply(endpoint.openai_base_url, [{"role": "user", "content": "hi"}])
    ending = Ending(Termination.HARNESS_ERROR, "codex exited 1: boom")
    return TrialResult(task.id, harness, ending, watch.stages())
