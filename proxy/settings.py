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
    """Every field is ``LEGO_<NAME>`` in the environment; ``description`` is what
    ``lego-proxy serve --help`` and the README's settings table say about it."""

    model_config = SettingsConfigDict(env_prefix="LEGO_", extra="ignore", frozen=True)

    env: str = Field(
        default="development",
        description="'development' allows the default admin key; anything else (production) "
        "requires LEGO_ADMIN_KEY and, on a wildcard LEGO_HOST, LEGO_PUBLIC_URL",
    )
    host: str = Field(default="127.0.0.1", description="bind address (serve --host)")
    port: int = Field(default=8000, description="port (serve --port)")
    public_url: str | None = Field(
        default=None,
        description="base of the URLs handed to harnesses (default http://HOST:PORT)",
    )
    data_dir: Path = Field(
        default_factory=default_data_dir,
        description="SQLite file, spool, journal and the tiny model (default "
        "~/.local/share/lego-proxy)",
    )
    database_url: str | None = Field(
        default=None,
        description="postgresql+asyncpg://... or sqlite+aiosqlite:///... (default: a SQLite "
        "file in LEGO_DATA_DIR)",
    )
    backend_url: str | None = Field(
        default=None,
        description="SGLang workers (comma-separated, each session pinned to one) or one "
        "router (default: the embedded local engine)",
    )
    backend_health_interval_s: float = Field(
        default=5.0, gt=0, description="seconds between health probes of each backend worker"
    )
    admin_key: str | None = Field(
        default=None,
        description="Bearer key of the control, export and UI routes (default in "
        "development: lego-dev-admin-key)",
    )
    tokenizer_path: Path | None = Field(
        default=None,
        description="HF directory whose tokenizer and chat template render prompts (default: "
        "the tiny model the embedded engine serves; required with LEGO_BACKEND_URL)",
    )
    tool_parser: ToolParser | None = Field(
        default=None,
        description="qwen3 (<tool_call> JSON) or qwen3_coder (XML) (default: the format the "
        "served chat template writes, proxy.served_template)",
    )
    context_length: int = Field(
        default=32768, description="prompt + reserved output budget, in tokens"
    )
    default_max_tokens: int = Field(
        default=4096, description="output budget when neither harness nor session sets one"
    )
    max_body_bytes: int = Field(
        default=32 * 1024 * 1024, description="larger request bodies get 413"
    )
    return_routed_experts: bool = Field(
        default=True,
        description="ask SGLang for routed experts (needs --enable-return-routed-experts)",
    )
    backend_timeout_s: float = Field(
        default=1800.0,
        description="the longest a backend generation may go without sending anything (its "
        "response's start included)",
    )
    max_resumptions: int = Field(
        default=8, description="transparent re-sends of a generation after a pause-abort"
    )
    unstreamed_chunk_tokens: int = Field(
        default=64,
        ge=1,
        description="N > 1: a turn the harness does not stream asks SGLang for a chunk every "
        "N tokens (sampling_params.stream_interval; SGLang sends the first token at once): "
        "N times fewer chunks for the proxy to read, the same record; 1 leaves SGLang's "
        "--stream-interval",
    )
    # False mimics templates that drop earlier reasoning at each new user query: the branch
    # then splits per turn; the recorded prompt ids are what the model saw.
    keep_reasoning: bool = Field(
        default=True,
        description="earlier reasoning stays in the context as sampled; false drops it as "
        "the template does (a fork per turn)",
    )
    max_sessions_held: int = Field(
        default=DEFAULT_MAX_SESSIONS,
        ge=1,
        description="sessions whose ledger stays in memory (least recently used dropped, "
        "reloaded from the database when used again)",
    )
    pause_max_wait_s: float = Field(
        default=30.0,
        description="how long a new turn of a paused run waits before it gets 429 with Retry-After",
    )
    pause_retry_after_s: float = Field(
        default=5.0, description="the Retry-After of that 429, in seconds"
    )
    pause_sync_s: float = Field(
        default=0.5, description="how often a replica reads which runs are paused"
    )
    journal: bool = Field(
        default=True,
        description="fsync a completed turn the database has not taken in time before its "
        "last byte goes out, so even SIGKILL loses none",
    )
    journal_after_s: float = Field(
        default=0.25,
        ge=0.0,
        description="how long a completed turn waits for the database before it is "
        "journaled instead (a database that took it made it as durable)",
    )
    engine_args: str = Field(
        default="",
        description="extra command-line arguments of the embedded engine (e.g. "
        "'--script policy.json': see docs/scripted-policy.md)",
    )
    signing_secret: str | None = Field(
        default=None,
        description="HMAC key of reasoning signatures (default: derived from the admin key)",
    )

    @model_validator(mode="after")
    def _check_public_url(self) -> Settings:
        if self.env != "development" and self.wildcard_host and self.public_url is None:
            raise ValueError(
                f"LEGO_PUBLIC_URL must be set when LEGO_HOST is {self.host!r} outside "
                "development: harnesses are handed URLs under it, and "
                f"http://{self.host}:{self.port} reaches nobody"
            )
        return self

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
    def wildcard_host(self) -> bool:
        """Bound to every interface: the bind address is no URL a harness can use."""
        return self.host in ("0.0.0.0", "::", "")

    @property
    def effective_public_url(self) -> str:
        return (self.public_url or f"http://{self.host}:{self.port}").rstrip("/")
