"""The ``lego_proxy`` agent loop inside the REAL verl 0.9.1 (``make test-verl``).

verl lives in its own environment (it pins an older transformers than lego-proxy's), so
where it cannot be imported this module is skipped and says why. Where it can, the loop is
built the way verl's ``AgentLoopWorker`` builds one (``hydra.utils.instantiate`` of the
agent-loop YAML entry, with verl's own constructor arguments), run on a real lego-proxy
session (the harness is the one faked edge: ``conftest.coding_agent``), and its outputs
are verl's own ``AgentLoopOutput`` objects, checked field by field and through
``as_dict()`` and verl's V1 storage step (``list_of_dict_to_tensordict``) against the
session's recorded arrays.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from kernel.errors import ConfigurationError
from tests.proxy.conftest import ADMIN_KEY, Proxy
from tests.verl_bridge.conftest import TASK_ID, coding_agent, crashing_harness, new_run
from verl_bridge.verl_api import AGENT_NAME, SampleFields, load

try:
    VERL = load()
except ConfigurationError as exc:
    pytest.skip(exc.message, allow_module_level=True)

import hydra
import pandas as pd
from omegaconf import OmegaConf
from transformers import AutoTokenizer
from verl.experimental.agent_loop import agent_loop as verl_agent_loop
from verl.utils.dataset.rl_dataset import RLHFDataset
from verl.utils.tensordict_utils import list_of_dict_to_tensordict

from verl_bridge.agent_loop import LegoProxyAgentLoop

TARGET = f"{LegoProxyAgentLoop.__module__}.{LegoProxyAgentLoop.__qualname__}"
SAMPLING = {"temperature": 0.9, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0}


def build_loop(
    proxy: Proxy, run_id: str, pool: Path, model_dir: Path, harness_dir: Path, *, v1: bool = True
) -> Any:
    """As verl's worker does it, from the entry the agent-loop YAML gives (docs/verl.md)."""
    config = OmegaConf.create(
        {
            "trainer": {"use_v1": v1},
            "actor_rollout_ref": {
                "rollout": {"n": 2, "prompt_length": 4096, "response_length": 4096}
            },
            "data": {},
        }
    )
    entry = {
        "_target_": TARGET,
        "proxy_url": proxy.url,
        "admin_key": ADMIN_KEY,
        "run_id": run_id,
        "harness": "codex",
        "tasks": str(pool),
        "harness_dir": str(harness_dir),
    }
    return hydra.utils.instantiate(
        config=entry,
        trainer_config=verl_agent_loop.DictConfigWrap(config=config),
        server_manager=None,  # the harness reaches verl's servers through the proxy
        tokenizer=AutoTokenizer.from_pretrained(model_dir),
        processor=None,
        hf_model_type=None,
        dataset_cls=RLHFDataset,
        data_config=verl_agent_loop.DictConfigWrap(config.data),
        tools=verl_agent_loop.ToolListWrap([]),
    )


def fields(uid: str = "uid-7") -> dict[str, Any]:
    """A dataset row as verl's V1 worker passes it (numpy and tensor scalars included)."""
    return {
        "raw_prompt": [{"role": "user", "content": "the harness gets the task's own prompt"}],
        "extra_info": {"lego_task_id": TASK_ID, "index": 0},
        "data_source": "lego-proxy",
        "uid": uid,
        "session_id": np.int64(1),
        "global_steps": torch.tensor(3),
    }


@pytest.fixture
def harness_dir(tmp_path: Path) -> Path:
    (tmp_path / "harness" / "npm").mkdir(parents=True)  # what `make harness-install` leaves
    return tmp_path / "harness"


def test_the_loop_is_a_verl_agent_loop_registered_under_its_name() -> None:
    assert issubclass(LegoProxyAgentLoop, verl_agent_loop.AgentLoopBase)
    assert verl_agent_loop._agent_loop_registry[AGENT_NAME] == {"_target_": TARGET}
    assert VERL.version == "0.9.1"


