"""The typed boundary to verl 0.9.1: what the bridge uses of it, loaded on demand.

verl is not a dependency of lego-proxy (it pins a transformers older than ours; ``make
test-verl`` gives it its own environment), and it ships no types mypy could see here.
So the bridge touches verl only through this module:

- ``load()`` imports ``verl.experimental.agent_loop.agent_loop`` and returns a ``Verl``
  holding its ``AgentLoopBase``, ``AgentLoopOutput``, ``AgentLoopMetrics`` and
  ``register``; ``ConfigurationError`` with the import error when verl is missing.
- ``outputs_of(verl, trajectory)``: the trajectory's real ``AgentLoopOutput`` objects
  (``convert.to_verl``, then lists of Python ints and floats, routed experts as the
  array, the trial's agent-execution and verification seconds as verl's metrics); a
  sample left out is logged with the reason.
- ``TrainerView.of(trainer_config)`` reads the two settings of verl's trainer config the
  loop depends on; ``SampleFields`` validates what verl passes ``run`` for one sample
  (dataset columns, numpy scalars and 0-d tensors accepted where verl sends them).
- ``session_pins(sampling_params)`` maps verl's sampling to the session's pins.

Everything verl hands over is untyped (``Any``) until it passes through one of these.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Protocol

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from kernel.errors import ConfigurationError
from recorder.export_wire import Trajectory
from verl_bridge.convert import VerlOutput, to_verl

AGENT_NAME = "lego_proxy"
AGENT_LOOP_MODULE = "verl.experimental.agent_loop.agent_loop"
logger = logging.getLogger(__name__)


class AgentLoopOutput(Protocol):
    """What the bridge and its tests use of verl's ``AgentLoopOutput``."""

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float] | None
    reward_score: float | None
    num_turns: int
    extra_fields: dict[str, Any]

    def as_dict(self) -> dict[str, Any]: ...


@dataclass(frozen=True, slots=True)
class Verl:
    base: type  # AgentLoopBase
    output: Callable[..., AgentLoopOutput]  # AgentLoopOutput(**fields)
    metrics: Callable[..., object]  # AgentLoopMetrics(**seconds)
    register: Callable[[str], Callable[[type], type]]
    version: str


def load() -> Verl:
    try:
        module = importlib.import_module(AGENT_LOOP_MODULE)
        version = str(importlib.import_module("verl").__version__)
    except ImportError as exc:
        raise ConfigurationError(
            f"verl cannot be imported ({exc.__class__.__name__}: {exc}); `make test-verl` "
            "builds an environment with verl 0.9.1"
        ) from exc
    return Verl(
        base=module.AgentLoopBase,
        output=module.AgentLoopOutput,
        metrics=module.AgentLoopMetrics,
        register=module.register,
        version=version,
    )


def outputs_of(verl: Verl, trajectory: Trajectory) -> list[AgentLoopOutput]:
    conversion = to_verl(trajectory)
    if conversion.dropped is not None:
        logger.warning("lego-proxy sample left out of training: %s", conversion.dropped)
    stages = trajectory.stages
    metrics = {
        "generate_sequences": (stages and stages.agent_execution) or 0.0,
        "compute_score": (stages and stages.verification) or 0.0,
    }
    return [_output(verl, output, metrics) for output in conversion.outputs]


def _output(verl: Verl, output: VerlOutput, metrics: Mapping[str, float]) -> AgentLoopOutput:
    return verl.output(
        prompt_ids=output.prompt_ids.tolist(),
        response_ids=output.response_ids.tolist(),
        response_mask=output.response_mask.tolist(),
        response_logprobs=output.response_logprobs.tolist(),
        routed_experts=output.routed_experts,
        reward_score=output.reward_score,
        num_turns=output.num_turns,
        metrics=verl.metrics(**metrics),
        extra_fields=dict(output.extra_fields),
    )


@dataclass(frozen=True, slots=True)
class TrainerView:
    use_v1: bool  # trainer.use_v1: the trainer that takes several outputs per sample
    group_size: int  # actor_rollout_ref.rollout.n: samples per prompt

    @classmethod
    def of(cls, trainer_config: Any) -> TrainerView:
        """``trainer_config`` is verl's ``DictConfigWrap`` of the whole config."""
        config = trainer_config.config
        return cls(
            use_v1=bool(config.trainer.get("use_v1", False)),
            group_size=int(config.actor_rollout_ref.rollout.n),
        )


def _plain(value: object) -> object:
    """numpy scalars and 0-d tensors as the Python value they hold."""
    item = getattr(value, "item", None)
    return item() if callable(item) else value


class _Edge(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class ExtraInfo(_Edge):
    lego_task_id: str = Field(min_length=1)


class SampleFields(_Edge):
    """A dataset row's fields, as verl 0.9.1's V1 worker passes them to ``run``."""

    extra_info: ExtraInfo
    uid: Annotated[str, BeforeValidator(_plain)]  # the prompt's group, from verl
    session_id: Annotated[int, BeforeValidator(_plain)] = 0  # sample index in the group
    global_steps: Annotated[int, BeforeValidator(_plain)] = -1


def session_pins(sampling_params: Mapping[str, object]) -> dict[str, float]:
    """verl's ``temperature``, ``top_p``, ``top_k`` pinned on the session (the harness's
    own choices never win); ``logprobs`` is always on in lego-proxy. A repetition penalty
    other than 1.0 cannot be pinned there, so it is refused rather than dropped."""
    pins: dict[str, float] = {}
    for name in ("temperature", "top_p"):
        value = sampling_params.get(name)
        if isinstance(value, int | float):
            pins[name] = float(value)
    top_k = sampling_params.get("top_k")
    if isinstance(top_k, int) and top_k > 0:  # -1 (vLLM/SGLang) and 0 (HF) mean "off"
        pins["top_k"] = top_k
    penalty = sampling_params.get("repetition_penalty", 1.0)
    if penalty != 1.0:
        raise ConfigurationError(
            f"repetition_penalty {penalty!r}: lego-proxy sessions pin temperature, top_p "
            "and top_k only"
        )
    return pins
