"""The README says what the code does: its settings table lists every setting with its default,
its command-line section every command and option, and its quick start the commands that
install only what each needs."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from app import cli
from app.settings import SECRETS_DIR_VARIABLE, Settings

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def section(title: str) -> str:
    start = README.index(f"\n## {title}")
    end = README.find("\n## ", start + 1)
    return README[start:end]


def settings_rows() -> list[tuple[list[str], str]]:
    """(names, default) of each row of the settings table."""
    rows = []
    for line in section("Settings").splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in line.split("|")[1:-1]]
            rows.append((re.findall(r"`([A-Z_]+)`", cells[0]), cells[1]))
    return rows


def test_the_settings_table_lists_every_setting() -> None:
    documented = {name for names, _ in settings_rows() for name in names}
    # and the variable naming the secret files' folder, read before the settings
    assert documented == set(Settings.model_fields) | {SECRETS_DIR_VARIABLE}


def test_the_settings_table_shows_the_numeric_defaults() -> None:
    checked = 0
    for names, default in settings_rows():
        values = [v.strip() for v in default.split(" / ")]
        if len(values) != len(names):
            continue
        for name, value in zip(names, values, strict=True):
            number = value.split()[0].replace(",", "")
            try:
                expected = float(number)
            except ValueError:
                continue
            actual = Settings.model_fields[name].default
            assert isinstance(actual, int | float), name
            assert float(actual) == expected, f"{name}: README says {value}, the code {actual}"
            checked += 1
    assert checked >= 30


def test_the_quick_start_installs_only_what_each_command_needs() -> None:
    quick = section("Quick start")
    assert "uv run --no-dev --extra embedded memory-service serve" in quick
    assert re.search(r"^uv run pytest\s+# 2\.", quick, re.MULTILINE)


def test_the_command_line_section_names_every_command_and_option() -> None:
    text = section("Command line")

    def walk(parser: argparse.ArgumentParser, words: list[str]) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    walk(child, [*words, name])
            elif action.option_strings and not isinstance(action, argparse._HelpAction):
                assert action.option_strings[-1] in text, f"{' '.join(words)} {action.option_strings[-1]}"
        if words:
            assert f"`{' '.join(words)}" in text, words  # a table row starts with the command

    walk(cli.build_parser(), [])
