"""`memory-service` as a real process on the real PostgreSQL: a database it cannot use is one
line naming the cause, within the start-up bound, and exit code 1; the ops commands run the
service's own queries and retries on the database directly."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import orjson
import pytest
from alembic.script import ScriptDirectory
from sqlalchemy.engine import make_url

from app.db import alembic_config
from tests.fakellm import FakeLLM
from tests.integration.conftest import AppFactory
from tests.integration.installs import throwaway_database

# The console script of this environment: what `uv run memory-service` runs.
COMMAND = str(Path(sys.executable).with_name("memory-service"))
# Settings a developer's shell may hold that would change what these processes do.
_SCRUBBED = ("DATABASE_URL", "OPENAI_API_KEY", "OPENAI_BASE_URL", "MEMORY_SUMMARIZER", "MEMORY_API_KEYS")


# Upper bounds only show a failure is reported in bounded time (it once took 75 s): they allow
# for the interpreter's start and imports on a loaded machine, not precise timing.
SLACK = 40.0


def run(*args: str, cwd: Path, timeout: float = 120, **env: str) -> tuple[int, str, str, float]:
    """Run `memory-service args`; (exit code, stdout, stderr, seconds)."""
    full = {k: v for k, v in os.environ.items() if k not in _SCRUBBED}
    full.update({"LOG_LEVEL": "WARNING", **env})
    started = time.monotonic()
    done = subprocess.run(
        [COMMAND, *args], cwd=cwd, env=full, capture_output=True, text=True, timeout=timeout, check=False
    )
    return done.returncode, done.stdout, done.stderr, time.monotonic() - started


def assert_one_line_error(stderr: str, *fragments: str) -> str:
    """The failure is the last line, from memory-service, with every fragment; nothing before
    it but (at most) the one notice that the database is being waited for."""
    lines = stderr.strip().splitlines()
    assert "Traceback" not in stderr, stderr
    assert lines and lines[-1].startswith("memory-service: "), stderr
    for fragment in fragments:
        assert fragment in lines[-1], stderr
    assert len(lines) <= 2, stderr
    if len(lines) == 2:
        assert "not reachable yet" in lines[0], stderr
    return lines[-1]


@pytest.fixture
def server_url(postgres_server_url: str) -> str:
    return postgres_server_url


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port  # closed again: nothing listens there


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts TCP connections (the kernel's backlog) and never answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        yield s.getsockname()[1]


# `serve` checks the database the same way before it listens; each process costs ~2 s of imports.
COMMANDS = ["migrate", pytest.param("serve", marks=pytest.mark.slow)]


@pytest.mark.parametrize("command", COMMANDS)
def test_missing_database_is_one_line_at_once(command: str, server_url: str, tmp_path: Path) -> None:
    name = f"memory_missing_{uuid.uuid4().hex[:8]}"
    url = make_url(server_url).set(database=name).render_as_string(hide_password=False)
    code, _, err, seconds = run(command, cwd=tmp_path, DATABASE_URL=url)
    assert code == 1
    assert_one_line_error(err, f'database "{name}" does not exist')
    assert seconds < SLACK


@pytest.mark.parametrize("command", COMMANDS)
def test_missing_role_is_one_line_at_once(command: str, server_url: str, tmp_path: Path) -> None:
    role = f"memory_nobody_{uuid.uuid4().hex[:8]}"
    url = make_url(server_url).set(username=role, password="not-shown").render_as_string(hide_password=False)
    code, _, err, seconds = run(command, cwd=tmp_path, DATABASE_URL=url)
    assert code == 1
    line = assert_one_line_error(err, f'role "{role}" does not exist')
    assert "not-shown" not in err and "***" in line
    assert seconds < SLACK


@pytest.mark.parametrize("command", COMMANDS)
def test_refused_connection_is_retried_for_the_start_up_wait_then_one_line(
    command: str, tmp_path: Path
) -> None:
    url = f"postgresql://postgres@127.0.0.1:{closed_port()}/postgres"
    code, _, err, seconds = run(
        command, cwd=tmp_path, DATABASE_URL=url, DATABASE_STARTUP_WAIT_SECONDS="1", LOG_LEVEL="INFO"
    )
    assert code == 1
    assert_one_line_error(err, "connection refused", "DATABASE_STARTUP_WAIT_SECONDS=1")
    assert 0.5 < seconds < 1 + 5 + SLACK  # the wait, an attempt's bound, the interpreter's start


@pytest.mark.slow
def test_with_the_default_settings_a_wrong_port_fails_within_15_s(tmp_path: Path) -> None:
    url = f"postgresql://postgres@127.0.0.1:{closed_port()}/postgres"
    code, _, err, seconds = run("serve", cwd=tmp_path, DATABASE_URL=url)
    assert code == 1
    assert_one_line_error(err, "connection refused", "DATABASE_STARTUP_WAIT_SECONDS=10")
    assert 9 < seconds < 15 + SLACK


def test_a_server_that_never_answers_times_out(silent_port: int, tmp_path: Path) -> None:
    url = f"postgresql://postgres@127.0.0.1:{silent_port}/postgres"
    code, _, err, seconds = run(
        "migrate",
        cwd=tmp_path,
        DATABASE_URL=url,
        DATABASE_CONNECT_TIMEOUT_SECONDS="0.5",
        DATABASE_STARTUP_WAIT_SECONDS="0",  # one attempt
    )
    assert code == 1
    assert_one_line_error(err, "no answer within 0.5 s (DATABASE_CONNECT_TIMEOUT_SECONDS)")
    assert seconds < 0.5 + SLACK


@pytest.mark.slow
def test_migrate_on_a_database_it_may_not_change_names_the_error(
    server_url: str, plain_database_url: str, tmp_path: Path
) -> None:
    """Reachable, but the role may not create tables: the migration's error, in one line."""
    name = f"memory_ro_{uuid.uuid4().hex[:8]}"
    role = f"memory_ro_{uuid.uuid4().hex[:8]}"
    admin = make_url(server_url).set(drivername="postgresql").render_as_string(hide_password=False)

    async def sql(*statements: str, database: str | None = None) -> None:
        target = admin if database is None else make_url(admin).set(database=database).render_as_string(False)
        conn = await asyncpg.connect(target)
        try:
            for statement in statements:
                await conn.execute(statement)
        finally:
            await conn.close()

    asyncio.run(sql(f'CREATE ROLE "{role}" LOGIN', f'CREATE DATABASE "{name}"'))
    try:
        asyncio.run(sql(f'REVOKE CREATE ON SCHEMA public FROM PUBLIC, "{role}"', database=name))
        url = make_url(server_url).set(database=name, username=role).render_as_string(hide_password=False)
        code, _, err, _ = run("migrate", cwd=tmp_path, DATABASE_URL=url)
        assert code == 1
        assert_one_line_error(err, "migration failed: InsufficientPrivilegeError: permission denied")
    finally:
        asyncio.run(sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)', f'DROP ROLE IF EXISTS "{role}"'))


