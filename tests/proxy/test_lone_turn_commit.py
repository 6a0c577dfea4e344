"""A turn alone in flight is committed by its own request; a turn that ends while others
generate waits for the writer's batch, so turns ending together share one commit.

Read through ``lego_recorder_written_at_once_turns`` on the proxy's ``/metrics``, on the
embedded SQLite database (the one the event loop writes to).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.proxy.conftest import DEFAULT_REPLY, SLOW_REPLY, Proxy, running_proxy
from tests.support.tap import BackendTap

AT_ONCE = "lego_recorder_written_at_once_turns_total"


def ask(proxy: Proxy, content: str) -> str:
    session = proxy.new_session()
    body = {"model": "m", "messages": [{"role": "user", "content": content}]}
    response = httpx.post(f"{session['openai_base_url']}/chat/completions", json=body, timeout=60)
    response.raise_for_status()
    turns = proxy.trajectory(session["id"])["turns"]
    assert [turn["status"] for turn in turns] == ["completed"]
    return str(response.json()["choices"][0]["message"]["content"])


def test_only_a_turn_alone_in_flight_is_written_at_once(
    tap: BackendTap, model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # However slow this disk's commits, they stay on the loop (the proxy runs in-process).
    monkeypatch.setattr("recorder.sqlite_turns.INLINE_WRITE_S", 60.0)
    with running_proxy(tap.url, model_dir, tmp_path, None) as proxy:
        assert ask(proxy, "hello") == DEFAULT_REPLY
        assert proxy.metric_total(AT_ONCE) == 1

        tap.reset()
        slow: list[str] = []
        runner = threading.Thread(target=lambda: slow.append(ask(proxy, "SLOW")))
        runner.start()
        deadline = time.monotonic() + 10
        while not tap.generates and time.monotonic() < deadline:
            time.sleep(0.01)
        assert tap.generates, "the slow turn never reached the backend"
        # The slow turn generates for 3 s: this one ends while it runs, and is batched.
        assert ask(proxy, "hello") == DEFAULT_REPLY
        assert runner.is_alive()
        assert proxy.metric_total(AT_ONCE) == 1

        runner.join(timeout=30)
        assert slow == [SLOW_REPLY]
        assert proxy.metric_total(AT_ONCE) == 2  # the slow turn ended alone
