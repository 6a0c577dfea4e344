"""Weights broadcast over a process group (engine.distributed): SGLang 0.5.23's routes on a
real engine, with this test as rank 0 over real gloo on loopback.

What is served after the broadcast is checked through the engine's own teacher-forced
logprobs of a fixed prompt: equal to those after loading the same weights from disk, unlike
those before.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM
from transformers.core_model_loading import revert_weight_conversion

from engine.loopback import running_engine
from kernel.threaded import free_port
from kernel.weight_group import GroupAddress, WeightGroup, flatten, spec_of
from tests.engine.helpers import engine_config

TIMEOUT_S = 20.0
PROMPT = list(range(5, 45))
NO_SESSION = (
    "update_weights_from_distributed must run between begin_weight_update() and end_weight_update()"
)


@pytest.fixture(scope="module")
def url(tiny_model_dir: Path) -> Iterator[str]:
    config = engine_config(tiny_model_dir, weight_group_timeout_s=TIMEOUT_S)
    with running_engine(config) as base_url:
        yield base_url


@pytest.fixture(scope="module")
def scaled_model_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with every weight scaled: weights the engine does not serve yet."""
    model: Any = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    with torch.no_grad():
        for param in model.parameters():
            param.mul_(1.25)
    target = tmp_path_factory.mktemp("scaled")
    model.save_pretrained(str(target))
    return target


def checkpoint_tensors(model_dir: Path) -> list[tuple[str, torch.Tensor]]:
    """The model's weights named and shaped as its checkpoint has them (what a trainer
    sends; transformers fuses the MoE experts in memory)."""
    model: Any = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    return list(revert_weight_conversion(model, model.state_dict()).items())


