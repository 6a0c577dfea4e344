"""What the verl agent loop needs to know, validated once per loop: ``BridgeSettings``.

Values come from the agent loop's entry in verl's ``agent_loop_config_path`` YAML (hydra
passes its keys to the loop's constructor, which passes them here) and, for any key the
YAML does not set, from the environment under ``LEGO_VERL_`` (``LEGO_VERL_ADMIN_KEY``,
...), which verl's Ray workers inherit through ``ray_kwargs.ray_init.runtime_env``.

- ``proxy_url``: the proxy as the verl worker reaches it (``http://HOST:PORT``); the
  sandboxed harness reaches it at the same address through the proxy-only gate.
- ``admin_key``, ``run_id``: the control API's key and an existing run.
- ``harness``: one of ``rollouts.harnesses.HARNESSES``.
- ``tasks``: the task pool; a sample names its task by ``extra_info.lego_task_id``.
- ``sandbox`` / ``sandbox_image``, ``harness_dir``, ``cache``: as ``lego-proxy rollout``
  takes them (defaults: bwrap, ``make harness-install``'s cache, ``POOL/.cache``).
- ``group_prefix``: put before each group id (``<prefix><task>.s<step>.<uid>``).

``trial_setup(settings)`` is the ``TrialSetup`` every trial of the loop shares.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from kernel.errors import ConfigurationError
from rollouts.harnesses import HARNESSES
from rollouts.trial import TrialSetup, proxy_route
from sandbox.backends import BACKENDS, make_sandbox


def default_harness_dir() -> Path:
    """Where ``make harness-install`` puts the CLIs (as ``lego-proxy rollout`` looks)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "lego-proxy" / "harness"


class BridgeSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LEGO_VERL_", extra="forbid", frozen=True)

    proxy_url: str = Field(pattern=r"^http://[^/]+$")
    admin_key: SecretStr = Field(min_length=1)
    run_id: str = Field(min_length=1)
    harness: str
    tasks: Path
    sandbox: str = "bwrap"
    sandbox_image: str | None = None
    harness_dir: Path = Field(default_factory=default_harness_dir)
    cache: Path | None = None
    group_prefix: str = "verl."

    @field_validator("harness")
    @classmethod
    def _known_harness(cls, value: str) -> str:
        if value not in HARNESSES:
            raise ValueError(f"unknown harness {value!r}; one of {', '.join(HARNESSES)}")
        return value

    @field_validator("sandbox")
    @classmethod
    def _known_sandbox(cls, value: str) -> str:
        if value not in BACKENDS:
            raise ValueError(f"unknown sandbox {value!r}; one of {', '.join(BACKENDS)}")
        return value

    @property
    def cache_dir(self) -> Path:
        return self.cache or self.tasks / ".cache"


def trial_setup(settings: BridgeSettings) -> TrialSetup:
    parts = urlsplit(settings.proxy_url)
    if not parts.hostname:
        raise ConfigurationError(f"proxy_url {settings.proxy_url!r}: expected http://HOST:PORT")
    if (
        not (settings.harness_dir / "npm").is_dir()
        and not (settings.harness_dir / "py312").is_dir()
    ):
        raise ConfigurationError(
            f"no harness CLIs in {settings.harness_dir}: run `make harness-install` or set "
            "harness_dir (LEGO_VERL_HARNESS_DIR)"
        )
    sandbox = make_sandbox(settings.sandbox, image=settings.sandbox_image)
    scratch = settings.cache_dir / "trials"
    scratch.mkdir(parents=True, exist_ok=True)
    return TrialSetup(
        sandbox=sandbox,
        grader_sandbox=sandbox,
        cache_dir=settings.cache_dir,
        scratch_dir=scratch,
        runtime_dir=settings.harness_dir.resolve(),
        proxy=proxy_route(parts.hostname, parts.port or 80),
    )