def test_migrate_succeeds_and_says_nothing_at_warning(database_url: str, tmp_path: Path) -> None:
    code, out, err, _ = run("migrate", cwd=tmp_path, DATABASE_URL=database_url)
    assert (code, out, err) == (0, "", "")


def test_version(tmp_path: Path) -> None:
    from importlib import metadata

    code, out, _, _ = run("--version", cwd=tmp_path)
    assert (code, out.strip()) == (0, f"memory-service {metadata.version('memory-service')}")


# ---- ops ---------------------------------------------------------------------------------------


async def test_ops_commands_run_the_service_queries_and_retries(
    make_app: AppFactory, llm: FakeLLM, database_url: str, db: asyncpg.Connection, tmp_path: Path
) -> None:
    api = await make_app()
    llm.fail_next(1, status=400)
    for n in (1, 2, 3):
        await api.post_round("ops-cli", n)
    await api.idle()
    assert await db.fetchval("SELECT status FROM memory WHERE memory_id = 1") == "failed"

    def ops(*args: str) -> tuple[int, str, str, float]:
        return run(
            "ops",
            *args,
            cwd=tmp_path,
            DATABASE_URL=database_url,
            OPENAI_API_KEY="sk-test",
            OPENAI_BASE_URL=llm.base_url,
            MEMORY_LLM_MAX_RETRIES="0",
        )

    async def together(*commands: tuple[str, ...]) -> list[tuple[int, str, str, float]]:
        """Independent commands at once (each process spends ~2 s importing)."""
        return list(await asyncio.gather(*(asyncio.to_thread(ops, *c) for c in commands)))

    failed, elsewhere, missing = await together(
        ("failed",), ("failed", "--tenant", "someone-else"), ("retry", "999")
    )
    assert failed[0] == 0, failed[2]
    rows = orjson.loads(failed[1])
    assert [(f["conversation_id"], f["memory_id"]) for f in rows] == [("ops-cli", 1)]
    assert "BadRequestError" in rows[0]["error"]
    assert (elsewhere[0], orjson.loads(elsewhere[1])) == (0, [])  # another tenant sees none of it
    assert missing[0] == 1 and missing[2].strip() == "memory-service: memory 999 not found"

    # The retry runs in the CLI's process, against the (fake) model, and waits for it.
    code, out, err, _ = await asyncio.to_thread(ops, "retry", "1")
    assert code == 0, err
    retried = orjson.loads(out)
    assert (retried["memory_id"], retried["status"], retried["attempts"]) == (1, "completed", 2)
    assert await db.fetchval("SELECT status FROM memory WHERE memory_id = 1") == "completed"

    stats, again = await together(("stats",), ("retry", "1"))
    assert stats[0] == 0 and orjson.loads(stats[1])["total_summaries"] == 1
    assert again[0] == 1
    assert again[2].strip() == "memory-service: memory 1 is completed; only failed memories can be retried"

    # A summary in flight (the model holds it) is stuck once it is older than the age asked.
    llm.hold = True
    await api.post_round("ops-cli", 4)
    await asyncio.to_thread(llm.wait_for_calls, 2)
    any_age, lease_age = await together(("stuck", "--older-than", "0"), ("stuck",))
    stuck = orjson.loads(any_age[1])
    assert any_age[0] == 0 and [s["memory_id"] for s in stuck] == [2]
    assert stuck[0]["lease_expires_at"]
    assert (lease_age[0], orjson.loads(lease_age[1])) == (0, [])  # none older than the 300 s lease
    llm.release_all()
    await api.idle()


def test_commands_that_do_not_migrate_refuse_a_database_behind_this_version(
    server_url: str, tmp_path: Path
) -> None:
    """`ops`, `export`, `import` (and `serve`/`worker --no-migrate`) on a database with no schema,
    or an older one, say to migrate instead of failing on a missing table."""
    with throwaway_database(server_url) as url:
        code, _, err, _ = run("ops", "stats", cwd=tmp_path, DATABASE_URL=url)
        assert code == 1
        assert_one_line_error(err, "has no schema yet: run `memory-service migrate`")
        older = next(iter(ScriptDirectory.from_config(alembic_config(url)).walk_revisions())).down_revision

        async def at_older() -> None:
            conn = await asyncpg.connect(url)
            try:
                await conn.execute("CREATE TABLE alembic_version (version_num varchar(32))")
                await conn.execute("INSERT INTO alembic_version VALUES ($1)", older)
            finally:
                await conn.close()

        asyncio.run(at_older())
        code, _, err, _ = run("export", "anything", cwd=tmp_path, DATABASE_URL=url)
        assert code == 1
        assert_one_line_error(
            err, f"is at migration {older} and this version needs", "memory-service migrate"
        )