def post(url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{url}{path}", json=body, timeout=60)


def prompt_logprobs(url: str) -> list[float]:
    body = {
        "input_ids": PROMPT,
        "return_logprob": True,
        "logprob_start_len": 0,
        "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
    }
    meta = post(url, "/generate", body).raise_for_status().json()["meta_info"]
    return [float(lp) for lp, _tok, _ in meta["input_token_logprobs"][1:]]


def version(url: str) -> str:
    return str(httpx.get(f"{url}/model_info").json()["weight_version"])


def join(url: str, group_name: str = "weight_update_group") -> WeightGroup:
    """Rank 0 of a two-rank group whose rank 1 is the engine."""
    address = GroupAddress("127.0.0.1", free_port(), 2, group_name)
    body = {
        "master_address": address.master_address,
        "master_port": address.master_port,
        "rank_offset": 1,
        "world_size": 2,
        "group_name": group_name,
        "backend": "gloo",
    }
    with ThreadPoolExecutor(1) as pool:
        joining = pool.submit(post, url, "/init_weights_update_group", body)
        group = WeightGroup.join(address, 0, TIMEOUT_S)
        answer = joining.result()
    assert answer.status_code == 200, answer.text
    assert answer.json() == {
        "success": True,
        "message": "Succeeded to initialize custom process group.",
    }
    return group


def update_body(named: Sequence[tuple[str, torch.Tensor]], **fields: object) -> dict[str, object]:
    specs = [spec_of(name, tensor) for name, tensor in named]
    return {
        "names": [s.name for s in specs],
        "dtypes": [s.dtype for s in specs],
        "shapes": [list(s.shape) for s in specs],
        **fields,
    }


def send(
    url: str, group: WeightGroup, named: Sequence[tuple[str, torch.Tensor]], **fields: object
) -> httpx.Response:
    """POST the update while broadcasting its tensors, as a trainer must: the worker's
    handler answers only once it has received them."""
    bucket = fields.get("load_format") == "flattened_bucket"
    tensors = [flatten([t for _, t in named])] if bucket else [t for _, t in named]
    with ThreadPoolExecutor(1) as pool:
        body = update_body(named, **fields)
        answer = pool.submit(post, url, "/update_weights_from_distributed", body)
        group.broadcast(tensors)
        return answer.result()


@pytest.fixture
def group(url: str) -> Iterator[WeightGroup]:
    joined = join(url)
    yield joined
    post(url, "/destroy_weights_update_group", {})
    joined.close()
    post(url, "/end_weight_update", {})  # whatever the test left open


@pytest.fixture
def restore(url: str, tiny_model_dir: Path) -> Iterator[None]:
    yield
    body = {"model_path": str(tiny_model_dir), "weight_version": "default"}
    post(url, "/update_weights_from_disk", body).raise_for_status()


@pytest.mark.usefixtures("restore")
def test_broadcast_weights_are_served_as_if_loaded_from_disk(
    url: str, group: WeightGroup, scaled_model_dir: Path
) -> None:
    before = prompt_logprobs(url)
    named = checkpoint_tensors(scaled_model_dir)
    half = len(named) // 2
    assert post(url, "/begin_weight_update", {}).json() == {"success": True, "message": "Success"}
    # Two batches in one session: SGLang's default (a broadcast per tensor), then one
    # flattened bucket carrying the rest and the version label.
    first = send(url, group, named[:half])
    assert first.json() == {"success": True, "message": "Succeeded to update parameter online."}
    assert version(url) == "default"
    last = send(url, group, named[half:], load_format="flattened_bucket", weight_version="v-dist")
    assert last.status_code == 200
    assert last.json()["message"] == (
        "Succeeded to update parameter online. Weight version updated to v-dist."
    )
    assert post(url, "/end_weight_update", {}).json()["success"] is True
    broadcast = prompt_logprobs(url)
    assert version(url) == "v-dist"
    assert max(abs(a - b) for a, b in zip(broadcast, before, strict=True)) > 0.1

    post(url, "/update_weights_from_disk", {"model_path": str(scaled_model_dir)})
    assert prompt_logprobs(url) == broadcast


def test_an_update_outside_a_session_is_refused_before_any_broadcast(
    url: str, group: WeightGroup, scaled_model_dir: Path
) -> None:
    named = checkpoint_tensors(scaled_model_dir)[:2]
    answer = post(url, "/update_weights_from_distributed", update_body(named))
    assert answer.status_code == 400
    assert answer.json() == {"success": False, "message": NO_SESSION}


def test_an_update_without_a_group_names_the_route_to_call(url: str) -> None:
    post(url, "/begin_weight_update", {}).raise_for_status()
    try:
        body = update_body([("lm_head.weight", torch.zeros(2))], group_name="nobody")
        answer = post(url, "/update_weights_from_distributed", body)
    finally:
        post(url, "/end_weight_update", {})
    assert answer.status_code == 400
    assert answer.json() == {
        "success": False,
        "message": "Failed to receive weights: Group nobody not in []. "
        "Please call `init_weights_update_group` first.",
    }


@pytest.mark.parametrize(
    ("named", "expected"),
    [
        (
            [("lm_head.weight", torch.zeros(3, 5))],
            "Failed to update parameter online: Attempted to load weight "
            "(torch.Size([3, 5])) into parameter (torch.Size([4096, 64]))",
        ),
        (
            [("model.layers.1.mlp.experts.gate_up_proj", torch.zeros(8, 64, 64))],
            "Failed to update parameter online: Parameter "
            "model.layers.1.mlp.experts.gate_up_proj not found",
        ),
    ],
    ids=["wrong-shape", "in-memory-name"],
)
def test_weights_that_do_not_fit_are_refused_and_nothing_changes(
    url: str, group: WeightGroup, named: list[tuple[str, torch.Tensor]], expected: str
) -> None:
    before = prompt_logprobs(url)
    post(url, "/begin_weight_update", {}).raise_for_status()
    answer = send(url, group, named, load_format="flattened_bucket", weight_version="bad")
    assert answer.status_code == 400
    assert answer.json()["success"] is False
    assert answer.json()["message"].startswith(expected)
    assert answer.json()["message"].endswith("Please discard the whole weights.")
    assert version(url) == "default"
    assert prompt_logprobs(url) == before


def test_session_and_group_misuse_answers_as_sglang(url: str) -> None:
    assert post(url, "/end_weight_update", {}).json() == {
        "success": False,
        "message": "no weight-update session is open; call begin_weight_update() first",
    }
    post(url, "/begin_weight_update", {}).raise_for_status()
    twice = post(url, "/begin_weight_update", {})
    post(url, "/end_weight_update", {}).raise_for_status()
    assert twice.status_code == 400
    assert twice.json()["message"].startswith("a weight-update session is already open")
    gone = post(url, "/destroy_weights_update_group", {"group_name": "never-made"})
    assert gone.status_code == 400
    assert gone.json() == {"success": False, "message": "The group to be destroyed does not exist."}
    # SGLang's default backend is nccl; the CPU engine says so instead of waiting for peers.
    body = {"master_address": "127.0.0.1", "master_port": 1, "rank_offset": 1, "world_size": 2}
    nccl = post(url, "/init_weights_update_group", body)
    assert nccl.status_code == 400
    assert nccl.json()["message"].startswith("Failed to initialize custom process group: ")
    assert "gloo" in nccl.json()["message"]


def test_a_group_name_is_held_until_destroyed(url: str, group: WeightGroup) -> None:
    body = {
        "master_address": "127.0.0.1",
        "master_port": free_port(),
        "rank_offset": 1,
        "world_size": 2,
        "backend": "gloo",
    }
    again = post(url, "/init_weights_update_group", body)
    assert again.status_code == 400
    assert "already been created" in again.json()["message"]
    assert post(url, "/destroy_weights_update_group", {}).json()["success"] is True
    other = join(url)  # the name is free again
    post(url, "/destroy_weights_update_group", {}).raise_for_status()
    other.close()
