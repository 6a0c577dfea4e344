"""The conversion to verl's outputs, on real lego-proxy sessions (no verl needed).

A session is played through the real proxy (``conftest.coding_agent``: a tool call turn,
its continuation, a title request and a sub-agent, i.e. a main conversation and two
forks), finished through ``Episodes`` and read back over the export API in ``b64v1``;
every field of every output is then checked against the session's recorded arrays as
the trajectory route's plain ``json`` form gives them, and against its turns.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from kernel.errors import ConfigurationError
from recorder.export_wire import Segment, Trajectory
from rollouts.control import ControlClient
from tasks.spec import Task
from tests.proxy.conftest import Proxy
from tests.verl_bridge.conftest import coding_agent, crashing_harness, new_run
from verl_bridge.convert import Split, VerlOutput, to_verl
from verl_bridge.episode import Episodes, Sample, TrajectoryReader


def episodes(
    proxy: Proxy, control: ControlClient, reader: TrajectoryReader, trial: Any
) -> Episodes:
    return Episodes(control, reader, new_run(proxy), "codex", trial)


def sample(task: Task, index: int = 0) -> Sample:
    return Sample(task, f"verl.{task.id}.s0.u1", index, 2, {"temperature": 1.0})


def recorded(proxy: Proxy, session_id: str) -> dict[str, Any]:
    return proxy.trajectory(session_id)  # json: the server's own reading of the turns


def test_a_forked_session_becomes_one_output_per_segment_on_its_recorded_arrays(
    verl_proxy: Proxy, control: ControlClient, reader: TrajectoryReader, task: Task
) -> None:
    trajectory = episodes(verl_proxy, control, reader, coding_agent(1.0)).run(sample(task))
    truth = recorded(verl_proxy, trajectory.session_id)
    segments = truth["segments"]
    assert len(segments) == 3  # the main conversation, the title request, the sub-agent

    conversion = to_verl(trajectory)

    assert conversion.dropped is None
    outputs = conversion.outputs
    # verl's V1 trainer takes a sample's last output for its group's advantage: the main
    # conversation goes last, the forks before it in the trajectory's order.
    assert [o.extra_fields["lego_segment"] for o in outputs] == [1, 2, 0]
    assert [o.extra_fields["lego_main"] for o in outputs] == [False, False, True]
    completions = {t["id"]: t["completion_tokens"] for t in truth["turns"]}
    for output in outputs:
        segment = segments[int(str(output.extra_fields["lego_segment"]))]
        check_against_recorded(output, segment, completions)
        assert output.reward_score == 1.0
        assert output.extra_fields["lego_session_id"] == trajectory.session_id
        assert output.extra_fields["lego_termination"] == "completed"
        assert output.extra_fields["reward_extra_info"] == {}
    main = outputs[-1]
    assert main.num_turns == 4  # prompt, tool call, tool result, answer
    # The tool result sits between the two generations, in the response, unmasked.
    runs = np.flatnonzero(np.diff(main.response_mask.astype(np.int8)))
    assert (main.response_mask[0], main.response_mask[-1], len(runs)) == (1, 1, 2)


def check_against_recorded(
    output: VerlOutput, segment: dict[str, Any], completions: dict[str, int]
) -> None:
    tokens = np.array(segment["tokens"], dtype=np.int32)
    mask = np.array(segment["loss_mask"], dtype=np.uint8)
    logprobs = np.array(segment["logprobs"], dtype=np.float32)
    first = int(np.flatnonzero(mask)[0])
    np.testing.assert_array_equal(output.prompt_ids, tokens[:first], strict=True)
    np.testing.assert_array_equal(output.response_ids, tokens[first:], strict=True)
    np.testing.assert_array_equal(output.response_mask, mask[first:], strict=True)
    np.testing.assert_array_equal(output.response_logprobs, logprobs[first:], strict=True)
    assert (output.response_logprobs[output.response_mask == 0] == 0.0).all()
    assert (output.response_logprobs[output.response_mask == 1] < 0.0).any()
    # Every sampled token of the segment's turns, and nothing else, is in the mask.
    assert int(output.response_mask.sum()) == sum(completions[t] for t in segment["turn_ids"])
    assert output.extra_fields["lego_turn_ids"] == segment["turn_ids"]
    assert output.extra_fields["lego_weight_versions"] == segment["weight_versions"]
    assert output.num_turns == 2 * len(segment["turn_ids"])
    experts = np.array(segment["routed_experts"])
    assert output.routed_experts is not None
    # One row per token of the whole sequence, prompt and response; the last is padding.
    assert output.routed_experts.shape == (len(tokens), *experts.shape[1:])
    np.testing.assert_array_equal(output.routed_experts, experts)
    assert not output.routed_experts[-1].any()
    assert output.routed_experts[:-1].any()


def test_an_excluded_session_gives_verl_nothing_and_says_why(
    verl_proxy: Proxy, control: ControlClient, reader: TrajectoryReader, task: Task
) -> None:
    trajectory = episodes(verl_proxy, control, reader, crashing_harness).run(sample(task, 1))
    assert (trajectory.excluded, trajectory.reward) == (True, None)
    assert len(trajectory.segments) == 1  # the turn was recorded, and is not trained on

    conversion = to_verl(trajectory)

    assert conversion.outputs == ()
    assert conversion.dropped == f"session {trajectory.session_id}: excluded (harness_error)"


def test_a_trial_that_raises_still_finishes_its_session_as_aborted(
    verl_proxy: Proxy, control: ControlClient, reader: TrajectoryReader, task: Task
) -> None:
    def broken(*_: object) -> Any:
        raise RuntimeError("the runner itself broke")

    run_id = new_run(verl_proxy)
    with pytest.raises(RuntimeError, match="broke"):
        Episodes(control, reader, run_id, "codex", broken).run(sample(task))

    (session,) = verl_proxy.admin.get(f"/api/v1/runs/{run_id}/trajectories").json()["items"]
    assert (session["status"], session["termination"], session["excluded"]) == (
        "finished",
        "aborted",
        True,
    )
    assert "RuntimeError: the runner itself broke" in session["reward_details"]["reason"]


def test_the_session_carries_the_sample_group_index_and_pins(
    verl_proxy: Proxy, control: ControlClient, reader: TrajectoryReader, task: Task
) -> None:
    trajectory = episodes(verl_proxy, control, reader, coding_agent(0.0)).run(sample(task, 1))
    session = verl_proxy.admin.get(f"/api/v1/sessions/{trajectory.session_id}").json()
    assert (session["task_id"], session["group_id"], session["sample_index"]) == (
        task.id,
        f"verl.{task.id}.s0.u1",
        1,
    )
    assert (session["harness"], session["sampling"]["temperature"]) == ("codex", 1.0)
    assert to_verl(trajectory).outputs[-1].reward_score == 0.0  # a zero is a real reward


# -- the rules on made-up trajectories ---------------------------------------------------------


def segment(mask: list[int], *, experts: bool = True) -> Segment:
    n = len(mask)
    return Segment(
        tokens=np.arange(10, 10 + n, dtype=np.int32),
        loss_mask=np.array(mask, dtype=np.uint8),
        logprobs=np.where(np.array(mask) == 1, -0.5, 0.0).astype(np.float32),
        routed_experts=np.ones((n, 2, 2), dtype=np.uint8) if experts else None,
        weight_versions=("v1",),
        turn_ids=("t1",),
    )


def trajectory(*segments: Segment, **changes: Any) -> Trajectory:
    made = Trajectory(
        session_id="s1",
        run_id="r1",
        task_id="t",
        group_id="g",
        sample_index=0,
        purpose="train",
        status="finished",
        termination="completed",
        reward=0.5,
        excluded=False,
        segments=segments,
    )
    return dataclasses.replace(made, **changes)


def test_the_split_is_at_the_first_sampled_position() -> None:
    split = Split.of(segment([0, 0, 0, 1, 1, 0, 1]))
    assert split is not None
    assert (split.prompt, split.response) == (slice(0, 3), slice(3, 7))
    assert Split.of(segment([0, 0])) is None


def test_a_segment_without_sampled_tokens_is_left_out_and_the_main_one_still_goes_last() -> None:
    outputs = to_verl(trajectory(segment([0, 0]), segment([0, 1]), segment([1, 1]))).outputs
    assert [o.extra_fields["lego_segment"] for o in outputs] == [1, 2]
    nothing = to_verl(trajectory(segment([0, 0]), segment([0])))
    assert nothing.outputs == ()
    assert nothing.dropped == "session s1: no sampled token in its 2 segments"


def test_a_session_without_routed_experts_or_reward() -> None:
    (output,) = to_verl(trajectory(segment([0, 1, 1], experts=False))).outputs
    assert output.routed_experts is None
    unrewarded = to_verl(trajectory(segment([0, 1]), reward=None, status="active"))
    assert unrewarded.outputs == ()
    assert unrewarded.dropped == "session s1: no reward (active, completed)"


def test_a_vector_reward_is_refused_not_guessed() -> None:
    with pytest.raises(ConfigurationError, match="vector reward"):
        to_verl(trajectory(segment([0, 1]), reward=(1.0, 0.0)))
