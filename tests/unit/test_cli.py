"""The command line without a database: every option explains itself and shows its default,
`config` masks every secret and finds the embedded server, and settings come from secret files."""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from app import cli
from app.settings import SettingsError, load_settings


def parsers(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield parser.prog, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                yield from parsers(child)


def test_every_option_has_help_and_shows_its_default() -> None:
    seen = []
    for prog, parser in parsers(cli.build_parser()):
        formatter = parser._get_formatter()
        assert isinstance(formatter, cli.HelpFormatter), prog
        for action in parser._actions:
            if isinstance(
                action, argparse._HelpAction | argparse._VersionAction | argparse._SubParsersAction
            ):
                continue
            assert action.help, f"{prog} {action.dest} has no help"
            if action.option_strings:
                shown = formatter._get_help_string(action)
                assert "default:" in shown, f"{prog} {action.option_strings}: {shown}"
                assert f"{action.option_strings[-1]}" in parser.format_help()
                seen.append(f"{prog} {action.option_strings[-1]}")
    assert "memory-service ops stuck --tenant" in seen and "memory-service serve --port" in seen


def test_the_tenant_defaults_to_the_one_requests_get_without_api_keys() -> None:
    from app.edge import DEFAULT_TENANT

    args = cli.build_parser().parse_args(["ops", "failed"])
    assert args.tenant == DEFAULT_TENANT == cli.DEFAULT_TENANT
    assert args.limit == 50


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"memory-service {cli.version()}"
    assert cli.version()[0].isdigit()


SECRETS = ("0123456789abcdef-acme", "fedcba9876543210-beta", "sk-live-secret-value", "db-pass-word", "gw-pw")


def test_config_masks_every_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)  # no .env here
    (tmp_path / "unrelated").write_text("not a setting")
    monkeypatch.setenv("MEMORY_SECRETS_DIR", str(tmp_path))
    monkeypatch.setenv("MEMORY_API_KEYS", f"acme:{SECRETS[0]},beta:{SECRETS[1]}")
    monkeypatch.setenv("OPENAI_API_KEY", SECRETS[2])
    monkeypatch.setenv("DATABASE_URL", f"postgresql://memory:{SECRETS[3]}@db.internal:5432/memory")
    monkeypatch.setenv("OPENAI_BASE_URL", f"https://svc:{SECRETS[4]}@gateway.internal/v1")
    monkeypatch.setenv("MEMORY_MODEL", "some-model")
    assert cli.main(["config"]) == 0
    out = capsys.readouterr().out
    for secret in SECRETS:
        assert secret not in out
    lines = dict(line.split("=", 1) for line in out.splitlines() if not line.startswith("#"))
    assert lines["MEMORY_API_KEYS"] == "acme:***,beta:***"
    assert lines["OPENAI_API_KEY"] == "***"
    assert lines["DATABASE_URL"] == "postgresql://memory:***@db.internal:5432/memory"
    assert lines["OPENAI_BASE_URL"] == "https://svc:***@gateway.internal/v1"
    assert lines["MEMORY_MODEL"] == "some-model"
    assert lines["MEMORY_CATCH_UP_ON_COMPLETION"] == "true"
    # Every setting is listed.
    from app.settings import Settings

    assert set(lines) == set(Settings.model_fields)
    assert "# database: DATABASE_URL" in out
    assert f"# secret files: {tmp_path} (none named after a setting)" in out


def test_config_names_the_embedded_server_and_its_psql_address(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DATABASE_URL", raising=False)
    pgdata = tmp_path / "pgdata"
    pgdata.mkdir()
    monkeypatch.setenv("MEMORY_EMBEDDED_PGDATA", str(pgdata))
    assert cli.main(["config"]) == 0
    assert f"embedded PostgreSQL in {pgdata}, not running" in capsys.readouterr().out

    # PostgreSQL's postmaster.pid of a running server (this process stands in for it).
    (pgdata / "postmaster.pid").write_text(
        f"{os.getpid()}\n{pgdata}\n1700000000\n5433\n{pgdata}\n\n  1234  5678\nready   \n"
    )
    assert cli.main(["config"]) == 0
    out = capsys.readouterr().out
    assert (
        f"running (pid {os.getpid()}): psql 'postgresql://postgres@/postgres?host={pgdata}&port=5433'" in out
    )


def test_settings_from_secret_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for name in ("OPENAI_API_KEY", "MEMORY_MODEL", "DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "OPENAI_API_KEY").write_text("sk-from-a-file\n")  # as `echo` writes it
    (secrets / "database_url").write_text("postgresql://u:p@db:5432/x")  # any case
    (secrets / "MEMORY_MODEL").write_text("file-model")
    monkeypatch.setenv("MEMORY_SECRETS_DIR", str(secrets))
    monkeypatch.setenv("MEMORY_MODEL", "env-model")  # the environment wins over a file
    settings = load_settings()
    assert settings.OPENAI_API_KEY is not None
    assert settings.OPENAI_API_KEY.get_secret_value() == "sk-from-a-file"
    assert settings.DATABASE_URL == "postgresql+asyncpg://u:p@db:5432/x"
    assert settings.MEMORY_MODEL == "env-model"

    monkeypatch.setenv("MEMORY_SECRETS_DIR", str(tmp_path / "missing"))
    with pytest.raises(SettingsError, match="MEMORY_SECRETS_DIR"):
        load_settings()


def test_settings_errors_exit_2(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("MEMORY_ROLLING_WINDOW_SIZE", "1")
    assert cli.main(["migrate"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("memory-service: invalid settings: MEMORY_ROLLING_WINDOW_SIZE")
    assert len(err.strip().splitlines()) == 1


def test_the_start_up_wait_is_bounded_well_under_75_s() -> None:
    from app.settings import Settings

    settings = Settings(_env_file=None)
    assert settings.DATABASE_STARTUP_WAIT_SECONDS + settings.DATABASE_CONNECT_TIMEOUT_SECONDS <= 15
