"""Drives the OpenHands SDK the way its documentation does; runs in the pinned Python 3.12.

Not imported by the test suite (it needs ``openhands-sdk``, which needs Python >= 3.12): the
suite runs it as a program. The proxy reaches it only through env vars a user would set
(``LEGO_OPENAI_BASE_URL``, ``LEGO_SESSION_KEY``). It prints one JSON line last:
``{"status", "prompt_tokens", "completion_tokens", "calls"}``, the usage the SDK itself
accumulated from the proxy's replies, and exits 0 only when the conversation FINISHED.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Protocol, cast

from openhands.sdk import LLM, Agent, Conversation, Tool
from openhands.tools.file_editor import FileEditorTool
from openhands.tools.task_tracker import TaskTrackerTool
from openhands.tools.terminal import TerminalTool
from pydantic import SecretStr


class _Loop(Protocol):
    def send_message(self, message: str) -> None: ...
    def run(self) -> None: ...


def main(prompt: str) -> int:
    llm = LLM(
        model="openai/lego-policy",
        base_url=os.environ["LEGO_OPENAI_BASE_URL"],
        api_key=SecretStr(os.environ["LEGO_SESSION_KEY"]),
        stream=os.environ.get("LEGO_STREAM") == "1",
        num_retries=int(os.environ.get("LEGO_NUM_RETRIES", "2")),
        # The SDK's default backoff (8-64 s) would dominate a test run.
        retry_min_wait=1,
        retry_max_wait=2,
        usage_id="agent",
    )
    tools = [
        Tool(name=TerminalTool.name),
        Tool(name=FileEditorTool.name),
        Tool(name=TaskTrackerTool.name),
    ]
    agent = Agent(llm=llm, tools=tools)
    chunks: list[Any] = []
    conversation = Conversation(
        agent=agent, workspace=str(Path.cwd()), token_callbacks=[chunks.append]
    )
    # The SDK wraps these two in an untyped tracing decorator that erases their signatures
    # (mypy sees ``(*Never) -> Never``); the documented ones are restored here.
    loop = cast(_Loop, conversation)
    loop.send_message(prompt)
    loop.run()
    status = str(conversation.state.execution_status.value)
    usage = llm.metrics.accumulated_token_usage
    calls = [
        {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens}
        for u in llm.metrics.token_usages
    ]
    print(
        json.dumps(
            {
                "status": status,
                "prompt_tokens": usage.prompt_tokens if usage else 0,
                "completion_tokens": usage.completion_tokens if usage else 0,
                "calls": calls,
                "streamed_chunks": len(chunks),
            }
        )
    )
    return 0 if status == "finished" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
