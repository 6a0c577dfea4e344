"""Weight sync by broadcast (trainer_bridge.weights ``publish_tensors``, trainer_bridge.
broadcast): this process is rank 0 of a real gloo group with two real local engines on
loopback; one of them sits behind a front that logs its control calls, or refuses updates.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from starlette.applications import Starlette

from engine.config import EngineConfig
from engine.loopback import running_engine
from kernel.threaded import serve
from tests.support.worker_front import worker_front
from trainer_bridge.broadcast import GroupSettings, buckets
from trainer_bridge.policy import checkpoint_tensors, load_policy
from trainer_bridge.weights import WeightSync

TIMEOUT_S = 20.0
PROMPT = list(range(5, 45))


def front(upstream: str, *, refuse: str | None = None) -> Starlette:
    """A worker that forwards to its upstream engine and logs every control call; it fails
    every call to the route ``refuse`` without forwarding it: for the update, before
    receiving anything (as SGLang does outside a session), so the trainer's broadcast to
    it would wait; for the init, without joining, so the group cannot form."""
    return worker_front(upstream, refuse=refuse)


@pytest.fixture
def engines(tiny_model_dir: Path) -> Iterator[list[str]]:
    config = EngineConfig(model_path=tiny_model_dir, weight_group_timeout_s=TIMEOUT_S)
    with ExitStack() as stack:
        yield [stack.enter_context(running_engine(config)) for _ in range(2)]


@pytest.fixture(scope="module")
def scaled(tiny_model_dir: Path) -> list[tuple[str, torch.Tensor]]:
    """The trainer's in-memory policy after an 'update': every weight scaled."""
    model = load_policy(tiny_model_dir)
    with torch.no_grad():
        for param in model.parameters():
            param.mul_(1.25)
    return checkpoint_tensors(model)


def prompt_logprobs(url: str) -> list[float]:
    body = {
        "input_ids": PROMPT,
        "return_logprob": True,
        "logprob_start_len": 0,
        "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
    }
    response = httpx.post(f"{url}/generate", json=body, timeout=60).raise_for_status()
    return [float(lp) for lp, _tok, _ in response.json()["meta_info"]["input_token_logprobs"][1:]]


def version(url: str) -> str:
    return str(httpx.get(f"{url}/model_info").json()["weight_version"])


def sync(urls: list[str], **settings: Any) -> WeightSync:
    group = GroupSettings(**{"timeout_s": TIMEOUT_S, **settings})
    return WeightSync(",".join(urls), timeout_s=TIMEOUT_S, group=group)


def test_a_broadcast_is_served_by_every_worker_in_sglangs_order(
    engines: list[str], scaled: list[tuple[str, torch.Tensor]], tiny_model_dir: Path
) -> None:
    plain, upstream = engines
    before = prompt_logprobs(plain)
    logged = front(upstream)
    with serve(logged) as fronted, sync([plain, fronted], bucket_bytes=1 << 20) as weights:
        report = weights.publish_tensors(scaled, "step-1")
        assert report.updated == (plain, fronted)
        assert report.failed == ()
        first = list(logged.state.calls)
        weights.publish_tensors(scaled, "step-2")  # the group formed once is used again
        second = logged.state.calls[len(first) :]
        sent = weights.bytes_broadcast
    batches = len(buckets(scaled, 1 << 20))
    assert batches > 1  # several updates in one session
    assert first == [
        "/pause_generation",
        "/flush_cache",
        "/server_info",
        "/init_weights_update_group",
        "/begin_weight_update",
        *["/update_weights_from_distributed"] * batches,
        "/end_weight_update",
        "/continue_generation",
    ]
    assert second == [p for p in first if p not in ("/server_info", "/init_weights_update_group")]
    assert sent == 2 * 2 * sum(t.numel() * t.element_size() for _, t in scaled)
    # Both serve the broadcast weights, labelled, and exactly what the checkpoint holds.
    assert [version(u) for u in engines] == ["step-2", "step-2"]
    served = prompt_logprobs(plain)
    assert prompt_logprobs(upstream) == served
    assert max(abs(a - b) for a, b in zip(served, before, strict=True)) > 0.1
    assert all(httpx.get(f"{u}/ready").status_code == 200 for u in engines)


def test_a_worker_that_refuses_is_reported_and_the_next_sync_forms_a_new_group(
    engines: list[str], scaled: list[tuple[str, torch.Tensor]]
) -> None:
    good, upstream = engines
    before = prompt_logprobs(upstream)
    refusing = front(upstream, refuse="/update_weights_from_distributed")
    with serve(refusing) as failing, sync([good, failing]) as weights:
        began = time.monotonic()
        report = weights.publish_tensors(scaled, "step-3")
        took = time.monotonic() - began
        assert report.updated == (good,)
        ((url, why),) = report.failed
        assert url == failing
        assert why.startswith("update: ")
        assert "cannot load weights" in why
        # Its leaving the group ended the broadcast's wait on it: no timeout was waited out.
        assert took < TIMEOUT_S / 2
        calls = refusing.state.calls
        assert calls.index("/destroy_weights_update_group") > calls.index(
            "/update_weights_from_distributed"
        )
        assert calls[-2:] == ["/end_weight_update", "/continue_generation"]
        # The next sync forms a new group (the old one is gone everywhere) and it holds.
        report = weights.publish_tensors(scaled, "step-4")
        assert report.updated == (good,)
        assert calls.count("/init_weights_update_group") == 2
    assert version(good) == "step-4"
    assert version(upstream) == "default"
    assert prompt_logprobs(upstream) == before
    assert httpx.get(f"{upstream}/ready").status_code == 200


def test_a_worker_that_cannot_join_is_blamed_alone_and_the_group_forms_without_it(
    engines: list[str], scaled: list[tuple[str, torch.Tensor]]
) -> None:
    good, upstream = engines
    refusing = front(upstream, refuse="/init_weights_update_group")
    # The trainer waits `timeout_s` for the rank that never comes, then lets the good
    # worker go (its join fails too, but only after the trainer gave up).
    with serve(refusing) as failing, sync([good, failing], timeout_s=3.0) as weights:
        report = weights.publish_tensors(scaled, "step-5")
    assert report.updated == (good,)
    ((url, why),) = report.failed
    assert url == failing
    assert why.startswith("init: ")
    assert version(good) == "step-5"
    assert version(upstream) == "default"


def test_buckets_hold_one_dtype_and_keep_the_order() -> None:
    tensors = [
        ("a", torch.zeros(4)),
        ("b", torch.zeros(4)),
        ("c", torch.zeros(2, dtype=torch.bfloat16)),
        ("d", torch.zeros(300)),
        ("e", torch.zeros(1)),
    ]
    names = [[name for name, _ in bucket] for bucket in buckets(tensors, 64)]
    assert names == [["a", "b"], ["c"], ["d"], ["e"]]  # d alone is over the limit
