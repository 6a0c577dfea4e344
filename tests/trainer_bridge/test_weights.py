"""Weight sync reaches every worker, never the router (trainer_bridge.weights): real local
engines on loopback, alone and behind the real smg router, one of them failing its update."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

from engine.config import EngineConfig
from engine.loopback import running_engine
from kernel.errors import BackendError
from kernel.threaded import serve
from tests.support.smg import listed_workers, running_smg
from tests.support.worker_front import worker_front
from trainer_bridge.weights import SyncReport, WeightSync, discover_workers

SLOW = {"rules": [{"match": "slow", "reply": "tick " * 40, "delay_s": 0.02}], "default": "OK."}


def _version(url: str) -> str:
    return str(httpx.get(f"{url}/model_info").json()["weight_version"])


def refusing_updates(upstream: str) -> Starlette:
    """A worker that answers like its upstream engine but fails every weight update (a bad
    checkpoint, a full disk), and logs the control calls it gets."""
    refusal = {"success": False, "message": "cannot load weights", "num_paused_requests": 0}
    return worker_front(upstream, refuse="/update_weights_from_disk", refusal=refusal)


@pytest.fixture
def engines(tiny_model_dir: Path, tmp_path: Path) -> Iterator[list[str]]:
    script = tmp_path / "slow.json"
    script.write_text(json.dumps(SLOW))
    config = EngineConfig(model_path=tiny_model_dir, script_path=script)
    with ExitStack() as stack:
        yield [stack.enter_context(running_engine(config)) for _ in range(2)]


def test_a_worker_list_is_updated_everywhere(engines: list[str], tiny_model_dir: Path) -> None:
    with WeightSync(",".join(engines)) as sync:
        report = sync.publish(str(tiny_model_dir), "step-1")
    assert report.updated == tuple(engines)
    assert report.failed == ()
    assert [_version(url) for url in engines] == ["step-1", "step-1"]
    assert all(httpx.get(f"{url}/ready").status_code == 200 for url in engines)


def test_a_running_turn_comes_back_as_a_resumable_abort(
    engines: list[str], tiny_model_dir: Path
) -> None:
    prompt = "<|im_start|>user\nslow<|im_end|>\n<|im_start|>assistant\n"
    finishes: list[dict[str, Any]] = []

    def stream() -> None:
        body = {"text": prompt, "stream": True, "sampling_params": {"max_new_tokens": 200}}
        with httpx.stream("POST", f"{engines[0]}/generate", json=body, timeout=60) as r:
            last = [line for line in r.iter_lines() if line.startswith("data: {")][-1]
        finishes.append(json.loads(last[6:])["meta_info"]["finish_reason"])

    turn = threading.Thread(target=stream)
    turn.start()
    time.sleep(0.3)
    with WeightSync(",".join(engines)) as sync:
        sync.publish(str(tiny_model_dir), "step-2")
    turn.join(timeout=30)
    (finish,) = finishes
    assert finish["type"] == "abort"
    assert finish["status_code"] is None  # the proxy resumes it after the sync


def test_behind_smg_every_worker_is_reached_and_a_failing_one_is_taken_out(
    engines: list[str], tiny_model_dir: Path, tmp_path: Path
) -> None:
    good, upstream = engines
    front = refusing_updates(upstream)
    with serve(front) as failing, running_smg([good, failing], tmp_path) as router:
        with httpx.Client() as http:
            found_router, workers = discover_workers(http, router)
        assert found_router == router
        assert sorted(w.url for w in workers) == sorted([good, failing])
        with WeightSync(router) as sync:
            report = sync.publish(str(tiny_model_dir), "step-3")
        assert report.updated == (good,)
        ((url, why),) = report.failed
        assert url == failing
        assert why.startswith("update: ")
        assert report.removed == (failing,)
        deadline = time.monotonic() + 10
        while failing in [w["url"] for w in listed_workers(router)]:
            assert time.monotonic() < deadline, "the router still lists the failed worker"
            time.sleep(0.2)
    assert _version(good) == "step-3"
    assert _version(upstream) == "default"
    # Paused, flushed, refused, then continued: nothing waits on its pause forever.
    assert front.state.calls[-1] == "/continue_generation"
    assert "/pause_generation" in front.state.calls
    assert httpx.get(f"{upstream}/ready").status_code == 200


def test_no_worker_taking_the_weights_is_an_error(engines: list[str], tmp_path: Path) -> None:
    with WeightSync(",".join(engines)) as sync, pytest.raises(BackendError, match="no worker"):
        sync.publish(str(tmp_path / "missing"), "step-4")
    assert all(httpx.get(f"{url}/ready").status_code == 200 for url in engines)


def test_a_failed_worker_of_a_list_leaves_the_rotation_and_an_updated_one_comes_back() -> None:
    report = SyncReport(
        version="step-4",
        updated=("http://a:1",),
        failed=(("http://b:1", "update: cannot load weights"), ("http://c:1", "pause: down")),
        removed=("http://c:1",),  # behind smg: out of the router already
    )
    exclude, include = report.rotation_changes()
    assert exclude == {"http://b:1": "weight sync to step-4 failed: update: cannot load weights"}
    assert include == ["http://a:1"]
