"""The proxy's one settings class (env prefix ``LEGO_``), validated at start-up.

Outside development (``LEGO_ENV`` other than ``development``) an admin key is required, must
not be the development default, and must be at least ``MIN_ADMIN_KEY_CHARS`` characters.
Whitespace around the key is dropped (a key read from a secret file usually ends with a
newline, which no ``Authorization`` header or login form can carry).
"""

from __future__ import annotations

import hashlib
from enum import StrEnum
from pathlib import Path

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from proxy.lru import DEFAULT_MAX_SESSIONS

DEV_ADMIN_KEY = "lego-dev-admin-key"
MIN_ADMIN_KEY_CHARS = 16


class ToolParser(StrEnum):
    QWEN3 = "qwen3"  # <tool_call>{"name": ..., "arguments": {...}}</tool_call>
    QWEN3_CODER = "qwen3_coder"  # <tool_call><function=NAME><parameter=K>V</parameter>...


def default_data_dir() -> Path:
    return Path.home() / ".local" / "share" / "lego-proxy"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LEGO_", extra="ignore", frozen=True)

    env: str = "development"
    host: str = "127.0.0.1"
    port: int = 8000
    public_url: str | None = Field(
        default=None, description="Base URL harnesses use to reach this proxy."
    )
    data_dir: Path = Field(default_factory=default_data_dir)
    database_url: str | None = None  # unset: SQLite file in data_dir
    # unset: the embedded local engine. One URL (a worker or an sglang-router) or a
    # comma-separated list of workers, each session pinned to one by rendezvous hashing.
    backend_url: str | None = None
    backend_health_interval_s: float = Field(default=5.0, gt=0)
    admin_key: str | None = None
    tokenizer_path: Path | None = None  # unset: the embedded engine's model
    tool_parser: ToolParser = ToolParser.QWEN3
    context_length: int = 32768  # prompt + reserved output budget, in tokens
    default_max_tokens: int = 4096  # output budget when neither harness nor session sets one
    max_body_bytes: int = 32 * 1024 * 1024
    return_routed_experts: bool = True
    backend_timeout_s: float = 1800.0
    max_resumptions: int = 8  # transparent re-sends after a backend pause-abort
    # Earlier turns' reasoning stays in the context exactly as sampled (one training
    # sequence per branch). False mimics templates that drop it at each new user query:
    # the branch then splits per turn; the recorded prompt ids are what the model saw.
    keep_reasoning: bool = True
    # Sessions whose ledger and conversations stay in memory, least recently used dropped
    # first; a dropped session is reloaded from the database on its next request.
    max_sessions_held: int = Field(default=DEFAULT_MAX_SESSIONS, ge=1)
    # While a run is paused (weight sync), a new turn waits this long, then gets 429 with
    # Retry-After so the harness's own retry comes back after the sync.
    pause_max_wait_s: float = 30.0
    pause_retry_after_s: float = 5.0
    pause_sync_s: float = 0.5  # how often a replica reads which runs are paused
    # Write-ahead journal: a completed turn is fsync'd before the harness gets its last
    # byte, so even SIGKILL loses no turn (costs about one group-committed fsync per turn).
    journal: bool = True
    engine_args: str = ""  # extra CLI args for the embedded engine (e.g. "--script f.json")
    signing_secret: str | None = None  # unset: derived from the admin key

    @field_validator("admin_key")
    @classmethod
    def _strip_key(cls, value: str | None) -> str | None:
        return value.strip() if value is not None else None

    @model_validator(mode="after")
    def _check_safe(self) -> Settings:
        if self.env == "development":
            return self
        if self.admin_key in (None, "", DEV_ADMIN_KEY):
            raise ValueError(
                "LEGO_ADMIN_KEY must be set to a non-default secret when LEGO_ENV is not "
                "'development'"
            )
        if len(self.admin_key or "") < MIN_ADMIN_KEY_CHARS:
            raise ValueError(
                f"LEGO_ADMIN_KEY must be at least {MIN_ADMIN_KEY_CHARS} characters when "
                "LEGO_ENV is not 'development' (e.g. `openssl rand -hex 32`)"
            )
        return self

    @model_validator(mode="after")
    def _check_backend_urls(self) -> Settings:
        if self.backend_url is not None:
            for url in self.backend_urls:
                if not url.startswith(("http://", "https://")):
                    raise ValueError(f"LEGO_BACKEND_URL entries must be http(s) URLs, got {url!r}")
        return self

    @property
    def backend_urls(self) -> tuple[str, ...]:
        """The workers in ``backend_url`` (empty when the embedded engine is used)."""
        if self.backend_url is None:
            return ()
        return tuple(u.strip().rstrip("/") for u in self.backend_url.split(","))

    @property
    def effective_admin_key(self) -> str:
        return self.admin_key or DEV_ADMIN_KEY

    @property
    def effective_signing_secret(self) -> bytes:
        """HMAC key for reasoning signatures; replicas sharing an admin key agree on it."""
        if self.signing_secret:
            return self.signing_secret.encode()
        label = b"lego-proxy reasoning signatures\0"
        return hashlib.sha256(label + self.effective_admin_key.encode()).digest()

    @property
    def effective_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite+aiosqlite:///{self.data_dir / 'lego.sqlite3'}"

    @property
    def effective_public_url(self) -> str:
        return (self.public_url or f"http://{self.host}:{self.port}").rstrip("/")
