"""The one config dataclass and its command-line overrides."""

from __future__ import annotations

import pytest

from kernel.errors import ConfigurationError
from trainer_bridge.config import TrainConfig, config_from_args


def test_defaults_are_lego_rl_table_10() -> None:
    c = TrainConfig(model_path="m")
    assert (c.lr, c.grad_clip, c.kl_coef) == (1e-6, 1.0, 1e-3)
    assert (c.clip_low, c.clip_high) == (3e-4, 4e-4)
    assert (c.groups_per_step, c.max_staleness, c.steps) == (64, 1, 126)
    assert c.replay


def test_every_field_is_a_flag() -> None:
    c = config_from_args(
        [
            "--model-path",
            "/m",
            "--proxy-url",
            "http://p",
            "--admin-key",
            "k",
            "--backend-url",
            "http://b",
            "--lr",
            "1e-4",
            "--steps",
            "5",
            "--no-replay",
            "--max-staleness",
            "none",
            "--max-wait-s",
            "2.5",
        ]
    )
    assert c == TrainConfig(
        model_path="/m",
        proxy_url="http://p",
        admin_key="k",
        backend_url="http://b",
        lr=1e-4,
        steps=5,
        replay=False,
        max_staleness=None,
        max_wait_s=2.5,
    )


def test_model_path_is_required() -> None:
    with pytest.raises(SystemExit):
        config_from_args([])


def test_weight_sync_modes_are_checked_at_start() -> None:
    c = config_from_args(
        ["--model-path", "m", "--weight-sync", "distributed", "--no-save-checkpoints"]
    )
    assert (c.weight_sync, c.save_checkpoints, c.weight_sync_backend) == (
        "distributed",
        False,
        "gloo",
    )
    with pytest.raises(ConfigurationError, match="'disk' or 'distributed'"):
        TrainConfig(model_path="m", weight_sync="nfs")
    with pytest.raises(ConfigurationError, match="loads the saved checkpoints"):
        TrainConfig(model_path="m", save_checkpoints=False)
    with pytest.raises(ConfigurationError, match="gloo"):
        TrainConfig(model_path="m", weight_sync="distributed", weight_sync_backend="mpi")
