"""``proxy.settings.Settings``: defaults, ``LEGO_`` env parsing, the production guard."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from proxy.settings import DEV_ADMIN_KEY, Settings, ToolParser, default_data_dir


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test sees only the LEGO_ variables it sets (CI may export some)."""
    for name in list(os.environ):
        if name.upper().startswith("LEGO_"):
            monkeypatch.delenv(name)


def test_defaults_are_the_embedded_development_setup() -> None:
    settings = Settings()
    assert settings.env == "development"
    assert (settings.host, settings.port) == ("127.0.0.1", 8000)
    assert settings.backend_url is None  # the embedded local engine
    assert settings.database_url is None
    assert settings.tokenizer_path is None
    assert settings.tool_parser is None  # the format the served template writes
    assert settings.data_dir == default_data_dir()
    assert settings.admin_key is None
    assert settings.effective_admin_key == DEV_ADMIN_KEY
    assert settings.effective_public_url == "http://127.0.0.1:8000"


def test_env_prefix_is_parsed_and_typed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("LEGO_PORT", "9123")
    monkeypatch.setenv("LEGO_HOST", "0.0.0.0")
    monkeypatch.setenv("LEGO_BACKEND_URL", "http://sglang:30000")
    monkeypatch.setenv("LEGO_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("LEGO_TOKENIZER_PATH", str(tmp_path / "model"))
    monkeypatch.setenv("LEGO_TOOL_PARSER", "qwen3_coder")
    monkeypatch.setenv("LEGO_RETURN_ROUTED_EXPERTS", "false")
    monkeypatch.setenv("LEGO_ADMIN_KEY", "sekrit")
    monkeypatch.setenv("LEGO_PUBLIC_URL", "https://proxy.example/")
    monkeypatch.setenv("PORT", "1")  # unprefixed variables are not ours
    settings = Settings()
    assert settings.port == 9123
    assert settings.host == "0.0.0.0"
    assert settings.backend_url == "http://sglang:30000"
    assert settings.data_dir == tmp_path
    assert settings.tokenizer_path == tmp_path / "model"
    assert settings.tool_parser is ToolParser.QWEN3_CODER
    assert settings.return_routed_experts is False
    assert settings.effective_admin_key == "sekrit"
    assert settings.effective_public_url == "https://proxy.example"  # no trailing slash


def test_explicit_arguments_win_over_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEGO_PORT", "9123")
    assert Settings(port=7000).port == 7000
    assert Settings(port=7000).effective_public_url == "http://127.0.0.1:7000"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("LEGO_PORT", "eighty"),
        ("LEGO_TOOL_PARSER", "hermes"),
        ("LEGO_CONTEXT_LENGTH", "1.5"),
        ("LEGO_UNSTREAMED_CHUNK_TOKENS", "0"),
    ],
)
def test_bad_values_are_refused(monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError):
        Settings()


def test_settings_are_frozen() -> None:
    settings = Settings()
    with pytest.raises(ValidationError):
        settings.port = 1


@pytest.mark.parametrize("admin_key", [None, "", DEV_ADMIN_KEY])
def test_production_refuses_a_missing_or_default_admin_key(
    monkeypatch: pytest.MonkeyPatch, admin_key: str | None
) -> None:
    monkeypatch.setenv("LEGO_ENV", "production")
    if admin_key is not None:
        monkeypatch.setenv("LEGO_ADMIN_KEY", admin_key)
    with pytest.raises(ValidationError, match="LEGO_ADMIN_KEY"):
        Settings()


def test_production_accepts_a_real_admin_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEGO_ENV", "production")
    monkeypatch.setenv("LEGO_ADMIN_KEY", "a-real-secret-of-some-length")
    assert Settings().effective_admin_key == "a-real-secret-of-some-length"


@pytest.mark.parametrize("admin_key", ["a", "short-secret", " " * 20])
def test_production_refuses_a_weak_admin_key(
    monkeypatch: pytest.MonkeyPatch, admin_key: str
) -> None:
    monkeypatch.setenv("LEGO_ENV", "production")
    monkeypatch.setenv("LEGO_ADMIN_KEY", admin_key)
    with pytest.raises(ValidationError, match="LEGO_ADMIN_KEY"):
        Settings()


def test_a_key_read_with_its_trailing_newline_still_works(monkeypatch: pytest.MonkeyPatch) -> None:
    """A secret file ends with a newline no header or login form can carry (issue 16)."""
    monkeypatch.setenv("LEGO_ENV", "production")
    monkeypatch.setenv("LEGO_ADMIN_KEY", "a-real-secret-of-some-length\n")
    assert Settings().effective_admin_key == "a-real-secret-of-some-length"


def test_development_may_use_the_dev_key_explicitly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEGO_ADMIN_KEY", DEV_ADMIN_KEY)
    assert Settings().effective_admin_key == DEV_ADMIN_KEY


def test_effective_database_url(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("LEGO_DATA_DIR", str(tmp_path / "data"))
    expected = f"sqlite+aiosqlite:///{tmp_path / 'data' / 'lego.sqlite3'}"
    assert Settings().effective_database_url == expected
    postgres = "postgresql+asyncpg://lego@db:5432/lego"
    monkeypatch.setenv("LEGO_DATABASE_URL", postgres)
    assert Settings().effective_database_url == postgres
    # An empty variable counts as unset (compose files often template it to "").
    monkeypatch.setenv("LEGO_DATABASE_URL", "")
    assert Settings().effective_database_url == expected


def test_every_setting_is_described_and_in_the_readme_table() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    rows = {
        line.split("|")[1].strip().strip("`") for line in readme.splitlines() if "| `LEGO_" in line
    }
    for name, field in Settings.model_fields.items():
        assert field.description, f"LEGO_{name.upper()} has no description"
        assert f"LEGO_{name.upper()}" in rows, f"LEGO_{name.upper()} is missing from the README"
    assert rows <= {f"LEGO_{name.upper()}" for name in Settings.model_fields}  # none stale