async def test_the_loop_turns_a_real_session_into_verl_outputs(
    verl_proxy: Proxy, pool: Path, tiny_model_dir: Path, harness_dir: Path
) -> None:
    run_id = new_run(verl_proxy)
    loop = build_loop(verl_proxy, run_id, pool, tiny_model_dir, harness_dir)
    loop.trial = coding_agent(1.0)  # the sandboxed harness is the one edge played here

    outputs = await loop.run(dict(SAMPLING, logprobs=True), **fields())

    (listed,) = verl_proxy.admin.get(f"/api/v1/runs/{run_id}/trajectories").json()["items"]
    assert (listed["group_id"], listed["sample_index"]) == (f"verl.{TASK_ID}.s3.uid-7", 1)
    assert listed["sampling"]["temperature"] == 0.9
    truth = verl_proxy.trajectory(listed["id"])
    assert all(isinstance(o, verl_agent_loop.AgentLoopOutput) for o in outputs)
    assert [o.extra_fields["lego_segment"] for o in outputs] == [1, 2, 0]
    for output in outputs:
        check(output, truth["segments"][output.extra_fields["lego_segment"]])
    assert outputs[-1].num_turns == 4

    # verl's V1 worker stores each output's as_dict() in one TensorDict, ragged lengths.
    stored = list_of_dict_to_tensordict([o.as_dict() for o in outputs])
    assert stored.batch_size == torch.Size([3])
    lengths = stored["responses"].offsets().diff().tolist()
    assert lengths == [len(o.response_ids) for o in outputs]


def check(output: Any, segment: dict[str, Any]) -> None:
    tokens, mask = segment["tokens"], segment["loss_mask"]
    first = mask.index(1)
    assert (output.prompt_ids, output.response_ids) == (tokens[:first], tokens[first:])
    assert output.response_mask == mask[first:]
    assert output.response_logprobs == segment["logprobs"][first:]
    assert output.reward_score == 1.0

    tensors = output.as_dict()
    assert tensors["prompts"].dtype == tensors["responses"].dtype == torch.int64
    assert torch.equal(tensors["prompts"], torch.tensor(tokens[:first]))
    assert torch.equal(tensors["responses"], torch.tensor(tokens[first:]))
    assert torch.equal(tensors["response_mask"], torch.tensor(mask[first:]))
    logprobs = torch.tensor(segment["logprobs"][first:], dtype=torch.float32)
    assert torch.equal(tensors["rollout_log_probs"], logprobs)
    experts = torch.tensor(segment["routed_experts"], dtype=torch.int16)
    assert tensors["routed_experts"].shape == (len(tokens), *experts.shape[1:])
    assert torch.equal(tensors["routed_experts"], experts)
    scores = tensors["rm_scores"]
    assert (scores[-1].item(), int(torch.count_nonzero(scores))) == (1.0, 1)
    assert tensors["extra_fields"]["lego_turn_ids"] == segment["turn_ids"]


async def test_an_excluded_sample_gives_verl_no_output(
    verl_proxy: Proxy, pool: Path, tiny_model_dir: Path, harness_dir: Path
) -> None:
    run_id = new_run(verl_proxy)
    loop = build_loop(verl_proxy, run_id, pool, tiny_model_dir, harness_dir)
    loop.trial = crashing_harness

    assert await loop.run(dict(SAMPLING), **fields("uid-8")) == []
    (listed,) = verl_proxy.admin.get(f"/api/v1/runs/{run_id}/trajectories").json()["items"]
    assert (listed["termination"], listed["excluded"], listed["turn_count"]) == (
        "harness_error",
        True,
        1,
    )


def test_verl_s_legacy_trainer_is_refused_before_any_trial(
    verl_proxy: Proxy, pool: Path, tiny_model_dir: Path, harness_dir: Path
) -> None:
    with pytest.raises(Exception, match=r"trainer\.use_v1=true"):
        build_loop(verl_proxy, "r", pool, tiny_model_dir, harness_dir, v1=False)


def test_a_dataset_row_made_as_the_docs_say_reaches_the_loop_through_verl_s_dataset(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    row = {
        "data_source": "lego-proxy",
        "agent_name": AGENT_NAME,
        "prompt": [{"role": "user", "content": "Fix clamp."}],
        "extra_info": {"lego_task_id": TASK_ID, "index": 0},
    }
    pd.DataFrame([row]).to_parquet(tmp_path / "lego_tasks.parquet")
    dataset = RLHFDataset(
        str(tmp_path / "lego_tasks.parquet"),
        AutoTokenizer.from_pretrained(tiny_model_dir),
        OmegaConf.create({"max_prompt_length": 512}),
    )

    read = dataset[0]
    assert read["agent_name"] == AGENT_NAME
    # verl's V1 worker adds the prompt's uid and the sample's session_id.
    fields = SampleFields.model_validate({**read, "uid": "u1", "session_id": 0})
    assert fields.extra_info.lego_task_id == TASK_ID
