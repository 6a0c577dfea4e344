"""The loop's settings: from the agent loop YAML's keys or ``LEGO_VERL_*``, validated."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from kernel.errors import ConfigurationError
from verl_bridge.settings import BridgeSettings, trial_setup

KEYS = {
    "proxy_url": "http://10.0.0.5:8080",
    "admin_key": "the-admin-secret",
    "run_id": "r1",
    "harness": "codex",
}


def test_yaml_keys_win_over_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("LEGO_VERL_RUN_ID", "from-env")
    monkeypatch.setenv("LEGO_VERL_GROUP_PREFIX", "exp7.")
    settings = BridgeSettings.model_validate({**KEYS, "tasks": tmp_path})
    assert (settings.run_id, settings.group_prefix) == ("r1", "exp7.")
    assert settings.cache_dir == tmp_path / ".cache"
    assert settings.admin_key.get_secret_value() == "the-admin-secret"
    assert "the-admin-secret" not in repr(settings)


@pytest.mark.parametrize(
    ("key", "value"),
    [("harness", "cursor"), ("sandbox", "vm"), ("proxy_url", "https://x/v1"), ("typo", 1)],
)
def test_bad_settings_are_refused(key: str, value: object, tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match=key):
        BridgeSettings.model_validate({**KEYS, "tasks": tmp_path, key: value})


def test_the_trial_setup_needs_the_installed_harnesses(tmp_path: Path) -> None:
    settings = BridgeSettings.model_validate(
        {**KEYS, "tasks": tmp_path, "harness_dir": tmp_path / "none"}
    )
    with pytest.raises(ConfigurationError, match="make harness-install"):
        trial_setup(settings)
    (tmp_path / "none" / "npm").mkdir(parents=True)
    setup = trial_setup(settings)
    assert (setup.proxy.host, setup.proxy.port) == ("10.0.0.5", 8080)
    assert setup.scratch_dir.is_dir()
