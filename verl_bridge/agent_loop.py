"""verl's agent loop ``lego_proxy``: each verl sample is one lego-proxy trial.

Importing this module imports verl (``verl_api.load``) and registers the class with
verl's ``register`` under ``AGENT_NAME``, which is how verl's own loops are found; in
verl's Ray workers, the ``agent_loop_config_path`` YAML (docs/verl.md) names it by its
path instead and carries the ``BridgeSettings`` keys.

verl builds one loop object per sample (``hydra.utils.instantiate``) with its own
arguments (trainer config, server manager, tokenizer, ...) and the YAML's keys. The loop
keeps verl's arguments for ``AgentLoopBase`` and takes the YAML's keys as its settings;
its constructor refuses what cannot work before any trial: verl's legacy trainer
(``trainer.use_v1=false`` takes one output per sample, a lego-proxy session may have
several), bad settings, a missing harness installation.

``run(sampling_params, **fields)`` validates the sample's fields (``SampleFields``: the
task from ``extra_info.lego_task_id``, the group from verl's ``uid``, the index from
``session_id``), runs the episode (``self.trial``: ``rollouts.trial.run_trial`` on the
settings' ``TrialSetup``) on a worker thread (a trial blocks for minutes; verl's event
loop must not), and returns ``verl_api.outputs_of(trajectory)``: a list of
``AgentLoopOutput``, empty for a sample verl must not train on.
verl's own LLM servers are not called from here: the harness's turns reach them through
the proxy, whose backend is the SGLang router in front of them.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from kernel.errors import ConfigurationError
from rollouts.control import ControlClient
from rollouts.harnesses import Endpoint
from rollouts.runner import Trial
from rollouts.stages import Stopwatch
from rollouts.trial import TrialResult, TrialSetup, run_trial
from tasks.spec import Task, load_task
from verl_bridge.episode import Episodes, Sample, TrajectoryReader
from verl_bridge.settings import BridgeSettings, trial_setup
from verl_bridge.verl_api import (
    AGENT_NAME,
    AgentLoopOutput,
    SampleFields,
    TrainerView,
    load,
    outputs_of,
    session_pins,
)

VERL = load()

# mypy checks this class against ``object``: verl's base is untyped here, and everything
# the loop takes from it passes through ``verl_api``.
if TYPE_CHECKING:
    _Base = object
else:
    _Base = VERL.base


@VERL.register(AGENT_NAME)
class LegoProxyAgentLoop(_Base):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        own = {name: kwargs.pop(name) for name in BridgeSettings.model_fields if name in kwargs}
        trainer = TrainerView.of(kwargs["trainer_config"])
        super().__init__(*args, **kwargs)
        if not trainer.use_v1:
            raise ConfigurationError(
                f"the {AGENT_NAME!r} agent loop returns one output per lego-proxy segment, "
                "which verl 0.9.1 takes only in its V1 trainer: set trainer.use_v1=true "
                "(the default)"
            )
        self.settings = BridgeSettings(**own)
        self.trainer = trainer
        self.trial: Trial = _sandboxed(trial_setup(self.settings))

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> list[AgentLoopOutput]:
        fields = SampleFields.model_validate(kwargs)
        settings = self.settings
        task = load_task(settings.tasks / fields.extra_info.lego_task_id)
        sample = Sample(
            task=task,
            group_id=f"{settings.group_prefix}{task.id}.s{fields.global_steps}.{fields.uid}",
            sample_index=fields.session_id,
            group_size=self.trainer.group_size,
            sampling=session_pins(sampling_params),
        )
        key = settings.admin_key.get_secret_value()
        with (
            ControlClient(settings.proxy_url, key) as control,
            TrajectoryReader(settings.proxy_url, key) as reader,
        ):
            episodes = Episodes(control, reader, settings.run_id, settings.harness, self.trial)
            trajectory = await asyncio.to_thread(episodes.run, sample)
        return outputs_of(VERL, trajectory)


def _sandboxed(setup: TrialSetup) -> Trial:
    def trial(task: Task, harness: str, endpoint: Endpoint, watch: Stopwatch) -> TrialResult:
        return run_trial(task, harness, endpoint, setup, watch)

    return trial
