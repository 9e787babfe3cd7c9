"""Settings: defaults from seed 004, URL forms, start-up errors that name the setting."""

from __future__ import annotations

import pytest

from app.settings import Settings, SettingsError, SummarizerKind, load_settings


def test_seed_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("DATABASE_URL", "OPENAI_API_KEY", "MEMORY_SUMMARIZER"):
        monkeypatch.delenv(name, raising=False)
    settings = Settings(_env_file=None)
    assert settings.MEMORY_ROLLING_WINDOW_SIZE == 14
    assert settings.MEMORY_SUMMARIZE_AFTER_SEQ == 5
    assert settings.MEMORY_MODEL == "gpt-4.1-mini"
    assert settings.MEMORY_PROCESSING_TIMEOUT_SECONDS == 300
    assert settings.summarizer_kind is SummarizerKind.OFFLINE


@pytest.mark.parametrize(
    "url",
    ["postgresql://u@h:5432/db", "postgres://u@h:5432/db", "postgresql+asyncpg://u@h:5432/db"],
)
def test_database_url_forms(url: str) -> None:
    assert Settings(_env_file=None, DATABASE_URL=url).DATABASE_URL == "postgresql+asyncpg://u@h:5432/db"


def test_auto_summarizer_uses_openai_when_a_key_is_set() -> None:
    settings = Settings(_env_file=None, OPENAI_API_KEY="sk-x")
    assert settings.summarizer_kind is SummarizerKind.OPENAI


@pytest.mark.parametrize(
    ("name", "value", "fragment"),
    [
        ("MEMORY_ROLLING_WINDOW_SIZE", "1", "MEMORY_ROLLING_WINDOW_SIZE"),
        ("MEMORY_SUMMARIZE_AFTER_SEQ", "soon", "MEMORY_SUMMARIZE_AFTER_SEQ"),
        ("DATABASE_URL", "mysql://x/y", "DATABASE_URL"),
        ("MEMORY_SUMMARIZER", "magic", "MEMORY_SUMMARIZER"),
        ("MEMORY_API_KEYS", "no-colon-here-at-all", "MEMORY_API_KEYS"),
        ("LOG_LEVEL", "LOUD", "LOG_LEVEL"),
        ("MEMORY_POLICY", "fifo", "MEMORY_POLICY: .*does not match any of the expected tags"),
        ("MEMORY_POLICY", '{"name": "rolling_blocks", "window": -1}', "MEMORY_POLICY: .*window"),
        ("MEMORY_POLICY", '{"name": ', "MEMORY_POLICY: .*not valid JSON"),
    ],
)
def test_invalid_settings_fail_naming_the_setting(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, fragment: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(SettingsError, match=fragment):
        load_settings()


def test_openai_summarizer_needs_a_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setenv("MEMORY_SUMMARIZER", "openai")
    with pytest.raises(SettingsError, match="OPENAI_API_KEY"):
        load_settings()


def test_api_keys_map_to_tenants() -> None:
    settings = Settings(_env_file=None, MEMORY_API_KEYS="acme:0123456789abcdef, beta:fedcba9876543210")
    assert settings.api_keys == {"0123456789abcdef": "acme", "fedcba9876543210": "beta"}


def test_default_policy_takes_seed_004_settings_as_sliding_window_defaults() -> None:
    settings = Settings(_env_file=None, MEMORY_ROLLING_WINDOW_SIZE=20, MEMORY_POLICY="sliding_window")
    assert settings.default_policy.name == "sliding_window"
    assert settings.policy_defaults["sliding_window"]["window_size"] == 20
    blocks = Settings(_env_file=None, MEMORY_POLICY='{"name": "rolling_blocks", "max_summaries": 5}')
    assert blocks.default_policy.model_dump() == {"name": "rolling_blocks", "window": 21, "max_summaries": 5}


@pytest.mark.parametrize(
    ("values", "fragment"),
    [
        ({"MEMORY_ADMIN_KEY": "short"}, "at least 16 characters"),
        (
            {"MEMORY_API_KEYS": "acme:acme-key-0123456789", "MEMORY_ADMIN_KEY": "acme-key-0123456789"},
            "differ from every tenant's key",
        ),
        ({"LOG_FORMAT": "xml"}, "LOG_FORMAT"),
    ],
)
def test_operator_settings_are_checked(
    monkeypatch: pytest.MonkeyPatch, values: dict[str, str], fragment: str
) -> None:
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SettingsError, match=fragment):
        load_settings()


def test_the_admin_key_is_read_without_blanks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMORY_ADMIN_KEY", "  admin-key-0123456789 ")
    assert load_settings().admin_key == "admin-key-0123456789"


def test_observability_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings(_env_file=None).LOG_FORMAT == "text"
    monkeypatch.setenv("LOG_FORMAT", "JSON")
    settings = load_settings()
    assert settings.LOG_FORMAT == "json"
    assert settings.MEMORY_METRICS_PUBLIC is None and settings.MEMORY_METRICS_REFRESH_SECONDS == 15
