"""MEMORY_API_KEYS: tenant names must fit conversations.tenant_id (VARCHAR(64)) and a sane
character set, or the service refuses to start, naming the setting (instead of a 500 on every
write by that tenant)."""

from __future__ import annotations

import pytest

from app.settings import Settings, SettingsError, load_settings

KEY = "0123456789abcdef"


@pytest.mark.parametrize(
    "tenant",
    [
        "t" * 65,  # one past VARCHAR(64)
        "x" * 500,
        "acme corp",  # space
        "acme/eu",
        "acme;drop",
        "ünïcode",
        "tab\there",
        "-leading-symbol",
    ],
    ids=["65-chars", "500-chars", "space", "slash", "semicolon", "non-ascii", "tab", "leading-symbol"],
)
def test_bad_tenant_names_are_refused_at_start_up(monkeypatch: pytest.MonkeyPatch, tenant: str) -> None:
    monkeypatch.setenv("MEMORY_API_KEYS", f"good:{'f' * 16},{tenant}:{KEY}")
    with pytest.raises(SettingsError, match="MEMORY_API_KEYS") as raised:
        load_settings()
    message = str(raised.value)
    assert "tenant" in message
    assert KEY not in message and "f" * 16 not in message  # keys are secrets: never echoed


@pytest.mark.parametrize("tenant", ["t" * 64, "a", "acme", "Acme-EU_2.prod", "9lives"])
def test_good_tenant_names_are_accepted(tenant: str) -> None:
    settings = Settings(_env_file=None, MEMORY_API_KEYS=f"{tenant}:{KEY}")
    assert settings.api_keys == {KEY: tenant}


def test_spaces_around_pairs_and_names_are_ignored() -> None:
    settings = Settings(_env_file=None, MEMORY_API_KEYS=f" acme : {KEY} ,")
    assert settings.api_keys == {KEY: "acme"}


def test_one_key_for_two_tenants_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMORY_API_KEYS", f"acme:{KEY},beta:{KEY}")
    with pytest.raises(SettingsError, match="MEMORY_API_KEYS") as raised:
        load_settings()
    assert KEY not in str(raised.value)
